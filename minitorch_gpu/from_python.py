"""Python numbers and (nested) sequences of them as NumPy arrays, checked as PyTorch checks
them: what ``tensor(data)`` and an op given a list (``x + [1, 2]``) read their data with.

Below the Tensor: it deals in NumPy arrays only, so the ops and the creation functions both
use it without importing each other.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .backend import dtypes

NUMBER_TYPES = (bool, int, float, np.bool_, np.integer, np.floating)
_MAX_DIMS = 64  # NumPy's limit; a list that contains itself nests forever


def is_number_dtype(dtype: np.dtype) -> bool:
    """Whether a tensor can hold ``dtype``: bool, integers, floats (bf16 included)."""
    return dtype.kind in "biuf" or dtype in dtypes.FLOATING


def check_number_dtype(dtype: np.dtype, op: str, what: str) -> None:
    """TypeError naming ``op`` unless ``dtype`` holds numbers a tensor can hold (not
    strings, objects, complex numbers or dates)."""
    if not is_number_dtype(dtype):
        raise TypeError(f"{op}: expected numbers (bool, int or float), got dtype {dtype} "
                        f"({what})")


def data_array(data: Any, op: str) -> np.ndarray:
    """Python numbers and (nested) sequences of them as a NumPy array, with NumPy's dtype.

    NumPy converts the data once; only when it fails or finds something other than numbers
    is the data walked (``_data_error``), so good data costs one ``np.asarray``. Errors
    follow PyTorch's: a ragged nesting is ``ValueError: op: expected a sequence of length
    2 at dim 1 (got 1, at data[1])``; a string, None or another object is a TypeError
    naming it and where it is.
    """
    try:
        array = np.asarray(data)
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise _data_error(data, op, exc) from None
    if array.dtype.kind not in "biuf":
        raise _data_error(data, op, None) from None
    return array


def check_fits(host: np.ndarray, dtype: np.dtype, op: str) -> None:
    """ValueError unless the integers of ``host`` fit the integer ``dtype``: a cast would
    wrap them silently, where NumPy converting the Python ints refuses."""
    if np.can_cast(host.dtype, dtype) or not host.size:
        return
    info = np.iinfo(dtype)
    low, high = int(host.min()), int(host.max())
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise ValueError(f"{op}: {bad} does not fit in {dtype} ([{info.min}, {info.max}])")


def _data_error(data: Any, op: str, numpy_error: Optional[Exception]) -> Exception:
    """The error for data NumPy could not turn into an array of numbers: the first place
    where it is ragged or holds something other than a number."""
    shape = []  # as PyTorch infers it: the lengths along the first elements
    item = data
    while _is_sequence(item) and len(shape) <= _MAX_DIMS:
        shape.append(len(item))
        if not len(item):
            break
        item = item[0]
    if len(shape) > _MAX_DIMS:
        return ValueError(f"{op}: the data nests deeper than {_MAX_DIMS} dims (does a list "
                          f"contain itself?)")
    found = _first_problem(data, tuple(shape), 0, "")
    if found is not None:
        return found[0](f"{op}: {found[1]}")
    reason = f": {numpy_error}" if numpy_error is not None else ""
    return TypeError(f"{op}: cannot make a tensor from {type(data).__name__}{reason}")


def _is_sequence(x: Any) -> bool:
    return isinstance(x, (list, tuple)) or (getattr(x, "ndim", 0) > 0 and hasattr(x, "shape"))


def describe(x: Any) -> str:
    if x is None:
        return "None"
    if _is_sequence(x):
        return f"a {type(x).__name__} of length {len(x)}"
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _first_problem(x: Any, shape: tuple, dim: int, where: str) -> Optional[tuple]:
    """(error class, message) for the first element of ``x`` (at nesting depth ``dim``,
    reached by the index path ``where``) that does not fit ``shape``; None if all fit."""
    at = f"at data{where}"
    if dim == len(shape):  # a number belongs here
        if isinstance(x, NUMBER_TYPES) or (hasattr(x, "dtype") and getattr(x, "ndim", 1) == 0
                                             and is_number_dtype(x.dtype)):
            if isinstance(x, int) and not -2 ** 63 <= x < 2 ** 64:
                return ValueError, f"{x} {at} does not fit in a 64-bit integer"
            return None
        if _is_sequence(x):
            return ValueError, (f"expected a number {at}, got {describe(x)} (the first "
                                f"elements give the shape {shape})")
        if where:
            return TypeError, (f"expected a number (bool, int or float) {at}, got "
                               f"{describe(x)}")
        return TypeError, (f"expected a number or a (nested) sequence of numbers, got "
                           f"{describe(x)}")
    if not _is_sequence(x):
        return ValueError, (f"expected a sequence of length {shape[dim]} at dim {dim} (got "
                            f"{describe(x)}, {at})")
    if len(x) != shape[dim]:
        return ValueError, (f"expected a sequence of length {shape[dim]} at dim {dim} (got "
                            f"{len(x)}, {at})")
    if not isinstance(x, (list, tuple)):  # an array or a tensor inside the data
        for d, (n, expected) in enumerate(zip(x.shape, shape[dim:])):
            if n != expected:
                return ValueError, (f"expected a sequence of length {expected} at dim "
                                    f"{dim + d} (got {n}, in the {type(x).__name__} {at})")
        if x.ndim != len(shape) - dim:
            return ValueError, (f"expected {len(shape) - dim} dims {at} (got a "
                                f"{type(x).__name__} of shape {tuple(x.shape)})")
        if not is_number_dtype(x.dtype):
            return TypeError, (f"expected numbers {at}, got dtype {x.dtype} "
                               f"({type(x).__name__})")
        return None
    for i, item in enumerate(x):
        found = _first_problem(item, shape, dim + 1, f"{where}[{i}]")
        if found is not None:
            return found
    return None
