"""Small helpers the op families share: operand lifting, type promotion, broadcasting,
dims."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Optional

import numpy as np

from ..amp import autocast_dtype
from ..autograd import unbroadcast  # noqa: F401  (re-exported for the ops)
from ..backend import dtypes
from ..creation import check_number_dtype, data_array
from ..tensor import Tensor, _wrap_dim

SCALAR_TYPES = (int, float, bool, np.number, np.bool_)


def shape_of(x: Any) -> tuple:
    return getattr(x, "shape", ())  # a Python scalar has shape ()


def as_tensor_like(value: Any, like: Tensor, op: str) -> Any:
    """A Python scalar stays a scalar (cheap); arrays and lists become Tensors on ``like``'s
    device; anything else is a TypeError naming the op."""
    if isinstance(value, Tensor) or isinstance(value, SCALAR_TYPES):
        return value
    if isinstance(value, (list, tuple)):  # checked as ``tensor`` checks it, NumPy's dtype
        return Tensor._make(like._backend.asarray(data_array(value, op)), like._backend, False)
    if hasattr(value, "__array_interface__") or hasattr(value, "__cuda_array_interface__"):
        check_number_dtype(value.dtype, op, type(value).__name__)
        return Tensor._make(like._backend.asarray(value), like._backend, False)
    raise TypeError(f"{op}: expected a Tensor or a number, got {type(value).__name__}")


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


# --- type promotion -----------------------------------------------------------------------
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
    from .shape import to_dtype  # shape builds on this module
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


def check_broadcast(op: str, *shapes: tuple) -> tuple:
    """The broadcast shape of ``shapes``, or ValueError naming the op and the shapes."""
    first = shapes[0]
    if all(s == first for s in shapes):
        return first
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        listed = " and ".join(str(s) for s in shapes)
        raise ValueError(f"{op}: shapes cannot broadcast: {listed}") from None


def normalize_dims(dim: Any, ndim: int, op: str) -> Optional[tuple]:
    """``dim`` (None, an int or a sequence of ints) as a sorted tuple of non-negative dims,
    or None for all dims: as in PyTorch, an empty sequence means all dims, and a 0-d tensor
    accepts dim 0 or -1 (there is nothing to reduce)."""
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        dims = tuple(sorted(_wrap_dim(d, ndim, op) for d in dim))
        if len(set(dims)) != len(dims):
            raise ValueError(f"{op}: dim {tuple(dim)} names a dim twice")
        return dims if dims and ndim else None
    dims = (_wrap_dim(dim, ndim, op),)
    return dims if ndim else None


def reduced_count(shape: tuple, axes: Optional[tuple]) -> int:
    if axes is None:
        return int(np.prod(shape, dtype=np.int64))
    return int(np.prod([shape[a] for a in axes], dtype=np.int64))


def expand_reduced(grad: Any, shape: tuple, axes: Optional[tuple], keepdim: bool, xp: Any) -> Any:
    """Broadcast the gradient of a reduction back over the reduced dims (a view, no copy)."""
    if not keepdim and axes is not None:
        grad = xp.expand_dims(grad, axes)
    return xp.broadcast_to(grad, shape)


def index_along(index: Any, dim: int, xp: Any) -> tuple:
    """The full position of every element of ``index`` in the array it indexes along
    ``dim``: its own position in every other dim, ``index`` along ``dim`` (the advanced
    index that undoes ``take_along_axis``, for the backward of gather, sort and topk)."""
    position = [xp.arange(n).reshape((-1,) + (1,) * (index.ndim - 1 - d))
                for d, n in enumerate(index.shape)]
    position[dim] = index
    return tuple(position)


NUMPY_NAMES = (("axis", "dim"), ("keepdims", "keepdim"))


def accept_numpy_names(fn: Any) -> Any:
    """``fn`` taking ``axis=`` for its ``dim`` and ``keepdims=`` for its ``keepdim``, as
    PyTorch's argument parser does for every op with those parameters (``x.sum(axis=0)``,
    ``mt.amax(x, axis=1, keepdims=True)``); ``fn`` itself when it has neither."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    aliases = tuple((alias, name) for alias, name in NUMPY_NAMES if name in params)
    if not aliases or getattr(fn, "accepts_numpy_names", False):
        return fn

    @functools.wraps(fn)
    def with_numpy_names(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            for alias, name in aliases:
                if alias in kwargs:
                    if name in kwargs:
                        raise TypeError(f"{fn.__name__}: got both {name}= and its alias "
                                        f"{alias}=")
                    kwargs[name] = kwargs.pop(alias)
        return fn(*args, **kwargs)
    with_numpy_names.accepts_numpy_names = True
    return with_numpy_names


def require_tensor(x: Any, op: str, name: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected {name} to be a Tensor, got {type(x).__name__}")
    return x


def require_float(x: Tensor, op: str, name: str = "input") -> None:
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        raise TypeError(f"{op}: expected a floating-point {name}, got {x.dtype}")




def widened(x: Any) -> Any:
    """``x`` in float32 when it is bf16/fp16 (the dtype to compute in, as PyTorch's "opmath"
    does), else ``x`` itself. Results are rounded back to the input's dtype by the op."""
    return x.astype(dtypes.float32) if x.dtype in dtypes.NARROW_FLOATS else x
