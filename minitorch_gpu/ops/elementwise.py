"""Elementwise ops: arithmetic, math functions, activations, selection, comparisons.

Binary ops broadcast like NumPy and declare ``broadcasts = True``: their backward returns
gradients of the broadcast shape and the engine sums each back to its input's shape. Python scalars pass straight through to the array module.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from ..autograd import Function
from ..backend import dtypes
from ..backend.threads import row_pieces, run_split
from ..tensor import Tensor
from ._util import (as_tensor_like, binary_operands, check_broadcast, float_input,
                    promote_operands, require_tensor, result_dtype, shape_of, widened)
from .rounding import div_rounded

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# --- arithmetic ---------------------------------------------------------------------------
class Add(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        return ctx.xp.add(a, b)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


class Sub(Function):
    broadcasts = True

    @staticmethod
    def forward(ctx, a, b):
        return ctx.xp.subtract(a, b)

    @staticmethod
    def backward(ctx, grad):
        return grad, (-grad if ctx.needs_input_grad[1] else None)


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


class Neg(Function):
    @staticmethod
    def forward(ctx, a):
        return ctx.xp.negative(a)

    @staticmethod
    def backward(ctx, grad):
        return -grad


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


# --- math functions and activations ----------------------------------------------------
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


class Log(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.log(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad / a


class Sin(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.sin(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad * ctx.xp.cos(a)


class Cos(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.cos(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return -grad * ctx.xp.sin(a)


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


class Tanh(Function):
    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.tanh(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * (1 - out * out)


class Sigmoid(Function):
    @staticmethod
    def forward(ctx, a):
        xp = ctx.xp
        # 1/(1+exp(-a)) overflows exp for very negative a; tanh form is stable everywhere.
        # bf16 inputs are computed (and saved) in float32: 1 - out cancels badly in bf16.
        out = 0.5 * (xp.tanh(0.5 * widened(a)) + 1)
        ctx.save_for_backward(out)
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out * (1 - out)


class Relu(Function):
    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.maximum(a, 0)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * (out > 0)


class Gelu(Function):
    """GELU, x * Phi(x): exact (erf) or the tanh approximation GPT-2 uses.

    The tanh form, in training, computes its local derivative in the same chain as the
    value (they share x^2 and t = tanh(...)) and saves only that: backward is then one
    multiplication, and one activation is kept, not x and t. Every step is in place in
    three buffers (on large activations a fresh temporary per step costs more than the
    arithmetic), split by rows over the cores for long inputs. The erf form saves x.
    bf16 and fp16 inputs are computed in float32 and the result rounded back.
    """

    @staticmethod
    def forward(ctx, a, approximate):
        xp = ctx.xp
        ctx.approximate = approximate
        kernels = ctx.backend.fused_kernels()  # CUDA: backend/kernels/gelu.cu
        ctx.kernels = kernels if kernels is not None and kernels.supports_gelu(a) else None
        if ctx.kernels is not None:  # float32 arithmetic; a bf16 result rounded back
            ctx.save_for_backward(a)
            return ctx.kernels.gelu_forward(widened(a), approximate).astype(a.dtype,
                                                                            copy=False)
        x = widened(a)
        if approximate != "tanh":
            ctx.save_for_backward(a)
            return (0.5 * x * (1 + ctx.backend.erf(x * _INV_SQRT_2))).astype(a.dtype,
                                                                             copy=False)
        need_grad = ctx.needs_input_grad[0]
        out, t = xp.empty_like(x), xp.empty_like(x)  # (a 0-d result stays an array)
        local = xp.empty_like(x) if need_grad else None

        def rows(r: Any) -> None:  # on every core for long inputs (backend/threads.py)
            x_, t_, out_ = x[r], t[r], out[r]
            square = local[r] if need_grad else out_  # x^2, kept for the derivative
            xp.multiply(x_, x_, out=square)
            xp.multiply(square, 0.044715, out=t_)
            t_ += 1
            t_ *= x_
            t_ *= _SQRT_2_OVER_PI  # sqrt(2/pi) (x + 0.044715 x^3)
            xp.tanh(t_, out=t_)
            if need_grad:
                # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
                d = square
                d *= 3 * 0.044715 * _SQRT_2_OVER_PI
                d += _SQRT_2_OVER_PI  # d(inner)/dx
                d *= x_
                d *= 0.5
                xp.add(t_, 1, out=out_)
                out_ *= 0.5  # 0.5 (1 + t)
                t_ *= t_
                xp.subtract(1, t_, out=t_)
                d *= t_  # 0.5 x (1 - t^2) d(inner)/dx
                d += out_
            else:
                xp.add(t_, 1, out=out_)
                out_ *= 0.5
            out_ *= x_  # 0.5 x (1 + t)

        run_split(rows, row_pieces(x))
        ctx.save_for_backward(local)
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        (saved,) = ctx.saved_tensors
        if ctx.kernels is not None:
            # a float32 gradient: the engine rounds it to the input's dtype
            return ctx.kernels.gelu_backward(widened(saved), widened(grad),
                                             ctx.approximate), None
        if ctx.approximate == "tanh":  # saved: the local derivative
            out = xp.empty_like(saved)
            run_split(lambda r: xp.multiply(grad[r], saved[r], out=out[r]), row_pieces(out))
            return out, None
        a = widened(saved)
        cdf = 0.5 * (1 + ctx.backend.erf(a * _INV_SQRT_2))
        local = cdf + a * _INV_SQRT_2PI * xp.exp(-0.5 * a * a)
        return (grad * local, None)


class Abs(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.abs(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        return grad * ctx.xp.sign(a)


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
        return xp.clip(a, low, high).astype(a.dtype, copy=False)  # bf16 stays bf16

    @staticmethod
    def backward(ctx, grad):
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None


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


def _share_gradient(grad, a_wins, tie):
    """a gets the gradient where it won and half of it on ties; b gets the rest."""
    grad_a = grad * (a_wins + 0.5 * tie)
    return grad_a, grad - grad_a


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


# --- functional wrappers ------------------------------------------------------------------
def add(a: Any, b: Any) -> Tensor:
    return Add.apply(*binary_operands(a, b, "add"))


def sub(a: Any, b: Any) -> Tensor:
    return Sub.apply(*binary_operands(a, b, "sub"))


def mul(a: Any, b: Any) -> Tensor:
    return Mul.apply(*binary_operands(a, b, "mul"))


def div(a: Any, b: Any, *, rounding_mode: Optional[str] = None) -> Tensor:
    """True division: integer operands give the default float (float32), as in PyTorch.
    ``rounding_mode="floor"`` or ``"trunc"`` rounds the quotient (``ops/rounding.py``)."""
    if rounding_mode is not None:
        return div_rounded(a, b, rounding_mode)
    a, b = binary_operands(a, b, "div")
    if not any(isinstance(x, Tensor) and dtypes.is_floating(x.dtype) for x in (a, b)):
        a, b = (float_input(x, "div") if isinstance(x, Tensor) else x for x in (a, b))
    return Div.apply(a, b)


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


def maximum(a: Any, b: Any) -> Tensor:
    return Maximum.apply(*binary_operands(a, b, "maximum"))


def minimum(a: Any, b: Any) -> Tensor:
    return Minimum.apply(*binary_operands(a, b, "minimum"))


def neg(a: Tensor) -> Tensor:
    return Neg.apply(require_tensor(a, "neg"))


def exp(a: Tensor) -> Tensor:
    return Exp.apply(float_input(a, "exp"))


def log(a: Tensor) -> Tensor:
    return Log.apply(float_input(a, "log"))


def sqrt(a: Tensor) -> Tensor:
    return Sqrt.apply(float_input(a, "sqrt"))


def sin(a: Tensor) -> Tensor:
    return Sin.apply(float_input(a, "sin"))


def cos(a: Tensor) -> Tensor:
    return Cos.apply(float_input(a, "cos"))


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


def tanh(a: Tensor) -> Tensor:
    return Tanh.apply(float_input(a, "tanh"))


def sigmoid(a: Tensor) -> Tensor:
    return Sigmoid.apply(float_input(a, "sigmoid"))


def relu(a: Tensor) -> Tensor:
    return Relu.apply(require_tensor(a, "relu"))


def gelu(a: Tensor, approximate: str = "none") -> Tensor:
    """GELU; ``approximate="tanh"`` is GPT-2's form, "none" the exact erf form (PyTorch's)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Gelu.apply(require_tensor(a, "gelu"), approximate)


