"""Worker threads for long array work that NumPy would run on one core.

NumPy's elementwise loops run on the calling thread, but they release the GIL while they
loop: two threads each running the same chain of in-place ufuncs on one half of a long
array keep two cores busy. (BLAS, the other big user of the cores, has its own threads.)
``run_split`` is that: ``fn(piece)`` for each piece, the last on the calling thread, the
others on a pool of ``cpu_threads() - 1`` workers made once. Worth it only for arrays of
hundreds of thousands of elements; below that, handing work to a thread costs more.
"""
from __future__ import annotations

import contextvars
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

__all__ = ["SPLIT_FROM", "cpu_threads", "row_pieces", "run_split", "set_cpu_threads"]

SPLIT_FROM = 1 << 20  # elements from which elementwise work is split (below: one thread)

_threads: Optional[int] = None  # None: every core this process may run on
_pool: Optional[ThreadPoolExecutor] = None


def cpu_threads() -> int:
    """How many threads ``run_split`` uses: ``set_cpu_threads``'s, else every usable core."""
    if _threads is not None:
        return _threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_cpu_threads(threads: Optional[int]) -> None:
    """Use ``threads`` threads (None: every usable core) for the split array work."""
    global _threads, _pool
    if threads is not None and threads < 1:
        raise ValueError(f"set_cpu_threads: threads must be >= 1, got {threads}")
    _threads = threads
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None


def run_split(fn: Callable[[Any], None], pieces: Sequence[Any]) -> None:
    """``fn(piece)`` for every piece, on up to ``cpu_threads()`` threads at once; returns
    when all are done and re-raises the first error."""
    global _pool
    if len(pieces) <= 1 or cpu_threads() <= 1:
        for piece in pieces:
            fn(piece)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(cpu_threads() - 1, thread_name_prefix="minitorch-gpu")
    # each piece runs in a copy of the caller's context: NumPy keeps np.errstate there, so
    # the workers ignore or raise on floating-point errors as the caller asked
    futures = [_pool.submit(contextvars.copy_context().run, fn, piece)
               for piece in pieces[:-1]]
    fn(pieces[-1])
    for future in futures:
        future.result()


def row_pieces(array: Any, min_elements: Optional[int] = None) -> list:
    """Slices of ``array``'s first axis, one per thread, for a NumPy array of at least
    ``min_elements`` (default ``SPLIT_FROM``) elements; otherwise (a GPU array, a short one, one core) a single
    ``...``, which indexes all of any array, 0-d included."""
    min_elements = SPLIT_FROM if min_elements is None else min_elements
    rows = array.shape[0] if array.ndim else 1
    parts = min(cpu_threads(), rows)
    if type(array).__module__ != "numpy" or array.size < min_elements or parts <= 1:
        return [...]
    bounds = [rows * i // parts for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]
