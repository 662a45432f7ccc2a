"""Matrix products: 1-D, 2-D and batched, with NumPy's broadcasting of batch dims.

Both directions call ``backend.matmul`` (BLAS on the CPU, cuBLAS on the GPU). Transposed
operands are passed as transposed views: BLAS reads them with a transpose flag, no copy.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..autograd import Function
from ..tensor import Tensor
from ._util import (as_tensor_like, check_broadcast, require_float, require_tensor, unbroadcast,
                    widened)
from .promotion import autocast_lower, cast_to, promote_types


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        need_a, need_b = ctx.needs_input_grad
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        ctx.a_shape, ctx.b_shape = a.shape, b.shape
        if a.ndim > 2 and b.ndim == 2:  # (..., m, k) @ (k, n): a linear layer
            # one (M, k) @ (k, n) GEMM over all leading dims, not one small GEMM per batch
            out = ctx.backend.matmul(a.reshape(-1, a.shape[-1]), b)
            out = out.reshape(a.shape[:-1] + (b.shape[1],))
        else:
            out = ctx.backend.matmul(a, b)
        # bf16 @ bf16 accumulates in float32 and returns float32 (ml_dtypes); the result is
        # bf16 again, as in PyTorch (``matmul`` gave both operands one dtype)
        if out.dtype != a.dtype:
            out = out.astype(a.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        a, b = ctx.saved_tensors
        if len(ctx.a_shape) > 2 and len(ctx.b_shape) == 2:
            g = grad.reshape(-1, grad.shape[-1])  # (M, n)
            grad_a = grad_b = None
            if b is not None:
                grad_a = ctx.backend.matmul(g, b.T).reshape(ctx.a_shape)  # (M, n) @ (n, k)
            if a is not None:  # (k, M) @ (M, n): the sum over the batch is inside the GEMM
                grad_b = ctx.backend.matmul(a.reshape(-1, a.shape[-1]).T, g)
            return grad_a, grad_b
        a_vec, b_vec = len(ctx.a_shape) == 1, len(ctx.b_shape) == 1
        # A 1-D a acts as a (1, k) row and a 1-D b as a (k, 1) column; put those dims back.
        g = grad
        if a_vec and b_vec:
            g = grad.reshape(1, 1)
        elif a_vec:
            g = xp.expand_dims(grad, -2)  # (..., n) -> (..., 1, n)
        elif b_vec:
            g = xp.expand_dims(grad, -1)  # (..., m) -> (..., m, 1)
        grad_a = grad_b = None
        if b is not None:  # a needs a gradient
            b2 = b[:, None] if b_vec else b
            grad_a = ctx.backend.matmul(g, xp.swapaxes(b2, -1, -2))  # (..., m, n) @ (..., n, k)
            grad_a = unbroadcast(grad_a, (1,) + ctx.a_shape if a_vec else ctx.a_shape)
            grad_a = grad_a.reshape(ctx.a_shape)
        if a is not None:  # b needs a gradient
            a2 = a[None, :] if a_vec else a
            grad_b = ctx.backend.matmul(xp.swapaxes(a2, -1, -2), g)  # (..., k, m) @ (..., m, n)
            grad_b = unbroadcast(grad_b, ctx.b_shape + (1,) if b_vec else ctx.b_shape)
            grad_b = grad_b.reshape(ctx.b_shape)
        return grad_a, grad_b


def matmul(a: Any, b: Any) -> Tensor:
    """``a @ b``: (n,)@(n,) -> (), (m,k)@(k,n) -> (m,n), (...,m,k)@(...,k,n) -> (...,m,n).

    Operands of different dtypes promote as ``a + b`` does (``torch.result_type``):
    float32 @ int64 is float32, float32 @ float64 is float64. PyTorch refuses mixed
    products instead; here one rule serves every binary op.
    """
    if not isinstance(a, Tensor):
        a = as_tensor_like(a, b, "matmul")
    if not isinstance(b, Tensor):
        b = as_tensor_like(b, a, "matmul")
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError("matmul: both operands must be tensors (not Python scalars); use * "
                        "to scale")
    sa, sb = tuple(a.shape), tuple(b.shape)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both operands need at least 1 dim: {sa} @ {sb}")
    k_a = sa[-1]
    k_b = sb[0] if b.ndim == 1 else sb[-2]
    if k_a != k_b:
        raise ValueError(f"matmul: inner dimensions differ: {sa} @ {sb}")
    if a.ndim > 2 or b.ndim > 2:
        check_broadcast("matmul (batch dims)", sa[:-2], sb[:-2])
    a, b = autocast_lower(a, b)
    if a.dtype != b.dtype:  # as the elementwise ops promote, not NumPy's float64
        dtype = promote_types(a.dtype, b.dtype)
        a, b = cast_to(a, dtype), cast_to(b, dtype)
    return MatMul.apply(a, b)


class Linear(Function):
    """``x @ weight.T + bias``, plus ``residual`` when given, as one node: one GEMM over all
    leading dims, the bias and the residual added in place into the GEMM's output, and a
    backward of two GEMMs and a column sum. The residual is a block's skip connection
    (``x + proj(y)``): added here it costs no graph node and no buffer of its own, and its
    gradient is the output's, handed through."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, out_dtype):
        need_x, need_w = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if need_w else None, weight if need_x else None)
        ctx.x_shape, ctx.linear_dtype = x.shape, x.dtype
        rows = x.reshape(-1, x.shape[-1])  # (M, in), M = product of the leading dims
        out = ctx.backend.matmul(rows, weight.T)  # (M, out); weight.T is a view BLAS reads transposed
        if bias is not None or residual is not None:
            # the backend returns a bf16 product in float32 (cuBLAS's float32 output on the
            # GPU, BLAS on widened operands on the CPU): the bias and the residual are
            # added before the one rounding below
            out = widened(out)
        if bias is not None:
            out += bias  # in place: no second activation-sized buffer
        if residual is not None:
            ctx.residual_dtype = residual.dtype
            if np.dtype(out_dtype).itemsize > out.dtype.itemsize:  # float32 @, float64 +
                out = out.astype(out_dtype)
            out += residual.reshape(out.shape)
        # bf16 operands accumulate in float32: round once, here
        if out.dtype != out_dtype:
            out = out.astype(out_dtype)
        return out.reshape(x.shape[:-1] + (weight.shape[0],))

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b, need_r = ctx.needs_input_grad[:4]
        grad_r = grad.astype(ctx.residual_dtype, copy=False) if need_r else None
        g = grad.reshape(-1, grad.shape[-1])  # (M, out)
        if g.dtype != ctx.linear_dtype and (need_x or need_w or need_b):
            g = g.astype(ctx.linear_dtype)  # a bf16 product under a float32 residual
        grad_x = ctx.backend.matmul(g, weight).reshape(ctx.x_shape) if need_x else None  # (M, in)
        grad_w = ctx.backend.matmul(g.T, x.reshape(-1, x.shape[-1])) if need_w else None  # (out, in)
        grad_b = None
        if need_b:  # (out,): the column sums as a vector-matrix product (BLAS on every
            # core; cuBLAS), summed in float32 for bf16 as every product here is (a long sum
            # in bf16 would lose the low bits), without a float32 copy of the gradient
            ones = ctx.xp.ones(g.shape[0], dtype=g.dtype)
            grad_b = ctx.backend.matmul(ones, g).astype(g.dtype, copy=False)
        return grad_x, grad_w, grad_b, grad_r, None


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *,
           residual: Optional[Tensor] = None) -> Tensor:
    """``x @ weight.T + bias``: x (..., in), weight (out, in) as PyTorch stores it, bias (out,)
    -> (..., out). One fused node (``Linear``). Floating inputs only (as in PyTorch); of
    different widths they promote as ``matmul``'s do (float32 with float64 is float64).

    ``residual`` (..., out), not in PyTorch's signature, adds a skip connection in the same
    node: ``residual + linear(x, weight, bias)`` with one pass less over memory, the result
    of the two's promoted dtype (under bf16 autocast, the float32 residual stream's)."""
    for name, t in (("input", x), ("weight", weight)):
        require_tensor(t, "linear", name)
        require_float(t, "linear", name)
    if x.ndim < 1 or weight.ndim != 2:
        raise ValueError(f"linear: expected input (..., in) and weight (out, in), got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input has {x.shape[-1]} features, weight {tuple(weight.shape)} "
                         f"expects {weight.shape[1]} (weight is (out_features, in_features))")
    if bias is not None:
        require_tensor(bias, "linear", "bias")
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"linear: bias has shape {tuple(bias.shape)}, expected "
                             f"({weight.shape[0]},)")
    if residual is not None:
        require_tensor(residual, "linear", "residual")
        require_float(residual, "linear", "residual")
        expected = tuple(x.shape[:-1]) + (weight.shape[0],)
        if tuple(residual.shape) != expected:
            raise ValueError(f"linear: residual has shape {tuple(residual.shape)}, expected "
                             f"the output's {expected} (it is added, not broadcast)")
    x, weight, bias = autocast_lower(x, weight, bias)
    dtype = promote_types(x.dtype, weight.dtype)
    if bias is not None:
        dtype = promote_types(dtype, bias.dtype)
        bias = cast_to(bias, dtype)
    out_dtype = dtype if residual is None else promote_types(dtype, residual.dtype)
    return Linear.apply(cast_to(x, dtype), cast_to(weight, dtype), bias, residual, out_dtype)
