"""Scaled dot-product attention as one fused Function, forward and backward.

softmax(q k^T * scale + mask) v, with the scores computed in one buffer that is masked,
soft-maxed and (in training) dropped out in place. Backward uses the saved probabilities:
    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dQ = dS K s,  dK = dS^T Q s.
The (L, S) probability matrix is kept per head. Three other paths keep only each query's
log-sum-exp instead and recompute the probabilities in backward, never holding (L, S):
on a CUDA backend, float32 or bf16 attention without a mask or dropout can go to the
flash-attention kernels (backend/kernels/attention.cu, which read q, k, v in place);
elsewhere, the same attention with at least ``TILED_FROM`` keys goes to the tiled,
online-softmax loop of ``attention_tiled.py``.

``PackedCausalAttention`` is GPT's form of it: causal self-attention that reads q, k and
v as strided views of the (B, T, 3C) projection and writes the heads side by side into
(B, T, C), with its gradient written straight into one (B, T, 3C) buffer: no split, no
head transposes, no copies, one node instead of a dozen.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import numpy as np

from ..autograd import Function, is_grad_enabled
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
    if kernels is not None and kernels.supports_attention_softmax(q, k, v, mask) and \
            _dense_bytes(q, k) <= DENSE_MAX_BYTES:
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
        # q's dtype for the caller) for backward's rowsum
        ctx.path, ctx.kernels = "kernel", kernels
        result, lse = kernels.flash_attention_forward(q, k, v, causal, scale)
        return _into(out, result.astype(q.dtype, copy=False)), (result, lse)
    if mask is None and dropout_p == 0.0 and k.shape[-2] >= TILED_FROM and \
            q.dtype == k.dtype == v.dtype and k.shape[:-2] == v.shape[:-2] and \
            np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) == q.shape[:-2]:
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
        result, lse = saved
        # q, k, v and grad as they are (bf16, strided views); float32 gradients, which the
        # engine rounds to q, k, v's dtype
        grads = ctx.kernels.flash_attention_backward(q, k, v, result, grad, lse, ctx.causal,
                                                     ctx.scale)
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


def _heads(packed, n_head: int, parts: int):
    """Views (B, nh, T, hs) of the ``parts`` blocks of C columns of ``packed`` (B, T, parts*C):
    strides only, no copy."""
    B, T, width = packed.shape
    heads = packed.reshape(B, T, parts, n_head, width // (parts * n_head))
    return [heads[:, :, i].transpose(0, 2, 1, 3) for i in range(parts)]


def _attend_packed(ctx, qkv, k, v, n_head, mask, causal, dropout_p):
    """Attention of the queries in ``qkv`` (B, T, 3C) over keys and values ``k``, ``v``
    (B, nh, S, hs): the output (B, T, C), heads side by side, written in place by the last
    GEMM, and what ``_attend`` saved for backward."""
    B, T, C3 = qkv.shape
    q = _heads(qkv, n_head, 3)[0]  # (B, nh, T, hs), a view
    out = ctx.xp.empty((B, T, C3 // 3), dtype=qkv.dtype)
    (head_out,) = _heads(out, n_head, 1)  # (B, nh, T, hs) view of out
    scale = 1.0 / math.sqrt(C3 // (3 * n_head))
    _, saved = _attend(ctx, q, k, v, mask, causal, scale, dropout_p, out=head_out)
    return out, saved


class PackedCausalAttention(Function):
    """Causal self-attention from the packed projection qkv (B, T, 3C) to (B, T, C), heads
    side by side. Batched GEMMs read q, k, v in place and write their results through
    transposed views, so neither direction copies a head."""

    @staticmethod
    def forward(ctx, qkv, n_head, dropout_p):
        _, k, v = _heads(qkv, n_head, 3)  # (B, nh, T, hs) each, views
        out, saved = _attend_packed(ctx, qkv, k, v, n_head, None, True, dropout_p)
        ctx.save_for_backward(qkv, *saved)
        ctx.n_head = n_head
        return out  # (B, T, C)

    @staticmethod
    def backward(ctx, grad):
        qkv, *saved = ctx.saved_tensors
        q, k, v = _heads(qkv, ctx.n_head, 3)
        grad_qkv = ctx.xp.empty(qkv.shape, dtype=grad.dtype)  # (B, T, 3C)
        (head_grad,) = _heads(grad, ctx.n_head, 1)  # (B, nh, T, hs) view of grad
        _attend_backward(ctx, q, k, v, saved, head_grad, outs=_heads(grad_qkv, ctx.n_head, 3))
        return grad_qkv, None, None


def packed_causal_attention(qkv: Tensor, n_head: int, dropout_p: float = 0.0) -> Tensor:
    """Causal multi-head self-attention on the packed projection ``qkv`` (B, T, 3C), q, k
    and v side by side as GPT's c_attn makes them, ``n_head`` heads of C / n_head: (B, T, C)
    with the heads side by side, as c_proj takes them. The same as splitting q, k, v into
    (B, nh, T, hs) heads, ``scaled_dot_product_attention(q, k, v, is_causal=True)`` and
    putting the heads back together, as one node without copies."""
    require_tensor(qkv, "packed_causal_attention", "qkv")
    require_float(qkv, "packed_causal_attention", "qkv")
    if qkv.ndim != 3 or not isinstance(n_head, int) or n_head < 1 or \
            qkv.shape[2] % (3 * n_head):
        raise ValueError(f"packed_causal_attention: expected qkv (B, T, 3 * C) with C a "
                         f"multiple of n_head = {n_head!r}, got shape {tuple(qkv.shape)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"packed_causal_attention: dropout_p must be in [0, 1), got "
                         f"{dropout_p}")
    (qkv,) = autocast_lower(qkv)
    return PackedCausalAttention.apply(qkv, n_head, float(dropout_p))


class CachedCausalAttention(Function):
    """Inference with a KV cache: the T new positions of the packed projection qkv
    (B, T, 3C) attend over the ``start`` cached ones and themselves. Their keys and values
    are written into the cache buffers (B, nh, capacity, hs) at start .. start + T. One
    node instead of a split, three head views and a concatenation per token; no backward
    (a cache belongs to generation, under no_grad)."""

    @staticmethod
    def forward(ctx, qkv, keys, values, start, n_head):
        C = qkv.shape[2] // 3  # q, k, v: column views of the packed projection
        return _attend_cached(ctx, qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:], keys,
                              values, start, n_head)  # (B, T, C)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("cached_causal_attention has no backward: a KV cache is for "
                           "inference (run under no_grad)")


def cached_causal_attention(qkv: Tensor, keys: Tensor, values: Tensor, start: int,
                            n_head: int) -> Tensor:
    """Attention of the new positions in ``qkv`` (B, T, 3C) over ``start`` cached positions
    and themselves, appending their keys and values to ``keys``/``values`` (B, nh,
    capacity, hs) in place: (B, T, C), heads side by side. For ``KVCache``; no gradient."""
    (qkv,) = autocast_lower(qkv)
    return CachedCausalAttention.apply(qkv, keys, values, int(start), int(n_head))


def _grouped_heads(x, n_groups: int, group: int):
    """View (B, n_groups, group, T, hs) of the heads of ``x`` (B, T, n_groups * group * hs),
    heads side by side as a projection makes them: strides only, no copy. Query head
    g * group + j sits at [:, g, j]: the j-th query of key/value head g."""
    B, T, width = x.shape
    heads = x.reshape(B, T, n_groups, group, width // (n_groups * group))
    return heads.transpose(0, 2, 3, 1, 4)


def _sum_into(out, grad):
    """The gradient ``grad`` (B, Hkv, G, S, hs) of a k or v broadcast over the G query
    heads of its group, summed over G into ``out`` (B, Hkv, 1, S, hs); unchanged when
    it already has one head per group (a kernel that summed it, or G = 1)."""
    if grad.shape[2] != 1:
        grad = grad.sum(axis=2, keepdims=True)
    out[...] = grad


class GroupedCausalAttention(Function):
    """Causal self-attention of ``n_head`` query heads over ``n_kv_head`` key/value heads
    (grouped-query attention; multi-query when n_kv_head is 1), from the projections q
    (B, T, n_head * hs), k and v (B, T, n_kv_head * hs) to (B, T, n_head * hs), heads side
    by side. The queries are viewed as (B, n_kv_head, G, T, hs) and the keys and values
    as (B, n_kv_head, 1, T, hs), broadcast over the group dim G in the batched products:
    no key or value is repeated, and their gradients are summed over G."""

    @staticmethod
    def forward(ctx, q, k, v, n_head, n_kv_head, dropout_p):
        group = n_head // n_kv_head
        out = ctx.xp.empty(q.shape, dtype=ctx.xp.result_type(q.dtype, v.dtype))
        scale = 1.0 / math.sqrt(q.shape[2] // n_head)
        _, saved = _attend(ctx, _grouped_heads(q, n_kv_head, group),
                           _grouped_heads(k, n_kv_head, 1), _grouped_heads(v, n_kv_head, 1),
                           None, True, scale, dropout_p, out=_grouped_heads(out, n_kv_head, group))
        ctx.save_for_backward(q, k, v, *saved)
        ctx.heads = (n_kv_head, group)
        return out  # (B, T, n_head * hs)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, *saved = ctx.saved_tensors
        n_kv_head, group = ctx.heads
        xp = ctx.xp
        grads = [xp.empty(t.shape, dtype=grad.dtype) if need else None
                 for t, need in zip((q, k, v), ctx.needs_input_grad[:3])]
        views = [None if g is None else _grouped_heads(g, n_kv_head, group if i == 0 else 1)
                 for i, g in enumerate(grads)]
        # q's gradient is written in place; k's and v's come back per query head when
        # G > 1 (the products' broadcast), summed here over the group
        outs = (views[0], *(views[1:] if group == 1 else (None, None)))
        grad_q, grad_k, grad_v = _attend_backward(
            ctx, _grouped_heads(q, n_kv_head, group), _grouped_heads(k, n_kv_head, 1),
            _grouped_heads(v, n_kv_head, 1), saved, _grouped_heads(grad, n_kv_head, group),
            *ctx.needs_input_grad[:3], outs=outs)
        if group != 1:
            for view, result in zip(views[1:], (grad_k, grad_v)):
                if view is not None:
                    _sum_into(view, result)
        return grads[0], grads[1], grads[2], None, None, None


def _check_grouped(where: str, q: Tensor, k: Tensor, v: Tensor, n_head: int,
                   n_kv_head: int) -> None:
    """ValueError/TypeError naming the argument unless q is (B, T, n_head * hs) and k, v
    are (B, S, n_kv_head * hs) with n_kv_head dividing n_head."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(t, where, name)
        require_float(t, where, name)
    for name, n in (("n_head", n_head), ("n_kv_head", n_kv_head)):
        if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{where}: {name} must be a positive int, got {n!r}")
    if n_head % n_kv_head:
        raise ValueError(f"{where}: n_kv_head ({n_kv_head}) must divide n_head ({n_head})")
    if q.ndim != 3 or q.shape[2] % n_head:
        raise ValueError(f"{where}: expected q (B, T, n_head * head_dim) with n_head = "
                         f"{n_head}, got shape {tuple(q.shape)}")
    width = q.shape[2] // n_head * n_kv_head
    for name, t in (("k", k), ("v", v)):
        if t.ndim != 3 or t.shape[0] != q.shape[0] or t.shape[2] != width:
            raise ValueError(f"{where}: expected {name} (B, S, n_kv_head * head_dim) = "
                             f"({q.shape[0]}, S, {width}) beside q {tuple(q.shape)}, got "
                             f"{tuple(t.shape)}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"{where}: k and v have {k.shape[1]} and {v.shape[1]} positions")


def _check_dropout(where: str, dropout_p: Any) -> None:
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or \
            not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{where}: dropout_p must be a number in [0, 1), got {dropout_p!r}")


def grouped_causal_attention(q: Tensor, k: Tensor, v: Tensor, n_head: int, n_kv_head: int,
                             dropout_p: float = 0.0) -> Tensor:
    """Causal grouped-query self-attention on the projections: q (B, T, n_head * hs), k and
    v (B, T, n_kv_head * hs), heads side by side as a Llama's q_proj, k_proj and v_proj
    make them; query head h attends with key/value head h // (n_head / n_kv_head), as
    PyTorch's ``enable_gqa`` and Hugging Face's ``repeat_kv``. Returns (B, T, n_head * hs),
    heads side by side, as o_proj takes them. One node; no key or value repeated, no head
    copied either way."""
    _check_grouped("grouped_causal_attention", q, k, v, n_head, n_kv_head)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"grouped_causal_attention: q has {q.shape[1]} positions, k and v "
                         f"{k.shape[1]} (self-attention: the same positions)")
    _check_dropout("grouped_causal_attention", dropout_p)
    q, k, v = autocast_lower(q, k, v)
    return GroupedCausalAttention.apply(q, k, v, int(n_head), int(n_kv_head),
                                        float(dropout_p))


