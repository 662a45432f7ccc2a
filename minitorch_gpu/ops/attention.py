"""Scaled dot-product attention as one fused Function, forward and backward.

softmax(q k^T * scale + mask) v, with the scores computed in one buffer that is masked,
soft-maxed and (in training) dropped out in place. Backward uses the saved probabilities:
    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dQ = dS K s,  dK = dS^T Q s.
The (L, S) probability matrix is kept per head. On a CUDA backend, float32 attention
without a mask or dropout goes to the flash-attention kernels (backend/kernels/attention.cu)
instead, which keep only each query's log-sum-exp and never store the (L, S) matrix.
"""
from __future__ import annotations

import math
from typing import Optional

from ..autograd import Function
from ..backend import dtypes
from ..tensor import Tensor
from ._util import (autocast_lower, check_broadcast, require_float, require_tensor, unbroadcast,
                    widened)
from .softmax import softmax_


class ScaledDotProductAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale, dropout_p):
        xp = ctx.xp
        kernels = ctx.backend.fused_kernels()  # CUDA: backend/kernels/attention.cu
        ctx.kernels = kernels if kernels is not None and kernels.supports_flash_attention(
            q, k, v, mask, dropout_p) else None
        if ctx.kernels is not None:  # tiled, online softmax: no (L, S) matrix is stored
            # in float32 (bf16 inputs widened, the output rounded back); q, k, v are saved
            # as given, bf16 under autocast, and the float32 output for backward's rowsum
            out, lse = ctx.kernels.flash_attention_forward(widened(q), widened(k), widened(v),
                                                           causal, scale)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.scale, ctx.causal = scale, causal
            return out.astype(q.dtype, copy=False)
        scores = ctx.backend.matmul(q, xp.swapaxes(k, -1, -2))  # (..., L, S)
        scores = widened(scores)  # bf16/fp16 scores: softmax in float32
        scores *= scale
        L, S = scores.shape[-2:]
        no_key = None  # rows where the mask leaves a query no key to attend to
        if causal:  # query i sees keys 0..i (top-left aligned, as PyTorch's is_causal)
            xp.copyto(scores, -xp.inf, where=xp.triu(xp.ones((L, S), dtype=bool), k=1))
        elif mask is not None:
            shape = xp.broadcast(scores, mask).shape  # the mask may have batch dims only v has
            if shape != scores.shape:
                scores = xp.ascontiguousarray(xp.broadcast_to(scores, shape))
            if mask.dtype == bool:  # True = may attend
                xp.copyto(scores, -xp.inf, where=~mask)
            else:  # additive float mask
                scores += mask
            no_key = scores.max(axis=-1, keepdims=True) == -xp.inf  # (..., L, 1)
        probs = softmax_(scores, -1, xp).astype(q.dtype, copy=False)
        if no_key is not None:
            # a query the mask lets see no key gets all-zero weights, as in PyTorch, rather
            # than softmax's 0/0 = nan (which would reach every gradient)
            xp.copyto(probs, 0, where=no_key)
        keep = None
        attended = probs
        if dropout_p > 0.0:
            keep = ctx.backend.rand(probs.shape, dtypes.float32) >= dropout_p
            attended = probs * keep
            attended *= 1.0 / (1.0 - dropout_p)
        ctx.save_for_backward(q, k, v, probs, keep)
        ctx.scale, ctx.dropout_p = scale, dropout_p
        out = ctx.backend.matmul(attended, v)  # (..., L, Ev)
        return out.astype(xp.result_type(q.dtype, v.dtype), copy=False)  # bf16 stays bf16

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        if ctx.kernels is not None:
            q, k, v, out, lse = ctx.saved_tensors
            grad_q, grad_k, grad_v = ctx.kernels.flash_attention_backward(
                widened(q), widened(k), widened(v), out, widened(grad), lse, ctx.causal,
                ctx.scale)  # float32 gradients: the engine rounds them to q, k, v's dtype
            return grad_q, grad_k, grad_v, None, None, None, None
        q, k, v, probs, keep = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        attended = probs
        if keep is not None:
            attended = probs * keep * (1.0 / (1.0 - ctx.dropout_p))
        grad_v = ctx.backend.matmul(xp.swapaxes(attended, -1, -2), grad) if need_v else None
        grad_q = grad_k = None
        if need_q or need_k:
            d_probs = ctx.backend.matmul(grad, xp.swapaxes(v, -1, -2))  # (..., L, S)
            if keep is not None:
                d_probs *= keep
                d_probs *= 1.0 / (1.0 - ctx.dropout_p)
            # softmax backward, in place: dS = P * (dP - rowsum(dP * P))
            d_scores = d_probs
            d_scores -= (d_probs * probs).sum(axis=-1, keepdims=True)
            d_scores *= probs
            d_scores *= ctx.scale
            if need_q:
                grad_q = ctx.backend.matmul(d_scores, k)
            if need_k:
                grad_k = ctx.backend.matmul(xp.swapaxes(d_scores, -1, -2), q)
        return (unbroadcast(grad_q, q.shape) if grad_q is not None else None,
                unbroadcast(grad_k, k.shape) if grad_k is not None else None,
                unbroadcast(grad_v, v.shape) if grad_v is not None else None,
                None, None, None, None)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False,
                                 scale: Optional[float] = None) -> Tensor:
    """Attention over the last two dims: query (..., L, E), key (..., S, E), value (..., S, Ev)
    -> (..., L, Ev), as torch.nn.functional.scaled_dot_product_attention.

    ``attn_mask`` is bool (True = may attend) or float (added to the scores), broadcast to
    (..., L, S); a query it leaves no key to attend to gets zeros, not nan. ``is_causal``
    masks keys after each query (top-left aligned when L != S). ``dropout_p`` applies
    dropout to the attention weights; pass 0 in evaluation.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        require_tensor(t, "scaled_dot_product_attention", name)
        require_float(t, "scaled_dot_product_attention", name)
        if t.ndim < 2:
            raise ValueError(f"scaled_dot_product_attention: {name} needs at least 2 dims "
                             f"(..., seq, dim), got shape {tuple(t.shape)}")
    q_shape, k_shape, v_shape = tuple(query.shape), tuple(key.shape), tuple(value.shape)
    if q_shape[-1] != k_shape[-1]:
        raise ValueError(f"scaled_dot_product_attention: query and key feature dims differ: "
                         f"{q_shape} and {k_shape}")
    if k_shape[-2] != v_shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: key and value lengths differ: "
                         f"{k_shape} and {v_shape}")
    batch = check_broadcast("scaled_dot_product_attention (batch dims)",
                            q_shape[:-2], k_shape[:-2], v_shape[:-2])
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1), got "
                         f"{dropout_p}")
    mask = None
    if attn_mask is not None:
        if is_causal:
            raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal, "
                             "not both")
        require_tensor(attn_mask, "scaled_dot_product_attention", "attn_mask")
        scores_shape = batch + (q_shape[-2], k_shape[-2])
        if check_broadcast("scaled_dot_product_attention (attn_mask)", attn_mask.shape,
                           scores_shape) != scores_shape:
            raise ValueError(f"scaled_dot_product_attention: attn_mask of shape "
                             f"{tuple(attn_mask.shape)} does not broadcast to the scores' "
                             f"shape {scores_shape}")
        mask = attn_mask.data
    if scale is None:
        scale = 1.0 / math.sqrt(q_shape[-1])
    query, key, value = autocast_lower(query, key, value)
    return ScaledDotProductAttention.apply(query, key, value, mask, bool(is_causal),
                                           float(scale), float(dropout_p))
