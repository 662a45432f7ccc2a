"""The ``cupy.*`` functions of the stand-in: ufuncs, creation, shape and sorting routines,
each NumPy's on the arrays' device views, with CuPy's refusals on top (each cited from
CuPy v14.2.0).

Only what the engine calls is here (``FUNCTIONS``, ``UFUNCS``, ``CREATION``);
``tests/test_cupy_stand_in.py`` checks every name against real CuPy where it is installed.
"""
from __future__ import annotations

from typing import Any, Optional

# (the names of ``FUNCTIONS`` and ``UFUNCS`` below shadow Python's max, min, sum, abs,
# round, all and any in this module: NumPy's or builtins' are spelled out where meant)

import numpy as np

from .. import memory
from . import cuda
import builtins

from .array import (ndarray, record_read, reduction_input, refuse_upload_while_capturing,
                    unwrap, wrap, written_of)
from .indexing import wrap_indices

from .ufunc_types import resolve as _resolve_types  # CuPy's loops (scripts/cupy_tables.py)
from .signatures import check_call  # CuPy's signatures (scripts/cupy_tables.py)

full_sorts = [0]  # argsorts of whole rows that argpartition fell back to (see argpartition)


def refuse_host(value: Any) -> None:
    """CuPy's operations take no NumPy array (``_kernel.pyx``, ``_preprocess_args``)."""
    raise TypeError(f"Unsupported type {type(value)}")


def _current() -> int:
    return cuda.current_device_id()


class ufunc:
    """``cupy.ufunc``: NumPy's loop of the same name, on device arrays, accepting only the
    operand dtypes CuPy's own loops take (``ufunc_types.resolve``)."""

    def __init__(self, name: str) -> None:
        self.__name__ = name
        self._numpy = getattr(np, name)
        self.nin, self.nout = self._numpy.nin, self._numpy.nout

    def __repr__(self) -> str:
        return f"<stand-in ufunc '{self.__name__}'>"

    def __call__(self, *args: Any, out: Any = None, dtype: Any = None,
                 casting: str = "same_kind", **kwargs: Any) -> Any:
        device = _current()
        inputs = unwrap(list(args[:self.nin]), device)
        outputs = out if out is not None else args[self.nin:] or None
        loop = _resolve_types(self.__name__, inputs, dtype=dtype)
        # CuPy converts each operand to its loop's input type first (``_kernel.pyx``,
        # ``_get_out_args``/``_preprocess_args``): a bf16 logical_not runs in float32
        inputs = [x.astype(t) if isinstance(x, np.ndarray) and x.dtype != t else x
                  for x, t in zip(inputs, loop.in_dtypes)]
        if outputs is not None:
            single = not isinstance(outputs, tuple)
            views = unwrap((outputs,) if single else tuple(outputs), device)
            self._numpy(*inputs, out=views, casting=casting, **kwargs)
            return outputs
        # the results written straight into new device buffers of the loop's output types
        shape = np.broadcast_shapes(*(np.shape(x) for x in inputs))
        results = tuple(memory.empty(shape, t) for t in loop.out_dtypes)
        self._numpy(*inputs, out=results, casting="unsafe", **kwargs)
        arrays = tuple(ndarray._of(r, device) for r in results)
        return arrays if len(arrays) > 1 else arrays[0]


UFUNCS = (
    "abs", "absolute", "add", "arccos", "arccosh", "arcsin", "arcsinh", "arctan",
    "arctan2", "arctanh", "bitwise_and", "bitwise_or", "bitwise_xor", "cbrt", "ceil",
    "cos", "cosh", "divide", "equal", "exp", "exp2", "expm1", "floor", "floor_divide",
    "fmod", "greater", "greater_equal", "invert", "isfinite", "isinf", "isnan",
    "left_shift", "less", "less_equal", "log", "log10", "log1p", "log2", "logaddexp",
    "logical_and", "logical_not", "logical_or", "logical_xor", "matmul", "maximum",
    "minimum", "multiply", "negative", "not_equal", "positive", "power", "reciprocal",
    "remainder", "right_shift", "rint", "sign", "signbit", "sin", "sinh", "sqrt", "square",
    "subtract", "tan", "tanh", "true_divide", "trunc", "fmax", "fmin", "copysign",
    "float_power", "divmod",
)
for _name in UFUNCS:
    globals()[_name] = ufunc(_name)


