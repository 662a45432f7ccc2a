"""Small helpers the op families share: operand lifting, broadcasting, dims."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..autograd import unbroadcast  # noqa: F401  (re-exported for the ops)
from ..tensor import Tensor, _wrap_dim

SCALAR_TYPES = (int, float, bool, np.number, np.bool_)


def shape_of(x: Any) -> tuple:
    return getattr(x, "shape", ())  # a Python scalar has shape ()


def as_tensor_like(value: Any, like: Tensor, op: str) -> Any:
    """A Python scalar stays a scalar (cheap); arrays and lists become Tensors on ``like``'s
    device; anything else is a TypeError naming the op."""
    if isinstance(value, Tensor) or isinstance(value, SCALAR_TYPES):
        return value
    if isinstance(value, (list, tuple)) or hasattr(value, "__array_interface__") \
            or hasattr(value, "__cuda_array_interface__"):
        return Tensor._make(like._backend.asarray(value), like._backend, False)
    raise TypeError(f"{op}: expected a Tensor or a number, got {type(value).__name__}")


def binary_operands(a: Any, b: Any, op: str) -> tuple:
    """Lift the operands of a binary op and check their shapes broadcast."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):  # the common case, kept cheap
        if a.data.shape != b.data.shape:
            check_broadcast(op, a.data.shape, b.data.shape)
        return a, b
    if isinstance(a, Tensor):
        b = as_tensor_like(b, a, op)
    elif isinstance(b, Tensor):
        a = as_tensor_like(a, b, op)
    else:
        raise TypeError(f"{op}: expected at least one Tensor, got {type(a).__name__} "
                        f"and {type(b).__name__}")
    shape_a, shape_b = shape_of(a), shape_of(b)
    if shape_a != shape_b and shape_a and shape_b:  # a scalar always broadcasts
        check_broadcast(op, shape_a, shape_b)
    return a, b


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


def require_tensor(x: Any, op: str, name: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected {name} to be a Tensor, got {type(x).__name__}")
    return x


def require_float(x: Tensor, op: str, name: str = "input") -> None:
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        raise TypeError(f"{op}: expected a floating-point {name}, got {x.dtype}")
