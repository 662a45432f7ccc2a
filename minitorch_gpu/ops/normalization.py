"""Layer normalization as one fused Function (llm.c's layernorm_forward/backward).

Forward saves the input, the mean and 1/std per row; backward recomputes the normalized
input from them, so no extra activation of the input's size is kept.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

from ..autograd import Function
from ..tensor import Tensor
from ._util import autocast_float32, require_float, require_tensor, widened


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
        work = widened(x)  # bf16/fp16 statistics in float32
        mean = work.mean(axis=axes, keepdims=True)
        centered = work - mean
        rstd = 1.0 / ctx.xp.sqrt((centered * centered).mean(axis=axes, keepdims=True) + eps)
        out = centered
        out *= rstd  # x_hat, in place in the centered buffer
        if weight is not None:
            out *= weight
        if bias is not None:
            out += bias
        ctx.save_for_backward(x, mean, rstd, weight)
        ctx.axes = axes
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        x, mean, rstd, weight = ctx.saved_tensors
        axes = ctx.axes
        batch_axes = tuple(range(x.ndim - len(axes)))
        need_x, need_w, need_b = ctx.needs_input_grad[:3]  # then axes and eps
        if ctx.kernels is not None:
            grad_x, grad_w, grad_b = ctx.kernels.layer_norm_backward(grad, x, weight, mean, rstd,
                                                                     len(axes))
            return (grad_x if need_x else None, grad_w if need_w else None,
                    grad_b if need_b else None, None, None)
        # three activation-sized buffers in all (x_hat, g_hat, scratch), reused in place
        x_hat = x - mean
        x_hat *= rstd
        grad_b = grad.sum(axis=batch_axes) if need_b else None
        scratch = grad * x_hat
        grad_w = scratch.sum(axis=batch_axes) if need_w else None
        grad_x = None
        if need_x:
            if weight is not None:
                g_hat = grad * weight  # dL/dx_hat
                xp.multiply(g_hat, x_hat, out=scratch)
            else:
                g_hat = grad  # scratch already holds g_hat * x_hat
            # dL/dx = rstd * (g_hat - mean(g_hat) - x_hat * mean(g_hat * x_hat))
            x_hat *= scratch.mean(axis=axes, keepdims=True)
            grad_x = xp.subtract(g_hat, g_hat.mean(axis=axes, keepdims=True), out=scratch)
            grad_x -= x_hat
            grad_x *= rstd
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
