"""Operands as PyTorch promotes them: Python numbers and tensors lifted to one dtype
(``torch.result_type``), ints wrapped into integer dtypes, the casts autocast and the
real-only ops ask for. Every cast is the differentiable ``to_dtype``."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..amp.autocast_mode import autocast_dtype
from ..backend import dtypes
from ..tensor import Tensor
from ._util import as_tensor_like, check_broadcast, require_tensor, shape_of
from .conversions import to_dtype


def binary_operands(a: Any, b: Any, op: str) -> tuple:
    """Lift the operands of a binary op, check their shapes broadcast and promote their
    dtypes as PyTorch does (``promote_operands``)."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):  # the common case, kept cheap
        if a.data.shape != b.data.shape:
            check_broadcast(op, a.data.shape, b.data.shape)
        if a.data.dtype != b.data.dtype:
            return promote_operands(a, b)
        return a, b
    if isinstance(a, Tensor):
        if type(b) in _NUMBERS:  # a Python number broadcasts against anything
            return promote_operands(a, b)
        b = as_tensor_like(b, a, op)
    elif isinstance(b, Tensor):
        if type(a) in _NUMBERS:
            return promote_operands(a, b)
        a = as_tensor_like(a, b, op)
    else:
        raise TypeError(f"{op}: expected at least one Tensor, got {type(a).__name__} "
                        f"and {type(b).__name__}")
    shape_a, shape_b = shape_of(a), shape_of(b)
    if shape_a != shape_b and shape_a and shape_b:  # a scalar always broadcasts
        check_broadcast(op, shape_a, shape_b)
    return promote_operands(a, b)


def _category(dtype: Any) -> int:
    """0 bool, 1 integer, 2 floating: PyTorch promotes across these before within them."""
    return 0 if dtype.kind == "b" else 2 if dtypes.is_floating(dtype) else 1


def _priority(x: Any) -> int:
    """Tensors with dims outrank 0-d tensors, which outrank Python numbers."""
    return 0 if not isinstance(x, Tensor) else 1 if x.ndim == 0 else 2


_DEFAULT_FOR_CATEGORY = (dtypes.bool_, dtypes.int64, dtypes.default_float)
_NUMBERS = (bool, int, float)


def _dtype_of(x: Any) -> np.dtype:
    if isinstance(x, Tensor):
        return x.data.dtype
    if isinstance(x, bool):  # before int: bool is an int in Python
        return dtypes.bool_
    if isinstance(x, int):
        return dtypes.int64
    return dtypes.float64 if isinstance(x, float) else np.asarray(x).dtype


def result_dtype(a: Any, b: Any) -> np.dtype:
    """The dtype PyTorch gives ``a op b`` (``torch.result_type``), for Tensors and Python
    numbers. Unlike NumPy: a float tensor keeps its dtype against integer tensors
    (float32 * int64 is float32, not float64); a number or a 0-d tensor never widens a
    tensor of its own category (float32 * 0-d float64 is float32); an integer tensor with
    a float number gives the default float32."""
    da, db = _dtype_of(a), _dtype_of(b)
    ca, cb = _category(da), _category(db)
    pa, pb = _priority(a), _priority(b)
    if pa == pb:
        if not pa:  # two numbers
            return _DEFAULT_FOR_CATEGORY[max(ca, cb)]
        return promote_types(da, db)
    high, low = (a, b) if pa > pb else (b, a)
    (dh, ch), (dl, cl) = ((da, ca), (db, cb)) if pa > pb else ((db, cb), (da, ca))
    if ch >= cl:
        return dh
    return dl if isinstance(low, Tensor) else _DEFAULT_FOR_CATEGORY[cl]


def promote_types(da: np.dtype, db: np.dtype) -> np.dtype:
    """The common dtype of two tensors of equal rank (as in ``cat``): the higher category
    wins (int64 with float32 is float32), else NumPy's promotion within the category."""
    ca, cb = _category(da), _category(db)
    if ca != cb:
        return da if ca > cb else db
    return np.promote_types(da, db)


