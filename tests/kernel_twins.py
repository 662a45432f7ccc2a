"""NumPy twins of the algorithms in ``attention.cu``, ``attention_softmax.cu`` and
``cross_entropy.cu`` (``minitorch_gpu/backend/kernels``), for the tests.

Each function here follows its kernel block by block and tile by tile: the same tile
sizes, the same loop bounds (causal early exits included), the same zero-padded tiles
and masks, the same online-softmax updates and the same reduction trees; where the
kernel has a lane or a thread, the twin has an array axis. Comments name the kernel's
variables. They run on any machine, in float32 or float64, and the tests check them
against the vectorised ops (``ops/attention.py``, ``ops/loss.py``): that proves the
algorithm the .cu files implement; the GPU tests then check the kernels against the ops.

These are slow (Python loops over tiles) and exist for testing only.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from minitorch_gpu.backend.kernels.attention import (attention_group, attention_input_code,
                                                     attention_layout)

WARP = 32
# attention.cu
WARPS = 4
TILE = 32
FWD_ROWS = 4
# cross_entropy.cu
CE_THREADS = 256
CE_WARPS = CE_THREADS // WARP


def bwd_rows(head_dim: int) -> int:
    """attention.cu's BWD_ROWS."""
    return 2 if head_dim > 64 else 4


def exp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """exp(a - b), and 0 where a is -inf (the kernels' exp_diff)."""
    with np.errstate(invalid="ignore"):  # -inf - -inf, masked by the where
        return np.where(a == -np.inf, 0, np.exp(a - b)).astype(np.result_type(a, b))


def load_tile(src: np.ndarray, first: int, rows: int) -> np.ndarray:
    """Rows first .. first + rows of src (BH, count, E), zero past the end (load_tile)."""
    tile = np.zeros((src.shape[0], rows, src.shape[2]), dtype=src.dtype)
    part = src[:, first:first + rows]
    tile[:, :part.shape[1]] = part
    return tile


def load_vector(src: np.ndarray, first: int, rows: int) -> np.ndarray:
    """Entries first .. first + rows of src (BH, count), zero past the end."""
    out = np.zeros((src.shape[0], rows), dtype=src.dtype)
    part = src[:, first:first + rows]
    out[:, :part.shape[1]] = part
    return out


def visible(queries: np.ndarray, keys: np.ndarray, S: int, causal: bool) -> np.ndarray:
    """Whether each query (column vector) may attend to each key (row vector)."""
    return (keys < S) & ~(causal & (keys > queries))


def _as_heads(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, x.shape[-2], x.shape[-1])  # (..., n, E) -> (BH, n, E)


