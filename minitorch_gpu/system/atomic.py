"""Atomic file writes: a reader sees the old file or the whole new one, never a part.

>>> with atomic_write(Path("run/config.yaml"), "w") as f:
...     f.write(text)

The data goes to a hidden temporary file beside the target (``TEMPORARY_NAME``:
``.NAME.tmp-PID``), which is flushed and fsynced, renamed over the target, and then the
directory is fsynced so the rename itself survives a power cut. On any exception, Ctrl-C
included, the temporary file is removed and the target is left as it was. Checkpoints, run
files, downloads and caches are all written this way.

Only a process killed outright (``kill -9``, a power cut) leaves its temporary file
behind; ``remove_leftover_temporaries`` clears a folder of them (the trainer does, in its
run directory, once it holds the directory's lock).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import string
from pathlib import Path
from typing import IO, Iterator, Optional, Tuple

__all__ = ["TEMPORARY_NAME", "atomic_write", "remove_leftover_temporaries"]

# The name of the temporary file that becomes ``target``: hidden, and tagged with the PID
# of the process writing it. atomic_write names its files with it and
# remove_leftover_temporaries recognises them by it, so the two cannot drift apart.
TEMPORARY_NAME = ".{target}.tmp-{pid}"


def _name_pattern(template: str) -> "re.Pattern[str]":
    """A regular expression matching the names ``template.format(...)`` gives."""
    fields = {"target": "(?P<target>.+)", "pid": "(?P<pid>[0-9]+)"}
    return re.compile("".join(re.escape(literal) + (fields[field] if field else "")
                              for literal, field, _, _ in string.Formatter().parse(template)))


_TEMPORARY_PATTERN = _name_pattern(TEMPORARY_NAME)


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "wb", *,
                 encoding: Optional[str] = None) -> Iterator[IO]:
    """Open a temporary file to write ``path``'s new contents; on a clean exit it replaces
    ``path``. ``mode`` is "wb" or "w" (then ``encoding`` defaults to UTF-8). The parent
    folder must exist."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode must be 'w' or 'wb', got {mode!r}")
    if mode == "w" and encoding is None:
        encoding = "utf-8"
    path = Path(path)
    temporary = path.with_name(TEMPORARY_NAME.format(target=path.name, pid=os.getpid()))
    try:
        with open(temporary, mode, encoding=encoding) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    _fsync_directory(path.parent)


def atomic_copy(source: Path, target: Path) -> None:
    """Replace ``target`` with a byte copy of ``source``, as atomically as ``atomic_write``."""
    with open(source, "rb") as src, atomic_write(target) as dst:
        shutil.copyfileobj(src, dst, 16 << 20)


def remove_leftover_temporaries(directory: Path) -> Tuple[int, int]:
    """Delete the temporary files that killed writers left in ``directory`` (not below it):
    regular files named by TEMPORARY_NAME whose writer is no longer a process of this
    machine (a live one may be saving right now). Returns (files, bytes) removed.

    Call it only while no other process of the project writes there (the trainer holds
    the run directory's lock); every other file is left alone."""
    files = size = 0
    for entry in os.scandir(directory):
        match = _TEMPORARY_PATTERN.fullmatch(entry.name)
        if match is None or not entry.is_file(follow_symlinks=False) \
                or _process_exists(int(match["pid"])):
            continue
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            bytes_held = entry.stat(follow_symlinks=False).st_size
            os.unlink(entry.path)
            files, size = files + 1, size + bytes_held
    return files, size


def _process_exists(pid: int) -> bool:
    """Whether ``pid`` is a live process here. Signal 0 checks without sending anything
    (POSIX; on Windows ``os.kill`` would end the process, so there every PID counts as
    live and nothing is removed)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)  # pid 0 would mean this process group: it counts as live
    except (ProcessLookupError, OverflowError):  # no such process; a PID past C's int
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _fsync_directory(directory: Path) -> None:
    """Make a rename durable (POSIX). Best effort: the file is in place already, and some
    systems (Windows, some network file systems) can't sync a directory."""
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