def promote_operands(a: Any, b: Any) -> tuple:
    """``a`` and ``b`` with each Tensor cast to their ``result_dtype`` (NumPy scalars become
    Python numbers, as PyTorch treats them); Python numbers stay as they are, which NumPy
    applies without widening the array."""
    # the hot case first: a tensor and a Python number that leaves its dtype as it is
    if isinstance(a, Tensor) and type(b) in _NUMBERS:
        if type(b) is int and a.data.dtype.kind in "iu":
            return a, wrap_int(b, a.data.dtype)
        if type(b) is not float or a.data.dtype in dtypes.FLOATING:
            return a, b
    elif isinstance(b, Tensor) and type(a) in _NUMBERS:
        if type(a) is int and b.data.dtype.kind in "iu":
            return wrap_int(a, b.data.dtype), b
        if type(a) is not float or b.data.dtype in dtypes.FLOATING:
            return a, b
    a = a.item() if isinstance(a, np.generic) else a
    b = b.item() if isinstance(b, np.generic) else b
    dtype = result_dtype(a, b)
    if dtype.kind in "iu":
        a, b = (wrap_int(x, dtype) if type(x) is int else x for x in (a, b))
    return cast_to(a, dtype), cast_to(b, dtype)


def wrap_int(value: int, dtype: np.dtype) -> int:
    """A Python int as an integer tensor of ``dtype`` meets it in PyTorch: wrapped modulo
    2**bits when out of the dtype's range (int32 | 0xFFFFFFFF is int32 | -1), where NumPy
    raises OverflowError. Ints past [-2**63, 2**64) are an error in PyTorch too."""
    low, high = _INT_RANGES.get(dtype) or _INT_RANGES.setdefault(
        dtype, (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)))
    if low <= value <= high:
        return value
    if not -2 ** 63 <= value < 2 ** 64:
        raise OverflowError(f"int {value} too big to convert to {dtype} (PyTorch takes ints "
                            "in [-2**63, 2**64) and wraps them)")
    bits = 8 * dtype.itemsize
    value %= 1 << bits
    return value - (1 << bits) if low < 0 and value > high else value


_INT_RANGES: dict = {}


def cast_to(x: Any, dtype: np.dtype) -> Any:
    """``x`` as ``dtype`` if it is a Tensor of another dtype (a differentiable cast)."""
    if not isinstance(x, Tensor) or x.dtype == dtype:
        return x
    return to_dtype(x, dtype)


def autocast_lower(*tensors: Any) -> tuple:
    """Inside ``autocast``, the floating Tensors among ``tensors`` cast to its dtype (the
    inputs of a matrix product); outside, ``tensors`` as given. See ``amp``."""
    dtype = autocast_dtype()
    if dtype is None:
        return tensors
    return tuple(cast_to(t, dtype) if isinstance(t, Tensor) and dtypes.is_floating(t.dtype)
                 else t for t in tensors)


def autocast_float32(x: Any) -> Any:
    """Inside ``autocast``, a bf16/fp16 Tensor cast up to float32 (the input of a
    reduction that must not lose bits: layer norm, softmax, the loss); else ``x``."""
    if autocast_dtype() is None or not isinstance(x, Tensor) \
            or x.dtype not in dtypes.NARROW_FLOATS:
        return x
    return cast_to(x, dtypes.float32)


def float_input(a: Any, op: str) -> Tensor:
    """``a`` checked to be a Tensor; integer and bool tensors become the default float
    (torch.exp of an int64 tensor is float32), for ops defined only on reals."""
    require_tensor(a, op)
    return a if dtypes.is_floating(a.dtype) else cast_to(a, dtypes.default_float)


def float_operands(a: Any, b: Any, op: str) -> tuple:
    """``binary_operands`` for ops defined only on reals (true division, atan2,
    logaddexp): two integer/bool operands become float32, as torch.div or torch.atan2 of
    two int64 tensors."""
    a, b = binary_operands(a, b, op)
    if not any(isinstance(x, Tensor) and dtypes.is_floating(x.dtype) for x in (a, b)):
        a, b = (float_input(x, op) if isinstance(x, Tensor) else float(x) for x in (a, b))
    return a, b