def _read_heads(group: int, *arrays: np.ndarray) -> list:
    """``arrays`` (q, k, v[, do]: (..., n, E)) as the kernels read them, through the
    launcher's strides (``attention_layout``; copied first where the launcher copies): q
    and do as (BHG, n, E), query head (b, h, g) at flat index (b * H + h) * G + g, and k, v
    as (BH, n, E), kv head (b, h) at b * H + h (G = ``group``; 1 without grouping). Widened
    to float32 from bf16/fp16 as the kernels' to_float does (float32 and float64 stay)."""
    arrays, heads, strides = attention_layout(arrays, group)
    read_heads = []
    for x, steps in zip(arrays, strides):
        n, E = x.shape[-2:]
        if len(steps) == 3:  # k, v: (batch, head, row)
            steps, G = (steps[0], steps[1], 0, steps[2]), 1
        else:  # q, do: (batch, head, group, row)
            G = group
        shape = (x.size // (n * E * heads * G), heads, G, n, E)
        read = np.lib.stride_tricks.as_strided(
            x, shape, tuple(s * x.itemsize for s in (*steps, 1)), writeable=False)
        read = read.reshape(-1, n, E)
        read_heads.append(read.astype(np.float32) if attention_input_code(x.dtype) in (1, 2)
                          else read)
    return read_heads


# --- attention.cu -------------------------------------------------------------------------
def flash_attention_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool,
                            scale: float) -> Tuple[np.ndarray, np.ndarray]:
    """Twin of ``flash_attention_forward``: (o (..., L, E), lse (..., L)), in float32 for
    float32/bf16/fp16 inputs (float64 ones stay float64), read as the kernel reads them.
    Grouped-query attention as q (..., Hkv, G, L, E) over k, v (..., Hkv, 1, S, E): query
    head (h, g) reads kv head h."""
    batch = q.shape[:-2]
    group = attention_group(q, k, v)
    q, k, v = _read_heads(group, q, k, v)
    k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)  # block bh reads bh // G
    BH, L, E = q.shape
    S = k.shape[1]
    dtype = q.dtype
    o = np.empty_like(q)
    lse = np.empty((BH, L), dtype=dtype)
    BR = WARPS * FWD_ROWS
    for q0 in range(0, L, BR):  # blockIdx.x; every bh at once
        q_s = load_tile(q, q0, BR)  # (BH, BR, E)
        rows = np.arange(q0, q0 + BR)[:, None]  # (BR, 1): the row of each (warp, r)
        m = np.full((BH, BR), -np.inf, dtype=dtype)
        l = np.zeros((BH, BR), dtype=dtype)
        acc = np.zeros((BH, BR, E), dtype=dtype)
        kv_end = min(S, q0 + BR) if causal else S
        for kv0 in range(0, kv_end, TILE):
            k_s, v_s = load_tile(k, kv0, TILE), load_tile(v, kv0, TILE)  # (BH, TILE, E)
            keys = np.arange(kv0, kv0 + TILE)[None, :]  # (1, TILE): key = kv0 + lane
            s = np.where(visible(rows, keys, S, causal),
                         (q_s @ np.swapaxes(k_s, 1, 2)) * dtype.type(scale), -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))  # warp_max
            p = exp_diff(s, m_new[..., None])  # each lane's key weight
            alpha = exp_diff(m, m_new)
            l = l * alpha + p.sum(axis=-1)  # warp_sum
            acc = acc * alpha[..., None] + p @ v_s  # the shuffled p_j times v_s[j]
            m = m_new
        n = min(BR, L - q0)  # rows past L are not written
        o[:, q0:q0 + n] = acc[:, :n] / l[:, :n, None]
        lse[:, q0:q0 + n] = m[:, :n] + np.log(l[:, :n])
    return o.reshape(*batch, L, E), lse.reshape(*batch, L)


