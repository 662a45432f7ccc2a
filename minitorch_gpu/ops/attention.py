"""Scaled dot-product attention as one fused Function, forward and backward.

softmax(q k^T * scale + mask) v, with the scores computed in one buffer that is masked,
soft-maxed and (in training) dropped out in place. Backward uses the saved probabilities:
    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dQ = dS K s,  dK = dS^T Q s.
The (L, S) probability matrix is kept per head. Three other paths keep only each query's
log-sum-exp instead and recompute the probabilities in backward, never holding (L, S):
on a CUDA backend, float32 or bf16 attention without a mask or dropout can go to the
flash-attention kernels (backend/kernels/attention.cu, which read q, k, v in place); on
the CPU, float32 attention without a mask goes to the CPU's flash kernel
(backend/cpu_kernels/attention.py, dropout included) where it is the faster path;
elsewhere, the same attention with at least ``TILED_FROM`` keys goes to the tiled,
online-softmax loop of ``attention_tiled.py``.

The forms GPT and a Llama call on their projections (heads read in place, one node per
layer, KV-cached variants) are in ``attention_heads.py``, over ``_attend`` and
``_attend_backward`` here.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ..autograd import Function
from ..backend import dtypes
from ..backend.threads import row_pieces, run_split
from ..tensor import Tensor
from ._util import check_broadcast, require_float, require_tensor, widened
from .attention_tiled import tiled_attention_backward, tiled_attention_forward
from .promotion import autocast_lower
from .softmax import softmax_


TILED_FROM = 1024  # keys from which attention without mask or dropout is tiled (memory)
# On CUDA, attention whose float32 scores and saved probabilities (dropped-out copy
# included) take at most this many bytes runs as cuBLAS products around the fused softmax
# kernel (tensor cores); longer attention goes to the flash kernels, which never hold them
DENSE_MAX_BYTES = 2 << 30


def _dense_bytes(q, k) -> int:
    """Bytes the dense path holds at once: the (..., L, S) float32 scores, and the
    probabilities and their dropped-out copy in q's dtype."""
    batch = math.prod(np.broadcast_shapes(q.shape[:-2], k.shape[:-2]))
    return batch * q.shape[-2] * k.shape[-2] * (4 + 2 * q.dtype.itemsize)


def _attend(ctx, q, k, v, mask, causal, scale, dropout_p, out=None):
    """The forward of every path, on raw arrays: returns (output, saved), where ``saved`` is
    what ``_attend_backward`` needs besides q, k and v. ``out`` receives the output."""
    xp = ctx.xp
    kernels = ctx.backend.fused_kernels()  # CUDA: backend/kernels/attention*.cu
    ctx.scale, ctx.causal, ctx.dropout_p = scale, causal, dropout_p
    tiled = mask is None and dropout_p == 0.0 and k.shape[-2] >= TILED_FROM and \
        q.dtype == k.dtype == v.dtype and k.shape[:-2] == v.shape[:-2] and \
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) == q.shape[:-2]
    # on the CPU (whose kernels are numba's softmax between NumPy's products) the tiled
    # path takes the long sequences, for memory, as it does without kernels
    if kernels is not None and kernels.supports_attention_softmax(q, k, v, mask) and \
            _dense_bytes(q, k) <= DENSE_MAX_BYTES and not (
                tiled and ctx.backend.device.type == "cpu"):
        # tensor cores: Q K^T and A V as cuBLAS GEMMs (bf16 in, float32 accumulation),
        # scale, causal mask, softmax and dropout between them as one kernel; the dropout
        # mask is a hash of a seed drawn here, so backward recomputes it instead of saving it
        ctx.path, ctx.kernels = "dense", kernels
        scores = ctx.backend.matmul(q, xp.swapaxes(k, -1, -2))  # (..., L, S) float32
        seed = None
        if dropout_p > 0.0:
            seed = ctx.backend.randint(0, 2 ** 62, (1,), dtypes.int64).view(xp.uint64)
        probs, attended = kernels.attention_softmax_forward(scores, causal, scale, dropout_p,
                                                            seed, q.dtype)
        del scores
        if out is not None and out.shape == attended.shape[:-1] + v.shape[-1:]:
            return ctx.backend.matmul(attended, v, out=out), (probs, attended, seed)
        result = ctx.backend.matmul(attended, v)  # (..., L, Ev)
        return _into(out, result.astype(q.dtype, copy=False)), (probs, attended, seed)
    if kernels is not None and kernels.supports_flash_attention(q, k, v, mask, dropout_p):
        # tiled, online softmax in float32; the kernels read q, k, v as stored (bf16 under
        # autocast) and where they are (GPT's strided head views): no widened or
        # contiguous copies. q, k, v are saved as given, and the float32 output (rounded to
        # q's dtype for the caller) for backward's rowsum. Dropout (the CPU's kernel takes
        # it; CUDA's flash kernels decline it) by the hash of a seed drawn here, as on the
        # dense path: backward recomputes the mask
        ctx.path, ctx.kernels = "kernel", kernels
        seed = ()
        if dropout_p > 0.0:
            seed = (ctx.backend.randint(0, 2 ** 62, (1,), dtypes.int64).view(xp.uint64),)
        result, lse = kernels.flash_attention_forward(q, k, v, causal, scale,
                                                      *((dropout_p, *seed) if seed else ()))
        return _into(out, result.astype(q.dtype, copy=False)), (result, lse, *seed)
    if tiled:
        # k, v may be broadcast over q's batch (grouped-query attention's group dim)
        ctx.path = "tiled"  # memory-efficient: never more than a tile of the scores
        result, lse = tiled_attention_forward(xp, ctx.backend.matmul, widened(q), widened(k),
                                              widened(v), causal, scale)
        return _into(out, result.astype(q.dtype, copy=False)), (result, lse)
    ctx.path = "full"
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
    run_split(lambda rows: softmax_(scores[rows], -1, xp), row_pieces(scores))  # in place
    probs = scores.astype(q.dtype, copy=False)
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
    if out is not None and out.shape == attended.shape[:-1] + v.shape[-1:]:
        return ctx.backend.matmul(attended, v, out=out), (probs, keep)
    result = ctx.backend.matmul(attended, v)  # (..., L, Ev)
    dtype = xp.result_type(q.dtype, v.dtype)  # bf16 stays bf16
    return _into(out, result.astype(dtype, copy=False)), (probs, keep)


