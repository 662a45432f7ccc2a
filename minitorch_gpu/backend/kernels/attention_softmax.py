"""The launchers of attention's softmax between its two cuBLAS products
(``attention_softmax.cu``): scale, causal mask, softmax and dropout in one kernel, and
its backward in one more.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np

from . import loader
from .loader import BFLOAT16, FLOAT32, check_float32, check_shape, on_device_of_first_array

SOFTMAX_THREADS = 256  # attention_softmax.cu's SOFTMAX_THREADS: one block per row
DROPOUT_BITS = 24  # attention_softmax.cu's kept(): the hash's top 24 bits against p 2^24
_PROB_TYPES = (FLOAT32, BFLOAT16)  # PROB_BF16 = 0, 1


def supports_attention_softmax(q: Any, k: Any, v: Any, mask: Optional[Any]) -> bool:
    """float32 or bf16 q, k, v of one dtype, at least 2-D, no attn_mask (causal or not,
    dropout or not), v's batch dims no wider than the scores' (q's and k's broadcast), at
    most 2^31 - 1 rows of scores (one block each) of < 2^31 keys."""
    if mask is not None or not q.dtype == k.dtype == v.dtype or q.dtype not in _PROB_TYPES:
        return False
    if min(q.ndim, k.ndim, v.ndim) < 2 or q.size == 0 or k.size == 0:
        return False
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    # v may not widen the batch: backward's dA = dO V^T would then outgrow the saved P
    if np.broadcast_shapes(batch, v.shape[:-2]) != batch:
        return False
    rows = math.prod(batch) * q.shape[-2]
    return rows <= 2 ** 31 - 1 and k.shape[-2] <= 2 ** 31 - 1


def _dropout_arguments(op: str, dropout_p: float, seed: Optional[Any]) -> tuple:
    """(threshold, keep_scale, seed) as the kernels take them: dropout keeps an element when
    its hash's top 24 bits reach threshold = round(p 2^24)."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
    threshold = int(round(dropout_p * (1 << DROPOUT_BITS)))
    if threshold and (seed is None or seed.dtype != np.uint64 or seed.shape != (1,)):
        raise ValueError(f"{op}: dropout needs seed, a (1,) uint64 device array, got "
                         f"{None if seed is None else (seed.dtype, tuple(seed.shape))}")
    if not threshold:
        seed = _unused_seed(loader.require_cupy())
    return np.uint32(threshold), np.float32(1.0 / (1.0 - dropout_p)), seed


def _unused_seed(cupy: Any) -> Any:
    """A (1,) uint64 array on the current device for the seed argument without dropout
    (never read then), made once per device."""
    device = cupy.cuda.Device().id if hasattr(cupy, "cuda") else -1
    if device not in _UNUSED_SEEDS:
        _UNUSED_SEEDS[device] = cupy.zeros(1, dtype=np.uint64)
    return _UNUSED_SEEDS[device]


_UNUSED_SEEDS: dict = {}


@on_device_of_first_array
def attention_softmax_forward(scores: Any, causal: bool, scale: float, dropout_p: float,
                              seed: Optional[Any], dtype: Any) -> Tuple[Any, Any]:
    """``(P, A)``: P = softmax(scores * scale), keys after each query masked when ``causal``
    (top-left aligned), and A = dropout(P) with the mask drawn from ``seed`` (A is P when
    ``dropout_p`` is 0), both (..., L, S) in ``dtype`` (float32 or bf16).

    scores: (..., L, S) float32, as cuBLAS writes Q K^T. seed: a (1,) uint64 device array
    (the backward recomputes the mask from it), or None without dropout."""
    op = "attention_softmax_forward"
    check_float32(op, scores=scores)
    dtype = np.dtype(dtype)
    if dtype not in _PROB_TYPES or scores.ndim < 2 or scores.size == 0:
        raise ValueError(f"{op}: expected non-empty scores (..., L, S) and dtype float32 or "
                         f"bfloat16, got {tuple(scores.shape)} and {dtype}")
    threshold, keep_scale, seed = _dropout_arguments(op, dropout_p, seed)
    cupy = loader.require_cupy()
    scores = loader.contiguous(scores)
    L, S = scores.shape[-2:]
    probs = cupy.empty(scores.shape, dtype=dtype)
    attended = cupy.empty_like(probs) if threshold else probs
    kernel = loader.load_kernel(scores, "attention_softmax.cu", "attention_softmax_forward",
                     PROB_BF16=int(dtype == BFLOAT16))
    kernel((scores.size // S,), (SOFTMAX_THREADS,),
           (scores, probs, attended, np.int32(L), np.int32(S), np.float32(scale),
            np.int32(causal), threshold, keep_scale, seed))
    return probs, attended


@on_device_of_first_array
def attention_softmax_backward(d_attended: Any, probs: Any, scale: float, dropout_p: float,
                               seed: Optional[Any]) -> Any:
    """dS, the gradient of the scores (before scaling), in P's dtype, from dA = dO V^T
    (..., L, S) float32 and the forward's P, ``dropout_p`` and ``seed``:
    dS = scale * P * (dP - rowsum(dP * P)) with dP = dA * keep / (1 - p)."""
    op = "attention_softmax_backward"
    check_float32(op, d_attended=d_attended)
    if probs.dtype not in _PROB_TYPES:
        raise TypeError(f"{op}: probs must be float32 or bfloat16, got {probs.dtype}")
    check_shape(op, "probs", probs, d_attended.shape)
    threshold, keep_scale, seed = _dropout_arguments(op, dropout_p, seed)
    cupy = loader.require_cupy()
    d_attended, probs = loader.contiguous(d_attended), loader.contiguous(probs)
    S = probs.shape[-1]
    d_scores = cupy.empty(probs.shape, dtype=probs.dtype)
    kernel = loader.load_kernel(probs, "attention_softmax.cu", "attention_softmax_backward",
                     PROB_BF16=int(probs.dtype == BFLOAT16))
    kernel((probs.size // S,), (SOFTMAX_THREADS,),
           (d_attended, probs, d_scores, np.int32(S), np.float32(scale), threshold,
            keep_scale, seed))
    return d_scores
