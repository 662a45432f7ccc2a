"""Attention on a model's projections, heads read where the projections wrote them.

GPT's and a Llama's attention never split their projections into head tensors: the
queries, keys and values are strided views of the (B, T, width) outputs of the
projections, the output is written through a view of the (B, T, C) result, and the
gradients go straight into buffers of the projections' shapes. Each form is one graph
node over ``attention._attend``'s paths:

* ``PackedCausalAttention``: GPT's causal self-attention on the packed (B, T, 3C)
  projection of c_attn, q, k and v side by side;
* ``GroupedCausalAttention``: a Llama's grouped-query attention on its separate q
  (B, T, n_head * hs), k and v (B, T, n_kv_head * hs) projections: the queries viewed
  (B, n_kv_head, G, T, hs) against keys and values (B, n_kv_head, 1, T, hs), so the
  group dim is a broadcast, never a copy, and k's and v's gradients are summed over it;
* ``CachedCausalAttention`` and ``CachedGroupedAttention``: the same for generation with
  a KV cache, the new positions' keys and values appended to the cache buffers; no
  backward.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

from ..autograd import Function, is_grad_enabled
from ..backend import dtypes
from ..tensor import Tensor
from ._util import require_float, require_tensor
from .attention import _attend, _attend_backward
from .promotion import autocast_lower


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
    where = "cached_causal_attention"
    require_tensor(qkv, where, "qkv")
    require_float(qkv, where, "qkv")
    if qkv.ndim != 3 or isinstance(n_head, bool) or not isinstance(n_head, numbers.Integral) \
            or n_head < 1 or qkv.shape[2] % (3 * n_head):
        raise ValueError(f"{where}: expected qkv (B, T, 3 * C) with C a multiple of n_head = "
                         f"{n_head!r}, got shape {tuple(qkv.shape)}")
    if isinstance(keys, Tensor) and keys.ndim == 4 and keys.shape[1] != n_head:
        raise ValueError(f"{where}: the cache holds {keys.shape[1]} heads, n_head is {n_head}")
    C = qkv.shape[2] // 3  # the checks on q, k, v's column views and the cache's n_head heads
    _check_cached(where, qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:], keys, values,
                  start, int(n_head))
    (qkv,) = autocast_lower(qkv)
    return CachedCausalAttention.apply(qkv, keys, values, _start(start), int(n_head))


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
    xp = ctx.xp
    if not isinstance(start, int) and ctx.backend.reads_are_free:
        # the CPU reads the position tensor here, in the op (so every replay reads it
        # anew), and runs the int form: exactly the arithmetic of an uncaptured step
        start = int(start[0])
        if not 0 <= start <= keys.shape[2] - T:
            raise ValueError(f"cached attention: position {start} leaves no room for {T} "
                             f"new positions in a cache of {keys.shape[2]}")
    if isinstance(start, int):  # positions start .. start + T - 1: attend over 0 .. end - 1
        end = start + T
        positions = slice(start, end)
        mask = None
        if start and T > 1:  # query i sits at position start + i: it sees keys 0 .. start + i
            mask = xp.tri(T, end, start, dtype=bool)
        causal = start == 0
    else:  # an array (1,): the static form, same shapes at every position (capturable)
        capacity = keys.shape[2]
        ctx.backend.check_in_range(start, capacity - T + 1, "cached attention: position",
                                   f"leaves no room for {T} new positions in a cache of "
                                   f"{capacity} (expected 0 <= position <= {capacity - T})")
        positions = start + xp.arange(T)  # (T,)
        end = capacity  # every slot, those past the query's position masked off
        mask = xp.arange(capacity)[None, :] <= positions[:, None]  # (T, capacity)
        causal = False
    keys[:, :, positions] = _grouped_heads(k, n_kv_head, 1)[:, :, 0]
    values[:, :, positions] = _grouped_heads(v, n_kv_head, 1)[:, :, 0]
    out = xp.empty(q.shape, dtype=q.dtype)
    scale = 1.0 / math.sqrt(q.shape[2] // n_head)
    if T == 1 and mask is None and q.dtype == keys.dtype == dtypes.float32 and \
            ctx.backend.reads_are_free:
        _attend_one(xp, _grouped_heads(q, n_kv_head, group)[:, :, :, 0], keys[:, :, :end],
                    values[:, :, :end], scale, _grouped_heads(out, n_kv_head, group)[:, :, :, 0])
        return out
    _attend(ctx, _grouped_heads(q, n_kv_head, group), keys[:, :, None, :end],
            values[:, :, None, :end], mask, causal, scale, 0.0,
            out=_grouped_heads(out, n_kv_head, group))
    return out


def _attend_one(xp, q, keys, values, scale, out):
    """A decode step's attention on the CPU: one query per head, q (B, Hkv, G, hs), over
    every cached key (B, Hkv, S, hs), into ``out`` (B, Hkv, G, hs). Nothing to mask (the
    query is the newest position), so the products and a float32 softmax, with none of
    ``_attend``'s dispatch: a decode step's attention is a few thousand FLOPs, and its
    Python is the cost (``_attend`` takes 30 us here, this about 10)."""
    scores = xp.matmul(q, keys.swapaxes(-1, -2))  # (B, Hkv, G, S)
    scores *= scale
    scores -= scores.max(axis=-1, keepdims=True)
    xp.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    xp.matmul(scores, values, out=out)


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
    _check_cached("cached_grouped_attention", q, k, v, keys, values, start, n_head)
    q, k, v = autocast_lower(q, k, v)
    return CachedGroupedAttention.apply(q, k, v, keys, values, _start(start), int(n_head))


def _start(start: Any) -> Any:
    """A cached op's ``start`` as its forward takes it: an int, or the position tensor
    itself (apply hands its array to forward; a captured step rebinds it per call)."""
    return start if isinstance(start, Tensor) else int(start)


def _check_cached(where: str, q: Tensor, k: Tensor, v: Tensor, keys: Tensor, values: Tensor,
                  start: Any, n_head: int) -> None:
    """ValueError/RuntimeError naming the argument, before the cache is written, unless q,
    k, v are the new positions' projections (``_check_grouped``, n_kv_head the cache's
    heads), the cache buffers are float (B, n_kv_head, capacity, head_dim) of one dtype,
    ``start`` leaves room for them, and grad mode is off for them."""
    for name, t in (("keys", keys), ("values", values)):
        require_tensor(t, where, name)
        require_float(t, where, name)
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
    if isinstance(start, Tensor):  # the static form: checked against the cache at run time
        if not dtypes.is_integer(start.dtype) or tuple(start.shape) != (1,) or \
                start.device != keys.device:
            raise ValueError(f"{where}: a position tensor must be one int64 on the cache's "
                             f"device {keys.device}, shape (1,); got {start.dtype} of shape "
                             f"{tuple(start.shape)} on {start.device}")
    elif isinstance(start, bool) or not isinstance(start, numbers.Integral) or \
            not 0 <= start <= keys.shape[2] - T:
        raise ValueError(f"{where}: start must be an int in [0, capacity - T] = [0, "
                         f"{keys.shape[2] - T}] ({T} new positions, capacity "
                         f"{keys.shape[2]}), got {start!r}")
    if is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError(f"{where}: a KV cache is for inference; run under no_grad()")
