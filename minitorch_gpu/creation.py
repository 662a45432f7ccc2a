"""Factory functions: tensor, zeros, ones, full, arange, randn, rand, randint, *_like, empty.

Every factory takes ``dtype``, ``device`` and ``requires_grad``. Floats default to float32,
Python ints to int64, as in PyTorch. Random ones draw from the backend's seeded stream
(``manual_seed``).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .backend import Device, dtypes, get_backend
from .tensor import Tensor

DeviceLike = Any  # "cpu", "cuda", "cuda:1" or a Device


def _finish(array: Any, backend: Any, requires_grad: bool) -> Tensor:
    t = Tensor._make(array, backend, False)
    if requires_grad:
        t.requires_grad_()
    return t


def _shape(size: tuple, op: str) -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    for n in size:
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{op}: sizes must be non-negative ints, got {size}")
    return tuple(int(n) for n in size)


def _dtype(dtype: Any, default: np.dtype = dtypes.float32) -> np.dtype:
    return default if dtype is None else dtypes.as_dtype(dtype)


def tensor(data: Any, dtype: Any = None, device: DeviceLike = None,
           requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data`` (numbers, nested lists, arrays, a Tensor).

    >>> tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    """
    if isinstance(data, Tensor):
        source = data._backend.to_numpy(data.data) if device is not None else data.data
        backend = get_backend(device) if device is not None else data._backend
        array = backend.asarray(source, dtype=None if dtype is None else dtypes.as_dtype(dtype))
        array = array.copy() if array is data.data else array
        return _finish(array, backend, requires_grad)
    backend = get_backend(device if device is not None else "cpu")
    if dtype is None and not hasattr(data, "dtype"):
        inferred = np.asarray(data)
        if inferred.dtype.kind == "f":
            dtype = dtypes.float32  # Python floats become float32, as in PyTorch
        elif inferred.dtype.kind in "iu":
            dtype = dtypes.int64
        elif inferred.dtype.kind != "b":
            raise TypeError(f"tensor: cannot make a tensor from {type(data).__name__} holding "
                            f"{inferred.dtype}")
    array = backend.asarray(data, dtype=None if dtype is None else dtypes.as_dtype(dtype))
    if hasattr(data, "__array_interface__") or hasattr(data, "__cuda_array_interface__"):
        array = array.copy() if array is data or array.base is data else array
    return _finish(array, backend, requires_grad)


def zeros(*size: Any, dtype: Any = None, device: DeviceLike = None,
          requires_grad: bool = False) -> Tensor:
    backend = get_backend(device or "cpu")
    return _finish(backend.xp.zeros(_shape(size, "zeros"), dtype=_dtype(dtype)), backend,
                   requires_grad)


def ones(*size: Any, dtype: Any = None, device: DeviceLike = None,
         requires_grad: bool = False) -> Tensor:
    backend = get_backend(device or "cpu")
    return _finish(backend.xp.ones(_shape(size, "ones"), dtype=_dtype(dtype)), backend,
                   requires_grad)


def empty(*size: Any, dtype: Any = None, device: DeviceLike = None,
          requires_grad: bool = False) -> Tensor:
    """Uninitialised memory: fill it before reading."""
    backend = get_backend(device or "cpu")
    return _finish(backend.xp.empty(_shape(size, "empty"), dtype=_dtype(dtype)), backend,
                   requires_grad)


def full(size: Any, fill_value: Any, dtype: Any = None, device: DeviceLike = None,
         requires_grad: bool = False) -> Tensor:
    backend = get_backend(device or "cpu")
    if dtype is None:  # NumPy scalars count as the Python numbers they hold
        dtype = dtypes.bool_ if isinstance(fill_value, (bool, np.bool_)) else \
            dtypes.int64 if isinstance(fill_value, (int, np.integer)) else dtypes.float32
    size = _shape((size,) if isinstance(size, int) else tuple(size), "full")
    return _finish(backend.xp.full(size, fill_value, dtype=_dtype(dtype)), backend,
                   requires_grad)


def arange(start: Any, end: Any = None, step: Any = 1, dtype: Any = None,
           device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    """``start, start+step, ...`` below ``end``; ints give int64, any float gives float32."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must be non-zero")
    if dtype is None:
        is_int = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
        dtype = dtypes.int64 if is_int else dtypes.float32
    backend = get_backend(device or "cpu")
    return _finish(backend.xp.arange(start, end, step, dtype=_dtype(dtype)), backend,
                   requires_grad)


def randn(*size: Any, dtype: Any = None, device: DeviceLike = None,
          requires_grad: bool = False) -> Tensor:
    """Samples of the standard normal distribution."""
    backend = get_backend(device or "cpu")
    return _finish(backend.randn(_shape(size, "randn"), _dtype(dtype)), backend, requires_grad)


def rand(*size: Any, dtype: Any = None, device: DeviceLike = None,
         requires_grad: bool = False) -> Tensor:
    """Samples of the uniform distribution on [0, 1)."""
    backend = get_backend(device or "cpu")
    return _finish(backend.rand(_shape(size, "rand"), _dtype(dtype)), backend, requires_grad)


def randint(low: int, high: Optional[int] = None, size: Any = (), dtype: Any = None,
            device: DeviceLike = None) -> Tensor:
    """Integers uniform in [low, high) (``randint(high, size)`` means low = 0), int64."""
    if isinstance(high, (tuple, list)):  # randint(high, size), as torch.randint
        high, size = None, high
    if high is None:
        low, high = 0, low
    if high <= low:
        raise ValueError(f"randint: expected low < high, got low={low}, high={high}")
    backend = get_backend(device or "cpu")
    size = _shape((size,) if isinstance(size, int) else tuple(size), "randint")
    return _finish(backend.randint(low, high, size, _dtype(dtype, dtypes.int64)), backend, False)


def _like(op: str, make: Any, other: Tensor, dtype: Any, device: DeviceLike,
          requires_grad: bool) -> Tensor:
    if not isinstance(other, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(other).__name__}")
    return make(other.shape, dtype=other.dtype if dtype is None else dtype,
                device=other.device if device is None else device, requires_grad=requires_grad)


def zeros_like(other: Tensor, dtype: Any = None, device: DeviceLike = None,
               requires_grad: bool = False) -> Tensor:
    return _like("zeros_like", zeros, other, dtype, device, requires_grad)


def ones_like(other: Tensor, dtype: Any = None, device: DeviceLike = None,
              requires_grad: bool = False) -> Tensor:
    return _like("ones_like", ones, other, dtype, device, requires_grad)


def empty_like(other: Tensor, dtype: Any = None, device: DeviceLike = None,
               requires_grad: bool = False) -> Tensor:
    return _like("empty_like", empty, other, dtype, device, requires_grad)


def randn_like(other: Tensor, dtype: Any = None, device: DeviceLike = None,
               requires_grad: bool = False) -> Tensor:
    return _like("randn_like", randn, other, dtype, device, requires_grad)


def full_like(other: Tensor, fill_value: Any, dtype: Any = None, device: DeviceLike = None,
              requires_grad: bool = False) -> Tensor:
    return full(other.shape, fill_value, dtype=other.dtype if dtype is None else dtype,
                device=other.device if device is None else device, requires_grad=requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A CPU tensor sharing ``array``'s memory (as torch.from_numpy)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    return Tensor._make(array, get_backend(Device("cpu")), False)