def flash_attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray,
                             do: np.ndarray, lse: np.ndarray, causal: bool,
                             scale: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Twin of the three backward kernels: (dq, dk, dv), contiguous, in the forward's
    dtype; do is read in q's dtype, as the launcher casts it. Grouped (q (..., Hkv, G, L,
    E), k, v (..., Hkv, 1, S, E)): dk, dv of k's shape, each kv block summing the G query
    heads of its group in turn."""
    q_shape, k_shape = q.shape, k.shape
    group = attention_group(q, k, v)
    q, k_kv, v_kv, do = _read_heads(group, q, k, v, do.astype(q.dtype, copy=False))
    k, v = np.repeat(k_kv, group, axis=0), np.repeat(v_kv, group, axis=0)  # dq reads bh // G
    o = _as_heads(o)
    BH, L, E = q.shape
    S = k.shape[1]
    dtype = q.dtype
    lse = lse.reshape(BH, L)
    scale = dtype.type(scale)
    delta = (do * o).sum(axis=-1)  # flash_attention_backward_preprocess: D, (BH, L)
    rows_per_warp = bwd_rows(E)

    # flash_attention_backward_dq: blocks of query rows, walking K/V tiles
    dq = np.empty_like(q)
    BR = WARPS * rows_per_warp
    for q0 in range(0, L, BR):
        q_s, do_s = load_tile(q, q0, BR), load_tile(do, q0, BR)
        row_lse, row_delta = load_vector(lse, q0, BR), load_vector(delta, q0, BR)
        rows = np.arange(q0, q0 + BR)[:, None]
        acc = np.zeros((BH, BR, E), dtype=dtype)
        kv_end = min(S, q0 + BR) if causal else S
        for kv0 in range(0, kv_end, TILE):
            k_s, v_s = load_tile(k, kv0, TILE), load_tile(v, kv0, TILE)
            keys = np.arange(kv0, kv0 + TILE)[None, :]
            s = q_s @ np.swapaxes(k_s, 1, 2)  # (BH, BR, TILE): lane j, key j
            dp = do_s @ np.swapaxes(v_s, 1, 2)
            p = np.exp(s * scale - row_lse[..., None])
            ds = np.where(visible(rows, keys, S, causal), p * (dp - row_delta[..., None]), 0)
            acc += ds @ k_s  # the shuffled ds_j times k_s[j]
        n = min(BR, L - q0)
        dq[:, q0:q0 + n] = acc[:, :n] * scale

    # flash_attention_backward_dkdv: blocks of keys of a kv head, walking the Q tiles of
    # each of its group's G query heads in turn
    KBH = k_kv.shape[0]
    dk, dv = np.empty_like(k_kv), np.empty_like(v_kv)
    BK = WARPS * rows_per_warp
    q_g, do_g = (a.reshape(KBH, group, L, E) for a in (q, do))  # query head (bh, g)
    lse_g, delta_g = (a.reshape(KBH, group, L) for a in (lse, delta))
    for k0 in range(0, S, BK):
        k_s, v_s = load_tile(k_kv, k0, BK), load_tile(v_kv, k0, BK)  # (KBH, BK, E)
        keys = np.arange(k0, k0 + BK)[:, None]  # (BK, 1): the key of each (warp, r)
        dk_acc = np.zeros((KBH, BK, E), dtype=dtype)
        dv_acc = np.zeros((KBH, BK, E), dtype=dtype)
        for g in range(group):
            for q0 in range(k0 if causal else 0, L, TILE):
                q_s, do_s = load_tile(q_g[:, g], q0, TILE), load_tile(do_g[:, g], q0, TILE)
                lse_s = load_vector(lse_g[:, g], q0, TILE)
                delta_s = load_vector(delta_g[:, g], q0, TILE)
                queries = np.arange(q0, q0 + TILE)[None, :]  # (1, TILE): query = q0 + lane
                mask = (queries < L) & visible(queries, keys, S, causal)
                s = k_s @ np.swapaxes(q_s, 1, 2)  # (KBH, BK, TILE)
                dp = v_s @ np.swapaxes(do_s, 1, 2)
                p = np.where(mask, np.exp(s * scale - lse_s[:, None, :]), 0)
                ds = np.where(mask, p * (dp - delta_s[:, None, :]), 0)
                dv_acc += p @ do_s  # the shuffled p_i times do_s[i]
                dk_acc += ds @ q_s
        n = min(BK, S - k0)  # keys past S are not written
        dk[:, k0:k0 + n] = dk_acc[:, :n] * scale
        dv[:, k0:k0 + n] = dv_acc[:, :n]
    return dq.reshape(q_shape), dk.reshape(k_shape), dv.reshape(k_shape)


# --- cross_entropy.cu ---------------------------------------------------------------------
def _merge(m: np.ndarray, s: np.ndarray, other_m: np.ndarray,
           other_s: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The kernel's merge of two (max, sum of exp(z - max)) pairs."""
    merged = np.maximum(m, other_m)
    return merged, s * exp_diff(m, merged) + other_s * exp_diff(other_m, merged)