_REDUCTIONS = frozenset({"sum", "prod", "max", "min", "amax", "amin", "any", "all"})


def _on_device(function: Any, name: str) -> Any:
    """``function`` (NumPy's) on device arrays: operands unwrapped (refusing host arrays
    and other devices' arrays), the result wrapped on the current device (a view of the
    first array operand stays its view). The call is first bound against CuPy's own
    signature of ``name``: a keyword NumPy takes and CuPy lacks is a TypeError here too."""
    path = "cupy." + name

    def on_device(*args: Any, **kwargs: Any) -> Any:
        check_call(path, args, kwargs)
        device = _current()
        like = next((a for a in args if isinstance(a, ndarray)), None)
        args = unwrap(list(args), device)
        kwargs = {k: unwrap(v, device) for k, v in kwargs.items()}
        if name in _REDUCTIONS and args and isinstance(args[0], np.ndarray):
            args[0] = reduction_input(name.lstrip("a") if name in ("amax", "amin") else name,
                                      args[0], kwargs.get("dtype"))
        return wrap(function(*args, **kwargs), like=like)
    on_device.__name__ = name
    return on_device


# routines that compute on device arrays, NumPy's under the same name
FUNCTIONS = (
    "allclose", "argmax", "argmin", "array_equal", "broadcast_to", "concatenate",
    "copyto", "cumprod", "cumsum", "einsum", "expand_dims", "flip", "isclose", "moveaxis",
    "nonzero", "reshape", "result_type", "roll", "round", "searchsorted", "split",
    "squeeze", "stack", "swapaxes", "tile", "transpose", "tril", "triu", "where",
    "sum", "prod", "max", "min", "mean", "var", "std", "all", "any", "amax", "amin",
    "count_nonzero", "diag", "outer", "dot", "vstack", "hstack", "atleast_1d",
    "ravel", "repeat", "unique", "bincount", "linspace", "nan_to_num", "unravel_index",
    "vdot",
)
for _name in FUNCTIONS:
    globals()[_name] = _on_device(getattr(np, _name), _name)


def copyto(dst: ndarray, src: Any, casting: str = "same_kind", where: Any = True) -> None:
    device = _current()
    np.copyto(unwrap(dst, device), unwrap(src, device), casting=casting,
              where=unwrap(where, device))


def take(a: ndarray, indices: Any, axis: Optional[int] = None, out: Any = None) -> Any:
    """Wrapped indices (``_take_kernel``)."""
    device = _current()
    view, index = unwrap(a, device), unwrap(indices, device)
    size = view.size if axis is None else view.shape[axis]
    result = np.take(view, wrap_indices(np.asarray(index), size), axis=axis)
    if out is not None:
        unwrap(out, device)[...] = result
        return out
    return wrap(result)


def take_along_axis(a: ndarray, indices: ndarray, axis: Optional[int]) -> Any:
    """Wrapped indices: CuPy indexes with them (``cupy/_indexing/indexing.py``)."""
    device = _current()
    view, index = unwrap(a, device), unwrap(indices, device)
    size = view.size if axis is None else view.shape[axis]
    return wrap(np.take_along_axis(view, wrap_indices(index, size), axis=axis))


def clip(a: ndarray, a_min: Any, a_max: Any, out: Any = None) -> Any:
    """CuPy's ``_ndarray_clip`` (``cupy/_core/_routines_math.pyx``) replaces a None bound by
    the dtype's extreme only for kinds 'f', 'i' and 'u'; for bfloat16 (kind 'V') the None
    reaches the ufunc, which refuses it."""
    device = _current()
    view = unwrap(a, device)
    if (a_min is None or a_max is None) and view.dtype.kind not in "fiu":
        raise TypeError("Unsupported type <class 'NoneType'>")
    low, high = unwrap(a_min, device), unwrap(a_max, device)
    if out is not None:
        np.clip(view, low, high, out=unwrap(out, device))
        return out
    return wrap(np.clip(view, low, high))


_THRUST_REFUSES = ("V",)  # cupy/cuda/thrust.pyx: no dtype id for bfloat16 (kind 'V')


