"""Data crossing between the host and a device: counted reads, deferred checks, uploads.

A GPU runs the kernels Python queues while Python goes on queuing more. Whenever Python
needs a value back (``loss.item()``, ``if count:``, ``int(indices.max())``) it waits for
every kernel queued before it, and the GPU then idles while Python queues the next ones.
A training step should therefore read nothing between log points. Three things here make
that checkable and possible, on either backend:

- ``HostReadCount``: every read goes through ``Backend.to_numpy``, which counts it in
  ``backend.host_reads`` (on the CPU too, where a read costs nothing, so a CPU test can
  prove that the GPU's path has none).
- ``DeferredChecks``: checks of values (an index in range) computed on the device as a
  min and a max, accumulated over calls, and read together later.
- ``Upload``: host arrays on their way to the device (a batch), ready for the work
  queued after ``result()``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np


class HostReadCount:
    """The reads of one backend inside a ``with backend.count_host_reads() as reads:``
    block: ``reads.count`` (live inside the block, fixed at its end)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._start = backend.host_reads
        self._end: Optional[int] = None

    def close(self) -> None:
        self._end = self._backend.host_reads

    @property
    def count(self) -> int:
        end = self._backend.host_reads if self._end is None else self._end
        return end - self._start

    def __repr__(self) -> str:
        return f"HostReadCount({self.count} on {self._backend.device})"


class Upload:
    """Arrays on their way to a device (``Backend.host_to_device_async``). Here they are
    there already; the CUDA backend's subclass makes the work queued after ``result()``
    wait for its copy (on the device, not on the host)."""

    def __init__(self, arrays: List[Any]) -> None:
        self._arrays = arrays

    def result(self) -> List[Any]:
        """The arrays on the device, for the work queued from now on."""
        return self._arrays


def range_error(bad: int, before: str, after: str, device: Any = None,
                error: type = ValueError) -> Exception:
    """The error (``error``: ValueError, or IndexError for an index) of a failed range
    check: ``"{before} {bad} {after}"``, and, for a check read after its op ran, where it
    was checked."""
    message = f"{before} {bad} {after}"
    if device is not None:
        message += (f" [checked on {device} without waiting for it, and read at a later "
                    f"host read]")
    return error(message)


def check_extremes(low: int, high: int, stop: int, before: str, after: str,
                   device: Any = None, *, start: int = 0, error: type = ValueError) -> None:
    """Raise ``range_error`` unless ``start <= low`` and ``high < stop``; the value named is
    the low one when it is below ``start``, else the high one."""
    if low < start:
        raise range_error(low, before, after, device, error)
    if high >= stop:
        raise range_error(high, before, after, device, error)


class DeferredChecks:
    """Range checks kept on the device until something reads them.

    Each check is keyed by its message and bound; its running min and max over every call
    are two 0-d device arrays (a few tiny kernels per call, no host read). ``read`` brings
    all of them back in one copy and raises the first that failed."""

    def __init__(self) -> None:
        # (before, after, start, stop, error) -> (running min, running max)
        self._pending: Dict[Tuple[str, str, int, int, type], Tuple[Any, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, xp: Any, low: Any, high: Any, stop: int, before: str, after: str, *,
            start: int = 0, error: type = ValueError) -> None:
        key = (before, after, start, stop, error)
        pending = self._pending.get(key)
        if pending is not None:
            low, high = xp.minimum(pending[0], low), xp.maximum(pending[1], high)
        self._pending[key] = (low, high)

    def take(self) -> Dict[Tuple[str, str, int, int, type], Tuple[Any, Any]]:
        """The pending checks, forgotten here: a CUDA Graph's, made while it captured
        (each launch writes their arrays again; ``add_launched`` reads them)."""
        pending, self._pending = self._pending, {}
        return pending

    def add_launched(self, xp: Any, checks: Dict[Tuple[str, str, int, int, type],
                                                 Tuple[Any, Any]]) -> None:
        """A graph's checks after one of its launches, pending like any other. Copies
        (or new running extremes): the next launch overwrites the graph's own arrays,
        maybe before anything reads them."""
        for (before, after, start, stop, error), (low, high) in checks.items():
            key = (before, after, start, stop, error)
            pending = self._pending.get(key)
            if pending is None:
                self._pending[key] = (low.copy(), high.copy())
            else:
                self._pending[key] = (xp.minimum(pending[0], low), xp.maximum(pending[1], high))

    def read(self, xp: Any, to_host: Callable[[Any], np.ndarray], device: Any) -> None:
        """Read every pending check (one copy to the host) and forget them; raise the
        error of the first that failed."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        extremes = xp.stack([value for pair in pending.values() for value in pair])
        values = to_host(extremes.astype(np.int64)).tolist()  # (2 * checks,)
        for i, (before, after, start, stop, error) in enumerate(pending):
            check_extremes(values[2 * i], values[2 * i + 1], stop, before, after, device,
                           start=start, error=error)
