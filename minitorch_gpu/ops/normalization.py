"""Layer normalization and RMS normalization, each one fused Function (llm.c's
layernorm_forward/backward).

Forward saves the input, the mean and 1/std per row; backward recomputes the normalized
input from them, so no extra activation of the input's size is kept. On the CPU the row
and column sums are matrix-vector products and einsums rather than ``mean``/``sum``: each
reads its operand once, with no temporary, and BLAS runs on every core.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence, Union

import ml_dtypes
import numpy as np

from ..autograd import Function
from ..backend.threads import row_pieces, run_split
from ..tensor import Tensor
from ._util import require_float, require_tensor, widened
from .promotion import autocast_float32


class LayerNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, axes, eps):
        kernels = ctx.backend.fused_kernels()  # CUDA: backend/kernels/layernorm.cu
        ctx.kernels = kernels if kernels is not None and kernels.supports_layer_norm(
            x, weight, bias) else None
        if ctx.kernels is not None:
            out, mean, rstd = ctx.kernels.layer_norm_forward(x, weight, bias, eps, len(axes))
            ctx.save_for_backward(x, mean, rstd, weight)  # mean, rstd: (rows,), no keepdims
            ctx.axes = axes
            return out
        xp = ctx.xp
        rows = widened(x).reshape(-1, math.prod(x.shape[len(x.shape) - len(axes):]))  # (R, n)
        n = rows.shape[1]
        # the row statistics as BLAS products, each one read of the rows, no temporary:
        # mean = rows @ (1/n), var = rowsum(centered * centered) / n
        mean = ctx.backend.matmul(rows, xp.full(n, 1.0 / n, dtype=rows.dtype))[:, None]  # (R, 1)
        out = rows - mean  # centered, then normalized, scaled and shifted in place
        var = xp.einsum("ij,ij->i", out, out)[:, None]  # (R, 1)
        var *= 1.0 / n
        var += eps
        rstd = xp.sqrt(var, out=var)
        xp.divide(1.0, rstd, out=rstd)
        out *= rstd  # x_hat
        if weight is not None:
            out *= weight.reshape(-1)
        if bias is not None:
            out += bias.reshape(-1)
        ctx.save_for_backward(x, mean, rstd, weight)
        ctx.axes = axes
        return out.reshape(x.shape).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        x, mean, rstd, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]  # then axes and eps
        if ctx.kernels is not None:
            grad_x, grad_w, grad_b = ctx.kernels.layer_norm_backward(grad, x, weight, mean, rstd,
                                                                     len(ctx.axes))
            return (grad_x if need_x else None, grad_w if need_w else None,
                    grad_b if need_b else None, None, None)
        # two activation-sized buffers (x_hat, g_hat); sums over rows and over columns as
        # BLAS products or einsum, which read their operands once and allocate nothing big
        n = mean.shape[0]  # rows
        shape = (n, x.size // n)
        x_hat = widened(x).reshape(shape) - mean  # (R, n)
        x_hat *= rstd
        g = grad.reshape(shape)
        grad_b = ctx.backend.matmul(xp.ones(n, dtype=g.dtype), g) if need_b else None  # (n,)
        grad_w = xp.einsum("ij,ij->j", g, x_hat) if need_w else None
        grad_x = None
        if need_x:
            g_hat = g * weight.reshape(-1) if weight is not None else g.copy()  # dL/dx_hat
            # dL/dx = rstd * (g_hat - mean(g_hat) - x_hat * mean(g_hat * x_hat))
            k = shape[1]
            x_hat *= xp.einsum("ij,ij->i", g_hat, x_hat)[:, None] / k
            g_hat -= ctx.backend.matmul(g_hat, xp.full(k, 1.0 / k, dtype=g_hat.dtype))[:, None]
            g_hat -= x_hat
            g_hat *= rstd
            grad_x = g_hat.reshape(x.shape)
        if weight is not None:
            grad_w = grad_w.reshape(weight.shape) if grad_w is not None else None
            grad_b = grad_b.reshape(weight.shape) if grad_b is not None else None
        return grad_x, grad_w, grad_b, None, None


def layer_norm(x: Tensor, normalized_shape: Union[int, Sequence[int]],
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: float = 1e-5) -> Tensor:
    """Normalize over the trailing ``normalized_shape`` dims, then scale and shift."""
    require_tensor(x, "layer_norm")
    require_float(x, "layer_norm")
    x = autocast_float32(x)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or tuple(x.shape[x.ndim - len(shape):]) != shape or len(shape) > x.ndim:
        raise ValueError(f"layer_norm: normalized_shape {shape} does not match the trailing "
                         f"dims of the input's shape {tuple(x.shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != shape:
            raise ValueError(f"layer_norm: {name} has shape {tuple(p.shape)}, expected {shape}")
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    return LayerNorm.apply(x, weight, bias, axes, eps)


class RMSNorm(Function):
    """y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps) over the trailing dims; one
    node, statistics in float32 or wider (float64 stays float64). Backward, with
    g_hat = grad * weight and x_hat = x * rstd:
        dx = rstd * (g_hat - x_hat * mean(g_hat * x_hat)) = rstd * g_hat - x * c,
        c = rstd^3 * rowsum(g_hat * x) / n,   dweight = sum over rows of grad * x * rstd,
    so x_hat is never stored. Forward saves x, rstd (rows,) and weight, on both paths.

    On a CUDA backend the kernels ``rms_norm_forward``/``rms_norm_backward`` take the inputs
    they support; elsewhere the rows are split over the cores for long inputs, each piece
    one chain of in-place passes, its row sums as einsums (one read, no temporary).
    """

    @staticmethod
    def forward(ctx, x, weight, n, eps):
        kernels = ctx.backend.fused_kernels()  # CUDA: backend/kernels (rms_norm)
        ctx.kernels = kernels if kernels is not None and kernels.supports_rms_norm(
            x, weight) else None
        ctx.n = n
        if ctx.kernels is not None:
            out, rstd = ctx.kernels.rms_norm_forward(x, weight, eps, n)  # rstd: (rows,)
            ctx.save_for_backward(x, rstd, weight)
            return out
        xp = ctx.xp
        rows = widened(x).reshape(-1, n)  # (R, n): a copy only when x is bf16 or strided
        rstd = xp.empty(rows.shape[0], dtype=rows.dtype)
        out = xp.empty_like(rows)
        w = widened(weight).reshape(-1) if weight is not None else None

        def piece(r: Any) -> None:  # on every core for long inputs (backend/threads.py)
            rows_, out_ = rows[r], out[r]
            s = xp.einsum("ij,ij->i", rows_, rows_)
            s *= 1.0 / n
            s += eps
            xp.sqrt(s, out=s)
            xp.divide(1.0, s, out=s)
            rstd[r] = s
            if w is not None:  # two passes, the second in place
                xp.multiply(rows_, w, out=out_)
                out_ *= s[:, None]
            else:
                xp.multiply(rows_, s[:, None], out=out_)

        run_split(piece, row_pieces(rows))
        ctx.save_for_backward(x, rstd, weight)
        return out.reshape(x.shape).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[:2]
        if ctx.kernels is not None:
            grad_x, grad_w = ctx.kernels.rms_norm_backward(grad, x, weight, rstd, ctx.n)
            return grad_x if need_x else None, grad_w if need_w else None, None, None
        xp = ctx.xp
        n = ctx.n
        rows = widened(x).reshape(-1, n)
        g = widened(grad).reshape(-1, n)
        w = widened(weight).reshape(-1) if weight is not None else None
        grad_x = xp.empty_like(rows) if need_x else None
        pieces = row_pieces(rows)
        partial_w = [None] * len(pieces)  # each piece's column sums, added in order below

        def piece(i_r: Any) -> None:
            i, r = i_r
            x_, g_, s = rows[r], g[r], rstd[r]
            if need_w:  # one read of grad and x, no temporary
                partial_w[i] = xp.einsum("ij,ij,i->j", g_, x_, s)
            if need_x:
                gx = grad_x[r]
                if w is not None:
                    xp.multiply(g_, w, out=gx)  # g_hat
                else:
                    gx[...] = g_
                c = xp.einsum("ij,ij->i", gx, x_)  # rowsum(g_hat * x)
                c *= s * s * s
                c *= 1.0 / n
                gx *= s[:, None]
                gx -= x_ * c[:, None]

        run_split(piece, list(enumerate(pieces)))
        grad_w = None
        if need_w:
            grad_w = partial_w[0]
            for more in partial_w[1:]:
                grad_w += more
            grad_w = grad_w.reshape(weight.shape)
        return (grad_x.reshape(x.shape) if need_x else None), grad_w, None, None


def rms_norm(x: Tensor, normalized_shape: Union[int, Sequence[int]],
             weight: Optional[Tensor] = None, eps: Optional[float] = None) -> Tensor:
    """Root-mean-square normalization over the trailing ``normalized_shape`` dims, scaled
    by ``weight``, as torch.nn.functional.rms_norm (``eps`` None: the dtype's machine
    epsilon). Float32 statistics under autocast, as layer_norm."""
    require_tensor(x, "rms_norm")
    require_float(x, "rms_norm")
    x = autocast_float32(x)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or len(shape) > x.ndim or tuple(x.shape[x.ndim - len(shape):]) != shape:
        raise ValueError(f"rms_norm: normalized_shape {shape} does not match the trailing "
                         f"dims of the input's shape {tuple(x.shape)}")
    if weight is not None and tuple(weight.shape) != shape:
        raise ValueError(f"rms_norm: weight has shape {tuple(weight.shape)}, expected {shape}")
    if eps is None:
        eps = float(ml_dtypes.finfo(x.dtype).eps)
    return RMSNorm.apply(x, weight, math.prod(shape), float(eps))


class PNorm(Function):
    """``sum(|x|^p)^(1/p)`` along one axis (kept), for a finite p other than 0: a zero
    entry adds 0 for p > 0 and makes the norm 0 for p < 0 (its |x|^p is inf), with no
    division by zero on the way. The gradient is ``sign(x) (|x| / norm)^(p - 1)``, and 0
    at a zero entry or a zero norm (PyTorch's choice for its norm: so a row of zeros, or
    p < 1 at a zero, gives finite gradients where the chain rule through pow would give
    0 * inf)."""

    @staticmethod
    def forward(ctx, x, axis, p):
        xp = ctx.xp
        a = xp.abs(x)
        nonzero = a > 0
        powered = xp.where(nonzero, xp.where(nonzero, a, 1) ** p, 0 if p > 0 else xp.inf)
        norm = powered.sum(axis=axis, keepdims=True) ** (1.0 / p)
        ctx.save_for_backward(x, norm)
        ctx.p = p
        return norm.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        x, norm = ctx.saved_tensors
        a = xp.abs(x)
        live = (a > 0) & (norm > 0)
        ratio = xp.where(live, a / xp.where(norm > 0, norm, 1), 1)
        slope = xp.where(live, xp.sign(x) * ratio ** (ctx.p - 1), 0)
        return (grad * slope).astype(x.dtype, copy=False), None, None


def normalize(input: Tensor, p: float = 2.0, dim: int = 1,  # noqa: A002
              eps: float = 1e-12) -> Tensor:
    """``input`` divided by its p-norm along ``dim``, the norm clamped below at ``eps``, as
    torch.nn.functional.normalize. Every p torch.linalg.vector_norm takes ("fro" is 2):
    0 counts the nonzero entries (a constant, so no gradient flows through the norm), inf
    and -inf are the largest and smallest absolute value, any other p is
    ``sum(|x|^p)^(1/p)`` (``PNorm``: a negative p with a zero entry gives norm 0, so the
    clamp's 1/eps, as PyTorch; a zero row's gradient is finite, as PyTorch's)."""
    require_tensor(input, "normalize")
    require_float(input, "normalize")
    if p == "fro":
        p = 2
    if not isinstance(p, numbers.Real):
        raise TypeError(f"normalize: p must be a number or 'fro', got {p!r}")
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or \
            not -input.ndim <= dim < max(input.ndim, 1):
        raise IndexError(f"normalize: dim {dim!r} is out of range for a {input.ndim}-d "
                         f"input (expected an int in [{-input.ndim}, {input.ndim - 1}])")
    p = float(p)
    if p == 1:
        norm = input.abs().sum(dim, keepdim=True)
    elif p == 0:
        norm = (input != 0).sum(dim, keepdim=True).to(input.dtype)
    elif p == math.inf:
        norm = input.abs().amax(dim, keepdim=True)
    elif p == -math.inf:
        norm = input.abs().amin(dim, keepdim=True)
    else:
        norm = PNorm.apply(input, dim % max(input.ndim, 1), p)
    return input / norm.clamp(min=eps)
