"""One trainer at a time in a run directory: an advisory lock on ``RUN/.lock``.

>>> lock = lock_run_directory(Path("checkpoints/tiny"))  # RunDirectoryInUse if held
>>> ...                                                   # train, save, log
>>> lock.release()

The lock is ``flock(LOCK_EX | LOCK_NB)`` on the file ``.lock`` inside the run directory,
which holds its holder's PID, host and start time (JSON) for the refusal's message. The
kernel drops the lock when the process ends however it ends (``kill -9`` included), so a
dead trainer never blocks the next one; its stale ``.lock`` file is simply locked again.
A lock, not a PID file: a PID file outlives ``kill -9`` and must be judged stale, which PID
reuse and other hosts make guesswork.

A clean release removes the file, while still holding the lock. A process that opened
the file just before that would then lock a file no longer in the directory, so after
locking, the holder checks that the path still names the file it locked, and if not,
opens the path again: at every moment at most one process holds the lock on the file the
path names.

The lock is advisory: it stops other trainers, not ``rm`` or an editor. It holds on a
local disk and on NFS (Linux maps ``flock`` to NFS byte-range locks). Where there is no
``fcntl`` (Windows) or the file system refuses locks, ``lock_run_directory`` returns a lock
that holds nothing and says why in ``warning``: the run goes ahead unguarded.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from pathlib import Path
from typing import Optional

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

__all__ = ["LOCK_NAME", "RunDirectoryInUse", "RunLock", "lock_run_directory"]

LOCK_NAME = ".lock"  # inside the run directory
# errors of a file system that cannot lock (some network and FUSE mounts)
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class RunDirectoryInUse(RuntimeError):
    """Another process holds the run directory's lock; ``holder`` describes it."""

    def __init__(self, directory: Path, holder: str) -> None:
        super().__init__(f"{directory} is in use by another trainer ({holder})")
        self.directory, self.holder = directory, holder


class RunLock:
    """A held lock on a run directory (or, with ``warning`` set, a placeholder that holds
    nothing). ``release`` is idempotent; the process ending releases it too."""

    def __init__(self, path: Path, descriptor: Optional[int],
                 warning: Optional[str] = None) -> None:
        self.path, self._descriptor, self.warning = path, descriptor, warning

    @property
    def held(self) -> bool:
        return self._descriptor is not None

    def release(self) -> None:
        if self._descriptor is None:
            return
        descriptor, self._descriptor = self._descriptor, None
        try:
            if _names(self.path, descriptor):  # remove it while it is still ours
                self.path.unlink()
        except OSError:
            pass  # a stale .lock is harmless: the next trainer locks it again
        finally:
            os.close(descriptor)  # the lock goes with the last descriptor


def lock_run_directory(directory: Path) -> RunLock:
    """Lock ``directory`` (which must exist) for this process. Raises RunDirectoryInUse
    naming the holder when another process has it, OSError when the lock file cannot be
    created (no permission, a read-only disk)."""
    path = Path(directory) / LOCK_NAME
    if fcntl is None:
        return RunLock(path, None, "this platform has no fcntl.flock to lock the run "
                                   "directory with")
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(descriptor)
            os.close(descriptor)
            raise RunDirectoryInUse(Path(directory), holder) from None
        except OSError as exc:
            os.close(descriptor)
            if exc.errno not in _NO_LOCKS:
                raise
            with contextlib.suppress(OSError):
                path.unlink()
            return RunLock(path, None, f"the file system of {directory} cannot lock files "
                                       f"({exc.strerror or exc})")
        if _names(path, descriptor):
            break
        os.close(descriptor)  # its holder removed it as we locked it: lock the new one
    try:
        _write_holder(descriptor)
    except BaseException:  # a full disk: not left locked by a descriptor no one holds
        os.close(descriptor)
        raise
    return RunLock(path, descriptor)


def _names(path: Path, descriptor: int) -> bool:
    """Whether ``path`` is the file open as ``descriptor``."""
    try:
        named, held = os.stat(path), os.fstat(descriptor)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _write_holder(descriptor: int) -> None:
    """Put this process's PID, host and start time in the lock file. Written over the old
    contents and then cut to length, so a reader never finds the file empty."""
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                         "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode() + b"\n"
    os.pwrite(descriptor, record, 0)
    os.ftruncate(descriptor, len(record))


def _read_holder(descriptor: int) -> str:
    """The holder as words for the refusal: "PID 123 on host h since ...". The holder may
    be writing the file just now, so a few tries a few milliseconds apart."""
    for _ in range(20):
        try:
            record = json.loads(os.pread(descriptor, 4096, 0).decode())
            return (f"PID {int(record['pid'])} on host {record['host']}, "
                    f"since {record['since']}")
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.005)
    return "a process that has not yet written its PID into the lock file"

