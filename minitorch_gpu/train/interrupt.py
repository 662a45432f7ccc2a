"""Ctrl-C as a request: the first asks a loop to stop after its current step, so the state
it then saves is whole; a second one interrupts at once, as usual::

    stop = StopOnInterrupt()
    try:
        while not stop.requested:
            step()
    finally:
        stop.restore()
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any

__all__ = ["StopOnInterrupt"]


class StopOnInterrupt:
    """The first Ctrl-C (SIGINT) asks the loop to stop after the current step, so the state
    it saves is whole; a second one raises KeyboardInterrupt as usual. Installed only in
    the main thread (signal handlers can be set nowhere else). ``quiet``: say nothing (the
    ranks other than 0, which mpiexec passes the same Ctrl-C to)."""

    def __init__(self, quiet: bool = False) -> None:
        self.requested = False
        self.quiet = quiet
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            self.restore()
            raise KeyboardInterrupt
        self.requested = True
        if self.quiet:
            return
        # os.write, not print: a handler that prints while the loop is printing makes
        # Python raise "reentrant call"; a raw write to the file descriptor cannot
        with contextlib.suppress(OSError, ValueError):
            os.write(sys.stderr.fileno(),
                     b"\nCtrl-C: saving after this step (press again to quit without saving)\n")

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None