def _check_sortable(view: np.ndarray, what: str) -> None:
    """Thrust sorts no bfloat16 (``cupy/cuda/common.pyx`` has no dtype id for it)."""
    if view.dtype.kind in _THRUST_REFUSES:
        raise NotImplementedError(f"Sorting arrays with dtype '{view.dtype}' is not "
                                  f"supported ({what})")


def argsort(a: ndarray, axis: int = -1, kind: Any = None) -> Any:
    view = unwrap(a, _current())
    _check_sortable(view, "argsort")
    return wrap(np.argsort(view, axis=axis, kind="stable"))


def sort(a: ndarray, axis: int = -1, kind: Any = None) -> Any:
    view = unwrap(a, _current())
    _check_sortable(view, "sort")
    return wrap(np.sort(view, axis=axis, kind="stable"))


ARGPARTITION_SORT_FROM = 1024  # CuPy's partition kernel takes k below this


def argpartition(a: ndarray, kth: Any, axis: int = -1) -> Any:
    """CuPy's argpartition (``_ndarray_argpartition`` in ``_routines_sorting.pyx``) runs a
    partition kernel only while the largest kth, rounded up to a power of two, stays
    under 1024; past it, it sorts the whole axis (counted in ``full_sorts``), with the
    sort's dtype refusals."""
    view = unwrap(a, _current())
    for check in ("argpartition: (indices < 0).any()", "argpartition: (indices > 0).any()"):
        record_read(check)  # CuPy 14.2 checks the positions it unravels on the host
    largest = int(np.max(kth)) + 1  # (this module's max is cupy.max: NumPy's here)
    if 1 << (largest - 1).bit_length() >= ARGPARTITION_SORT_FROM:
        full_sorts[0] += 1
        _check_sortable(view, "argpartition of a large kth")
    return wrap(np.argpartition(view, kth, axis=axis))


def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None, *,
            blocking: bool = True) -> np.ndarray:
    if isinstance(a, ndarray):
        return a.get(order=order, out=out)
    return np.asarray(a, order=order)


# --- creation: on the current device ------------------------------------------------------
def _new(shape: Any, dtype: Any) -> ndarray:
    return ndarray._of(memory.empty(shape, dtype), _current())


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _new(shape, dtype)


def _filled(shape: Any, value: Any, dtype: Any) -> ndarray:
    out = _new(shape, dtype)
    out._view[...] = value
    return out


