"""Elementwise math: exp, log, sqrt, sin, cos, rsqrt, erf, exp2, log2, log10, tan, the
inverse and hyperbolic trig functions, atan2, logaddexp, lerp; and the predicates isnan,
isinf, isfinite, isclose (bool results, no gradient). tanh is with the activations.

Integer and bool inputs to these real functions give the default float (float32), as
in PyTorch. Each differentiable op is one Function; binary ones broadcast and declare it.
"""
from __future__ import annotations

import math
from typing import Any

from ..autograd import Function
from ..backend import dtypes
from ..tensor import Tensor
from ._util import check_broadcast, require_tensor, shape_of
from .promotion import binary_operands, cast_to, float_input, float_operands

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_LN2, _LN10 = math.log(2.0), math.log(10.0)


# --- unary functions ----------------------------------------------------------------------
class Exp(Function):
    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.exp(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out


def exp(a: Tensor) -> Tensor:
    return Exp.apply(float_input(a, "exp"))


class Log(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.log(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad / a


def log(a: Tensor) -> Tensor:
    return Log.apply(float_input(a, "log"))


class Sqrt(Function):
    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.sqrt(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad / (2 * out)


def sqrt(a: Tensor) -> Tensor:
    return Sqrt.apply(float_input(a, "sqrt"))


class Sin(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.sin(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad * ctx.xp.cos(a)


def sin(a: Tensor) -> Tensor:
    return Sin.apply(float_input(a, "sin"))


class Cos(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.cos(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return -grad * ctx.xp.sin(a)


def cos(a: Tensor) -> Tensor:
    return Cos.apply(float_input(a, "cos"))


class Rsqrt(Function):
    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.sqrt(a)
        out = ctx.xp.reciprocal(out)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * (-0.5 * out * out * out)  # d/dx x^-1/2 = -x^-3/2 / 2


def rsqrt(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
    """1 / sqrt(x)."""
    return Rsqrt.apply(float_input(input, "rsqrt"))


class Erf(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.backend.erf(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad * (_TWO_OVER_SQRT_PI * ctx.xp.exp(-a * a))


def erf(input: Tensor) -> Tensor:  # noqa: A002
    """The error function, 2/sqrt(pi) * integral of exp(-t^2) from 0 to x."""
    return Erf.apply(float_input(input, "erf"))


class Exp2(Function):
    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.exp2(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out * _LN2


def exp2(input: Tensor) -> Tensor:  # noqa: A002
    """2 ** x."""
    return Exp2.apply(float_input(input, "exp2"))


class Log2(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.log2(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad / (a * _LN2)


def log2(input: Tensor) -> Tensor:  # noqa: A002
    return Log2.apply(float_input(input, "log2"))


class Log10(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.log10(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad / (a * _LN10)


def log10(input: Tensor) -> Tensor:  # noqa: A002
    return Log10.apply(float_input(input, "log10"))


class Tan(Function):
    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.tan(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * (1 + out * out)


def tan(input: Tensor) -> Tensor:  # noqa: A002
    return Tan.apply(float_input(input, "tan"))


class Asin(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.arcsin(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad / ctx.xp.sqrt(1 - a * a)


def asin(input: Tensor) -> Tensor:  # noqa: A002
    return Asin.apply(float_input(input, "asin"))


class Acos(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.arccos(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return -grad / ctx.xp.sqrt(1 - a * a)


def acos(input: Tensor) -> Tensor:  # noqa: A002
    return Acos.apply(float_input(input, "acos"))


class Atan(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.arctan(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad / (1 + a * a)


def atan(input: Tensor) -> Tensor:  # noqa: A002
    return Atan.apply(float_input(input, "atan"))


class Sinh(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.sinh(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad * ctx.xp.cosh(a)


def sinh(input: Tensor) -> Tensor:  # noqa: A002
    return Sinh.apply(float_input(input, "sinh"))


class Cosh(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.cosh(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad * ctx.xp.sinh(a)


def cosh(input: Tensor) -> Tensor:  # noqa: A002
    return Cosh.apply(float_input(input, "cosh"))


class Asinh(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.arcsinh(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad / ctx.xp.sqrt(a * a + 1)


def asinh(input: Tensor) -> Tensor:  # noqa: A002
    return Asinh.apply(float_input(input, "asinh"))


class Acosh(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.arccosh(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad / ctx.xp.sqrt(a * a - 1)


def acosh(input: Tensor) -> Tensor:  # noqa: A002
    return Acosh.apply(float_input(input, "acosh"))


class Atanh(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.arctanh(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad / (1 - a * a)


def atanh(input: Tensor) -> Tensor:  # noqa: A002
    return Atanh.apply(float_input(input, "atanh"))


# --- binary functions ---------------------------------------------------------------------
class Atan2(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return ctx.xp.arctan2(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        scale = grad / (a * a + b * b)  # d/da = b / r^2, d/db = -a / r^2
        need_a, need_b = ctx.needs_input_grad
        return (scale * b if need_a else None, -scale * a if need_b else None)


def atan2(input: Any, other: Any) -> Tensor:  # noqa: A002
    """The angle of the point (other, input): arctan(input / other) in the right quadrant."""
    return Atan2.apply(*float_operands(input, other, "atan2"))


class Logaddexp(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        out = ctx.xp.logaddexp(a, b)
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        a, b, out = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad  # softmax of the pair: exp(a - out), ...
        return (grad * xp.exp(a - out) if need_a else None,
                grad * xp.exp(b - out) if need_b else None)


def logaddexp(input: Any, other: Any) -> Tensor:  # noqa: A002
    """log(exp(a) + exp(b)), without overflow."""
    return Logaddexp.apply(*float_operands(input, other, "logaddexp"))


class Lerp(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, start, end, weight):
        need_start, need_end, need_weight = ctx.needs_input_grad
        diff = end - start
        ctx.save_for_backward(weight if need_start or need_end else None,
                              diff if need_weight else None)
        return start + weight * diff

    @staticmethod
    def backward(ctx, grad):
        weight, diff = ctx.saved_tensors
        need_start, need_end, need_weight = ctx.needs_input_grad
        grad_end = grad * weight if need_start or need_end else None
        return (grad - grad_end if need_start else None, grad_end,
                grad * diff if need_weight else None)


def lerp(input: Tensor, end: Any, weight: Any) -> Tensor:  # noqa: A002
    """start + weight * (end - start); ``weight`` a number or a tensor (all broadcast; a
    weight tensor is cast to the result's dtype)."""
    require_tensor(input, "lerp")
    start, end = binary_operands(input, end, "lerp")
    if not dtypes.is_floating(start.dtype):
        raise TypeError(f"lerp: expected floating-point input and end, got {start.dtype}")
    if isinstance(weight, Tensor):
        check_broadcast("lerp", start.shape, shape_of(end), weight.shape)
        weight = cast_to(weight, start.dtype)
    elif isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise TypeError(f"lerp: weight must be a Tensor or a real number, got "
                        f"{type(weight).__name__}")
    return Lerp.apply(start, end, weight)


# --- predicates: bool results, no gradient ------------------------------------------------
def _predicate(name: str, ufunc: str):
    def predicate(input: Tensor) -> Tensor:  # noqa: A002
        require_tensor(input, name)
        xp = input._backend.xp
        return Tensor._make(xp.asarray(getattr(xp, ufunc)(input.data)), input._backend, False)
    predicate.__name__ = name
    predicate.__doc__ = f"Elementwise ``{ufunc}`` as a bool tensor (not differentiable)."
    return predicate


isnan = _predicate("isnan", "isnan")
isinf = _predicate("isinf", "isinf")
isfinite = _predicate("isfinite", "isfinite")


def isclose(input: Tensor, other: Any, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002
            equal_nan: bool = False) -> Tensor:
    """|input - other| <= atol + rtol * |other| elementwise, as a bool tensor."""
    require_tensor(input, "isclose")
    if rtol < 0 or atol < 0:
        raise ValueError(f"isclose: rtol and atol must be non-negative, got rtol={rtol}, "
                         f"atol={atol}")
    a, b = binary_operands(input, other, "isclose")
    xp = input._backend.xp
    out = xp.isclose(a.data if isinstance(a, Tensor) else a,
                     b.data if isinstance(b, Tensor) else b, rtol=rtol, atol=atol,
                     equal_nan=equal_nan)
    return Tensor._make(xp.asarray(out), input._backend, False)
