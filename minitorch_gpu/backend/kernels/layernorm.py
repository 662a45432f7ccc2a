"""Layer norm's launchers (``layernorm.cu``): forward, and backward as dx plus the
dweight/dbias column sums.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np

from . import loader
from .loader import (FLOAT32, blocks, check_float32, check_shape, is_float32,
                     on_device_of_first_array)

# launch shapes; each matches the #define of the same meaning in layernorm.cu
LAYERNORM_WARPS_PER_BLOCK = 8
LAYERNORM_COLUMN_THREADS = 256
LAYERNORM_ROWS_PER_CHUNK = 64  # rows summed per thread in the dweight/dbias partials


def supports_layer_norm(x: Any, weight: Optional[Any], bias: Optional[Any]) -> bool:
    """float32 input, weight and bias (either may be None), at least one element."""
    return (x.size > 0 and is_float32(x) and (weight is None or is_float32(weight))
            and (bias is None or is_float32(bias)))


def _layer_norm_rows(x: Any, normalized_dims: int) -> Tuple[int, int]:
    if not 1 <= normalized_dims <= x.ndim:
        raise ValueError(f"layer_norm kernel: normalized_dims must be in [1, {x.ndim}] for an "
                         f"input of shape {tuple(x.shape)}, got {normalized_dims}")
    columns = math.prod(x.shape[x.ndim - normalized_dims:])
    return x.size // columns if columns else 0, columns


def _affine(op: str, x: Any, weight: Optional[Any], bias: Optional[Any],
            normalized_dims: int) -> Tuple[Any, Any]:
    """weight and bias as flat contiguous (C,) arrays; ones/zeros where not given."""
    cupy = loader.require_cupy()
    shape = tuple(x.shape[x.ndim - normalized_dims:])
    columns = math.prod(shape)
    flat = []
    for name, p, fill in (("weight", weight, 1.0), ("bias", bias, 0.0)):
        if p is None:
            flat.append(cupy.full((columns,), fill, dtype=FLOAT32))
        else:
            check_float32(op, **{name: p})
            check_shape(op, name, p, shape)
            flat.append(loader.contiguous(p).reshape(columns))
    return flat[0], flat[1]


@on_device_of_first_array
def layer_norm_forward(x: Any, weight: Optional[Any], bias: Optional[Any], eps: float,
                       normalized_dims: int = 1) -> Tuple[Any, Any, Any]:
    """Layer norm over the trailing ``normalized_dims`` dims of float32 ``x``.

    Returns ``(y, mean, rstd)``: y of x's shape; mean and 1/std per row, of shape
    ``x.shape[:-normalized_dims]``, as ``layer_norm_backward`` needs them.
    """
    op = "layer_norm_forward"
    check_float32(op, x=x)
    rows, columns = _layer_norm_rows(x, normalized_dims)
    w, b = _affine(op, x, weight, bias, normalized_dims)
    cupy = loader.require_cupy()
    x = loader.contiguous(x)
    y = cupy.empty_like(x)
    mean = cupy.empty(x.shape[:x.ndim - normalized_dims], dtype=FLOAT32)
    rstd = cupy.empty_like(mean)
    if rows:
        kernel = loader.load_kernel(x, "layernorm.cu", "layernorm_forward")
        kernel((blocks(rows, LAYERNORM_WARPS_PER_BLOCK),), (LAYERNORM_WARPS_PER_BLOCK * 32,),
               (x, w, b, y, mean, rstd, np.int32(rows), np.int32(columns), np.float32(eps)))
    return y, mean, rstd


@on_device_of_first_array
def layer_norm_backward(dy: Any, x: Any, weight: Optional[Any], mean: Any, rstd: Any,
                        normalized_dims: int = 1) -> Tuple[Any, Any, Any]:
    """Gradients of ``layer_norm_forward``: ``(dx, dweight, dbias)``, dweight and dbias of
    the normalized shape (computed even when weight/bias were None)."""
    op = "layer_norm_backward"
    check_float32(op, dy=dy, x=x, mean=mean, rstd=rstd)
    check_shape(op, "dy", dy, x.shape)
    rows, columns = _layer_norm_rows(x, normalized_dims)
    check_shape(op, "mean", mean, x.shape[:x.ndim - normalized_dims])
    check_shape(op, "rstd", rstd, x.shape[:x.ndim - normalized_dims])
    w, _ = _affine(op, x, weight, None, normalized_dims)
    cupy = loader.require_cupy()
    dy, x, mean, rstd = (loader.contiguous(a) for a in (dy, x, mean, rstd))
    dx = cupy.empty_like(x)
    shape = tuple(x.shape[x.ndim - normalized_dims:])
    if not rows:
        zeros = cupy.zeros(shape, dtype=FLOAT32)
        return dx, zeros, zeros.copy()
    kernel = loader.load_kernel(x, "layernorm.cu", "layernorm_backward_dx")
    kernel((blocks(rows, LAYERNORM_WARPS_PER_BLOCK),), (LAYERNORM_WARPS_PER_BLOCK * 32,),
           (dy, x, w, mean, rstd, dx, np.int32(rows), np.int32(columns)))
    # dweight/dbias: per-chunk column sums on the GPU, then one sum over the chunks
    rows_per_chunk = max(LAYERNORM_ROWS_PER_CHUNK, blocks(rows, 65535))  # grid.y <= 65535
    chunks = blocks(rows, rows_per_chunk)
    dweight_partial = cupy.empty((chunks, columns), dtype=FLOAT32)
    dbias_partial = cupy.empty((chunks, columns), dtype=FLOAT32)
    kernel = loader.load_kernel(x, "layernorm.cu", "layernorm_backward_dweight_dbias")
    kernel((blocks(columns, LAYERNORM_COLUMN_THREADS), chunks), (LAYERNORM_COLUMN_THREADS,),
           (dy, x, mean, rstd, dweight_partial, dbias_partial, np.int32(rows),
            np.int32(columns), np.int32(rows_per_chunk)))
    return (dx, dweight_partial.sum(axis=0).reshape(shape),
            dbias_partial.sum(axis=0).reshape(shape))
