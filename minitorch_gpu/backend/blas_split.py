"""Stacked products of small matrices side by side on the cores, one BLAS thread each.

NumPy runs ``matmul`` of stacked (..., M, K) @ (..., K, N) arrays as one BLAS call per
matrix, each on BLAS's own threads. For the small matrices of attention (a head's
T x hs by hs x T) OpenBLAS either keeps a call on one thread or hands half of it to a
second thread at every call; either way one product at a time runs. Here the stack is
cut into one run of matrices per core instead (``backend/threads.py``), BLAS set to one
thread while they run, then set back. Measured on the 2-core machine of PERF.md, in a
small GPT's training step, its attention scores (8 x 6 heads of 256 x 64 by 64 x 256):
81 -> 64 ms a step; but its P V products (256 x 256 by 256 x 64) went from 43 and 40 ms
to 72 and 70, and the baby's scores (64 x 32 by 32 x 64) from 2.2 to 2.6 ms, so only the
shapes that won are split (``MAX_INNER``, ``MIN_OUTER``).

Only stacks of at least two matrices, and only where BLAS has at least two threads to
lend (so a process limited to one thread stays on one core). Each matrix is still one BLAS
call, now on one thread: the same product to within rounding, though not always bit for bit
(OpenBLAS's Haswell kernels sum a dot product in another order on one thread than on two).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .threads import cpu_threads, run_split

__all__ = ["MAX_INNER", "MAX_OUTER", "MIN_OUTER", "split_matmul"]

# which products of a stack are split (measured per shape in a training step, PERF.md):
# a short inner dimension and a wide result, as attention's scores Q K^T (M, N the
# sequence, K the head dim); with a long inner dimension (P V, dS K) and for tiny
# matrices (T 64) one call on two BLAS threads was faster in the step
MAX_INNER = 64  # K at most
MIN_OUTER, MAX_OUTER = 1 << 16, 1 << 22  # M N from 256 x 256 to 2048 x 2048

_controller: Any = None  # threadpoolctl's handle on NumPy's BLAS, found at the first use


def _blas() -> Any:
    """The BLAS library's thread controller (a ctypes call to get or set its threads), or
    False where threadpoolctl finds none."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController
        found = ThreadpoolController().select(user_api="blas").lib_controllers
        _controller = found[0] if len(found) == 1 else False
    return _controller


def split_matmul(a: Any, b: Any, out: Optional[Any] = None) -> Optional[Any]:
    """``np.matmul(a, b, out=out)`` with the stack split over the cores, or None (nothing
    done) where that does not apply: 2-D operands, one matrix, large matrices, mixed or
    non-float dtypes, one core or one BLAS thread."""
    if a.ndim < 3 and b.ndim < 3 or a.ndim < 2 or b.ndim < 2:
        return None
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        return None
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if not (k <= MAX_INNER and MIN_OUTER <= m * n <= MAX_OUTER) or not batch or \
            batch[0] < 2 or cpu_threads() < 2:
        return None
    blas = _blas()
    if not blas:
        return None
    threads = blas.get_num_threads()
    if threads < 2:
        return None
    if out is None:
        out = np.empty(batch + (m, n), dtype=a.dtype)
    elif out.shape != batch + (m, n) or out.dtype != a.dtype:
        return None
    # the operands padded to the result's number of dims, so axis 0 is the stack's first
    a = a.reshape((1,) * (len(batch) + 2 - a.ndim) + a.shape)
    b = b.reshape((1,) * (len(batch) + 2 - b.ndim) + b.shape)
    parts = min(cpu_threads(), threads, batch[0])
    bounds = [batch[0] * i // parts for i in range(parts + 1)]

    def piece(span: Any) -> None:
        rows = slice(*span)
        np.matmul(a[rows] if a.shape[0] > 1 else a, b[rows] if b.shape[0] > 1 else b,
                  out=out[rows])

    blas.set_num_threads(1)
    try:
        run_split(piece, list(zip(bounds, bounds[1:])))
    finally:
        blas.set_num_threads(threads)
    return out
