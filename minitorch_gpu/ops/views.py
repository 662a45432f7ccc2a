"""Views: view/reshape, transpose/permute, (un)squeeze, expand, basic slicing (ints,
slices, None, ...), narrow/split/chunk, and the strides that decide whether a view exists.

A view shares memory with its input: only shape and strides change (O(1), no copy);
``reshape`` copies only where no strides can show the new shape, as in PyTorch.
"""
from __future__ import annotations

import builtins
from typing import Any, Optional, Sequence

import numpy as np

from ..autograd import Function
from ..backend import dtypes
from ..tensor import Tensor, _wrap_dim
from ._util import require_tensor, unbroadcast


def contiguous_strides(shape: Sequence[int]) -> tuple:
    """Row-major strides, in elements, of a tensor of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= builtins.max(n, 1)
    return tuple(reversed(strides))


def view_strides(shape: Sequence[int], strides: Sequence[int],
                 new_shape: Sequence[int]) -> Optional[tuple]:
    """Strides that show the same memory as ``new_shape``, or None if no strides can.

    Dims of the old shape that lie back to back in memory (stride[i] == stride[i+1] *
    shape[i+1]) form one chunk; a view may split and merge dims only inside a chunk.
    This is the rule PyTorch's ``view`` applies.
    """
    if int(np.prod(shape)) == 0 or len(shape) == 0:
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_stride = strides[-1]  # stride of the innermost dim of the current chunk
    chunk_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        chunk_numel *= shape[d]
        chunk_ends = d == 0 or (shape[d - 1] != 1 and strides[d - 1] != chunk_numel * chunk_stride)
        if not chunk_ends:
            continue
        # give the chunk's elements to new dims, innermost first
        while view_d >= 0 and (view_numel < chunk_numel or new_shape[view_d] == 1):
            new_strides[view_d] = view_numel * chunk_stride
            view_numel *= new_shape[view_d]
            view_d -= 1
        if view_numel != chunk_numel:
            return None  # a new dim would straddle two chunks
        if d > 0:
            chunk_stride = strides[d - 1]
            chunk_numel = view_numel = 1
    return tuple(new_strides) if view_d == -1 else None


def infer_shape(shape: Sequence[int], numel: int, op: str) -> tuple:
    """``shape`` with one -1 resolved so that it holds ``numel`` elements."""
    shape = tuple(shape)
    unknown = [i for i, n in enumerate(shape) if n == -1]
    if len(unknown) > 1 or builtins.any(n < -1 for n in shape):
        raise ValueError(f"{op}: invalid shape {shape}: at most one -1 and no other negatives")
    known = int(np.prod([n for n in shape if n != -1]))
    if unknown:
        if known == 0 or numel % known:
            raise ValueError(f"{op}: shape {shape} is invalid for a tensor of {numel} elements")
        shape = shape[:unknown[0]] + (numel // known,) + shape[unknown[0] + 1:]
    elif known != numel:
        raise ValueError(f"{op}: shape {shape} is invalid for a tensor of {numel} elements")
    return shape


class Reshape(Function):
    """Reshape; a view whenever the strides allow (``view`` checks they do first)."""

    @staticmethod
    def forward(ctx, a, shape):
        ctx.in_shape = a.shape
        return a.reshape(shape)

    @staticmethod
    def backward(ctx, grad):
        return grad.reshape(ctx.in_shape), None


class ReshapeView(Reshape):
    returns_view = True


def view(a: Tensor, shape: Sequence[int]) -> Tensor:
    """Same memory, new shape; RuntimeError when the strides cannot express it."""
    require_tensor(a, "view")
    shape = infer_shape(shape, a.data.size, "view")
    if view_strides(a.shape, a.stride(), shape) is None:
        raise RuntimeError(
            f"view: shape {shape} is not compatible with the input's shape "
            f"{tuple(a.shape)} and strides {a.stride()} (the tensor is not contiguous "
            "there); use .reshape(...), which copies when it must, or .contiguous().view(...)")
    return ReshapeView.apply(a, shape)


def view_dtype(a: Tensor, dtype: Any) -> Tensor:
    """The same bytes read as ``dtype`` (PyTorch's ``view(dtype)``): same memory, no copy.

    Of equal itemsize, any layout and the same shape. Otherwise the last dim shrinks or
    grows by the ratio of the itemsizes, as in PyTorch, which needs it to have stride 1
    (and, to grow the itemsize, a size and other strides the ratio divides). Not
    differentiable: the result is cut from the graph, as an integer reading of floats must be.
    """
    require_tensor(a, "view")
    dtype = dtypes.as_dtype(dtype)
    old, new = a.dtype.itemsize, dtype.itemsize
    if old != new:
        names = f"{a.dtype} as {dtype} (different element sizes)"
        if a.ndim == 0:
            raise RuntimeError(f"view: a 0-d tensor cannot be viewed as {names}")
        if a.stride(-1) != 1:
            raise RuntimeError(f"view: the last dim must have stride 1 to view {names}, got "
                               f"strides {a.stride()}")
        if new > old:
            ratio = new // old
            if a.shape[-1] % ratio:
                raise RuntimeError(f"view: self.size(-1) must be divisible by {ratio} to view "
                                   f"{names}, but got {a.shape[-1]}")
            if builtins.any(s % ratio for s in a.stride()[:-1]):
                raise RuntimeError(f"view: self.stride(k) must be divisible by {ratio} for "
                                   f"every k < ndim - 1 to view {names}, got strides "
                                   f"{a.stride()}")
    out = Tensor._make(a.data.view(dtype), a._backend, False)
    out._version = a._version  # a view: in-place updates of either are seen by both
    return out


def reshape(a: Tensor, shape: Sequence[int]) -> Tensor:
    """A view when the strides allow, otherwise a copy."""
    require_tensor(a, "reshape")
    shape = infer_shape(shape, a.data.size, "reshape")
    if view_strides(a.shape, a.stride(), shape) is not None:
        return ReshapeView.apply(a, shape)
    return Reshape.apply(a, shape)


def flatten(a: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    require_tensor(a, "flatten")
    if a.ndim == 0:
        return reshape(a, (1,))
    start, end = _wrap_dim(start_dim, a.ndim, "flatten"), _wrap_dim(end_dim, a.ndim, "flatten")
    if start > end:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = a.shape[:start] + (int(np.prod(a.shape[start:end + 1])),) + a.shape[end + 1:]
    return reshape(a, shape)


def unsqueeze(a: Tensor, dim: int) -> Tensor:
    require_tensor(a, "unsqueeze")
    d = _wrap_dim(dim, a.ndim + 1, "unsqueeze")
    return ReshapeView.apply(a, a.shape[:d] + (1,) + a.shape[d:])


def squeeze(a: Tensor, dim: Any = None) -> Tensor:
    """Drop size-1 dims (all of them, or those of ``dim`` that have size 1)."""
    require_tensor(a, "squeeze")
    if dim is None:
        drop = {i for i, n in enumerate(a.shape) if n == 1}
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        drop = {d for d in (_wrap_dim(d, a.ndim, "squeeze") for d in dims)
                if a.ndim and a.shape[d] == 1}  # a 0-d tensor accepts dim 0 and stays 0-d
    if not drop:
        return a
    return ReshapeView.apply(a, tuple(n for i, n in enumerate(a.shape) if i not in drop))


class Permute(Function):
    returns_view = True

    @staticmethod
    def forward(ctx, a, dims):
        ctx.dims = dims
        return a.transpose(dims)

    @staticmethod
    def backward(ctx, grad):
        inverse = tuple(int(d) for d in np.argsort(ctx.dims))
        return grad.transpose(inverse), None


def transpose(a: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dims: a view with the two strides swapped."""
    require_tensor(a, "transpose")
    dims = list(range(a.ndim))
    d0, d1 = _wrap_dim(dim0, a.ndim, "transpose"), _wrap_dim(dim1, a.ndim, "transpose")
    if a.ndim:  # a 0-d tensor accepts dims 0 and -1 and stays as it is (still a view)
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return Permute.apply(a, tuple(dims))


def permute(a: Tensor, dims: Sequence[int]) -> Tensor:
    require_tensor(a, "permute")
    wrapped = tuple(_wrap_dim(d, a.ndim, "permute") for d in dims)
    if sorted(wrapped) != list(range(a.ndim)):
        raise ValueError(f"permute: dims {tuple(dims)} are not a permutation of the "
                         f"{a.ndim} dims of a tensor of shape {tuple(a.shape)}")
    return Permute.apply(a, wrapped)


class Expand(Function):
    returns_view = True

    @staticmethod
    def forward(ctx, a, shape):
        ctx.in_shape = a.shape
        return ctx.xp.broadcast_to(a, shape)  # stride 0 along expanded dims; read-only

    @staticmethod
    def backward(ctx, grad):
        return unbroadcast(grad, ctx.in_shape), None


def expand(a: Tensor, shape: Sequence[int]) -> Tensor:
    """Broadcast to ``shape`` (-1 keeps a dim) as a view with stride 0 on expanded dims."""
    require_tensor(a, "expand")
    shape = tuple(shape)
    if len(shape) < a.ndim:
        raise ValueError(f"expand: the target shape {shape} has fewer dims than the input "
                         f"{tuple(a.shape)}")
    lead = len(shape) - a.ndim
    target = []
    for i, n in enumerate(shape):
        old = a.shape[i - lead] if i >= lead else None
        if n == -1:
            if old is None:
                raise ValueError(f"expand: -1 is not allowed for the new leading dim {i}")
            n = old
        if old is not None and old != 1 and old != n:
            raise ValueError(f"expand: cannot expand shape {tuple(a.shape)} to {shape}: dim "
                             f"{i} has size {old}, only size-1 dims can grow")
        target.append(n)
    target = tuple(target)
    return a if target == a.shape else Expand.apply(a, target)


class Slice(Function):
    """Basic indexing (ints, slices, None, ...): a view."""

    returns_view = True

    @staticmethod
    def forward(ctx, a, key):
        ctx.in_shape, ctx.key = a.shape, key
        # NumPy turns a key that picks one element (x[0] of a 1-D x, x[()]) into a scalar
        # copy; with an Ellipsis in the key it returns a 0-d view instead
        if not any(k is Ellipsis for k in key):
            key = key + (Ellipsis,)
        return a[key]

    @staticmethod
    def backward(ctx, grad):
        out = ctx.xp.zeros(ctx.in_shape, dtype=grad.dtype)
        out[ctx.key] = grad
        return out, None


def narrow(a: Tensor, dim: int, start: int, length: int) -> Tensor:
    """Elements ``start .. start+length-1`` along ``dim``: a view."""
    require_tensor(a, "narrow")
    d = _wrap_dim(dim, a.ndim, "narrow")
    size = a.shape[d]
    if start < 0:
        start += size
    if not (0 <= start <= size and length >= 0 and start + length <= size):
        raise IndexError(f"narrow: start {start} and length {length} do not fit in dim {d} "
                         f"of size {size}")
    key = (slice(None),) * d + (slice(start, start + length),)
    return Slice.apply(a, key)


def split(a: Tensor, split_size: Any, dim: int = 0) -> tuple:
    """Views of ``split_size`` along ``dim`` (the last may be smaller), or of the sizes in a
    list."""
    require_tensor(a, "split")
    d = _wrap_dim(dim, a.ndim, "split")
    size = a.shape[d]
    if isinstance(split_size, int):
        if split_size <= 0:
            raise ValueError(f"split: split_size must be positive, got {split_size}")
        sizes = [builtins.min(split_size, size - s) for s in range(0, size, split_size)] or [0]
    else:
        sizes = [int(s) for s in split_size]
        if builtins.sum(sizes) != size:
            raise ValueError(f"split: sizes {sizes} sum to {builtins.sum(sizes)}, but dim {d} "
                             f"has size {size}")
    starts = np.cumsum([0] + sizes[:-1]).tolist()
    return tuple(narrow(a, d, s, n) for s, n in zip(starts, sizes))


def chunk(a: Tensor, chunks: int, dim: int = 0) -> tuple:
    """At most ``chunks`` views of equal size (the last may be smaller), as torch.chunk."""
    require_tensor(a, "chunk")
    if not isinstance(chunks, int) or chunks <= 0:
        raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    size = a.shape[_wrap_dim(dim, a.ndim, "chunk")]
    return split(a, builtins.max(-(-size // chunks), 1), dim)
