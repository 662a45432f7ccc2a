"""Dropout: zero each element with probability p in training, scale the rest by 1/(1-p)."""
from __future__ import annotations

from ..autograd import Function
from ..backend import dtypes
from ..tensor import Tensor
from ._util import require_float, require_tensor


class Dropout(Function):
    @staticmethod
    def forward(ctx, a, p):
        keep = ctx.backend.rand(a.shape, dtypes.float32) >= p  # bool mask, 1 byte/element
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        out = a * keep
        out *= ctx.scale
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        out = grad * keep
        out *= ctx.scale
        return out, None


def dropout(a: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Identity when not training or p == 0; random draws come from ``manual_seed``'s stream."""
    require_tensor(a, "dropout")
    require_float(a, "dropout")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return a
    if p == 1.0:
        return a * 0.0
    return Dropout.apply(a, p)