def _shuffle_down_tree(m: np.ndarray, s: np.ndarray,
                       z: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offsets 16, 8, 4, 2, 1 of __shfl_down_sync over the last axis (32 lanes): lane i
    merges lane i + offset. Only lanes < offset feed lane 0, so only they are kept."""
    for offset in (16, 8, 4, 2, 1):
        lo, hi = slice(0, offset), slice(offset, 2 * offset)
        merged_m, merged_s = _merge(m[..., lo], s[..., lo], m[..., hi], s[..., hi])
        z = z[..., lo] + z[..., hi]
        m, s = merged_m, merged_s
    return m[..., 0], s[..., 0], z[..., 0]


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -100,
                          label_smoothing: float = 0.0) -> Tuple[np.ndarray, np.ndarray]:
    """Twin of ``cross_entropy_forward``: (loss (M,), lse (M,)), one row per block."""
    M, C = logits.shape
    dtype = logits.dtype
    steps = -(-C // CE_THREADS)
    padded = np.full((M, steps * CE_THREADS), -np.inf, dtype=dtype)
    padded[:, :C] = logits
    padded = padded.reshape(M, steps, CE_THREADS)  # column c = step * CE_THREADS + t
    m = np.full((M, CE_THREADS), -np.inf, dtype=dtype)  # thread t's online max
    s = np.zeros((M, CE_THREADS), dtype=dtype)  # and sum of exp(z - m)
    z_sum = np.zeros((M, CE_THREADS), dtype=dtype)
    for step in range(steps):  # each thread's loop over its columns
        in_row = step * CE_THREADS + np.arange(CE_THREADS) < C
        z = padded[:, step]
        new_m, new_s = _merge(m, s, z, np.ones_like(z))
        m, s = np.where(in_row, new_m, m), np.where(in_row, new_s, s)
        z_sum = z_sum + np.where(in_row, z, 0)
    # per warp: the shuffle-down tree; lane 0 of warp w holds the warp's pair
    warp_m, warp_s, warp_z = _shuffle_down_tree(*(a.reshape(M, CE_WARPS, WARP)
                                                  for a in (m, s, z_sum)))
    # warp 0: lanes < CE_WARPS take the warps' pairs, the others the identity
    m = np.full((M, WARP), -np.inf, dtype=dtype)
    s = np.zeros((M, WARP), dtype=dtype)
    z_sum = np.zeros((M, WARP), dtype=dtype)
    m[:, :CE_WARPS], s[:, :CE_WARPS], z_sum[:, :CE_WARPS] = warp_m, warp_s, warp_z
    m, s, z_sum = _shuffle_down_tree(m, s, z_sum)
    lse = m + np.log(s)
    valid = targets != ignore_index
    outside = valid & ((targets < 0) | (targets >= C))  # the kernel's NaN, no read
    picked = logits[np.arange(M), np.where(valid & ~outside, targets, 0)]
    ls = dtype.type(label_smoothing)
    loss = (1 - ls) * (lse - picked)
    if label_smoothing != 0.0:
        loss = loss + ls * (lse - z_sum / dtype.type(C))
    loss = np.where(outside, dtype.type(np.nan), loss)
    return np.where(valid, loss, 0).astype(dtype), lse


def cross_entropy_backward(logits: np.ndarray, targets: np.ndarray, lse: np.ndarray,
                           dloss: np.ndarray, ignore_index: int = -100,
                           label_smoothing: float = 0.0) -> np.ndarray:
    """Twin of ``cross_entropy_backward``: dL/dlogits (M, C)."""
    M, C = logits.shape
    dtype = logits.dtype
    dloss = np.broadcast_to(np.asarray(dloss, dtype=dtype), (M,))
    ls = dtype.type(label_smoothing)
    g = np.exp(logits - lse[:, None]) - ls / dtype.type(C)  # softmax - smoothing
    valid = targets != ignore_index
    rows = np.flatnonzero(valid)
    g[rows, targets[rows]] -= 1 - ls  # - one-hot
    g *= dloss[:, None]
    g[~valid] = 0  # an ignored position gets no gradient
    return g


# --- attention_softmax.cu: the work between attention's two cuBLAS products ----------------
DROPOUT_BITS = 24
_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), \
    np.uint64(0x94D049BB133111EB)


def dropout_keep(seed: np.ndarray, shape: tuple, dropout_p: float) -> np.ndarray:
    """The kernel's kept(): True where element i (row-major index in ``shape``) survives,
    i.e. where the top 24 bits of splitmix64(seed + (i + 1) * golden) reach round(p 2^24)."""
    threshold = np.uint64(round(dropout_p * (1 << DROPOUT_BITS)))
    z = np.arange(1, int(np.prod(shape)) + 1, dtype=np.uint64) * _GOLDEN  # wraps, as in C
    z += np.asarray(seed, dtype=np.uint64).reshape(())
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z ^= z >> np.uint64(31)
    return ((z >> np.uint64(40)) >= threshold).reshape(shape)


def attention_softmax_forward(scores: np.ndarray, causal: bool, scale: float,
                              dropout_p: float, seed, dtype) -> Tuple[np.ndarray, np.ndarray]:
    """(P, A) as the kernel writes them: P = softmax(scores * scale) over each query's
    visible keys (0..i when causal), rounded once to ``dtype``; A = P * keep / (1 - p) from
    the float32 P, rounded once (A is P without dropout)."""
    s = scores.astype(np.float32) * np.float32(scale)
    L, S = s.shape[-2:]
    visible = np.tril(np.ones((L, S), bool)) if causal else np.ones((L, S), bool)
    m = np.where(visible, s, -np.inf).max(axis=-1, keepdims=True)
    e = np.where(visible, np.exp(np.where(visible, s - m, 0)), np.float32(0))
    p = e * (np.float32(1) / e.sum(axis=-1, keepdims=True, dtype=np.float32))
    probs = p.astype(dtype)
    if not round(dropout_p * (1 << DROPOUT_BITS)):
        return probs, probs
    keep = dropout_keep(seed, p.shape, dropout_p)
    return probs, np.where(keep, p * np.float32(1 / (1 - dropout_p)), 0).astype(dtype)


def attention_softmax_backward(d_attended: np.ndarray, probs: np.ndarray, scale: float,
                               dropout_p: float, seed) -> np.ndarray:
    """dS = scale * P * (dP - rowsum(dP * P)), dP = dA * keep / (1 - p), in P's dtype."""
    dp = d_attended.astype(np.float32)
    if round(dropout_p * (1 << DROPOUT_BITS)):
        keep = dropout_keep(seed, dp.shape, dropout_p)
        dp = np.where(keep, dp * np.float32(1 / (1 - dropout_p)), np.float32(0))
    p = probs.astype(np.float32)
    dot = (dp * p).sum(axis=-1, keepdims=True, dtype=np.float32)
    return (np.float32(scale) * p * (dp - dot)).astype(probs.dtype)


# --- Llama's kernels: rmsnorm.cu, rotary.cu, swiglu.cu --------------------------------------
# They read float32 or bf16 (widened exactly) and compute in float32; a float64 input
# stays float64 here, so the twins can be checked to 1e-10 against the formulas.
RMS_WARPS_PER_BLOCK = 8
RMS_COLUMN_THREADS = 256


def _widened(x: np.ndarray) -> np.ndarray:
    """x as the kernels' to_float reads it: bf16 to float32 exactly; float32 and float64
    as they are."""
    return x.astype(np.float32) if x.dtype.name == "bfloat16" else x


def _warp_sum(v: np.ndarray) -> np.ndarray:
    """warp_sum's butterfly over the last axis (32 lanes), as lane 0 ends with it: offsets
    16, 8, 4, 2, 1, lane i adding lane i ^ offset (a + b == b + a, so every lane agrees)."""
    for offset in (16, 8, 4, 2, 1):
        v = v[..., :offset] + v[..., offset:2 * offset]
    return v[..., 0]


def _lane_sums(terms: np.ndarray) -> np.ndarray:
    """Each lane's running sum of the columns l, l + 32, ... of terms (N, C), in order:
    (N, 32). Columns past C add nothing (the lane's loop ends)."""
    N, C = terms.shape
    sums = np.zeros((N, WARP), dtype=terms.dtype)
    for first in range(0, C, WARP):
        part = terms[:, first:first + WARP]
        sums[:, :part.shape[1]] += part
    return sums


def rms_norm_forward(x: np.ndarray, weight, eps: float, n: int):
    """Twin of ``rms_norm_forward``: (out in x's dtype and shape, rstd (rows,)), one warp
    per row: lane sums of squares, warp_sum, rstd, out = (x * rstd) * weight."""
    shape, stored = x.shape, x.dtype
    x = _widened(x).reshape(-1, n)
    dtype = x.dtype
    w = np.ones(n, dtype) if weight is None else weight.reshape(n).astype(dtype)
    total = _warp_sum(_lane_sums(x * x))
    rstd = dtype.type(1) / np.sqrt(total / dtype.type(n) + dtype.type(eps))
    out = x * rstd[:, None] * w
    return out.astype(stored).reshape(shape), rstd


def rms_norm_backward(grad: np.ndarray, x: np.ndarray, weight, rstd: np.ndarray, n: int):
    """Twin of ``rms_norm_backward``: (dx of x's shape, dweight (n,) or None), in the
    computing dtype; grad is read in x's dtype, as the launcher casts it. dx: one warp per
    row (lane sums of g_hat * x_hat, warp_sum); dweight: thread (c, chunk) sums its chunk's
    rows in order, then the chunks are summed."""
    from minitorch_gpu.backend.kernels.rmsnorm import rms_norm_chunks
    shape = x.shape
    dy = _widened(grad.astype(x.dtype, copy=False)).reshape(-1, n)
    x = _widened(x).reshape(-1, n)
    dtype = x.dtype
    rstd = rstd.astype(dtype)
    w = np.ones(n, dtype) if weight is None else weight.reshape(n).astype(dtype)
    x_hat = x * rstd[:, None]
    g_hat = dy * w
    mean_gx = _warp_sum(_lane_sums(g_hat * x_hat)) / dtype.type(n)
    dx = rstd[:, None] * (g_hat - x_hat * mean_gx[:, None])
    if weight is None:
        return dx.reshape(shape), None
    rows = x.shape[0]
    rows_per_chunk, chunks = rms_norm_chunks(rows)
    partial = np.zeros((chunks, n), dtype)
    terms = dy * x_hat
    for row in range(rows_per_chunk):  # each thread's loop, every chunk at once
        part = terms[row::rows_per_chunk]
        partial[:part.shape[0]] += part
    return dx.reshape(shape), partial.sum(axis=0)


def rotary_forward(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, inverse: bool):
    """Twin of ``rotary_forward`` (one thread per (row, pair): vectorised): x (B, T, H, D),
    cos and sin (T, D / 2); out in x's dtype, computed in float32 (float64 for float64)."""
    stored = x.dtype
    x = _widened(x)
    half = x.shape[-1] // 2
    c = cos.astype(x.dtype)[None, :, None, :]  # (1, T, 1, half): position t of each row
    s = sin.astype(x.dtype)[None, :, None, :]
    if inverse:
        s = -s
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(stored)


def _stable_sigmoid(g: np.ndarray) -> np.ndarray:
    """swiglu.cu's stable_sigmoid: exp(min(g, 0)) / (1 + exp(-|g|))."""
    return np.exp(np.minimum(g, 0)) / (g.dtype.type(1) + np.exp(-np.abs(g)))


def swiglu_forward(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Twin of ``swiglu_forward``: (gate * s) * up in gate's dtype."""
    g, u = _widened(gate), _widened(up)
    return (g * _stable_sigmoid(g) * u).astype(gate.dtype)


def swiglu_backward(grad: np.ndarray, gate: np.ndarray, up: np.ndarray):
    """Twin of ``swiglu_backward``: (dgate, dup) in the computing dtype; grad is read in
    gate's dtype, as the launcher casts it."""
    g, u = _widened(gate), _widened(up)
    d = _widened(grad.astype(gate.dtype, copy=False))
    s = _stable_sigmoid(g)
    one = g.dtype.type(1)
    return d * u * s * (one + g * (one - s)), d * g * s
