"""Activations: relu, gelu, tanh, sigmoid, silu, softplus, logsigmoid, leaky_relu, elu,
hardtanh, mish, and swiglu (Llama's gated MLP activation, silu(gate) * up).

Each is one Function. GELU's tanh form, silu and the ones after it compute, when a
gradient is wanted, their local derivative in the same chain as the value and save only
that (backward is then one multiplication). silu/softplus/logsigmoid/mish never
overflow: exp only ever sees non-positive arguments (or arguments capped at softplus's
threshold), and logaddexp does the softplus inside mish. bf16/fp16 inputs are computed in
float32 and the result rounded back.
"""
from __future__ import annotations

import math
from typing import Any

from ..autograd import Function
from ..backend.threads import row_pieces, run_split
from ..tensor import Tensor
from ._util import require_float, require_tensor, sigmoid_into, widened, work_dtype
from .promotion import float_input, promote_operands

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _float_activation(a: Any, op: str) -> Tensor:
    """PyTorch's activations take floating inputs only ("not implemented for 'Long'")."""
    require_tensor(a, op)
    require_float(a, op)
    return a


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


def relu(a: Tensor) -> Tensor:
    return Relu.apply(require_tensor(a, "relu"))


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
        kernels = ctx.backend.fused_kernels()  # backend/kernels/gelu.cu, cpu_kernels
        ctx.kernels = kernels if kernels is not None and kernels.supports_gelu(
            a, approximate) else None
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


