"""RMS norm's launchers (``rmsnorm.cu``): forward, and backward as dx plus the dweight
column sums. x (and the output, and dy) float32 or bf16, read as stored; statistics,
weight and gradients float32.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import loader
from .loader import (FLOAT32, blocks, check_float32, check_input_dtype, check_shape,
                     input_code, is_float32, is_float32_or_bf16, on_device_of_first_array)

# launch shapes; each matches the #define of the same meaning in rmsnorm.cu
RMS_NORM_WARPS_PER_BLOCK = 8
RMS_NORM_COLUMN_THREADS = 256
RMS_NORM_ROWS_PER_CHUNK = 64  # rows summed per thread in the dweight partials
_MAX_GRID_Y = 65535


def supports_rms_norm(x: Any, weight: Optional[Any]) -> bool:
    """x (..., n) float32 or bf16 (read as stored) with at least one element and
    n < 2^31; weight (n,) float32 or None. Any strides (a strided x is copied once)."""
    return (x.ndim >= 1 and x.size > 0 and x.shape[-1] < 2 ** 31 and is_float32_or_bf16(x)
            and (weight is None or (is_float32(weight) and tuple(weight.shape)
                                    == (x.shape[-1],))))


def _rows(op: str, x: Any, n: int) -> int:
    """x.size // n, after checking that n is the size of x's trailing dims (so the rows
    are x's leading index) and fits the kernels' int."""
    trailing = 0
    if isinstance(n, (int, np.integer)) and not isinstance(n, bool):
        trailing = 1
        for dim in reversed(x.shape):
            if trailing >= n:
                break
            trailing *= dim
    if not (trailing == n and 1 <= n < 2 ** 31):
        raise ValueError(f"{op}: n must be the size of x's trailing dims (x's last dim for "
                         f"(..., n)), below 2^31, got n={n!r} for x of shape "
                         f"{tuple(x.shape)}")
    return x.size // int(n)


def _weight(op: str, weight: Optional[Any], n: int) -> Any:
    """weight as a contiguous float32 (n,) array (a weight of the normalized shape, n
    elements, is taken flat); ones where it is None."""
    if weight is None:
        return loader.require_cupy().ones((n,), dtype=FLOAT32)
    check_float32(op, weight=weight)
    if weight.size != n:
        raise ValueError(f"{op}: weight has shape {tuple(weight.shape)}, expected ({n},)")
    return loader.contiguous(weight).reshape(n)


@on_device_of_first_array
def rms_norm_forward(x: Any, weight: Optional[Any], eps: float, n: int) -> Tuple[Any, Any]:
    """RMS norm of the rows of ``x`` (..., n), float32 or bf16: ``(out, rstd)``, out
    x * rstd * weight in x's dtype and shape (rounded once), rstd = 1 / sqrt(mean(x^2) +
    eps) per row, float32 (rows,) with rows = x.size // n, as ``rms_norm_backward`` needs
    it. weight: float32 (n,), or None for none."""
    op = "rms_norm_forward"
    check_input_dtype(op, x=x)
    rows = _rows(op, x, n)
    w = _weight(op, weight, int(n))
    cupy = loader.require_cupy()
    x = loader.contiguous(x)
    out = cupy.empty_like(x)
    rstd = cupy.empty((rows,), dtype=FLOAT32)
    if rows:
        kernel = loader.load_kernel(x, "rmsnorm.cu", "rms_norm_forward",
                                    INPUT_DTYPE=input_code(x.dtype))
        kernel((blocks(rows, RMS_NORM_WARPS_PER_BLOCK),), (RMS_NORM_WARPS_PER_BLOCK * 32,),
               (x, w, out, rstd, np.int64(rows), np.int32(n), np.float32(eps)))
    return out, rstd


def rms_norm_chunks(rows: int) -> Tuple[int, int]:
    """(rows_per_chunk, chunks) of the dweight partials: RMS_NORM_ROWS_PER_CHUNK rows per
    thread, or more where that would need more than 65535 chunks (grid.y)."""
    rows_per_chunk = max(RMS_NORM_ROWS_PER_CHUNK, blocks(rows, _MAX_GRID_Y))
    return rows_per_chunk, blocks(rows, rows_per_chunk)


@on_device_of_first_array
def rms_norm_backward(grad: Any, x: Any, weight: Optional[Any], rstd: Any,
                      n: int) -> Tuple[Any, Optional[Any]]:
    """Gradients of ``rms_norm_forward`` given ``grad`` = dL/dout: ``(grad_x,
    grad_weight)``, grad_x float32 of x's shape (the engine rounds it to x's dtype),
    grad_weight float32 (n,), or None when weight is None. grad is read in x's dtype
    (another float dtype is cast once); rstd is the forward's."""
    op = "rms_norm_backward"
    check_input_dtype(op, x=x)
    rows = _rows(op, x, n)
    check_shape(op, "grad", grad, x.shape)
    check_float32(op, rstd=rstd)
    check_shape(op, "rstd", rstd, (rows,))
    if grad.dtype != x.dtype:  # one module reads x and grad: grad in x's dtype
        if grad.dtype.kind != "f" and grad.dtype.name != "bfloat16":
            raise TypeError(f"{op}: grad must be a float array, got {grad.dtype}")
        grad = grad.astype(x.dtype)
    w = _weight(op, weight, int(n))
    cupy = loader.require_cupy()
    grad, x, rstd = (loader.contiguous(a) for a in (grad, x, rstd))
    grad_x = cupy.empty(x.shape, dtype=FLOAT32)
    if not rows:
        return grad_x, None if weight is None else cupy.zeros((int(n),), dtype=FLOAT32)
    defines = dict(INPUT_DTYPE=input_code(x.dtype))
    kernel = loader.load_kernel(x, "rmsnorm.cu", "rms_norm_backward_dx", **defines)
    kernel((blocks(rows, RMS_NORM_WARPS_PER_BLOCK),), (RMS_NORM_WARPS_PER_BLOCK * 32,),
           (grad, x, w, rstd, grad_x, np.int64(rows), np.int32(n)))
    if weight is None:
        return grad_x, None
    # dweight: per-chunk column sums on the GPU, then one sum over the chunks
    rows_per_chunk, chunks = rms_norm_chunks(rows)
    partial = cupy.empty((chunks, int(n)), dtype=FLOAT32)
    kernel = loader.load_kernel(x, "rmsnorm.cu", "rms_norm_backward_dweight", **defines)
    kernel((blocks(int(n), RMS_NORM_COLUMN_THREADS), chunks), (RMS_NORM_COLUMN_THREADS,),
           (grad, x, rstd, partial, np.int64(rows), np.int32(n), np.int64(rows_per_chunk)))
    return grad_x, partial.sum(axis=0)
