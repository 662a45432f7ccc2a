"""Rotary position embedding's launcher (``rotary.cu``): Llama's rotate-half RoPE of
(B, T, H, D) heads read in place through their strides, forward or inverse (backward).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import loader
from .loader import (ELEMENTWISE_THREADS, check_float32, check_input_dtype, check_shape,
                     elementwise_grid, input_code, is_float32, is_float32_or_bf16,
                     on_device_of_first_array)


def supports_rotary(x: Any, cos: Any, sin: Any) -> bool:
    """x (B, T, H, D) float32 or bf16 (read as stored), D even, at least one element, any
    strides (read in place when its last dim is contiguous); cos and sin float32
    (T, D / 2)."""
    if not (x.ndim == 4 and x.size > 0 and x.shape[-1] % 2 == 0 and is_float32_or_bf16(x)
            and is_float32(cos, sin)):
        return False
    half = (x.shape[1], x.shape[3] // 2)
    return tuple(cos.shape) == half and tuple(sin.shape) == half and x.shape[1] < 2 ** 31


def rotary_strides(x: Any) -> Optional[Tuple[int, int, int]]:
    """(batch, position, head) strides in elements with which ``rotary.cu`` reads x
    (B, T, H, D) in place; None when it cannot (a strided last dim, or a stride that is
    not a whole number of elements): the launcher then copies x once."""
    if any(s % x.itemsize for s in x.strides):
        return None
    strides = tuple(s // x.itemsize for s in x.strides)
    if x.shape[3] > 1 and strides[3] != 1:
        return None
    return strides[0], strides[1], strides[2]


@on_device_of_first_array
def rotary_forward(x: Any, cos: Any, sin: Any, inverse: bool) -> Any:
    """x rotated, rotate-half convention: with x1 = x[..., :D/2], x2 = x[..., D/2:] and
    the angles of each position t, out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin
    (``inverse``: with -sin, the backward). x (B, T, H, D) float32 or bf16, any strides
    (read in place; copied once where its last dim is strided); cos, sin float32
    (T, D / 2). Returns a new contiguous (B, T, H, D) array in x's dtype."""
    op = "rotary_forward"
    check_input_dtype(op, x=x)
    if x.ndim != 4 or x.shape[3] % 2:
        raise ValueError(f"{op}: x must be (B, T, H, D) with D even, got shape "
                         f"{tuple(x.shape)}")
    B, T, H, D = x.shape
    check_float32(op, cos=cos, sin=sin)
    check_shape(op, "cos", cos, (T, D // 2))
    check_shape(op, "sin", sin, (T, D // 2))
    cupy = loader.require_cupy()
    strides = rotary_strides(x)
    if strides is None:
        x = loader.contiguous(x)
        strides = rotary_strides(x)
    cos, sin = loader.contiguous(cos), loader.contiguous(sin)
    out = cupy.empty(x.shape, dtype=x.dtype)
    pairs = x.size // 2
    if pairs:
        kernel = loader.load_kernel(x, "rotary.cu", "rotary_forward",
                                    INPUT_DTYPE=input_code(x.dtype))
        kernel((elementwise_grid(pairs),), (ELEMENTWISE_THREADS,),
               (x, cos, sin, out, np.int64(pairs), np.int32(T), np.int32(H),
                np.int32(D // 2), np.int32(bool(inverse)),
                *(np.int64(s) for s in strides)))
    return out
