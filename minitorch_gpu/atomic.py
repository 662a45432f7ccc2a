"""Atomic file writes: a reader sees the old file or the whole new one, never a part.

>>> with atomic_write(Path("run/config.yaml"), "w") as f:
...     f.write(text)

The data goes to a hidden temporary file beside the target (``.NAME.tmp-PID``), which is
flushed and fsynced, renamed over the target, and then the directory is fsynced so the
rename itself survives a power cut. On any exception, Ctrl-C included, the temporary file
is removed and the target is left as it was. Checkpoints, run files, downloads and caches
are all written this way.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Iterator, Optional

__all__ = ["atomic_write"]


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
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
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
