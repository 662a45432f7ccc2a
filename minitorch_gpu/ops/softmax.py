"""Softmax and log-softmax along one dim, each a single fused Function.

bf16/fp16 inputs are computed in float32 (exponentials and sums need the range) and the
result is rounded back to the input's dtype.
"""
from __future__ import annotations

from typing import Any

from ..autograd import Function
from ..tensor import Tensor, _wrap_dim
from ._util import require_float, require_tensor, widened
from .promotion import autocast_float32


def working_copy(x: Any) -> Any:
    """A fresh array of ``x`` in a dtype wide enough for exp/sum (float32 for bf16/fp16)."""
    wide = widened(x)
    return x.copy() if wide is x else wide


def softmax_(x: Any, axis: int, xp: Any) -> Any:
    """Softmax of ``x`` along ``axis``, computed in place in ``x`` (which it returns)."""
    if x.size == 0:  # nothing to normalise (and max has no identity)
        return x
    x -= x.max(axis=axis, keepdims=True)  # exp of <= 0 cannot overflow
    xp.exp(x, out=x)
    x /= x.sum(axis=axis, keepdims=True)
    return x


def _checked_input(a: Tensor, dim: int, op: str) -> tuple:
    """``(a, axis)`` for softmax and log-softmax: a floating-point tensor (float32 under
    autocast) and ``dim`` as a non-negative axis."""
    require_tensor(a, op)
    require_float(a, op)
    a = autocast_float32(a)
    return a, _wrap_dim(dim, a.ndim, op)


class Softmax(Function):
    @staticmethod
    def forward(ctx, a, axis):
        out = softmax_(working_copy(a), axis, ctx.xp).astype(a.dtype, copy=False)
        ctx.save_for_backward(out)
        ctx.axis = axis
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        # d softmax: p * (g - sum(g * p))
        inner = (grad * out).sum(axis=ctx.axis, keepdims=True)
        return out * (grad - inner), None


def softmax(a: Tensor, dim: int) -> Tensor:
    return Softmax.apply(*_checked_input(a, dim, "softmax"))


class LogSoftmax(Function):
    @staticmethod
    def forward(ctx, a, axis):
        xp = ctx.xp
        shifted = working_copy(a)
        if shifted.size:  # an empty input has nothing to normalise (and max has no identity)
            shifted -= shifted.max(axis=axis, keepdims=True)
            shifted -= xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))
        out = shifted.astype(a.dtype, copy=False)
        ctx.save_for_backward(out)
        ctx.axis = axis
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        # d log_softmax: g - softmax * sum(g)
        return grad - ctx.xp.exp(out) * grad.sum(axis=ctx.axis, keepdims=True), None


def log_softmax(a: Tensor, dim: int) -> Tensor:
    return LogSoftmax.apply(*_checked_input(a, dim, "log_softmax"))
