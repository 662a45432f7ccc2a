"""Attention's dropout mask as the CUDA kernels draw it (``attention_softmax.cu``): an
element is kept where the splitmix64 hash of a seed and its row-major index in the
(..., L, S) weights passes a threshold, so a backward pass recomputes the mask instead of
saving it, and the dense path, the flash kernel and the GPU drop the same elements for a
seed.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .compiler import jit

DROPOUT_BITS = 24  # the kernel's kept(): the hash's top 24 bits against round(p 2^24)
_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), \
    np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S40 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(40)


@jit
def kept(seed, index, threshold):  # pragma: no cover - compiled
    """Whether dropout keeps the element at flat ``index`` of the (..., L, S) weights:
    splitmix64 of (seed, index), its top 24 bits against the threshold round(p 2^24)."""
    z = seed + (np.uint64(index) + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    z = z ^ (z >> _S31)
    return (z >> _S40) >= threshold


def dropout_arguments(op: str, dropout_p: float, seed: Optional[Any]) -> tuple:
    """(threshold, 1 / (1 - p), seed) as the kernels take them; threshold 0 without
    dropout. Raises naming ``op`` for a p outside [0, 1) or a missing seed."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
    threshold = int(round(dropout_p * (1 << DROPOUT_BITS)))
    if not threshold:
        return np.uint64(0), np.float32(1.0), np.uint64(0)
    if seed is None or seed.dtype != np.uint64 or seed.shape != (1,):
        raise ValueError(f"{op}: dropout needs seed, a (1,) uint64 array, got "
                         f"{None if seed is None else (seed.dtype, tuple(seed.shape))}")
    return np.uint64(threshold), np.float32(1.0 / (1.0 - dropout_p)), np.uint64(seed[0])