def _attend_backward(ctx, q, k, v, saved, grad, need_q=True, need_k=True, need_v=True,
                     outs=(None, None, None), need_mask=False):
    """(grad_q, grad_k, grad_v) of ``_attend``, of the broadcast shapes (None where not
    needed); each written into its ``outs`` array when one is given. With ``need_mask``
    (the full path only: the others take no mask) a fourth: the gradient of the scores
    after scaling, dS, which is a float mask's (it is added to them)."""
    xp = ctx.xp
    out_q, out_k, out_v = outs
    if ctx.path == "dense":
        probs, attended, seed = saved
        matmul = ctx.backend.matmul
        grad = grad.astype(v.dtype, copy=False)  # bf16 GEMMs take one dtype
        grad_v = matmul(xp.swapaxes(attended, -1, -2), grad, out=out_v) if need_v else None
        grad_q = grad_k = None
        if need_q or need_k:
            d_attended = matmul(grad, xp.swapaxes(v, -1, -2))  # (..., L, S) float32
            d_scores = ctx.kernels.attention_softmax_backward(d_attended, probs, ctx.scale,
                                                              ctx.dropout_p, seed)
            del d_attended
            if need_q:
                grad_q = matmul(d_scores, k, out=out_q)
            if need_k:
                grad_k = matmul(xp.swapaxes(d_scores, -1, -2), q, out=out_k)
        return grad_q, grad_k, grad_v
    if ctx.path == "kernel":
        result, lse, *seed = saved  # the dropout seed, where there was dropout
        # q, k, v and grad as they are (bf16, strided views); float32 gradients, which the
        # engine rounds to q, k, v's dtype
        grads = ctx.kernels.flash_attention_backward(
            q, k, v, result, grad, lse, ctx.causal, ctx.scale,
            *((ctx.dropout_p, *seed) if seed else ()))
        return tuple(_into(o, g) for o, g in zip(outs, grads))
    if ctx.path == "tiled":
        result, lse = saved
        grads = tiled_attention_backward(xp, ctx.backend.matmul, widened(q), widened(k),
                                         widened(v), result, lse, widened(grad), ctx.causal,
                                         ctx.scale)
        return tuple(_into(o, g) for o, g in zip(outs, grads))
    probs, keep = saved
    matmul = ctx.backend.matmul
    attended = probs
    if keep is not None:
        attended = probs * keep * (1.0 / (1.0 - ctx.dropout_p))
    grad_v = matmul(xp.swapaxes(attended, -1, -2), grad, out=out_v) if need_v else None
    grad_q = grad_k = grad_mask = None
    if need_q or need_k or need_mask:
        d_probs = matmul(grad, xp.swapaxes(v, -1, -2))  # (..., L, S)
        if keep is not None:
            d_probs *= keep
            d_probs *= 1.0 / (1.0 - ctx.dropout_p)
        # softmax backward, in place: dS = P * (dP - rowsum(dP * P))
        d_scores = d_probs

        def softmax_backward(rows: Any) -> None:  # on every core for long inputs
            d, p = d_scores[rows], probs[rows]
            d -= (d * p).sum(axis=-1, keepdims=True)
            d *= p
            if not need_mask:
                d *= ctx.scale

        run_split(softmax_backward, row_pieces(d_scores))
        if need_mask:  # dS before the scale (the mask is added to the scaled scores); the
            grad_mask = d_scores  # scale then goes on the (L, E) products, not a copy of dS
        if need_q:
            grad_q = matmul(d_scores, k, out=out_q)
            if need_mask:
                grad_q *= ctx.scale
        if need_k:
            grad_k = matmul(xp.swapaxes(d_scores, -1, -2), q, out=out_k)
            if need_mask:
                grad_k *= ctx.scale
    if need_mask:
        return grad_q, grad_k, grad_v, grad_mask
    return grad_q, grad_k, grad_v


