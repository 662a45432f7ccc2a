"""Rounding and integer-style division: floor, ceil, round, trunc, sign; floor_divide
(``//``), remainder (``%``), fmod, and ``div``'s rounding modes.

As in PyTorch: floor/ceil/round/trunc/sign and the rounded divisions are piecewise
constant, so their gradient is zero (torch's own floor_divide has no derivative; its
``div(rounding_mode="floor")``, the same values, gives zeros, and so do both here);
remainder and fmod pass the gradient to the dividend and give the divisor
-grad * (the rounded quotient). Integer tensors keep their dtype: ``7 // 2`` of int64
tensors is int64, rounding an integer tensor returns its values.
"""
from __future__ import annotations

from typing import Any, Optional

from ..autograd import Function
from ..backend import dtypes
from ..tensor import Tensor
from ._util import require_tensor
from .promotion import binary_operands


# --- rounding -----------------------------------------------------------------------------
class Rounding(Function):
    """floor, ceil, trunc, round (to ``decimals`` places, half to even) and sign: one
    Function, since they differ only in the array call and all have a zero gradient."""

    @staticmethod
    def forward(ctx, a, how, decimals):
        xp = ctx.xp
        if how == "round":
            return xp.round(a, decimals) if decimals else xp.rint(a)
        return getattr(xp, how)(a)

    @staticmethod
    def backward(ctx, grad):
        return ctx.xp.zeros_like(grad), None, None


def _rounding(input: Tensor, how: str, op: str, decimals: int = 0) -> Tensor:  # noqa: A002
    require_tensor(input, op)
    if input.dtype.kind == "b" and how != "sign":
        raise TypeError(f"{op}: not defined for bool tensors")
    if not dtypes.is_floating(input.dtype) and how != "sign" and not decimals:
        return input.clone()  # an integer is its own floor, ceil, trunc and round
    if input.dtype.kind == "b":  # sign of a bool is itself, as in PyTorch
        return input.clone()
    return Rounding.apply(input, how, int(decimals))


def floor(input: Tensor) -> Tensor:  # noqa: A002
    return _rounding(input, "floor", "floor")


def ceil(input: Tensor) -> Tensor:  # noqa: A002
    return _rounding(input, "ceil", "ceil")


def trunc(input: Tensor) -> Tensor:  # noqa: A002
    """Round towards zero."""
    return _rounding(input, "trunc", "trunc")


def round(input: Tensor, *, decimals: int = 0) -> Tensor:  # noqa: A001,A002 - torch.round
    """Round half to even, to ``decimals`` places (negative: to tens, hundreds, ...)."""
    if isinstance(decimals, bool) or not isinstance(decimals, int):
        raise TypeError(f"round: decimals must be an int, got {type(decimals).__name__}")
    return _rounding(input, "round", "round", decimals)


def sign(input: Tensor) -> Tensor:  # noqa: A002
    """-1, 0 or 1 by the sign of each element (0 for 0, NaN for NaN)."""
    return _rounding(input, "sign", "sign")


# --- integer-style division ---------------------------------------------------------------
def _int_trunc_divide(xp: Any, a: Any, b: Any) -> Any:
    """a / b rounded towards zero, exactly, for integers: floor division, plus one where
    the division was inexact and the signs differ."""
    quotient = xp.floor_divide(a, b)
    inexact = xp.remainder(a, b) != 0
    return quotient + (inexact & ((xp.asarray(a) < 0) != (xp.asarray(b) < 0)))


def _division_operands(a: Any, b: Any, op: str) -> tuple:
    """Promoted operands; an integer division by zero is PyTorch's RuntimeError (NumPy
    would warn and give 0). A zero in an integer tensor divisor is looked for where reads
    are free (the CPU); on a GPU that would wait for the device, and the quotient is left
    as CuPy gives it."""
    a, b = binary_operands(a, b, op)
    for x in (a, b):
        if isinstance(x, Tensor) and x.dtype.kind == "b":
            raise TypeError(f"{op}: not defined for bool tensors; cast them first")
    integral = all(x.dtype.kind in "iu" if isinstance(x, Tensor) else isinstance(x, int)
                   for x in (a, b))
    if integral:
        if isinstance(b, Tensor):
            zero = b._backend.reads_are_free and bool((b.data == 0).any())
        else:
            zero = b == 0
        if zero:
            raise RuntimeError(f"{op}: ZeroDivisionError (an integer divisor is 0)")
    return a, b


class RoundedDivide(Function):
    """a / b rounded down ("floor") or towards zero ("trunc"); a zero gradient."""

    broadcasts = True

    @staticmethod
    def forward(ctx, a, b, mode):
        xp = ctx.xp
        integral = all(getattr(x, "dtype", None) is None or x.dtype.kind in "iub"
                       for x in (a, b))
        if mode == "floor":
            return xp.floor_divide(a, b)
        if integral:
            return _int_trunc_divide(xp, a, b)
        return xp.trunc(xp.true_divide(a, b))

    @staticmethod
    def backward(ctx, grad):
        zeros = ctx.xp.zeros_like(grad)
        return zeros, zeros, None


def div_rounded(a: Any, b: Any, rounding_mode: Optional[str]) -> Tensor:
    """``div(a, b, rounding_mode="floor" | "trunc")``: integer inputs stay integers."""
    if rounding_mode not in ("floor", "trunc"):
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got "
                         f"{rounding_mode!r}")
    return RoundedDivide.apply(*_division_operands(a, b, "div"), rounding_mode)


def floor_divide(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``input // other``: the quotient rounded down (Python's and PyTorch's ``//``)."""
    return RoundedDivide.apply(*_division_operands(input, other, "floor_divide"), "floor")


def _dividend_and_divisor_grads(ctx, grad) -> tuple:
    """The gradients of a - b * q (remainder's q = floor(a / b), fmod's trunc(a / b),
    saved by forward when b needs a gradient): grad for a, -grad * q for b."""
    need_b = ctx.needs_input_grad[1]
    return grad, (-grad * ctx.saved_tensors[0] if need_b else None)


class Remainder(Function):
    """a - b * floor(a / b): the result has the divisor's sign (Python's ``%``)."""

    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        xp = ctx.xp
        if ctx.needs_input_grad[1]:
            ctx.save_for_backward(xp.floor_divide(a, b))
        return xp.remainder(a, b)

    @staticmethod
    def backward(ctx, grad):
        return _dividend_and_divisor_grads(ctx, grad)


def remainder(input: Any, other: Any) -> Tensor:  # noqa: A002
    """``input % other``, with the divisor's sign (Python's convention, PyTorch's ``%``)."""
    return Remainder.apply(*_division_operands(input, other, "remainder"))


class Fmod(Function):
    """a - b * trunc(a / b): the result has the dividend's sign (C's fmod)."""

    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        xp = ctx.xp
        if ctx.needs_input_grad[1]:
            ctx.save_for_backward(xp.trunc(xp.true_divide(a, b)))
        return xp.fmod(a, b)

    @staticmethod
    def backward(ctx, grad):
        return _dividend_and_divisor_grads(ctx, grad)


def fmod(input: Any, other: Any) -> Tensor:  # noqa: A002
    """The remainder of input / other with the dividend's sign (C's convention)."""
    return Fmod.apply(*_division_operands(input, other, "fmod"))