def _attend_cached(ctx, q, k, v, keys, values, start, n_head):
    """The forward of both cached ops, on raw arrays: the T new positions' keys and values
    k, v (B, T, n_kv_head * hs) written into the cache buffers (B, n_kv_head, capacity, hs)
    at start .. start + T, then their queries q (B, T, n_head * hs) over every cached
    position, each query head reading its group's key/value head in place. Returns
    (B, T, n_head * hs), heads side by side."""
    n_kv_head = keys.shape[1]
    group = n_head // n_kv_head
    T = q.shape[1]
    end = start + T
    keys[:, :, start:end] = _grouped_heads(k, n_kv_head, 1)[:, :, 0]
    values[:, :, start:end] = _grouped_heads(v, n_kv_head, 1)[:, :, 0]
    mask = None
    if start and T > 1:  # query i sits at position start + i: it sees keys 0 .. start + i
        mask = ctx.xp.tri(T, end, start, dtype=bool)
    out = ctx.xp.empty(q.shape, dtype=q.dtype)
    scale = 1.0 / math.sqrt(q.shape[2] // n_head)
    _attend(ctx, _grouped_heads(q, n_kv_head, group), keys[:, :, None, :end],
            values[:, :, None, :end], mask, start == 0, scale, 0.0,
            out=_grouped_heads(out, n_kv_head, group))
    return out


class CachedGroupedAttention(Function):
    """Inference with a KV cache of n_kv_head heads: the T new positions' queries q
    (B, T, n_head * hs) attend over the ``start`` cached positions and themselves; their
    keys and values k, v (B, T, n_kv_head * hs) are written into the cache buffers
    (B, n_kv_head, capacity, hs) at start .. start + T. No backward."""

    @staticmethod
    def forward(ctx, q, k, v, keys, values, start, n_head):
        return _attend_cached(ctx, q, k, v, keys, values, start, n_head)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("cached_grouped_attention has no backward: a KV cache is for "
                           "inference (run under no_grad)")


def cached_grouped_attention(q: Tensor, k: Tensor, v: Tensor, keys: Tensor, values: Tensor,
                             start: int, n_head: int) -> Tensor:
    """Grouped-query attention of the new positions' q (B, T, n_head * hs) over ``start``
    cached positions and themselves, appending their k, v (B, T, n_kv_head * hs) to
    ``keys``/``values`` (B, n_kv_head, capacity, hs) in place: (B, T, n_head * hs). For
    ``KVCache``; no gradient."""
    where = "cached_grouped_attention"
    for name, t in (("keys", keys), ("values", values)):
        require_tensor(t, where, name)
        if t.ndim != 4:
            raise ValueError(f"{where}: expected {name} (B, n_kv_head, capacity, head_dim), got "
                             f"shape {tuple(t.shape)}")
    _check_grouped(where, q, k, v, n_head, keys.shape[1])
    B, T = q.shape[:2]
    wanted = (B, keys.shape[1], keys.shape[2], q.shape[2] // n_head)
    for name, t in (("keys", keys), ("values", values)):
        if tuple(t.shape) != wanted or t.dtype != keys.dtype:
            raise ValueError(f"{where}: expected {name} of shape (B, n_kv_head, capacity, "
                             f"head_dim) = {wanted} and keys' dtype, got {tuple(t.shape)} "
                             f"{t.dtype}")
    if k.shape[1] != T:
        raise ValueError(f"{where}: q has {T} new positions, k and v {k.shape[1]}")
    if isinstance(start, bool) or not isinstance(start, numbers.Integral) or \
            not 0 <= start <= keys.shape[2] - T:
        raise ValueError(f"{where}: start must be an int in [0, capacity - T] = [0, "
                         f"{keys.shape[2] - T}] ({T} new positions, capacity "
                         f"{keys.shape[2]}), got {start!r}")
    if is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError(f"{where}: a KV cache is for inference; run under no_grad()")
    q, k, v = autocast_lower(q, k, v)
    return CachedGroupedAttention.apply(q, k, v, keys, values, int(start), int(n_head))
