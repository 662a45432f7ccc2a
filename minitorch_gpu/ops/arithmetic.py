"""Arithmetic: + - * / (true division), neg, pow, abs, clamp, maximum, minimum.

Binary ops broadcast like NumPy and declare ``broadcasts = True``: their backward returns
gradients of the broadcast shape and the engine sums each back to its input's shape.
Python scalars pass straight through to the array module. Division with a rounding mode,
//, % and fmod are in ``rounding.py``.
"""
from __future__ import annotations

from typing import Any, Optional

from ..autograd import Function
from ..tensor import Tensor
from ._util import require_tensor
from .promotion import binary_operands, float_operands, promote_operands
from .rounding import div_rounded


class Add(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        return ctx.xp.add(a, b)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


def add(a: Any, b: Any) -> Tensor:
    return Add.apply(*binary_operands(a, b, "add"))


class Sub(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        return ctx.xp.subtract(a, b)

    @staticmethod
    def backward(ctx, grad):
        return grad, (-grad if ctx.needs_input_grad[1] else None)


def sub(a: Any, b: Any) -> Tensor:
    return Sub.apply(*binary_operands(a, b, "sub"))


class Mul(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        need_a, need_b = ctx.needs_input_grad
        # each gradient needs only the other operand
        ctx.save_for_backward(b if need_a else None, a if need_b else None)
        return ctx.xp.multiply(a, b)

    @staticmethod
    def backward(ctx, grad):
        b, a = ctx.saved_tensors
        return (grad * b if b is not None else None,
                grad * a if a is not None else None)


def mul(a: Any, b: Any) -> Tensor:
    return Mul.apply(*binary_operands(a, b, "mul"))


class Div(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        out = ctx.xp.divide(a, b)
        ctx.save_for_backward(b, out if ctx.needs_input_grad[1] else None)
        return out

    @staticmethod
    def backward(ctx, grad):
        b, out = ctx.saved_tensors
        grad_a = grad / b
        return grad_a, (-grad_a * out if out is not None else None)  # d/db a/b = -a/b^2


def div(a: Any, b: Any, *, rounding_mode: Optional[str] = None) -> Tensor:
    """True division: integer operands give the default float (float32), as in PyTorch.
    ``rounding_mode="floor"`` or ``"trunc"`` rounds the quotient (``ops/rounding.py``)."""
    if rounding_mode is not None:
        return div_rounded(a, b, rounding_mode)
    return Div.apply(*float_operands(a, b, "div"))


class Neg(Function):
    @staticmethod
    def forward(ctx, a):
        return ctx.xp.negative(a)

    @staticmethod
    def backward(ctx, grad):
        return -grad


def neg(a: Tensor) -> Tensor:
    return Neg.apply(require_tensor(a, "neg"))


class Pow(Function):
    """``a ** b`` for tensor or scalar base and exponent."""

    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        out = ctx.xp.power(a, b)
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        a, b, out = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        grad_a = grad_b = None
        if need_a:  # d/da a^b = b a^(b-1), exactly 0 where b == 0 (a^0 is constant, even at 0)
            grad_a = xp.where(b == 0, 0, grad * b * xp.power(a, b - 1))
        if need_b:  # d/db a^b = a^b log a; 0 at a == 0 with b >= 0 (as PyTorch), -inf for b < 0
            log_a = xp.where(a == 0, -xp.inf, xp.log(xp.where(a == 0, 1, a)))
            grad_b = xp.where((a == 0) & (b >= 0), 0, grad * out * log_a)
        return grad_a, grad_b


def pow(a: Any, b: Any) -> Tensor:  # noqa: A001 - mirrors torch.pow
    a, b = binary_operands(a, b, "pow")
    if type(b) is int and b < 0 and isinstance(a, Tensor) and a.dtype.kind in "iub":
        raise RuntimeError("pow: Integers to negative integer powers are not allowed.")
    if isinstance(b, Tensor) and b.dtype.kind == "i" and \
            (a.dtype.kind in "iu" if isinstance(a, Tensor) else type(a) is int):
        return _integer_pow(a, b)
    return Pow.apply(a, b)


def _integer_pow(a: Any, b: Tensor) -> Tensor:
    """Integers to integer tensor powers as PyTorch computes them, where NumPy refuses any
    negative exponent: a ** -n is 1 for a == 1, +-1 for a == -1, else 0 (integer division
    of 1 by a ** n; 0 ** -n too). No gradient: the values are integers."""
    xp = b._backend.xp
    base, exponent = (a.data if isinstance(a, Tensor) else a), b.data
    negative = exponent < 0
    out = xp.power(base, xp.where(negative, 0, exponent))
    odd = (exponent % 2) == 1
    small = xp.where(base == 1, 1, xp.where(base == -1, xp.where(odd, -1, 1), 0))
    out = xp.where(negative, small, out).astype(b.dtype, copy=False)
    return Tensor._make(xp.asarray(out), b._backend, False)


class Abs(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.abs(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad * ctx.xp.sign(a)


def abs(a: Tensor) -> Tensor:  # noqa: A001 - mirrors torch.abs
    return Abs.apply(require_tensor(a, "abs"))


def clip_array(xp: Any, a: Any, low: Any, high: Any, out: Any = None) -> Any:
    """``a`` (a raw array) clipped to [low, high], where a bound of None means no bound
    (the callers check that one is given); clamp and clamp_ share it.

    A one-sided bound is ``xp.maximum``/``xp.minimum``, never ``xp.clip`` with a None:
    CuPy 14's clip fills in a missing bound only for float and integer dtype kinds ('f',
    'i', 'u'), so bf16 (ml_dtypes, kind 'V') reaches its ufunc with the None and raises
    TypeError. maximum/minimum are what NumPy's clip computes: the same values and dtype,
    NaN propagating (from ``a`` or the bound)."""
    if low is None:
        return xp.minimum(a, high, out=out)
    if high is None:
        return xp.maximum(a, low, out=out)
    return xp.clip(a, low, high, out=out)


class Clamp(Function):
    @staticmethod
    def forward(ctx, a, low, high):
        xp = ctx.xp
        # the gradient passes where the input was inside [low, high] (ends included)
        inside = xp.ones(a.shape, dtype=bool)
        if low is not None:
            inside &= a >= low
        if high is not None:
            inside &= a <= high
        ctx.save_for_backward(inside)
        return clip_array(xp, a, low, high).astype(a.dtype, copy=False)  # bf16 stays bf16

    @staticmethod
    def backward(ctx, grad):
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None


def clamp(a: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    require_tensor(a, "clamp")
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if isinstance(min, float) or isinstance(max, float):  # int tensor, float bounds: float32
        a = promote_operands(a, 1.0)[0]
    return Clamp.apply(a, min, max)


class Maximum(Function):
    """Elementwise max; where both are equal each gets half the gradient (as PyTorch)."""

    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return ctx.xp.maximum(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return _share_gradient(grad, a > b, a == b)


def maximum(a: Any, b: Any) -> Tensor:
    return Maximum.apply(*binary_operands(a, b, "maximum"))


class Minimum(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return ctx.xp.minimum(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return _share_gradient(grad, a < b, a == b)


def minimum(a: Any, b: Any) -> Tensor:
    return Minimum.apply(*binary_operands(a, b, "minimum"))


def _share_gradient(grad, a_wins, tie):
    """a gets the gradient where it won and half of it on ties; b gets the rest."""
    grad_a = grad * (a_wins + 0.5 * tie)
    return grad_a, grad - grad_a
