"""Softmax, a row at a time: attention's (scale, causal mask, softmax and dropout between
its two BLAS products, and its backward) and cross-entropy's (log-sum-exp and the picked
class, and the gradient p - onehot).

Attention's forward reads each row of the scores Q K^T once and writes P once, touching
only the keys a causal query sees (the rest are written 0); dropout keeps an element where
the hash of its row-major index and a seed passes the threshold, exactly as the CUDA
kernel does (``attention_softmax.cu``: splitmix64, top 24 bits against round(p 2^24)), so
backward recomputes the mask instead of saving it. Its backward writes dS over dA = dO V^T
in place: dS = scale P (dP - rowsum(dP P)), dP = dA keep / (1 - p).

Cross-entropy keeps each row's log-sum-exp only; backward recomputes the probabilities.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from .activations import _is_float32
from .attention import supports_flash_attention
from .compiler import exp32, jit, split_rows
from .dropout import dropout_arguments, kept

_ZERO, _ONE = np.float32(0.0), np.float32(1.0)


def supports_attention_softmax(q: Any, k: Any, v: Any, mask: Optional[Any]) -> bool:
    """float32 NumPy q, k, v, no attn_mask (causal or not, dropout or not), v's batch dims
    no wider than the scores' (q's and k's broadcast); not where the flash kernel takes
    them (``attention.supports_flash_attention``: there it is the faster path), so the ops
    go on to their kernel branch."""
    if mask is not None or not _is_float32(q, k, v) or min(q.ndim, k.ndim, v.ndim) < 2:
        return False
    if supports_flash_attention(q, k, v, mask, 0.0):
        return False
    if q.size == 0 or k.size == 0:
        return False
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    return np.broadcast_shapes(batch, v.shape[:-2]) == batch


@jit
def _softmax_forward(s, length, causal, scale, threshold, keep_scale, seed, probs,
                     attended, start, stop):  # pragma: no cover - compiled
    width = s.shape[1]
    for r in range(start, stop):
        sr, pr = s[r], probs[r]  # rows as 1-D views: indices from 0 vectorise
        seen = min(r % length + 1, width) if causal else width
        top = sr[0] * scale
        for j in range(1, seen):
            top = max(top, sr[j] * scale)
        total = _ZERO
        for j in range(seen):
            e = exp32(sr[j] * scale - top)
            pr[j] = e
            total += e
        inverse = _ONE / total
        for j in range(seen):
            pr[j] *= inverse
        for j in range(seen, width):
            pr[j] = _ZERO
        if threshold:
            ar = attended[r]
            base = r * width
            for j in range(width):
                ar[j] = pr[j] * keep_scale if kept(seed, base + j, threshold) else _ZERO


@jit
def _softmax_backward(d, probs, scale, threshold, keep_scale, seed, start,
                      stop):  # pragma: no cover - compiled
    width = d.shape[1]
    for r in range(start, stop):
        dr, pr = d[r], probs[r]
        if threshold:
            base = r * width
            for j in range(width):
                dr[j] = dr[j] * keep_scale if kept(seed, base + j, threshold) else _ZERO
        dot = _ZERO
        for j in range(width):
            dot += dr[j] * pr[j]
        for j in range(width):
            dr[j] = scale * pr[j] * (dr[j] - dot)


def attention_softmax_forward(scores: Any, causal: bool, scale: float, dropout_p: float,
                              seed: Optional[Any], dtype: Any) -> Tuple[Any, Any]:
    """``(P, A)``: P = softmax(scores * scale) with the keys after each query masked when
    ``causal`` (top-left aligned), A = dropout(P) (P itself without dropout); float32
    (..., L, S). ``seed``: a (1,) uint64 array, or None without dropout."""
    op = "attention_softmax_forward"
    if not _is_float32(scores) or np.dtype(dtype) != np.float32 or scores.ndim < 2:
        raise TypeError(f"{op}: expected float32 scores (..., L, S) and dtype float32, got "
                        f"{getattr(scores, 'dtype', None)} {tuple(scores.shape)} and {dtype}")
    threshold, keep_scale, seed = dropout_arguments(op, dropout_p, seed)
    length, width = scores.shape[-2:]
    rows = np.ascontiguousarray(scores).reshape(-1, width)
    probs = np.empty_like(rows)
    attended = np.empty_like(rows) if threshold else probs
    scale = np.float32(scale)
    split_rows(rows.shape[0], width, lambda a, b: _softmax_forward(
        rows, length, causal, scale, threshold, keep_scale, seed, probs, attended, a, b))
    return probs.reshape(scores.shape), attended.reshape(scores.shape)


def attention_softmax_backward(d_attended: Any, probs: Any, scale: float, dropout_p: float,
                               seed: Optional[Any]) -> Any:
    """dS, the gradient of the scores before scaling, written over ``d_attended`` (dA =
    dO V^T, float32, which the caller no longer needs) when it is contiguous."""
    op = "attention_softmax_backward"
    if not _is_float32(d_attended, probs) or d_attended.shape != probs.shape:
        raise TypeError(f"{op}: expected float32 d_attended and probs of one shape, got "
                        f"{getattr(d_attended, 'dtype', None)} {tuple(d_attended.shape)} and "
                        f"{getattr(probs, 'dtype', None)} {tuple(probs.shape)}")
    threshold, keep_scale, seed = dropout_arguments(op, dropout_p, seed)
    width = probs.shape[-1]
    d = np.ascontiguousarray(d_attended).reshape(-1, width)
    p = np.ascontiguousarray(probs).reshape(-1, width)
    scale = np.float32(scale)
    split_rows(d.shape[0], width, lambda a, b: _softmax_backward(
        d, p, scale, threshold, keep_scale, seed, a, b))
    return d.reshape(probs.shape)


def supports_cross_entropy(logits: Any, target: Any) -> bool:
    """float32 NumPy (M, C) logits and (M,) integer targets."""
    return (_is_float32(logits) and logits.ndim == 2 and logits.size > 0
            and type(target) is np.ndarray and target.dtype.kind in "iu"
            and target.shape == logits.shape[:1])


@jit
def _cross_entropy_forward(z, target, ignore_index, smoothing, nll, lse, start,
                           stop):  # pragma: no cover - compiled
    classes = z.shape[1]
    for r in range(start, stop):
        zr = z[r]
        top = zr[0]
        for j in range(1, classes):
            top = max(top, zr[j])
        total = _ZERO
        for j in range(classes):
            total += exp32(zr[j] - top)
        log_total = top + np.log(total)
        lse[r] = log_total
        t = target[r]
        if t == ignore_index:
            nll[r] = _ZERO
            continue
        loss = log_total - zr[t]
        if smoothing != 0:
            mean = _ZERO
            for j in range(classes):
                mean += zr[j]
            loss = (_ONE - smoothing) * loss + smoothing * (log_total - mean / classes)
        nll[r] = loss


@jit
def _cross_entropy_backward(z, target, lse, row_grad, ignore_index, smoothing, dz, start,
                            stop):  # pragma: no cover - compiled
    classes = z.shape[1]
    spread = smoothing / classes
    for r in range(start, stop):
        zr, dzr = z[r], dz[r]
        t = target[r]
        if t == ignore_index:
            for j in range(classes):
                dzr[j] = _ZERO
            continue
        l, g = lse[r], row_grad[r]
        for j in range(classes):
            dzr[j] = (exp32(zr[j] - l) - spread) * g
        dzr[t] -= (_ONE - smoothing) * g


def cross_entropy_forward(logits: Any, target: Any, ignore_index: int,
                          label_smoothing: float) -> Tuple[Any, Any]:
    """(nll, lse), both (M,) float32: each row's loss (0 where the target is
    ``ignore_index``) and log-sum-exp. The targets must be in range (the op checks them
    before it gets here)."""
    z = np.ascontiguousarray(logits)
    t = np.ascontiguousarray(target, dtype=np.int64)
    nll = np.empty(z.shape[0], dtype=np.float32)
    lse = np.empty_like(nll)
    smoothing = np.float32(label_smoothing)
    split_rows(z.shape[0], z.shape[1], lambda a, b: _cross_entropy_forward(
        z, t, ignore_index, smoothing, nll, lse, a, b))
    return nll, lse


def cross_entropy_backward(logits: Any, target: Any, lse: Any, row_grad: Any,
                           ignore_index: int, label_smoothing: float) -> Any:
    """dL/dlogits (M, C) float32 for ``row_grad``, dL/d(each row's loss): a scalar or (M,)."""
    z = np.ascontiguousarray(logits)
    t = np.ascontiguousarray(target, dtype=np.int64)
    g = np.ascontiguousarray(np.broadcast_to(np.asarray(row_grad, dtype=np.float32),
                                             z.shape[:1]))
    dz = np.empty_like(z)
    smoothing = np.float32(label_smoothing)
    split_rows(z.shape[0], z.shape[1], lambda a, b: _cross_entropy_backward(
        z, t, lse, g, ignore_index, smoothing, dz, a, b))
    return dz