def gelu(a: Tensor, approximate: str = "none") -> Tensor:
    """GELU; ``approximate="tanh"`` is GPT-2's form, "none" the exact erf form (PyTorch's)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Gelu.apply(require_tensor(a, "gelu"), approximate)


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


def tanh(a: Tensor) -> Tensor:
    return Tanh.apply(float_input(a, "tanh"))


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


def sigmoid(a: Tensor) -> Tensor:
    return Sigmoid.apply(float_input(a, "sigmoid"))


class Silu(Function):
    """x * sigmoid(x): Llama's MLP activation (SwiGLU), so one fused chain in place in two
    buffers (three with the gradient), split by rows over the cores for long inputs.

    The derivative s (1 + x (1 - s)) is computed in the forward chain and saved instead
    of x.
    """

    @staticmethod
    def forward(ctx, a):
        xp = ctx.xp
        x = widened(a)
        need_grad = ctx.needs_input_grad[0]
        out, scratch = xp.empty_like(x), xp.empty_like(x)  # (a 0-d result stays an array)
        local = xp.empty_like(x) if need_grad else None

        def rows(r: Any) -> None:  # on every core for long inputs (backend/threads.py)
            x_, s = x[r], out[r]
            sigmoid_into(xp, x_, s, scratch[r])
            if need_grad:
                d = local[r]
                xp.subtract(1, s, out=d)
                d *= x_
                d += 1
                d *= s  # s (1 + x (1 - s))
            s *= x_

        run_split(rows, row_pieces(x))
        ctx.save_for_backward(local)
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (local,) = ctx.saved_tensors
        return grad * local


def silu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """x * sigmoid(x) (also called swish). ``inplace`` is accepted for PyTorch's signature;
    the result is always a new tensor."""
    return Silu.apply(_float_activation(input, "silu"))


class SwiGLU(Function):
    """silu(gate) * up, Llama's MLP activation, as one node. Forward saves gate, up and
    s = sigmoid(gate) (as the other activations save their local derivative: the one
    exp of the op is paid once, not again in backward), and backward is products only:
        d/dgate = grad * up * s * (1 + gate * (1 - s)),   d/dup = grad * gate * s.
    Each pass is in place in its output, split by rows over the cores for long inputs;
    bf16/fp16 are computed in float32 and the result rounded back. On a CUDA backend the
    kernels ``swiglu_forward``/``swiglu_backward`` take the inputs they support (they
    recompute s instead: there an exp is cheaper than the bytes of saving it).
    """

    @staticmethod
    def forward(ctx, gate, up):
        kernels = ctx.backend.fused_kernels()  # CUDA: backend/kernels (swiglu)
        ctx.kernels = kernels if kernels is not None and kernels.supports_swiglu(
            gate, up) else None
        if ctx.kernels is not None:
            ctx.save_for_backward(gate, up, None)
            return ctx.kernels.swiglu_forward(gate, up)
        xp = ctx.xp
        out = xp.empty(gate.shape, dtype=work_dtype(gate))  # (a 0-d result stays an array)
        sig = xp.empty_like(out)

        def rows(r: Any) -> None:  # on every core for long inputs (backend/threads.py)
            g, o, s = widened(gate[r]), out[r], sig[r]
            sigmoid_into(xp, g, s, o)  # o: scratch until it takes the product
            xp.multiply(g, s, out=o)
            o *= up[r]  # bf16 up is widened by the ufunc, into the float32 output

        run_split(rows, row_pieces(out))
        ctx.save_for_backward(gate, up, sig)
        return out.astype(gate.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        gate, up, sig = ctx.saved_tensors
        need_gate, need_up = ctx.needs_input_grad[:2]
        if ctx.kernels is not None:
            # float32 gradients: the engine rounds them to the inputs' dtype
            grad_gate, grad_up = ctx.kernels.swiglu_backward(grad, gate, up)
            return grad_gate if need_gate else None, grad_up if need_up else None
        xp = ctx.xp
        work = sig.dtype
        grad_gate = xp.empty(gate.shape, dtype=work) if need_gate else None
        grad_up = xp.empty(gate.shape, dtype=work) if need_up else None

        def rows(r: Any) -> None:
            g, g_out, s = widened(gate[r]), widened(grad[r]), sig[r]
            silu = xp.multiply(g, s)
            if need_up:
                xp.multiply(g_out, silu, out=grad_up[r])
            if need_gate:  # s (1 + g (1 - s)) = s + silu (1 - s)
                d = grad_gate[r]
                xp.subtract(1, s, out=d)
                d *= silu
                d += s
                d *= up[r]
                d *= g_out

        run_split(rows, row_pieces(grad_gate if need_gate else grad_up))
        return grad_gate, grad_up


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up in one pass and one graph node (Llama's MLP: ``down(swiglu(gate(x),
    up(x)))``). ``gate`` and ``up`` must have the same shape (no broadcasting: they are
    two projections of the same activations); different float dtypes are promoted as
    ``*`` promotes them. No autocast rule: it keeps its input's dtype, as silu does (bf16
    in, bf16 out, float32 arithmetic)."""
    for name, t in (("gate", gate), ("up", up)):
        require_tensor(t, "swiglu", name)
        require_float(t, "swiglu", name)
    if tuple(gate.shape) != tuple(up.shape):
        raise ValueError(f"swiglu: expected gate and up of the same shape, got "
                         f"{tuple(gate.shape)} and {tuple(up.shape)}")
    if gate.dtype != up.dtype:
        gate, up = promote_operands(gate, up)
    return SwiGLU.apply(gate, up)