def _into(out, array):
    """``array``, copied into ``out`` when one is given (and then ``out``)."""
    if out is None:
        return array
    out[...] = array
    return out


class ScaledDotProductAttention(Function):
    broadcasts = True  # k, v over q's group dim (grouped-query), a mask over batch and heads

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale, dropout_p):
        result, saved = _attend(ctx, q, k, v, mask, causal, scale, dropout_p)
        ctx.save_for_backward(q, k, v, *saved)
        return result

    @staticmethod
    def backward(ctx, grad):
        q, k, v, *saved = ctx.saved_tensors
        need_mask = ctx.needs_input_grad[3]  # a float attn_mask that requires grad
        grads = _attend_backward(ctx, q, k, v, saved, grad, *ctx.needs_input_grad[:3],
                                 need_mask=need_mask)
        return (*grads[:3], grads[3] if need_mask else None, None, None, None)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """Attention over the last two dims: query (..., L, E), key (..., S, E), value (..., S, Ev)
    -> (..., L, Ev), as torch.nn.functional.scaled_dot_product_attention.

    ``attn_mask`` is bool (True = may attend) or float (added to the scores), broadcast to
    (..., L, S); a query it leaves no key to attend to gets zeros, not nan. A float mask
    that requires grad (a learned bias) gets the scores' gradient, summed over the dims it
    was broadcast along. ``is_causal``
    masks keys after each query (top-left aligned when L != S). ``dropout_p`` applies
    dropout to the attention weights; pass 0 in evaluation.

    ``enable_gqa``: grouped-query attention, query (..., Hq, L, E) over key and value
    (..., Hkv, S, E) with Hq a multiple of Hkv, query head h using kv head h // (Hq / Hkv),
    as PyTorch's. The keys and values are never repeated: the query becomes
    (..., Hkv, G, L, E) and k, v (..., Hkv, 1, S, E) broadcast over the group dim G in
    the batched products (full, tiled and CUDA dense paths), whose k, v gradients sum over
    it. The flash kernels take this grouped form too (query head (h, g) reads kv head h),
    so long GQA on CUDA (past the dense path's memory budget) runs in them, their dK and
    dV summed over each group in k's and v's own shape.
    """
    if enable_gqa and query.ndim >= 3 and key.ndim >= 3 and value.ndim >= 3 and \
            not query.shape[-3] == key.shape[-3] == value.shape[-3]:
        return _grouped_query_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                        scale)
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
        # the Tensor itself: a float mask that requires grad (a learned bias) gets dS
        mask = attn_mask
    if scale is None:
        scale = 1.0 / math.sqrt(q_shape[-1])
    query, key, value = autocast_lower(query, key, value)
    return ScaledDotProductAttention.apply(query, key, value, mask, bool(is_causal),
                                           float(scale), float(dropout_p))


def _grouped_query_attention(query: Tensor, key: Tensor, value: Tensor,
                             attn_mask: Optional[Tensor], dropout_p: float, is_causal: bool,
                             scale: Optional[float]) -> Tensor:
    """scaled_dot_product_attention(enable_gqa=True) when the head counts differ: the query's
    heads split as (Hkv, G), k and v given a group dim of 1 (views, no repeats)."""
    hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
    if hk != hv or hq % hk:
        raise ValueError(f"scaled_dot_product_attention: enable_gqa needs key and value with "
                         f"the same number of heads, dividing the query's: query "
                         f"{tuple(query.shape)}, key {tuple(key.shape)}, value "
                         f"{tuple(value.shape)}")
    group = hq // hk
    # (..., Hkv, G, L, E)
    q_grouped = query.reshape(*query.shape[:-3], hk, group, *query.shape[-2:])
    k_grouped, v_grouped = key.unsqueeze(-3), value.unsqueeze(-3)  # (..., Hkv, 1, S, E)
    mask = attn_mask
    if mask is not None and mask.ndim >= 3 and mask.shape[-3] != 1:
        if mask.shape[-3] != hq:
            raise ValueError(f"scaled_dot_product_attention: attn_mask of shape "
                             f"{tuple(mask.shape)} does not broadcast over {hq} query heads")
        mask = mask.reshape(*mask.shape[:-3], hk, group, *mask.shape[-2:])
    elif mask is not None and mask.ndim >= 3:
        mask = mask.unsqueeze(-3)  # (..., 1, 1, L, S)
    out = scaled_dot_product_attention(q_grouped, k_grouped, v_grouped, mask, dropout_p,
                                       is_causal, scale)  # (..., Hkv, G, L, Ev)
    return out.reshape(*out.shape[:-4], hq, *out.shape[-2:])