def abs(a: Tensor) -> Tensor:  # noqa: A001 - mirrors torch.abs
    return Abs.apply(require_tensor(a, "abs"))


def clamp(a: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    require_tensor(a, "clamp")
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if isinstance(min, float) or isinstance(max, float):  # int tensor, float bounds: float32
        a = promote_operands(a, 1.0)[0]
    return Clamp.apply(a, min, max)


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


# --- comparisons and logic: no gradient ---------------------------------------------------
def _compare(name: str, ufunc: str):
    def compare(a: Any, b: Any) -> Tensor:
        a, b = binary_operands(a, b, name)
        backend = (a if isinstance(a, Tensor) else b)._backend
        xp = backend.xp
        out = getattr(xp, ufunc)(a.data if isinstance(a, Tensor) else a,
                                 b.data if isinstance(b, Tensor) else b)
        return Tensor._make(xp.asarray(out), backend, False)
    compare.__name__ = name
    compare.__doc__ = f"Elementwise ``{ufunc}`` as a bool tensor (not differentiable)."
    return compare


eq = _compare("eq", "equal")
ne = _compare("ne", "not_equal")
lt = _compare("lt", "less")
le = _compare("le", "less_equal")
gt = _compare("gt", "greater")
ge = _compare("ge", "greater_equal")
logical_and = _compare("logical_and", "logical_and")
logical_or = _compare("logical_or", "logical_or")


def logical_not(a: Tensor) -> Tensor:
    require_tensor(a, "logical_not")
    return Tensor._make(a._backend.xp.logical_not(a.data), a._backend, False)


def _require_integral(op: str, *operands: Any) -> None:
    for x in operands:
        dtype = x.dtype if isinstance(x, Tensor) else type(x)
        if (x.dtype.kind not in "iub") if isinstance(x, Tensor) else isinstance(x, float):
            raise TypeError(f"{op}: expected integer or bool operands, got {dtype}; compare "
                            "first to get a bool mask (e.g. (x > 0) & (x < 1))")


def _bitwise(name: str, ufunc: str):
    def bitwise(a: Any, b: Any) -> Tensor:
        a, b = binary_operands(a, b, name)
        _require_integral(name, a, b)
        backend = (a if isinstance(a, Tensor) else b)._backend
        xp = backend.xp
        out = getattr(xp, ufunc)(a.data if isinstance(a, Tensor) else a,
                                 b.data if isinstance(b, Tensor) else b)
        return Tensor._make(xp.asarray(out), backend, False)
    bitwise.__name__ = name
    bitwise.__doc__ = (f"Elementwise ``{ufunc}`` of integer or bool tensors (``&``, ``|``): "
                       "logical for bool, bitwise for integers, as in PyTorch.")
    return bitwise


bitwise_and = _bitwise("bitwise_and", "bitwise_and")
bitwise_or = _bitwise("bitwise_or", "bitwise_or")
bitwise_xor = _bitwise("bitwise_xor", "bitwise_xor")


def bitwise_not(a: Tensor) -> Tensor:
    """``~a``: logical not of a bool tensor, bitwise not of an integer one."""
    require_tensor(a, "bitwise_not")
    _require_integral("bitwise_not", a)
    return Tensor._make(a._backend.xp.invert(a.data), a._backend, False)
