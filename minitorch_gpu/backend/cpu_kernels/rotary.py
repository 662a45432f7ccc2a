"""Rotary position embedding in one pass: each head of x read once and written once.

The NumPy code (``ops/rotary.py``) makes three passes per head (x times cos, a swapped
copy of x, the swapped copy times sin added in); here each pair (i, i + D/2) is read,
rotated and written in a single loop over the head:

    out1 = x1 cos - x2 sin,  out2 = x2 cos + x1 sin   (inverse: sin negated)

x is (B, T, H, D), float32, read where it lies (any strides, the heads of a projection's
layout); the result is a new contiguous array. The rows (one head of one position) are
split over the cores for long inputs (``compiler.split_rows``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .activations import _is_float32
from .compiler import jit, split_rows


def supports_rotary(x: Any, cos: Any, sin: Any) -> bool:
    """x (B, T, H, D) float32 NumPy, D even, at least one element; cos and sin float32
    (T, D / 2)."""
    if not (_is_float32(x, cos, sin) and x.ndim == 4 and x.size > 0 and x.shape[-1] % 2 == 0):
        return False
    half = (x.shape[1], x.shape[3] // 2)
    return cos.shape == half and sin.shape == half


@jit
def _rotary(x, cos, sin, sign, out, start, stop):  # pragma: no cover - compiled
    T, H, h = x.shape[1], x.shape[2], x.shape[3] // 2
    for r in range(start, stop):
        b, rest = divmod(r, T * H)
        t, head = divmod(rest, H)
        xr, orow, c, s = x[b, t, head], out[b, t, head], cos[t], sin[t]
        for i in range(h):  # indices from 0: the loop vectorises
            x1, x2, si = xr[i], xr[i + h], sign * s[i]
            orow[i] = x1 * c[i] - x2 * si
            orow[i + h] = x2 * c[i] + x1 * si


def rotary_forward(x: Any, cos: Any, sin: Any, inverse: bool) -> Any:
    """x rotated, rotate-half convention (``inverse``: by minus the angle, the backward).
    x (B, T, H, D) float32, any strides (a strided last dim is copied once); cos, sin
    float32 (T, D / 2). Returns a new contiguous (B, T, H, D) float32 array."""
    if not supports_rotary(x, cos, sin):
        raise ValueError(f"rotary_forward: expected float32 x (B, T, H, D) with D even and "
                         f"float32 cos, sin (T, D / 2), got x {x.dtype} {tuple(x.shape)}, cos "
                         f"{cos.dtype} {tuple(cos.shape)}, sin {sin.dtype} {tuple(sin.shape)}")
    if x.strides[-1] != x.itemsize:
        x = np.ascontiguousarray(x)
    cos, sin = np.ascontiguousarray(cos), np.ascontiguousarray(sin)
    B, T, H, D = x.shape
    out = np.empty((B, T, H, D), dtype=np.float32)
    sign = np.float32(-1.0 if inverse else 1.0)
    split_rows(B * T * H, D, lambda a, b: _rotary(x, cos, sin, sign, out, a, b))
    return out
