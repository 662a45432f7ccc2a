"""Memory-efficient scaled-dot-product attention on raw arrays: flash attention for any xp.

softmax(q k^T * scale) v is computed one (query block, key block) tile at a time. Forward
keeps, for each query, a running max m, a running sum l of exp(s - m) and an accumulator
acc of exp(s - m) v; a key block that raises the max rescales l and acc by exp(m_old - m).
It returns the output and each query's log-sum-exp lse = m + log(l), from which backward
recomputes any tile's weights exactly as p = exp(s - lse):
    D = rowsum(dO * O),  dV += P^T dO,  dS = P * (dO V^T - D),  dQ += dS K s,  dK += dS^T Q s.
Memory is the O(L * E) inputs and outputs plus one (block_q, block_k) tile per batch-head,
instead of the vectorised op's (L, S) probabilities per head. Causal attention skips the
key blocks wholly after a query block and masks only the tiles that cross the diagonal.
No autograd here: ``ops/attention.py`` calls these from its Function. ``matmul`` is the
backend's, batched over the leading dims, so each tile is one product for all heads at once.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Tuple

from ..autograd import unbroadcast

Matmul = Callable[[Any, Any], Any]


def _blas_ready(xp: Any, x: Any) -> Any:
    """``x`` itself when its rows have unit stride, as heads split out of a (B, T, 3C)
    projection do (BLAS reads those in place); otherwise a contiguous copy, since NumPy's
    matmul falls back to a slow element loop for other strides."""
    row_stride, col_stride = x.strides[-2:]
    if col_stride == x.itemsize and row_stride >= x.shape[-1] * x.itemsize:
        return x
    return xp.ascontiguousarray(x)


def _key_blocks(xp: Any, q0: int, q1: int, S: int, causal: bool,
                block_k: int) -> Iterator[Tuple[int, int, Optional[Any]]]:
    """(k0, k1, future) for each block of keys k0..k1-1 that queries q0..q1-1 can see.
    ``future`` (q1-q0, k1-k0) is True where the key comes after the query (causal tiles that
    cross the diagonal), else None. Causal is top-left aligned, as the vectorised op: query
    i sees keys 0..i, and every query sees key 0, so the first block has no empty row."""
    end = min(S, q1) if causal else S  # keys >= q1 are after every query of the block
    for k0 in range(0, end, block_k):
        k1 = min(k0 + block_k, end)
        future = None
        if causal and k1 - 1 > q0:
            future = xp.arange(k0, k1)[None, :] > xp.arange(q0, q1)[:, None]  # (bq, bk)
        yield k0, k1, future


def tiled_attention_forward(xp: Any, matmul: Matmul, q: Any, k: Any, v: Any, causal: bool,
                            scale: float, block_q: int = 128,
                            block_k: int = 256) -> Tuple[Any, Any]:
    """q (..., L, E), k (..., S, E), v (..., S, Ev) -> (out (..., L, Ev), lse (..., L)),
    both in q's dtype; lse is the log-sum-exp of each query's scaled scores."""
    q, k, v = (_blas_ready(xp, a) for a in (q, k, v))
    L, S = q.shape[-2], k.shape[-2]
    dtype = q.dtype
    scale = float(scale)  # a Python float keeps float32 float32 (a NumPy float64 would not)
    out = xp.empty(q.shape[:-1] + v.shape[-1:], dtype=dtype)  # (..., L, Ev)
    lse = xp.empty(q.shape[:-1], dtype=dtype)  # (..., L)
    k_t = xp.swapaxes(k, -1, -2)  # (..., E, S), a view
    for q0 in range(0, L, block_q):
        q1 = min(q0 + block_q, L)
        q_blk = q[..., q0:q1, :] * scale  # (..., bq, E): scaled once, not every tile
        m = xp.full(q_blk.shape[:-1] + (1,), -xp.inf, dtype=dtype)  # (..., bq, 1)
        l = xp.zeros_like(m)
        acc = xp.zeros(q_blk.shape[:-1] + v.shape[-1:], dtype=dtype)  # (..., bq, Ev)
        for k0, k1, future in _key_blocks(xp, q0, q1, S, causal, block_k):
            s = matmul(q_blk, k_t[..., k0:k1])  # (..., bq, bk)
            if future is not None:
                xp.copyto(s, -xp.inf, where=future)
            m_new = xp.maximum(m, s.max(axis=-1, keepdims=True))  # (..., bq, 1), finite
            s -= m_new
            p = xp.exp(s, out=s)  # exp(s - m_new), <= 1; 0 where masked
            alpha = xp.exp(m - m_new, out=m)  # rescales the old sums; 0 on the first block
            l *= alpha
            l += p.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += matmul(p, v[..., k0:k1, :])  # (..., bq, Ev)
            m = m_new
        xp.divide(acc, l, out=out[..., q0:q1, :])
        lse_blk = lse[..., q0:q1]  # (..., bq), a view into lse
        xp.log(l[..., 0], out=lse_blk)
        lse_blk += m[..., 0]
    return out, lse


def tiled_attention_backward(xp: Any, matmul: Matmul, q: Any, k: Any, v: Any, out: Any,
                             lse: Any, grad: Any, causal: bool, scale: float,
                             block_q: int = 128,
                             block_k: int = 256) -> Tuple[Any, Any, Any]:
    """Gradients (grad_q, grad_k, grad_v) of the forward above, given its ``out`` and ``lse``
    and the output's gradient ``grad`` (..., L, Ev); contiguous, in the inputs' dtypes."""
    q, k, v, grad = (_blas_ready(xp, a) for a in (q, k, v, grad))
    L, S = q.shape[-2], k.shape[-2]
    scale = float(scale)
    delta = (grad * out).sum(axis=-1, keepdims=True)  # (..., L, 1): D = rowsum(dO * O)
    grad_q = xp.empty(q.shape, dtype=q.dtype)
    grad_k = xp.zeros(k.shape, dtype=k.dtype)
    grad_v = xp.zeros(v.shape, dtype=v.dtype)
    k_t, v_t = xp.swapaxes(k, -1, -2), xp.swapaxes(v, -1, -2)  # (..., E, S), (..., Ev, S)
    for q0 in range(0, L, block_q):
        q1 = min(q0 + block_q, L)
        q_blk = q[..., q0:q1, :] * scale  # (..., bq, E): carries the scale into s and dK
        grad_blk = grad[..., q0:q1, :]  # (..., bq, Ev)
        lse_blk = lse[..., q0:q1, None]  # (..., bq, 1)
        delta_blk = delta[..., q0:q1, :]  # (..., bq, 1)
        dq = xp.zeros_like(q_blk)  # (..., bq, E), without the scale
        for k0, k1, future in _key_blocks(xp, q0, q1, S, causal, block_k):
            s = matmul(q_blk, k_t[..., k0:k1])  # (..., bq, bk)
            if future is not None:
                xp.copyto(s, -xp.inf, where=future)
            s -= lse_blk
            p = xp.exp(s, out=s)  # the forward's weights, recomputed
            gv = grad_v[..., k0:k1, :]  # k and v may broadcast over q's group dim
            gv += unbroadcast(matmul(xp.swapaxes(p, -1, -2), grad_blk), gv.shape)  # (.., bk, Ev)
            ds = matmul(grad_blk, v_t[..., k0:k1])  # dP (..., bq, bk)
            ds -= delta_blk
            ds *= p  # dS without the scale
            dq += matmul(ds, k[..., k0:k1, :])  # (..., bq, E)
            gk = grad_k[..., k0:k1, :]
            gk += unbroadcast(matmul(xp.swapaxes(ds, -1, -2), q_blk), gk.shape)  # (..., bk, E)
        xp.multiply(dq, scale, out=grad_q[..., q0:q1, :])
    return grad_q, grad_k, grad_v

