"""Flash attention on the CPU: forward and backward in tiles with an online softmax, the
launchers of ``backend/kernels/attention.py`` (``flash_attention_forward`` and
``flash_attention_backward``, same arguments and results), so ``ops/attention.py``'s kernel
branch serves both devices. It adds what the dense path has and the CUDA flash kernels do
not: dropout, by the CUDA kernels' hash (``dropout.kept``), so both devices drop the same
elements for a seed.

q, k, v and dO are read where they lie: the layout is the CUDA launcher's
(``attention_layout``: GPT's (B, nh, T, hs) heads of the packed (B, T, 3C) projection by
their strides, no copies; grouped-query attention as q (..., Hkv, G, L, E) over k, v
(..., Hkv, 1, S, E)). Each array is handed to the compiled loops as a flat view from its
first element, with its strides in elements.

Every tile product is ``_dot_tile``'s: dot products along contiguous rows (an operand
that the product needs the other way is transposed into a tile first), in 2 x 4 blocks
that LLVM vectorises with the partial sums in registers.

Forward: a (batch, head, query block) at a time, the units taken in chunks by every core.
The block's queries (``BLOCK_Q`` rows, pre-scaled) meet the keys ``BLOCK_K`` at a time:
the scores tile, then the running max m, the running sum l and the accumulator acc
updated as in ``attention.cu`` (acc += P V against the value tile transposed); causal key
blocks after the diagonal are never visited, and the diagonal tile's scores past the mask
are not computed. o = acc / l and lse = m + log(l) are written.

Backward: a (batch, kv head) at a time, the units taken in chunks by every core, so dK and
dV (summed over a group's G query heads) and dQ each have one writer and no locks. For
each query block of each of the group's query heads, the key blocks it sees: P rebuilt
from the saved lse, dP = dO V^T, dV += P^T dO, dS = P (dP - D) with D = rowsum(dO o),
dQ += scale dS K, dK += scale dS^T Q (the scale folded into dS).

Arithmetic is float32 (the accumulators too); inputs are float32 NumPy arrays, or bf16
ones (autocast's), which the kernels read as stored (viewed as uint16) and widen as they
load them, as the CUDA kernels do.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ..blas_split import _blas
from ..dtypes import bfloat16
from ..kernels.attention import attention_group, attention_layout
from .compiler import exp32, jit, split_chunks, widen
from .dropout import dropout_arguments, kept

BLOCK_Q = 64  # query rows per tile: each key tile loaded is reused over them
BLOCK_K = 64  # keys per tile: the scores row of a query (64 floats) stays in L1
# The dispatch rule, measured (scripts/bench_ops.py --attention-sweep; docs/DESIGN.md has
# the crossover): the fused kernel takes attention whose queries and keys both number at
# least FUSED_FROM (twice that for heads wider than WIDE_HEAD); the dense path (BLAS
# products around the softmax kernel) was as fast or faster below. Which BLAS kernels run
# the dense path's products moves the crossover: with OpenBLAS's AVX-512 kernels they run
# twice as fast as with its AVX2 ones, on this processor the same numba code
FUSED_FROM = {"avx2": 128, "avx512": 512}
WIDE_HEAD = 64
AVX512_KERNELS = frozenset({"SkylakeX", "Cooperlake", "SapphireRapids"})  # OpenBLAS's
_ZERO, _ONE = np.float32(0.0), np.float32(1.0)
_NEG_INF = np.float32(-np.inf)
_ALL = 1 << 40  # a _dot_tile bound that binds nothing


INPUT_DTYPES = (np.dtype(np.float32), bfloat16)  # read as stored; bf16 widened as loaded


def _readable(*arrays: Any) -> bool:
    """NumPy arrays of one dtype the kernels read (INPUT_DTYPES)."""
    return all(type(a) is np.ndarray and a.dtype == arrays[0].dtype for a in arrays) and \
        arrays[0].dtype in INPUT_DTYPES


def supports_flash_attention(q: Any, k: Any, v: Any, mask: Optional[Any],
                             dropout_p: float) -> bool:
    """NumPy q, k, v of one dtype, float32 or bf16 (autocast's: read as stored, the
    arithmetic float32), in the launcher's forms (one batch shape, or grouped: q
    (..., Hkv, G, L, E), k and v (..., Hkv, 1, S, E)), one head size, no attn_mask, causal
    or not, dropout or not; and where the kernel is the faster path (the measured rule:
    ``fused_is_faster``)."""
    if mask is not None or not _readable(q, k, v) or not 0.0 <= dropout_p < 1.0:
        return False
    if q.ndim < 2 or not attention_group(q, k, v) or q.size == 0 or k.size == 0:
        return False
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1] and k.shape[-2] == v.shape[-2]):
        return False
    return fused_is_faster(q.shape[-2], k.shape[-2], q.shape[-1])


def fused_is_faster(queries: int, keys: int, head_dim: int) -> bool:
    """Whether the fused kernel beats the dense path at this size. Measured with as many
    queries as keys, on OpenBLAS's AVX2 kernels: level at T = 64, the kernel ahead from 96
    to 128 at head sizes 32 and 64, from 128 to 256 at 128; on its AVX-512 kernels: the
    dense path ahead to T = 256, the kernel from 512. The shorter side decides elsewhere."""
    least = FUSED_FROM["avx512" if blas_kernels() in AVX512_KERNELS else "avx2"]
    return min(queries, keys) >= least * (2 if head_dim > WIDE_HEAD else 1)


def blas_kernels() -> Optional[str]:
    """The kernel architecture NumPy's BLAS runs (OpenBLAS's "Haswell", "SkylakeX", ...;
    threadpoolctl's, read once), None where it does not say (MKL, BLIS, none found)."""
    blas = _blas()
    return getattr(blas, "architecture", None) if blas else None


