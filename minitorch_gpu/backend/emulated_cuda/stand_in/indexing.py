"""Integer-array indices as CuPy takes them: wrapped around, never refused.

CuPy documents it among its differences from NumPy ("Out-of-bounds indices", docs
``user_guide/difference.rst``): integer-array indexing, ``take`` and ``scatter_add``
compute ``index % size`` (``_take_kernel`` and ``_scatter_op`` in v14.2.0's
``cupy/_core/_routines_indexing.pyx``), where NumPy raises IndexError. So the engine's own
bounds checks must catch a bad index before it reaches the device, as on a real GPU.
Scalar integer indices are checked by CuPy as by NumPy and are left to NumPy here.
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np


def wrap_indices(index: np.ndarray, size: int) -> np.ndarray:
    """``index % size`` where ``size`` > 0 (an empty axis has nothing to wrap onto)."""
    return np.remainder(index, size) if size > 0 else index


def _is_integer_array(part: Any) -> bool:
    if isinstance(part, np.ndarray):
        return part.dtype.kind in "iu"
    if isinstance(part, list):
        return np.asarray(part).dtype.kind in "iu"
    return False


def _axes_taken(part: Any) -> int:
    if part is None:
        return 0
    if isinstance(part, np.ndarray) and part.dtype == np.bool_:
        return part.ndim
    if isinstance(part, list) and np.asarray(part).dtype == np.bool_:
        return np.asarray(part).ndim
    return 1


def wrapped_key(key: Any, shape: Tuple[int, ...]) -> Any:
    """``key`` with each integer-array part taken modulo the size of the axis it indexes."""
    parts = key if isinstance(key, tuple) else (key,)
    if not any(_is_integer_array(p) for p in parts):
        return key
    explicit = sum(_axes_taken(p) for p in parts if p is not Ellipsis)
    out, axis = [], 0
    for part in parts:
        if part is Ellipsis:
            axis += len(shape) - explicit
            out.append(part)
            continue
        if _is_integer_array(part) and axis < len(shape):
            part = wrap_indices(np.asarray(part), shape[axis])
        out.append(part)
        axis += _axes_taken(part)
    return tuple(out) if isinstance(key, tuple) else out[0]
