"""Small helpers the op families share: operand lifting, broadcasting, dims, checks.
Type promotion and casts are in ``promotion.py``."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Optional

import numpy as np

from .. import autograd
from ..autograd import Function, unbroadcast  # noqa: F401  (unbroadcast: for the ops)
from ..backend import dtypes
from ..from_python import check_number_dtype, data_array
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


class Untracked(Function):
    """``compute(*arrays)``, an op without a gradient, as a node: what ``untracked`` makes
    while a function is being captured, so that a replay computes it again."""

    @staticmethod
    def forward(ctx, compute, *arrays):
        return compute(*arrays)


def untracked(compute: Any, *args: Any) -> Tensor:
    """``compute(*arrays)`` as a Tensor outside the graph, ``args`` Tensors (their arrays
    are passed) or other values (passed as they are), at least one a Tensor: the ops
    without a gradient (argmax, comparisons, integer casts...). Eagerly the array is
    wrapped as it is (no node: 0.3 us, not a node's 2-3); while a function is being
    captured it goes through ``Untracked`` so the capture records it."""
    if autograd._recorder is not None:
        return Untracked.apply(compute, *args)
    backend = next(a for a in args if isinstance(a, Tensor))._backend
    return Tensor._make(compute(*(a.data if isinstance(a, Tensor) else a for a in args)),
                        backend, False)


def untracked_binary(ufunc: str, a: Any, b: Any) -> Tensor:
    """``xp.<ufunc>(a, b)`` of lifted operands (one at least a Tensor) as a Tensor outside
    the graph: the comparisons, logic and bitwise ops, which have no gradient."""
    xp = (a if isinstance(a, Tensor) else b)._backend.xp
    fn = getattr(xp, ufunc)
    return untracked(lambda x, y: xp.asarray(fn(x, y)), a, b)


def work_dtype(x: Any) -> Any:
    """The dtype to compute ``x`` in: float32 for bf16/fp16, else its own (``widened``'s)."""
    return dtypes.float32 if x.dtype in dtypes.NARROW_FLOATS else x.dtype


def widened(x: Any) -> Any:
    """``x`` in float32 when it is bf16/fp16 (the dtype to compute in, as PyTorch's "opmath"
    does), else ``x`` itself. Results are rounded back to the input's dtype by the op."""
    return x.astype(dtypes.float32) if x.dtype in dtypes.NARROW_FLOATS else x


def sigmoid_into(xp: Any, x: Any, s: Any, scratch: Any) -> None:
    """sigmoid(x) into ``s``, as exp(min(x, 0)) / (1 + exp(-|x|)): exp never overflows and
    the tail keeps its relative accuracy (0.5 (1 + tanh(x / 2)) rounds silu(-20) to 0 in
    float32). One exp: with e = exp(-|x|), the numerator exp(min(x, 0)) is e where x < 0
    and 1 where x >= 0, i.e. max(e, x >= 0). ``scratch`` is a buffer of x's shape,
    overwritten."""
    xp.abs(x, out=scratch)
    xp.negative(scratch, out=scratch)
    xp.exp(scratch, out=scratch)  # e = exp(-|x|), in (0, 1]
    xp.greater_equal(x, 0, out=s)  # 1.0 where x >= 0, else 0.0
    xp.maximum(s, scratch, out=s)  # the numerator: 1, or e
    scratch += 1
    s /= scratch


def nonzero_positions(backend: Any, array: Any) -> tuple:
    """The positions of ``array``'s non-zero (true) elements in row-major order, one int64
    array per dim, as ``xp.nonzero``, but with its one host read counted.

    How many there are decides the result's shape, so it must be read; ``xp.nonzero``
    reads it inside CuPy, where ``backend.host_reads`` cannot see it. Here a GPU sends
    the count alone through ``to_numpy`` and places each position by a running count (no
    other read); the CPU reads the whole array through ``to_numpy``, which costs nothing
    there. ``array`` has at least one dim.
    """
    xp = backend.xp
    if not array.size:  # nothing to count: no read
        return tuple(xp.zeros(0, dtype=np.int64) for _ in array.shape)
    if backend.reads_are_free:
        return tuple(w.astype(np.int64, copy=False)
                     for w in np.nonzero(backend.to_numpy(array)))
    with backend.on_device():
        flat = (array != 0).reshape(-1)  # (n,)
        running = xp.cumsum(flat, dtype=np.int64)  # (n,): non-zeros up to and with each
        count = int(backend.to_numpy(running[-1]))  # the one read
        # each non-zero's place in the result; the zeros all go to a spare slot at the end
        slot = xp.where(flat, running - 1, count)
        found = xp.empty(count + 1, dtype=np.int64)
        found[slot] = xp.arange(flat.size, dtype=np.int64)
        return tuple(xp.unravel_index(found[:count], array.shape))
