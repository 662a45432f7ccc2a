"""Factory functions: tensor, zeros, ones, full, arange, randn, rand, randint, *_like, empty.

Every factory takes ``dtype``, ``device`` and ``requires_grad``. Floats default to float32,
Python ints to int64, as in PyTorch. Random ones draw from the backend's seeded stream
(``manual_seed``). Arrays are made inside ``backend.on_device()``: CuPy allocates on the
current GPU, which need not be the one asked for.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .backend import Device, dtypes, get_backend
from .from_python import NUMBER_TYPES, check_fits, check_number_dtype, data_array, describe
from . import tensor as tensor_module
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

    Nested lists must be rectangular and hold numbers (bool, int, float): a ragged one is a
    ValueError naming the dim that disagrees, anything else a TypeError naming what was
    found and where (``data_array``).

    >>> tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    """
    if tensor_module._capture_hook is not None:  # a copy would freeze a captured value
        tensor_module._capture_hook.copied(data)
    if isinstance(data, Tensor):
        source = data._backend.to_numpy(data.data) if device is not None else data.data
        backend = get_backend(device) if device is not None else data._backend
        array = backend.asarray(source, dtype=None if dtype is None else dtypes.as_dtype(dtype))
        if array is data.data:
            with backend.on_device():  # CuPy's copy() lands on the current GPU
                array = array.copy()
        return _finish(array, backend, requires_grad)
    backend = get_backend(device if device is not None else "cpu")
    dtype = None if dtype is None else dtypes.as_dtype(dtype)
    if not hasattr(data, "dtype"):  # Python numbers and sequences: checked, then cast once
        host = data_array(data, "tensor")  # a new array: no copy needed
        kind = host.dtype.kind
        if dtype is None:  # Python floats become float32, ints int64, as in PyTorch
            dtype = dtypes.float32 if kind == "f" else dtypes.int64 if kind in "iu" else None
        if kind in "iu" and dtype is not None and dtype.kind in "iu":
            check_fits(host, dtype, "tensor")
        return _finish(backend.asarray(host, dtype=dtype), backend, requires_grad)
    if data.dtype.kind not in "biuf":  # an array or a NumPy scalar: bf16, or no numbers
        check_number_dtype(data.dtype, "tensor", type(data).__name__)
    array = backend.asarray(data, dtype=dtype)
    if hasattr(data, "__array_interface__") or hasattr(data, "__cuda_array_interface__"):
        if array is data or array.base is data:
            with backend.on_device():  # CuPy's copy() lands on the current GPU
                array = array.copy()
    return _finish(array, backend, requires_grad)


def zeros(*size: Any, dtype: Any = None, device: DeviceLike = None,
          requires_grad: bool = False) -> Tensor:
    backend = get_backend(device or "cpu")
    with backend.on_device():
        array = backend.xp.zeros(_shape(size, "zeros"), dtype=_dtype(dtype))
    return _finish(array, backend, requires_grad)


def ones(*size: Any, dtype: Any = None, device: DeviceLike = None,
         requires_grad: bool = False) -> Tensor:
    backend = get_backend(device or "cpu")
    with backend.on_device():
        array = backend.xp.ones(_shape(size, "ones"), dtype=_dtype(dtype))
    return _finish(array, backend, requires_grad)


def empty(*size: Any, dtype: Any = None, device: DeviceLike = None,
          requires_grad: bool = False) -> Tensor:
    """Uninitialised memory: fill it before reading."""
    backend = get_backend(device or "cpu")
    with backend.on_device():
        array = backend.xp.empty(_shape(size, "empty"), dtype=_dtype(dtype))
    return _finish(array, backend, requires_grad)


def full(size: Any, fill_value: Any, dtype: Any = None, device: DeviceLike = None,
         requires_grad: bool = False) -> Tensor:
    if not isinstance(fill_value, NUMBER_TYPES):
        raise TypeError(f"full: fill_value must be a number (bool, int or float), got "
                        f"{describe(fill_value)}")
    backend = get_backend(device or "cpu")
    if dtype is None:  # NumPy scalars count as the Python numbers they hold
        dtype = dtypes.bool_ if isinstance(fill_value, (bool, np.bool_)) else \
            dtypes.int64 if isinstance(fill_value, (int, np.integer)) else dtypes.float32
    size = _shape((size,) if isinstance(size, int) else tuple(size), "full")
    with backend.on_device():
        array = backend.xp.full(size, fill_value, dtype=_dtype(dtype))
    return _finish(array, backend, requires_grad)


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
    dtype = _dtype(dtype)
    _check_arange_range(start, end, step)
    with backend.on_device():
        if dtype.kind in "iu" and dtype != dtypes.int64:
            # as PyTorch, values past a narrow integer dtype wrap (computed in int64, then cast)
            values = backend.xp.arange(start, end, step, dtype=dtypes.int64).astype(dtype)
        else:
            values = backend.xp.arange(start, end, step, dtype=dtype)
    return _finish(values, backend, requires_grad)


