"""Selection: ``where`` (one of two values by a condition), ``masked_fill``, and
``tril``/``triu`` (a triangle of the last two dims). The gradient flows only to the
elements that were selected."""
from __future__ import annotations

from typing import Any

from ..autograd import Function
from ..tensor import Tensor
from ._util import as_tensor_like, check_broadcast, require_tensor, shape_of
from .promotion import promote_operands, result_dtype


class Where(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, condition, a, b):
        ctx.save_for_backward(condition)
        return ctx.xp.where(condition, a, b)

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        (condition,) = ctx.saved_tensors
        zero = xp.zeros((), dtype=grad.dtype)
        _, need_a, need_b = ctx.needs_input_grad
        return (None,
                xp.where(condition, grad, zero) if need_a else None,
                xp.where(condition, zero, grad) if need_b else None)


def where(condition: Any, a: Any, b: Any) -> Tensor:
    """``a`` where ``condition`` is true, else ``b`` (all three broadcast together)."""
    like = next((x for x in (condition, a, b) if isinstance(x, Tensor)), None)
    if like is None:
        raise TypeError("where: expected at least one Tensor argument")
    condition = as_tensor_like(condition, like, "where")
    if not isinstance(condition, Tensor) or condition.dtype.kind != "b":
        raise TypeError(f"where: condition must be a bool tensor, got "
                        f"{getattr(condition, 'dtype', type(condition).__name__)}")
    a, b = as_tensor_like(a, like, "where"), as_tensor_like(b, like, "where")
    check_broadcast("where", shape_of(condition), shape_of(a), shape_of(b))
    a, b = promote_operands(a, b)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):  # two numbers: float32 or int64
        a = Tensor._make(like._backend.xp.asarray(a, dtype=result_dtype(a, b)), like._backend,
                         False)
    return Where.apply(condition, a, b)


class MaskedFill(Function):
    @staticmethod
    def forward(ctx, a, mask, value):
        ctx.save_for_backward(mask)
        xp = ctx.xp
        out = xp.where(mask, xp.asarray(value, dtype=a.dtype), a)
        return xp.asarray(out, order="C")  # row-major like PyTorch's, whatever a's layout

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return ctx.xp.where(mask, ctx.xp.zeros((), dtype=grad.dtype), grad), None, None


def masked_fill(a: Tensor, mask: Any, value: float) -> Tensor:
    """``a`` with ``value`` wherever the bool ``mask`` (broadcast to ``a``'s shape) is true."""
    require_tensor(a, "masked_fill")
    mask = as_tensor_like(mask, a, "masked_fill")
    if not isinstance(mask, Tensor) or mask.dtype.kind != "b":
        raise TypeError(f"masked_fill: mask must be a bool tensor, got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    if check_broadcast("masked_fill", a.shape, mask.shape) != a.shape:
        raise ValueError(f"masked_fill: mask of shape {mask.shape} does not broadcast to the "
                         f"input's shape {a.shape}")
    if isinstance(value, Tensor):
        value = value.item()
    return MaskedFill.apply(a, mask, value)


class Triangle(Function):
    """tril/triu: keep the elements on and below (or above) a diagonal of the last two dims;
    the gradient passes through the same elements."""

    @staticmethod
    def forward(ctx, a, diagonal, upper):
        ctx.diagonal, ctx.upper = diagonal, upper
        return (ctx.xp.triu if upper else ctx.xp.tril)(a, k=diagonal)

    @staticmethod
    def backward(ctx, grad):
        return (ctx.xp.triu if ctx.upper else ctx.xp.tril)(grad, k=ctx.diagonal), None, None


def _triangle(a: Tensor, diagonal: int, upper: bool) -> Tensor:
    op = "triu" if upper else "tril"
    require_tensor(a, op)
    if a.ndim < 2:
        raise ValueError(f"{op}: expected a tensor of at least 2 dims, got shape {tuple(a.shape)}")
    return Triangle.apply(a, int(diagonal), upper)


def tril(a: Tensor, diagonal: int = 0) -> Tensor:
    """Zero the elements above the ``diagonal``-th diagonal of the last two dims
    (``mt.tril(mt.ones(T, T))`` is a causal mask)."""
    return _triangle(a, diagonal, False)


def triu(a: Tensor, diagonal: int = 0) -> Tensor:
    """Zero the elements below the ``diagonal``-th diagonal of the last two dims."""
    return _triangle(a, diagonal, True)