class Softplus(Function):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (as PyTorch)."""

    @staticmethod
    def forward(ctx, a, beta, threshold):
        xp = ctx.xp
        x = widened(a)
        bx = x * beta
        linear = bx > threshold
        z = xp.exp(xp.minimum(bx, threshold))  # capped: no overflow where it is unused
        out = xp.log1p(z)
        if beta != 1:
            out /= beta
        out = xp.where(linear, x, out)
        if ctx.needs_input_grad[0]:  # sigmoid(beta x) = z / (1 + z), 1 on the linear part
            ctx.save_for_backward(xp.where(linear, xp.ones((), dtype=z.dtype), z / (z + 1)))
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (local,) = ctx.saved_tensors
        return grad * local, None, None


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:  # noqa: A002
    """A smooth relu: log(1 + exp(beta x)) / beta, linear where beta x > threshold."""
    return Softplus.apply(_float_activation(input, "softplus"), float(beta), float(threshold))


class LogSigmoid(Function):
    """log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): exp never sees a positive argument."""

    @staticmethod
    def forward(ctx, a):
        xp = ctx.xp
        x = widened(a)
        e = xp.empty_like(x)  # (a 0-d result stays an array, for the in-place chain)
        xp.abs(x, out=e)
        xp.negative(e, out=e)
        xp.exp(e, out=e)  # exp(-|x|) in (0, 1]
        out = xp.minimum(x, 0) - xp.log1p(e)
        if ctx.needs_input_grad[0]:  # 1 - sigmoid(x): e/(1+e) for x >= 0, 1/(1+e) below
            denominator = e + 1
            local = xp.where(x >= 0, e, xp.ones((), dtype=e.dtype))
            local /= denominator
            ctx.save_for_backward(local)
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (local,) = ctx.saved_tensors
        return grad * local


def logsigmoid(input: Tensor) -> Tensor:  # noqa: A002
    """log(sigmoid(x)), finite for every finite x."""
    return LogSigmoid.apply(_float_activation(input, "logsigmoid"))


class LeakyRelu(Function):
    @staticmethod
    def forward(ctx, a, negative_slope):
        xp = ctx.xp
        positive = a > 0
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(positive)
        ctx.negative_slope = negative_slope
        return xp.where(positive, a, a * negative_slope).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (positive,) = ctx.saved_tensors
        return ctx.xp.where(positive, grad, grad * ctx.negative_slope), None


def leaky_relu(input: Tensor, negative_slope: float = 0.01,  # noqa: A002
               inplace: bool = False) -> Tensor:
    """x for x > 0, else negative_slope * x."""
    return LeakyRelu.apply(_float_activation(input, "leaky_relu"), float(negative_slope))


class Elu(Function):
    @staticmethod
    def forward(ctx, a, alpha):
        xp = ctx.xp
        x = widened(a)
        positive = x > 0
        clipped = xp.minimum(x, 0)  # exp of x <= 0: no overflow
        negative_part = xp.expm1(clipped)
        if ctx.needs_input_grad[0]:  # 1 above 0, alpha exp(x) at and below (not expm1 + 1,
            local = xp.exp(clipped)  # which cancels far below 0)
            local *= alpha
            ctx.save_for_backward(xp.where(positive, xp.ones((), dtype=x.dtype), local))
        negative_part *= alpha
        return xp.where(positive, x, negative_part).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (local,) = ctx.saved_tensors
        return grad * local, None


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    """x for x > 0, else alpha (exp(x) - 1)."""
    return Elu.apply(_float_activation(input, "elu"), float(alpha))


class Hardtanh(Function):
    """clamp(x, min_val, max_val); unlike clamp, the gradient stops at the ends themselves
    (PyTorch's hardtanh_backward passes it only strictly inside)."""

    @staticmethod
    def forward(ctx, a, min_val, max_val):
        xp = ctx.xp
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward((a > min_val) & (a < max_val))
        return xp.clip(a, min_val, max_val).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0,  # noqa: A002
             inplace: bool = False) -> Tensor:
    """x clamped to [min_val, max_val]."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) must not exceed max_val ({max_val})")
    return Hardtanh.apply(_float_activation(input, "hardtanh"), float(min_val),
                          float(max_val))


class Mish(Function):
    """x tanh(softplus(x)), softplus as logaddexp(x, 0) (stable both ways).

    d/dx = t + x (1 - t^2) sigmoid(x), with t = tanh(softplus(x)), computed in the forward
    chain and saved instead of x.
    """

    @staticmethod
    def forward(ctx, a):
        xp = ctx.xp
        x = widened(a)
        t = xp.empty_like(x)  # (a 0-d result stays an array, for the in-place chain)
        xp.logaddexp(x, xp.zeros((), dtype=x.dtype), out=t)  # softplus(x)
        xp.tanh(t, out=t)
        if ctx.needs_input_grad[0]:
            local = xp.empty_like(x)
            sigmoid_into(xp, x, local, xp.empty_like(x))
            local *= x
            local *= 1 - t * t
            local += t
            ctx.save_for_backward(local)
        t *= x
        return t.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        (local,) = ctx.saved_tensors
        return grad * local


def mish(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    """x * tanh(softplus(x))."""
    return Mish.apply(_float_activation(input, "mish"))