_INT64_RANGE = (-2 ** 63, 2 ** 63 - 1)
ARANGE_MAX_NUMEL = 2 ** 48  # more elements than any device holds: a typo, not a request


def _check_arange_range(start: Any, end: Any, step: Any) -> None:
    """PyTorch's errors for bounds it can't hold, rather than NumPy's words (or a silent
    wrap past int64)."""
    for name, value in (("start", start), ("end", end), ("step", step)):
        if isinstance(value, (int, np.integer)) and not \
                _INT64_RANGE[0] <= int(value) <= _INT64_RANGE[1]:
            raise RuntimeError(f"arange: {name} {int(value)} cannot be converted to type "
                               "int64 without overflow")
        if isinstance(value, float) and not np.isfinite(value):
            raise RuntimeError(f"arange: unsupported range: {name} is {value}")
    count = -(-(float(end) - float(start)) // float(step))
    if count > ARANGE_MAX_NUMEL:
        raise RuntimeError(f"arange: {start} to {end} in steps of {step} is {count:.3g} "
                           f"elements, more than {ARANGE_MAX_NUMEL} (2**48)")


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
    if not isinstance(other, Tensor):
        raise TypeError(f"full_like: expected a Tensor, got {type(other).__name__}")
    return full(other.shape, fill_value, dtype=other.dtype if dtype is None else dtype,
                device=other.device if device is None else device, requires_grad=requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A CPU tensor sharing ``array``'s memory (as torch.from_numpy)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    check_number_dtype(array.dtype, "from_numpy", "numpy.ndarray")
    return Tensor._make(array, get_backend(Device("cpu")), False)


def eye(n: int, m: Optional[int] = None, *, dtype: Any = None, device: DeviceLike = None,
        requires_grad: bool = False) -> Tensor:
    """The (n, m) identity: ones on the main diagonal (``m`` defaults to ``n``)."""
    m = n if m is None else m
    _shape((n, m), "eye")
    backend = get_backend(device or "cpu")
    with backend.on_device():
        array = backend.xp.eye(int(n), int(m), dtype=_dtype(dtype))
    return _finish(array, backend, requires_grad)


def linspace(start: Any, end: Any, steps: int, *, dtype: Any = None, device: DeviceLike = None,
             requires_grad: bool = False) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end``, both included (float32 by
    default). Like PyTorch, the first half counts up from ``start`` and the second half
    down from ``end``, so both ends are exact."""
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"linspace: number of steps must be a non-negative int, got {steps!r}")
    for name, v in (("start", start), ("end", end)):
        if isinstance(v, Tensor):
            if v.ndim:
                raise ValueError(f"linspace: {name} must be a number or a 0-d tensor, got "
                                 f"shape {tuple(v.shape)}")
    start, end = (v.item() if isinstance(v, Tensor) else v for v in (start, end))
    dtype = _dtype(dtype)
    if dtype == dtypes.bool_:
        # PyTorch has no linspace for bool and raises NotImplementedError (a RuntimeError);
        # NumPy's would cast the values
        raise NotImplementedError("linspace: dtype bool is not supported, expected a "
                                  "floating or integer dtype")
    backend = get_backend(device or "cpu")
    with backend.on_device():
        values = _linspace_values(backend.xp, start, end, steps, dtype)
    return _finish(values, backend, requires_grad)


def _linspace_values(xp: Any, start: Any, end: Any, steps: int, dtype: np.dtype) -> Any:
    # computed in the output's float dtype, as PyTorch does, so float32 values match its
    work = dtype if dtypes.is_floating(dtype) and dtype.itemsize >= 4 else np.dtype(np.float64)
    i = xp.arange(int(steps)).astype(work)
    begin, finish = work.type(start), work.type(end)
    step = (finish - begin) / work.type(steps - 1) if steps > 1 else work.type(0)
    values = xp.where(i < steps // 2, begin + i * step, finish - (steps - 1 - i) * step)
    if steps == 1:
        values = xp.full(1, begin, dtype=work)
    if dtypes.is_integer(dtype):
        values = xp.trunc(values)
    return values.astype(dtype)
