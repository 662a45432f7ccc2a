"""Flash attention's launchers (``attention.cu``): forward and backward in tiles with an
online softmax, q, k and v read as stored and in place (strided heads included), and
grouped-query attention without repeating k and v.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from . import loader
from .loader import FLOAT32, blocks, check_float32, check_shape, on_device_of_first_array

MAX_HEAD_DIM = 128  # attention.cu's shared-memory tiles fit 48 KiB up to this head size
MAX_GRID_X = 2 ** 31 - 1  # CUDA's limit on gridDim.x: attention's flat row of blocks
MAX_SEQUENCE = 2 ** 30  # attention.cu holds positions as int, with room for a tile past them
# launch shapes; each matches the #define of the same meaning in attention.cu
ATTENTION_WARPS = 4
ATTENTION_FORWARD_ROWS = 4  # FWD_ROWS
# attention.cu's INPUT_DTYPE: the storage dtypes it reads q, k, v and dO in, widened to
# float32 on load (so the op passes bf16 under autocast as it is, no widened copies)
ATTENTION_INPUT_DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}


def attention_backward_rows(head_dim: int) -> int:
    """attention.cu's BWD_ROWS: rows per warp in the backward kernels."""
    return 2 if head_dim > 64 else 4


def attention_input_code(dtype: Any) -> Optional[int]:
    """attention.cu's INPUT_DTYPE for inputs of ``dtype``; None for a dtype it cannot read."""
    return ATTENTION_INPUT_DTYPES.get(np.dtype(dtype).name)


def attention_group(q: Any, k: Any, v: Any) -> Optional[int]:
    """G, the query heads per kv head, for q, k, v the kernels can take: 1 for one batch
    shape (..., n, E); G = q.shape[-3] for the grouped form of grouped-query attention, q
    (..., Hkv, G, L, E) with k and v (..., Hkv, 1, S, E) (the shapes ops/attention.py's
    and ops/attention_heads.py's GQA paths build: k and v broadcast over G, never repeated; q at least 4-D, so the
    kv heads have a dim of their own). None for any other batch shapes."""
    if q.ndim < 2 or not q.ndim == k.ndim == v.ndim:
        return None
    if q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        return 1
    if q.ndim >= 4 and q.shape[:-3] == k.shape[:-3] == v.shape[:-3] and \
            k.shape[-3] == v.shape[-3] == 1:
        return q.shape[-3]
    return None


def _attention_blocks(bh: int, L: int, S: int, head_dim: int) -> int:
    """The most blocks any attention kernel launches (one flat row: gridDim.x)."""
    rows_per_block = ATTENTION_WARPS * min(ATTENTION_FORWARD_ROWS,
                                           attention_backward_rows(head_dim))
    return blocks(max(L, S), rows_per_block) * bh


def supports_flash_attention(q: Any, k: Any, v: Any, mask: Optional[Any],
                             dropout_p: float) -> bool:
    """q (..., L, E), k (..., S, E), v (..., S, E) of one dtype, float32, bf16 or fp16 (the
    kernels read each as stored), with the same batch dims (no broadcasting) or in the
    grouped-query form q (..., Hkv, G, L, E), k and v (..., Hkv, 1, S, E)
    (``attention_group``), and any strides (heads that are strided views are read in
    place; see ``attention_head_split``),
    1 <= E <= MAX_HEAD_DIM, 1 <= L, S <= MAX_SEQUENCE, at most MAX_GRID_X blocks
    (ceil(max(L, S) / 16 or 8) * batch * heads), no attn_mask and no dropout. Causal or not.
    """
    if not (mask is None and dropout_p == 0.0 and q.dtype == k.dtype == v.dtype
            and attention_input_code(q.dtype) is not None and attention_group(q, k, v)
            and q.shape[-1] == k.shape[-1] == v.shape[-1]
            and 1 <= q.shape[-1] <= MAX_HEAD_DIM and k.shape[-2] == v.shape[-2]
            and q.size > 0 and k.size > 0):
        return False
    L, S, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    bh = q.size // (L * head_dim)
    return max(L, S) <= MAX_SEQUENCE and _attention_blocks(bh, L, S, head_dim) <= MAX_GRID_X