def zeros(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _filled(shape, 0, dtype)


def ones(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _filled(shape, 1, dtype)


def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C") -> ndarray:
    fill = unwrap(fill_value, _current())
    return _filled(shape, fill, np.asarray(fill).dtype if dtype is None else dtype)


def _like(a: ndarray, dtype: Any, shape: Any) -> tuple:
    return (a.shape if shape is None else shape), (a.dtype if dtype is None else dtype)


def empty_like(prototype: ndarray, dtype: Any = None, order: str = "K", subok: Any = None,
               shape: Any = None) -> ndarray:
    return _new(*_like(prototype, dtype, shape))


def zeros_like(a: ndarray, dtype: Any = None, order: str = "K", subok: Any = None,
               shape: Any = None) -> ndarray:
    return _filled(*_like(a, dtype, shape)[:1], 0, _like(a, dtype, shape)[1])


def ones_like(a: ndarray, dtype: Any = None, order: str = "K", subok: Any = None,
              shape: Any = None) -> ndarray:
    return _filled(*_like(a, dtype, shape)[:1], 1, _like(a, dtype, shape)[1])


def full_like(a: ndarray, fill_value: Any, dtype: Any = None, order: str = "K",
              subok: Any = None, shape: Any = None) -> ndarray:
    shape, dtype = _like(a, dtype, shape)
    return _filled(shape, unwrap(fill_value, _current()), dtype)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> ndarray:
    return wrap(np.arange(start, stop, step, dtype=dtype))


def eye(N: int, M: Optional[int] = None, k: int = 0, dtype: Any = float,
        order: str = "C") -> ndarray:
    return wrap(np.eye(N, M, k, dtype=dtype))


def tri(N: int, M: Optional[int] = None, k: int = 0, dtype: Any = float) -> ndarray:
    return wrap(np.tri(N, M, k, dtype=dtype))


def array(obj: Any, dtype: Any = None, copy: bool = True, order: str = "K",
          subok: bool = False, ndmin: int = 0, *, blocking: bool = False) -> ndarray:
    """Host data uploaded (NumPy arrays included: the one door in); a device array copied
    (to the current device, from any)."""
    if isinstance(obj, ndarray):
        source = obj._view
        cuda.check_ordered(written_of(obj), "the source of a copy")
        result = np.array(source, dtype=dtype, copy=True, ndmin=ndmin)
        return ndarray._of(_copy_in(result), _current())
    if isinstance(obj, (list, tuple)) and builtins.any(isinstance(v, ndarray) for v in obj):
        return wrap(np.array(unwrap(list(obj), _current()), dtype=dtype, ndmin=ndmin))
    host = np.array(obj, dtype=dtype, copy=True, ndmin=ndmin)
    if host.dtype == object:
        raise ValueError("Unsupported dtype object")
    refuse_upload_while_capturing(host, "cupy.array/asarray of host data")
    return ndarray._of(_copy_in(host), _current())


def _copy_in(host: np.ndarray) -> np.ndarray:
    out = memory.empty(host.shape, host.dtype)
    out[...] = host
    return out


def asarray(a: Any, dtype: Any = None, order: Any = None, *, blocking: bool = False) -> Any:
    if isinstance(a, ndarray) and (dtype is None or np.dtype(dtype) == a.dtype):
        if a._device != _current():  # CuPy copies across devices here
            return array(a)
        return a
    return array(a, dtype=dtype)


def ascontiguousarray(a: Any, dtype: Any = None) -> Any:
    if isinstance(a, ndarray) and a._view.flags.c_contiguous and \
            (dtype is None or np.dtype(dtype) == a.dtype) and a._device == _current():
        return a
    if isinstance(a, ndarray):
        unwrap(a, _current())  # another device's array: refused as by its kernels
        return ndarray._of(_copy_in(np.ascontiguousarray(a._view, dtype=dtype)), _current())
    return array(a, dtype=dtype)


def broadcast(*arrays: Any) -> Any:
    return np.broadcast(*unwrap(list(arrays), _current()))


def matmul_refusals(a: np.ndarray, b: np.ndarray) -> None:
    """CuPy 14 refuses batched bfloat16 products (cupy/cupy#10317)."""
    if a.dtype.kind == "V" and (a.ndim > 2 or b.ndim > 2):
        raise TypeError("cupy.matmul: batched bfloat16 products are not supported")


def matmul(*args: Any, out: Any = None, **kwargs: Any) -> Any:
    """A gufunc in CuPy: ``matmul(x1, x2, /, out=...)``."""
    if len(args) != 2 or kwargs:
        raise TypeError(f"matmul takes two operands and out=, got {len(args)} operands"
                        f"{' and ' + ', '.join(kwargs) if kwargs else ''}")
    device = _current()
    left, right = unwrap(args[0], device), unwrap(args[1], device)
    matmul_refusals(left, right)
    cuda.device.get_cublas_handle()  # CuPy's matmul is a cuBLAS GEMM on this device
    if out is not None:
        np.matmul(left, right, out=unwrap(out, device))
        return out
    return wrap(np.matmul(left, right))


def get_array_module(*args: Any) -> Any:
    """The stand-in's cupy where an argument is a device array, else NumPy."""
    if builtins.any(isinstance(a, ndarray) for a in args):
        import sys
        return sys.modules[__package__].cupy
    return np


# --- routines whose result's size or value CuPy reads back itself: each a host read -----
# (each a description per read: bincount and unravel_index read twice,
# cupy/_statistics/histogram.py and cupy/_indexing/generate.py, "# synchronize!")
_READS = {"nonzero": ("nonzero (the count of nonzeros)",), "unique": ("unique (its size)",),
          "bincount": ("bincount: (x < 0).any()", "bincount: int(cupy.max(x)) (its size)"),
          "allclose": ("allclose (a Python bool)",),
          "array_equal": ("array_equal (a Python bool)",),
          "unravel_index": ("unravel_index: (indices < 0).any()",
                            "unravel_index: (indices > 0).any()"),
          "where": ("where(condition) (nonzero: the count of nonzeros)",)}


def _reading(name: str) -> Any:
    counted = globals()[name]

    def reads(*args: Any, **kwargs: Any) -> Any:
        if name == "where" and (len(args) > 1 or kwargs):  # where(c, x, y): a kernel
            return counted(*args, **kwargs)
        if name == "unique" and args and isinstance(args[0], ndarray):
            _check_sortable(args[0]._view, "unique")  # CuPy's unique sorts
        for what in _READS[name]:
            record_read(what)
        return counted(*args, **kwargs)
    reads.__name__ = name
    return reads


for _name in _READS:
    globals()[_name] = _reading(_name)


def repeat(a: ndarray, repeats: Any, axis: Optional[int] = None) -> Any:
    """An array of counts is read back for the result's size (``cupy/_manipulation``)."""
    device = _current()
    if isinstance(repeats, ndarray):
        record_read("repeat (the sum of its counts)")
    return wrap(np.repeat(unwrap(a, device), unwrap(repeats, device), axis=axis))


class _StrideTricks:
    @staticmethod
    def as_strided(x: ndarray, shape: Any = None, strides: Any = None) -> ndarray:
        view = np.lib.stride_tricks.as_strided(unwrap(x, x._device), shape, strides)
        return ndarray._of(view, x._device, x if x._base is None else x._base)


class lib:
    stride_tricks = _StrideTricks


# --- the array's operators and NumPy's protocols: CuPy's ufuncs on device arrays ------
def _array_ufunc(self: ndarray, numpy_ufunc: Any, method: str, *inputs: Any,
                 **kwargs: Any) -> Any:
    ours = globals().get(numpy_ufunc.__name__)
    if not isinstance(ours, ufunc) or method != "__call__":
        return NotImplemented
    return ours(*inputs, **kwargs)


def _array_function(self: ndarray, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    ours = globals().get(func.__name__)
    if ours is None or not callable(ours):
        return NotImplemented
    return ours(*args, **kwargs)


def _binary(name: str, reflected: bool = False) -> Any:
    def method(self: ndarray, other: Any) -> Any:
        if isinstance(other, np.ndarray):
            if reflected:
                return NotImplemented
            refuse_host(other)
        op = globals()[name]
        return op(other, self) if reflected else op(self, other)
    return method


def _inplace(name: str) -> Any:
    def method(self: ndarray, other: Any) -> Any:
        globals()[name](self, other, out=self)
        return self
    return method


def _unary(name: str) -> Any:
    return lambda self: globals()[name](self)


# the methods CuPy implements with its functions (``_ndarray_argsort``, ``_ndarray_clip``,
# ``_ndarray_take``, ``_ndarray_nonzero``): the same refusals, wrapping and reads
ndarray.argsort = lambda self, axis=-1, kind=None: argsort(self, axis, kind)
ndarray.clip = lambda self, min=None, max=None, out=None: clip(self, min, max, out)
ndarray.take = lambda self, indices, axis=None, out=None: take(self, indices, axis, out)
ndarray.nonzero = lambda self: nonzero(self)
ndarray.repeat = lambda self, repeats, axis=None: repeat(self, repeats, axis)


def _sort_in_place(self: ndarray, axis: int = -1, kind: Any = None) -> None:
    """``ndarray.sort`` sorts in place (Thrust: no bfloat16)."""
    _check_sortable(self._view, "sort")
    self._view.sort(axis=axis, kind="stable")


ndarray.sort = _sort_in_place
ndarray.__array_ufunc__ = _array_ufunc
ndarray.__array_function__ = _array_function
for _op, _name in {"add": "add", "sub": "subtract", "mul": "multiply",
                   "truediv": "true_divide", "floordiv": "floor_divide", "mod": "remainder",
                   "pow": "power", "matmul": "matmul", "and": "bitwise_and",
                   "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "left_shift",
                   "rshift": "right_shift"}.items():
    setattr(ndarray, f"__{_op}__", _binary(_name))
    setattr(ndarray, f"__r{_op}__", _binary(_name, reflected=True))
    setattr(ndarray, f"__i{_op}__", _inplace(_name))
for _op, _name in {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal",
                   "eq": "equal", "ne": "not_equal"}.items():
    setattr(ndarray, f"__{_op}__", _binary(_name))
for _op, _name in {"neg": "negative", "pos": "positive", "abs": "absolute",
                   "invert": "invert"}.items():
    setattr(ndarray, f"__{_op}__", _unary(_name))
del _op


del _name