def _flat(a: Any) -> Any:
    """A 1-D view of the memory ``a`` spans, from its first element (strides >= 0)."""
    span = 1 + sum((n - 1) * s // a.itemsize for n, s in zip(a.shape, a.strides))
    return np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(a.itemsize,))


def _layout(arrays: list, group: int) -> Tuple[list, int, tuple]:
    """The CUDA launcher's layout (``attention_layout``), arrays with a negative stride
    copied first; returns the flat views, the head count and the strides (int64)."""
    arrays = [np.ascontiguousarray(a) if min(a.strides, default=0) < 0 else a
              for a in arrays]
    arrays, heads, strides = attention_layout(arrays, group)
    flat = [_flat(a.view(np.uint16) if a.dtype == bfloat16 else a) for a in arrays]
    return flat, heads, tuple(np.int64(s) for a in strides for s in a)


def _check(op: str, q: Any, k: Any, v: Any) -> Tuple[int, int, int, int]:
    """(query heads, L, S, E) after checking dtypes and shapes; raises naming the argument."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not _readable(a, q):
            raise TypeError(f"{op}: {name} must be a float32 or bfloat16 NumPy array of q's "
                            f"dtype, got {type(a).__name__} of {getattr(a, 'dtype', None)} "
                            f"(q: {getattr(q, 'dtype', None)})")
    if q.ndim < 2 or not q.ndim == k.ndim == v.ndim or not attention_group(q, k, v):
        raise ValueError(f"{op}: q, k, v must share their batch dims, or be grouped: q "
                         f"(..., Hkv, G, L, E) with k, v (..., Hkv, 1, S, E); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    E = q.shape[-1]
    if not (E >= 1 and k.shape[-1] == v.shape[-1] == E and k.shape[-2] == v.shape[-2]):
        raise ValueError(f"{op}: expected k and v of shape (..., S, {E}), got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    L, S = q.shape[-2], k.shape[-2]
    if L < 1 or S < 1:
        raise ValueError(f"{op}: needs at least one query and one key, got L={L}, S={S}")
    return q.size // (L * E), L, S, E


@jit
def _dot_tile(a, b, c, m, n, r, add, cols_to):  # pragma: no cover - compiled
    """c[i, j] (+)= sum over e < r of a[i, e] b[j, e], for i < m and j < min(n, i +
    cols_to): the bound skips the scores a causal mask hides in a diagonal tile (``_ALL``
    for none; a block of two rows takes its second row's, so an entry or two past a row's
    last key are computed: the callers mask them). Each dot product is a reduction along
    contiguous rows from index 0, which LLVM vectorises with its partial sums in
    registers, in blocks of 2 rows of a by 4 of b, so each row loaded serves several
    products (2 x 4 measured 1.15x 2 x 2's speed, and level with 3 x 3 and 4 x 4; bounding
    the reductions too, on a diagonal tile, measured slower than summing the zeros)."""
    i = 0
    while i < m:
        pair = i + 1 < m
        width = max(min(n, i + cols_to), 0)
        a0, c0 = a[i], c[i]
        a1, c1 = (a[i + 1], c[i + 1]) if pair else (a0, c0)
        j = 0
        while j + 3 < width:
            b0, b1, b2, b3 = b[j], b[j + 1], b[j + 2], b[j + 3]
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = _ZERO
            for e in range(r):
                x, y = a0[e], a1[e]
                s00 += x * b0[e]
                s01 += x * b1[e]
                s02 += x * b2[e]
                s03 += x * b3[e]
                s10 += y * b0[e]
                s11 += y * b1[e]
                s12 += y * b2[e]
                s13 += y * b3[e]
            if add:
                s00 += c0[j]
                s01 += c0[j + 1]
                s02 += c0[j + 2]
                s03 += c0[j + 3]
                s10 += c1[j]
                s11 += c1[j + 1]
                s12 += c1[j + 2]
                s13 += c1[j + 3]
            c0[j], c0[j + 1], c0[j + 2], c0[j + 3] = s00, s01, s02, s03
            if pair:
                c1[j], c1[j + 1], c1[j + 2], c1[j + 3] = s10, s11, s12, s13
            j += 4
        while j < width:
            b0 = b[j]
            s00 = s10 = _ZERO
            for e in range(r):
                s00 += a0[e] * b0[e]
                s10 += a1[e] * b0[e]
            c0[j] = c0[j] + s00 if add else s00
            if pair:
                c1[j] = c1[j] + s10 if add else s10
            j += 1
        i += 2


@jit
def _load_rows(src, at, stride, rows, scale, dst):  # pragma: no cover - compiled
    """dst[i] = scale * src[at + i * stride : ... + E], i < rows (a tile of rows read in
    place; the row's elements are contiguous)."""
    E = dst.shape[1]
    for i in range(rows):
        row, out = src[at + i * stride:], dst[i]
        for e in range(E):
            out[e] = widen(row[e]) * scale


@jit
def _load_columns(src, at, stride, rows, dst):  # pragma: no cover - compiled
    """dst[e, i] = src[at + i * stride + e]: a tile of rows, transposed."""
    E = dst.shape[0]
    for i in range(rows):
        row = src[at + i * stride:]
        for e in range(E):
            dst[e, i] = widen(row[e])


@jit
def _flash_attention_forward(q, k, v, o, lse, L, S, E, heads, group, scale, causal,
                             threshold, keep_scale, seed, q_batch, q_head, q_group, q_row,
                             k_batch, k_head, k_row, v_batch, v_head, v_row, start,
                             stop):  # pragma: no cover - compiled
    tiles = (L + BLOCK_Q - 1) // BLOCK_Q
    qt = np.empty((BLOCK_Q, E), np.float32)  # the block's queries, times scale
    kb = np.empty((BLOCK_K, E), np.float32)  # a key tile
    vt = np.empty((E, BLOCK_K), np.float32)  # a value tile, transposed
    s = np.empty((BLOCK_Q, BLOCK_K), np.float32)  # scores, then weights
    acc = np.zeros((BLOCK_Q, E), np.float32)
    m = np.empty(BLOCK_Q, np.float32)
    total = np.empty(BLOCK_Q, np.float32)
    for unit in range(start, stop):
        tile = unit % tiles
        problem = unit // tiles  # the query head, (b * heads + h) * group + g
        g = problem % group
        h = (problem // group) % heads
        b = problem // (group * heads)
        q0 = tile * BLOCK_Q
        rows = min(BLOCK_Q, L - q0)
        k_at = b * k_batch + h * k_head
        v_at = b * v_batch + h * v_head
        _load_rows(q, b * q_batch + h * q_head + g * q_group + q0 * q_row, q_row, rows,
                   scale, qt)
        for i in range(rows):
            m[i] = _NEG_INF
            total[i] = _ZERO
            accr = acc[i]
            for e in range(E):
                accr[e] = _ZERO
        kv_end = min(S, q0 + rows) if causal else S  # later keys: masked for every row
        for k0 in range(0, kv_end, BLOCK_K):
            cols = min(BLOCK_K, kv_end - k0)
            _load_rows(k, k_at + k0 * k_row, k_row, cols, _ONE, kb)
            _load_columns(v, v_at + k0 * v_row, v_row, cols, vt)
            diagonal = q0 - k0 if causal else _ALL  # key j + k0 masked past row i + q0
            _dot_tile(qt, kb, s, rows, cols, E, False, 2 + diagonal)
            for i in range(rows):
                sr, accr = s[i], acc[i]
                seen = min(cols, q0 + i + 1 - k0) if causal else cols
                if seen <= 0:
                    for j in range(cols):
                        sr[j] = _ZERO
                    continue
                top = m[i]
                for j in range(seen):
                    top = max(top, sr[j])
                alpha = exp32(m[i] - top) if m[i] > _NEG_INF else _ZERO
                added = _ZERO
                for j in range(seen):
                    p = exp32(sr[j] - top)
                    sr[j] = p
                    added += p
                for j in range(seen, cols):
                    sr[j] = _ZERO
                m[i] = top
                total[i] = total[i] * alpha + added
                if threshold:
                    base = (np.uint64(problem) * np.uint64(L) + np.uint64(q0 + i)) * \
                        np.uint64(S) + np.uint64(k0)
                    for j in range(seen):
                        if kept(seed, base + np.uint64(j), threshold):
                            sr[j] *= keep_scale
                        else:
                            sr[j] = _ZERO
                for e in range(E):
                    accr[e] *= alpha
            _dot_tile(s, vt, acc, rows, E, cols, True, _ALL)  # acc += P V
        for i in range(rows):
            inverse = _ONE / total[i]
            accr, dst = acc[i], o[problem * L + q0 + i]
            for e in range(E):
                dst[e] = accr[e] * inverse
            lse[problem * L + q0 + i] = m[i] + np.log(total[i])


@jit
def _flash_attention_backward(q, k, v, do, o, lse, dq, dk, dv, L, S, E, heads, group,
                              scale, causal, threshold, keep_scale, seed, q_batch, q_head,
                              q_group, q_row, k_batch, k_head, k_row, v_batch, v_head, v_row,
                              d_batch, d_head, d_group, d_row, start,
                              stop):  # pragma: no cover - compiled
    qb = np.empty((BLOCK_Q, E), np.float32)  # the query tile
    qt = np.empty((E, BLOCK_Q), np.float32)  # ... transposed
    dob = np.empty((BLOCK_Q, E), np.float32)  # its output gradient
    dot = np.empty((E, BLOCK_Q), np.float32)  # ... transposed
    dqb = np.empty((BLOCK_Q, E), np.float32)  # its gradient, summed over the key tiles
    kb = np.empty((BLOCK_K, E), np.float32)
    kt = np.empty((E, BLOCK_K), np.float32)
    vb = np.empty((BLOCK_K, E), np.float32)
    p = np.empty((BLOCK_Q, BLOCK_K), np.float32)  # the weights, then dS
    dp = np.empty((BLOCK_Q, BLOCK_K), np.float32)
    pt = np.empty((BLOCK_K, BLOCK_Q), np.float32)  # the kept weights, then dS, transposed
    delta = np.empty(BLOCK_Q, np.float32)  # D = rowsum(dO o)
    for kv_head in range(start, stop):
        h = kv_head % heads
        b = kv_head // heads
        k_at = b * k_batch + h * k_head
        v_at = b * v_batch + h * v_head
        for j in range(kv_head * S, (kv_head + 1) * S):
            dkr, dvr = dk[j], dv[j]
            for e in range(E):
                dkr[e] = _ZERO
                dvr[e] = _ZERO
        for g in range(group):
            problem = kv_head * group + g
            for q0 in range(0, L, BLOCK_Q):
                rows = min(BLOCK_Q, L - q0)
                q_at = b * q_batch + h * q_head + g * q_group + q0 * q_row
                d_at = b * d_batch + h * d_head + g * d_group + q0 * d_row
                _load_rows(q, q_at, q_row, rows, _ONE, qb)
                _load_columns(q, q_at, q_row, rows, qt)
                _load_rows(do, d_at, d_row, rows, _ONE, dob)
                _load_columns(do, d_at, d_row, rows, dot)
                for i in range(rows):
                    dor, orow, dqr = dob[i], o[problem * L + q0 + i], dqb[i]
                    total = _ZERO
                    for e in range(E):
                        total += dor[e] * orow[e]
                        dqr[e] = _ZERO
                    delta[i] = total
                kv_end = min(S, q0 + rows) if causal else S
                for k0 in range(0, kv_end, BLOCK_K):
                    cols = min(BLOCK_K, kv_end - k0)
                    _load_rows(k, k_at + k0 * k_row, k_row, cols, _ONE, kb)
                    _load_columns(k, k_at + k0 * k_row, k_row, cols, kt)
                    _load_rows(v, v_at + k0 * v_row, v_row, cols, _ONE, vb)
                    diagonal = q0 - k0 if causal else _ALL
                    _dot_tile(qb, kb, p, rows, cols, E, False, 2 + diagonal)  # scores / scale
                    _dot_tile(dob, vb, dp, rows, cols, E, False, 2 + diagonal)  # dO V^T
                    for i in range(rows):
                        pr, dpr = p[i], dp[i]
                        seen = min(cols, q0 + i + 1 - k0) if causal else cols
                        seen = max(seen, 0)
                        row_lse, row_delta = lse[problem * L + q0 + i], delta[i]
                        for j in range(seen):
                            pr[j] = exp32(pr[j] * scale - row_lse)
                        for j in range(seen, cols):  # masked (and maybe never computed)
                            pr[j] = _ZERO
                            dpr[j] = _ZERO
                        if threshold:
                            base = (np.uint64(problem) * np.uint64(L) +
                                    np.uint64(q0 + i)) * np.uint64(S) + np.uint64(k0)
                            for j in range(cols):
                                w = keep_scale if kept(seed, base + np.uint64(j),
                                                        threshold) else _ZERO
                                pt[j, i] = pr[j] * w  # the weights as dropout left them
                                dpr[j] *= w
                        else:
                            for j in range(cols):
                                pt[j, i] = pr[j]
                        for j in range(cols):  # dS, times scale
                            pr[j] = scale * pr[j] * (dpr[j] - row_delta)
                    dv_tile = dv[kv_head * S + k0:]
                    _dot_tile(pt, dot, dv_tile, cols, E, rows, True, _ALL)  # dV += P^T dO
                    _dot_tile(p, kt, dqb, rows, E, cols, True, _ALL)  # dQ += dS K
                    for i in range(rows):
                        pr = p[i]
                        for j in range(cols):
                            pt[j, i] = pr[j]
                    dk_tile = dk[kv_head * S + k0:]
                    _dot_tile(pt, qt, dk_tile, cols, E, rows, True, _ALL)  # dK += dS^T Q
                for i in range(rows):
                    src, dst = dqb[i], dq[problem * L + q0 + i]
                    for e in range(E):
                        dst[e] = src[e]


def flash_attention_forward(q: Any, k: Any, v: Any, causal: bool, scale: float,
                            dropout_p: float = 0.0,
                            seed: Optional[Any] = None) -> Tuple[Any, Any]:
    """softmax(q k^T * scale [causal]) v without storing the (L, S) scores, as the CUDA
    launcher of the same name: q (..., L, E), k and v (..., S, E) float32, read in place, or
    the grouped form q (..., Hkv, G, L, E) over k, v (..., Hkv, 1, S, E). Returns ``(o,
    lse)``, contiguous float32: o of q's shape and each query's log-sum-exp (q.shape[:-1]).
    With ``dropout_p`` > 0 the weights are dropped out by the hash of ``seed`` (a (1,)
    uint64 array) and each element's index in the (..., L, S) scores, as the dense path's
    kernels do; lse stays that of the weights before dropout."""
    op = "flash_attention_forward"
    bh, L, S, E = _check(op, q, k, v)
    threshold, keep_scale, seed = dropout_arguments(op, dropout_p, seed)
    group = attention_group(q, k, v)
    (qf, kf, vf), heads, strides = _layout([q, k, v], group)
    o = np.empty(q.shape, np.float32)
    lse = np.empty(q.shape[:-1], np.float32)
    tiles = -(-L // BLOCK_Q)
    sizes = (np.int64(L), np.int64(S), np.int64(E), np.int64(heads), np.int64(group))

    def run(start: int, stop: int) -> None:  # the (query head, query tile) units start..stop
        _flash_attention_forward(qf, kf, vf, o.reshape(-1, E), lse.reshape(-1), *sizes,
                                 np.float32(scale), bool(causal), threshold, keep_scale, seed,
                                 *strides, np.int64(start), np.int64(stop))
    split_chunks(bh * tiles, min(L, BLOCK_Q) * S * E // 8, run)
    return o, lse


def flash_attention_backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any,
                             causal: bool, scale: float, dropout_p: float = 0.0,
                             seed: Optional[Any] = None) -> Tuple[Any, Any, Any]:
    """Gradients ``(dq, dk, dv)``, contiguous float32, of ``flash_attention_forward`` given
    ``do`` = dL/do, the weights rebuilt from the saved ``lse`` (and the dropout mask from
    ``seed``), as the CUDA launcher of the same name. dk and dv have k's and v's shapes:
    for grouped-query attention the sums over each group's query heads."""
    op = "flash_attention_backward"
    bh, L, S, E = _check(op, q, k, v)
    threshold, keep_scale, seed = dropout_arguments(op, dropout_p, seed)
    for name, a, shape in (("o", o, q.shape), ("do", do, q.shape), ("lse", lse, q.shape[:-1])):
        if type(a) is not np.ndarray or not (a.dtype.kind == "f" or a.dtype == bfloat16) \
                or a.shape != shape:
            raise ValueError(f"{op}: {name} must be a float NumPy array of shape {shape}, got "
                             f"{type(a).__name__} {getattr(a, 'dtype', None)} "
                             f"{tuple(getattr(a, 'shape', ()))}")
    group = attention_group(q, k, v)
    if do.dtype not in INPUT_DTYPES:  # float64, say: the kernels read float32 or bf16
        do = do.astype(np.float32)
    (qf, kf, vf, dof), heads, strides = _layout([q, k, v, do], group)
    o = np.ascontiguousarray(o, dtype=np.float32)
    lse = np.ascontiguousarray(lse, dtype=np.float32)
    dq = np.empty(q.shape, np.float32)
    dk = np.empty(k.shape, np.float32)
    dv = np.empty(v.shape, np.float32)
    kv_heads = bh // group
    sizes = (np.int64(L), np.int64(S), np.int64(E), np.int64(heads), np.int64(group))

    def run(start: int, stop: int) -> None:  # the kv heads start..stop
        _flash_attention_backward(qf, kf, vf, dof, o.reshape(-1, E), lse.reshape(-1),
                                  dq.reshape(-1, E), dk.reshape(-1, E), dv.reshape(-1, E),
                                  *sizes, np.float32(scale), bool(causal), threshold,
                                  keep_scale, seed, *strides, np.int64(start),
                                  np.int64(stop))
    split_chunks(kv_heads, group * L * S * E // 4, run)
    return dq, dk, dv