def _attention_shapes(op: str, q: Any, k: Any, v: Any) -> Tuple[int, int, int, int]:
    """(BH, L, S, E) after checking the dtypes and shapes, BH the number of query heads;
    raises naming the argument."""
    if attention_input_code(q.dtype) is None:
        raise TypeError(f"{op}: q must be float32, bfloat16 or float16, got {q.dtype}")
    for name, a in (("k", k), ("v", v)):
        if a.dtype != q.dtype:
            raise TypeError(f"{op}: q, k, v must share one dtype, got {name} {a.dtype} with q "
                            f"{q.dtype}")
    if q.ndim < 2 or not q.ndim == k.ndim == v.ndim:
        raise ValueError(f"{op}: q, k, v must be (..., seq, head_dim) with one rank, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not attention_group(q, k, v):
        raise ValueError(f"{op}: q, k, v must share their batch dims (no broadcasting), or "
                         f"be grouped: q (..., Hkv, G, L, E) with k, v (..., Hkv, 1, S, E); "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    head_dim = q.shape[-1]
    if not (k.shape[-1] == v.shape[-1] == head_dim and k.shape[-2] == v.shape[-2]):
        raise ValueError(f"{op}: expected k and v of shape (..., S, {head_dim}), got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"{op}: head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    L, S = q.shape[-2], k.shape[-2]
    if not (1 <= L <= MAX_SEQUENCE and 1 <= S <= MAX_SEQUENCE):
        raise ValueError(f"{op}: needs 1 to {MAX_SEQUENCE} queries and keys, got L={L}, "
                         f"S={S}")
    bh = q.size // (L * head_dim)
    if _attention_blocks(bh, L, S, head_dim) > MAX_GRID_X:
        raise ValueError(f"{op}: at most {MAX_GRID_X} blocks of rows per launch, got "
                         f"{_attention_blocks(bh, L, S, head_dim)} for q of shape "
                         f"{tuple(q.shape)} and k of shape {tuple(k.shape)}")
    return bh, L, S, head_dim


def _element_strides(a: Any) -> Optional[Tuple[int, ...]]:
    """a's strides in elements; None when one is not a whole number of them."""
    if any(s % a.itemsize for s in a.strides):
        return None
    return tuple(s // a.itemsize for s in a.strides)


def _batch_breaks(batch: tuple, strides: tuple) -> set:
    """The dims j of ``batch`` (of size > 1) that do not flatten with the previous dim of
    size > 1: where index (i, j) is not at stride(j) * (i * n_j + j)."""
    dims = [d for d, n in enumerate(batch) if n != 1]
    return {j for i, j in zip(dims, dims[1:]) if strides[i] != strides[j] * batch[j]}


def attention_head_split(arrays: Sequence[Any]) -> Tuple[int, Tuple[bool, ...]]:
    """How the attention kernels read ``arrays`` (q, k, v[, dO]: (..., n, E), one batch
    shape) in place: ``(split, copy)``. The batch dims before ``split`` flatten into the
    kernels' outer (batch) index, those from ``split`` on into the inner (head) index, each
    with one stride per array (``attention_strides``); ``copy[i]`` says array i must be made
    contiguous first, because its last dim is strided or its batch dims need more than the
    two strides the others leave. GPT's heads, (B, nh, T, hs) views of (B, T, 3C), give
    split 1 and no copies::

        >>> qkv = np.zeros((2, 5, 3, 4, 8), np.float32)  # (B, T, 3, nh, hs)
        >>> q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        >>> attention_head_split([q, k, v])
        (1, (False, False, False))
    """
    batch = tuple(arrays[0].shape[:-2])
    strides = [_element_strides(a) for a in arrays]
    copy = [s is None or (a.shape[-1] != 1 and s[-1] != 1) for a, s in zip(arrays, strides)]
    breaks = [set() if c else _batch_breaks(batch, s[:-2]) for c, s in zip(copy, strides)]
    while len(set().union(*breaks)) > 1:  # more than two strides: copy the worst offender
        worst = max(range(len(arrays)), key=lambda i: len(breaks[i]))
        copy[worst], breaks[worst] = True, set()
    union = set().union(*breaks)
    return (min(union) if union else 0), tuple(copy)


def attention_strides(a: Any, split: int) -> Tuple[int, int, int]:
    """(batch, head, row) strides in elements with which the kernels read ``a`` (..., n, E)
    split at ``split`` (``attention_head_split``): each group's flat index steps by the
    stride of its last dim of size > 1 (0 for a group of ones)."""
    shape, strides = a.shape, _element_strides(a)

    def step(dims: range) -> int:
        return next((strides[d] for d in reversed(dims) if shape[d] != 1), 0)
    return step(range(split)), step(range(split, a.ndim - 2)), strides[-2]


def attention_layout(arrays: Sequence[Any], group: int,
                     contiguous: Any = np.ascontiguousarray) -> Tuple[list, int, list]:
    """How the kernels read ``arrays`` (q, k, v[, do]), ``group`` = G from
    ``attention_group``: ``(arrays, heads, strides)``, the arrays (made contiguous by
    ``contiguous`` only where ``attention_head_split`` says), the inner (head) count and
    each array's strides in elements: (batch, head, group, row) for q and do (group 0
    when G = 1), (batch, head, row) for k and v. With G > 1 the split is that of the
    arrays without their group dim (q[..., 0, :, :], k[..., 0, :, :], ...), so k and v
    index the kv heads and q and do add g times their group stride."""
    def kv_heads(a: Any) -> Any:  # without the group dim: the (..., Hkv, n, E) view
        return a[..., 0, :, :] if group > 1 else a

    split, copy = attention_head_split([kv_heads(a) for a in arrays])
    arrays = [contiguous(a) if c else a for a, c in zip(arrays, copy)]
    strides = []
    for i, a in enumerate(arrays):
        batch, head, row = attention_strides(kv_heads(a), split)
        if i in (0, 3):  # q, do: the group stride
            group_stride = a.strides[-3] // a.itemsize if group > 1 else 0
            strides.append((batch, head, group_stride, row))
        else:
            strides.append((batch, head, row))
    return arrays, math.prod(kv_heads(arrays[0]).shape[split:-2]), strides


def _attention_layout(arrays: Sequence[Any], group: int) -> Tuple[list, int, tuple]:
    """``attention_layout`` with the device's copies, the strides as int64 scalars in the
    kernels' order."""
    arrays, heads, strides = attention_layout(arrays, group, loader.contiguous)
    return arrays, heads, tuple(np.int64(s) for a in strides for s in a)


@on_device_of_first_array
def flash_attention_forward(q: Any, k: Any, v: Any, causal: bool,
                            scale: float) -> Tuple[Any, Any]:
    """softmax(q k^T * scale [causal]) v without storing the (L, S) scores.

    q (..., L, E), k and v (..., S, E): one dtype, float32, bf16 or fp16, read as stored
    and where they are (strided heads in place; a copy only where ``attention_head_split``
    asks for one); computed in float32. Grouped-query attention as q (..., Hkv, G, L, E)
    over k, v (..., Hkv, 1, S, E): query head (h, g) attends over kv head h. Returns
    ``(o, lse)``, contiguous float32: o of q's shape and each query's log-sum-exp of
    scores lse (q.shape[:-1]), which the backward needs.
    """
    op = "flash_attention_forward"
    bh, L, S, head_dim = _attention_shapes(op, q, k, v)
    group = attention_group(q, k, v)
    cupy = loader.require_cupy()
    (q, k, v), heads, strides = _attention_layout((q, k, v), group)
    o = cupy.empty(q.shape, dtype=FLOAT32)
    lse = cupy.empty(q.shape[:-1], dtype=FLOAT32)
    rows_per_block = ATTENTION_WARPS * ATTENTION_FORWARD_ROWS
    kernel = loader.load_kernel(q, "attention.cu", "flash_attention_forward", HEAD_DIM=head_dim,
                     INPUT_DTYPE=attention_input_code(q.dtype))
    kernel((blocks(L, rows_per_block) * bh,), (ATTENTION_WARPS * 32,),
           (q, k, v, o, lse, np.int32(L), np.int32(S), np.int32(heads), np.int32(group),
            np.float32(scale), np.int32(causal), *strides))
    return o, lse


@on_device_of_first_array
def flash_attention_backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any,
                             causal: bool, scale: float) -> Tuple[Any, Any, Any]:
    """Gradients ``(dq, dk, dv)``, contiguous float32, of ``flash_attention_forward`` given
    ``do`` = dL/do, recomputing the attention weights from the saved ``lse``. q, k, v and
    do are read as stored and in place, as in the forward (do in q's dtype: another float
    dtype is cast once); o and lse are the forward's float32 outputs. dk and dv have k's
    and v's shapes: for grouped-query attention (..., Hkv, 1, S, E), the sums over the G
    query heads of each group (no repeated k, v, no atomics)."""
    op = "flash_attention_backward"
    bh, L, S, head_dim = _attention_shapes(op, q, k, v)
    group = attention_group(q, k, v)
    check_float32(op, o=o, lse=lse)
    check_shape(op, "o", o, q.shape)
    check_shape(op, "do", do, q.shape)
    check_shape(op, "lse", lse, q.shape[:-1])
    if do.dtype != q.dtype:  # one module reads q, k, v and do: do in q's dtype
        if attention_input_code(do.dtype) is None and do.dtype != np.float64:
            raise TypeError(f"{op}: do must be float64, float32, bfloat16 or float16, got "
                            f"{do.dtype}")
        do = do.astype(q.dtype)
    cupy = loader.require_cupy()
    (q, k, v, do), heads, strides = _attention_layout((q, k, v, do), group)
    o, lse = loader.contiguous(o), loader.contiguous(lse)
    delta = cupy.empty(lse.shape, dtype=FLOAT32)  # D = rowsum(dO * O), (..., L)
    dq = cupy.empty(q.shape, dtype=FLOAT32)
    dk = cupy.empty(k.shape, dtype=FLOAT32)
    dv = cupy.empty(v.shape, dtype=FLOAT32)
    threads = (ATTENTION_WARPS * 32,)
    defines = dict(HEAD_DIM=head_dim, INPUT_DTYPE=attention_input_code(q.dtype))
    kernel = loader.load_kernel(q, "attention.cu", "flash_attention_backward_preprocess", **defines)
    kernel((max(1, min(blocks(bh * L, ATTENTION_WARPS), 65536)),), threads,
           (o, do, delta, np.int64(bh * L), np.int32(L), np.int32(heads), np.int32(group),
            *strides[-4:]))  # do's strides
    rows_per_block = ATTENTION_WARPS * attention_backward_rows(head_dim)
    sizes = (np.int32(L), np.int32(S), np.int32(heads), np.int32(group), np.float32(scale),
             np.int32(causal))
    kernel = loader.load_kernel(q, "attention.cu", "flash_attention_backward_dq", **defines)
    kernel((blocks(L, rows_per_block) * bh,), threads,
           (q, k, v, do, lse, delta, dq, *sizes, *strides))
    kernel = loader.load_kernel(q, "attention.cu", "flash_attention_backward_dkdv", **defines)
    kernel((blocks(S, rows_per_block) * (bh // group),), threads,  # one per kv head's tile
           (q, k, v, do, lse, delta, dk, dv, *sizes, *strides))
    return dq, dk, dv
