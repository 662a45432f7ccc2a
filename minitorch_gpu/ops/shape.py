"""Shape ops, views and indexing: view/reshape, transpose/permute, (un)squeeze, expand,
slicing, narrow/split/chunk, cat/stack, integer-array indexing and gather, copies and casts.

A view shares memory with its input: only shape and strides change (O(1), no copy).
Ops that copy (cat, stack, advanced indexing) return row-major arrays whatever the
inputs' layout, as PyTorch does (NumPy would keep a permuted layout, and ``.view`` of the
result would then fail where PyTorch's succeeds).
"""
from __future__ import annotations

import builtins
import functools
from typing import Any, Optional, Sequence

import numpy as np

from ..autograd import Function
from ..backend import dtypes, get_backend
from ..tensor import Tensor, _wrap_dim
from ._util import cast_to, index_along, promote_types, require_tensor


# --- strides ------------------------------------------------------------------------------
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


# --- view-producing Functions -------------------------------------------------------------
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


class Expand(Function):
    returns_view = True

    @staticmethod
    def forward(ctx, a, shape):
        ctx.in_shape = a.shape
        return ctx.xp.broadcast_to(a, shape)  # stride 0 along expanded dims; read-only

    @staticmethod
    def backward(ctx, grad):
        from ._util import unbroadcast
        return unbroadcast(grad, ctx.in_shape), None


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


class Gather(Function):
    """Advanced indexing with integer or bool arrays: a copy; backward scatter-adds, so
    repeated indices all receive their gradient."""

    @staticmethod
    def forward(ctx, a, key):
        ctx.in_shape, ctx.key = a.shape, key
        return ctx.xp.asarray(a[key], order="C")

    @staticmethod
    def backward(ctx, grad):
        out = ctx.xp.zeros(ctx.in_shape, dtype=grad.dtype)
        ctx.backend.scatter_add(out, ctx.key, grad)
        return out, None


# --- copies -------------------------------------------------------------------------------
class Copy(Function):
    """A fresh row-major copy (``contiguous`` of a non-contiguous tensor, ``clone``)."""

    @staticmethod
    def forward(ctx, a):
        return ctx.xp.array(a, copy=True, order="C")

    @staticmethod
    def backward(ctx, grad):
        return grad


class Cast(Function):
    @staticmethod
    def forward(ctx, a, dtype):
        ctx.in_dtype = a.dtype
        # float32 -> bf16 rounds to nearest, ties to even, in one pass on both backends:
        # ml_dtypes on the CPU (5x faster than the bit-level dtypes.float32_to_bfloat16 it
        # matches bit for bit), CUDA's __float2bfloat16_rn in CuPy's astype on the GPU
        # (checked against it in test_amp; only a NaN's payload differs)
        return a.astype(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.astype(ctx.in_dtype), None


class ToDevice(Function):
    """Move to another device; the gradient moves back. ``to_device`` rebinds the output.
    The target backend's ``asarray`` always copies: from the host, to it, and from another
    GPU (``cuda:0`` to ``cuda:1``), so the two tensors never share memory."""

    @staticmethod
    def forward(ctx, a, target):
        return target.asarray(a)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backend.asarray(grad), None


class Cat(Function):
    @staticmethod
    def forward(ctx, *arrays, dim):
        ctx.dim = dim
        ctx.sizes = [a.shape[dim] for a in arrays]
        return ctx.xp.asarray(ctx.xp.concatenate(arrays, axis=dim), order="C")

    @staticmethod
    def backward(ctx, grad):
        bounds = np.cumsum(ctx.sizes)[:-1]
        pieces = ctx.xp.split(grad, bounds.tolist(), axis=ctx.dim)
        return tuple(p if need else None for p, need in zip(pieces, ctx.needs_input_grad))


class Stack(Function):
    @staticmethod
    def forward(ctx, *arrays, dim):
        ctx.dim = dim
        return ctx.xp.asarray(ctx.xp.stack(arrays, axis=dim), order="C")

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        return tuple(xp.take(grad, i, axis=ctx.dim) if need else None
                     for i, need in enumerate(ctx.needs_input_grad))


class GatherAlongDim(Function):
    """torch.gather: ``out[i][j] = a[index[i][j]][j]`` along ``dim``."""

    @staticmethod
    def forward(ctx, a, index, dim):
        ctx.in_shape, ctx.dim = a.shape, dim
        ctx.save_for_backward(index)
        if index.shape != a.shape:  # index may be smaller in the other dims: read that corner
            a = a[tuple(slice(None) if d == dim else slice(0, n)
                        for d, n in enumerate(index.shape))]
        return ctx.xp.take_along_axis(a, index, axis=dim)

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        (index,) = ctx.saved_tensors
        out = xp.zeros(ctx.in_shape, dtype=grad.dtype)
        # an index may repeat: its gradients add up
        ctx.backend.scatter_add(out, index_along(index, ctx.dim, xp), grad)
        return out, None, None


# --- functional wrappers ------------------------------------------------------------------
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


def _is_basic_key(key: tuple) -> bool:
    return builtins.all(k is None or k is Ellipsis or isinstance(k, (int, slice, np.integer))
                        and not isinstance(k, bool) for k in key)


def index_key(key: Any, tensor: Tensor) -> Any:
    """An indexing key with Tensors and lists replaced by arrays on ``tensor``'s device."""
    parts = key if isinstance(key, tuple) else (key,)
    out = []
    for k in parts:
        if isinstance(k, Tensor):
            if k._backend is not tensor._backend:
                raise RuntimeError(f"indexing: the index is on {k.device}, the tensor on "
                                   f"{tensor.device}")
            if k.dtype.kind not in "iub":
                raise IndexError(f"indexing: index tensors must be integer or bool, got "
                                 f"{k.dtype}")
            # a 0-d integer tensor indexes like the int it holds (a view, as in PyTorch)
            k = int(k.item()) if k.ndim == 0 and k.dtype.kind in "iu" else k.data
        elif isinstance(k, (list, np.ndarray)):
            k = tensor._backend.asarray(k)
            if k.dtype.kind not in "iub":
                raise IndexError(f"indexing: index arrays must be integer or bool, got {k.dtype}")
        elif isinstance(k, float):
            raise IndexError(f"indexing: float index {k}; indices must be ints, slices, "
                             "None, ... or integer/bool tensors")
        elif isinstance(k, slice) and k.step is not None:
            step = k.step.__index__()  # PyTorch's words, not NumPy's (which allows < 0)
            if step == 0:
                raise ValueError("indexing: slice step cannot be zero")
            if step < 0:
                raise ValueError(f"indexing: step must be greater than zero, got {step} "
                                 "(use flip for a reversed copy)")
        out.append(k)
    return tuple(out)


def split_advanced_key(key: tuple) -> Optional[tuple]:
    """PyTorch's placement of advanced indices, as two keys: (basic, advanced), or None
    when ``key`` has no int beside an index array (NumPy's rule is then PyTorch's).

    NumPy counts an int beside an index array as one more advanced index, so in
    ``x[1, :, idx]`` the two are apart and the indexed dims go first: (2, 3) for x of
    shape (2, 3, 4). PyTorch selects with the ints first and then places the index arrays
    among the dims left, where ``idx`` stands alone: (3, 2). The basic key (the ints,
    slices and None, every index array replaced by full slices) is a view; the advanced
    key indexes that view, with full slices where the basic key kept a dim.
    """
    arrays = [k for k in key if not (k is None or k is Ellipsis or isinstance(k, slice)
                                     or isinstance(k, (int, np.integer)))]
    if not arrays or not builtins.any(isinstance(k, (int, np.integer)) and
                                      not isinstance(k, bool) for k in key):
        return None
    basic, advanced = [], []
    for k in key:
        if k is None or isinstance(k, slice):
            basic.append(k)
            advanced.append(slice(None))  # a None has made a dim of size 1
        elif k is Ellipsis:
            basic.append(k)
            advanced.append(k)
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            basic.append(k)  # the dim is gone
        else:  # an index array: a bool mask spans as many dims as it has
            spans = k.ndim if getattr(k, "dtype", None) == bool else 1
            basic.extend([slice(None)] * spans)
            advanced.append(k)
    return tuple(basic), tuple(advanced)


def getitem(a: Tensor, key: Any) -> Tensor:
    """``a[key]``: a view for ints/slices/None/..., a gathered copy for index arrays
    (placed as PyTorch places them, see ``split_advanced_key``)."""
    key = index_key(key, a)
    try:
        if _is_basic_key(key):
            return Slice.apply(a, key)
        parts = split_advanced_key(key)
        if parts is not None:
            return Gather.apply(Slice.apply(a, parts[0]), parts[1])
        return Gather.apply(a, key)
    except IndexError as exc:
        raise IndexError(f"indexing a tensor of shape {tuple(a.shape)}: {exc}") from None


def setitem_target(array: Any, key: tuple) -> tuple:
    """(array, key) such that ``array[key] = value`` writes what ``tensor[key] = value``
    writes in PyTorch: the basic part of the key applied first as a view (see
    ``split_advanced_key``)."""
    parts = split_advanced_key(key)
    if parts is None:
        return array, key
    basic = parts[0] if builtins.any(k is Ellipsis for k in parts[0]) else parts[0] + (Ellipsis,)
    return array[basic], parts[1]  # (a view: Ellipsis keeps a 0-d result an array)


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


def _check_sequence(tensors: Sequence[Tensor], op: str) -> list:
    """The tensors, checked, cast to their common dtype (int64 with float32 is float32)."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{op}: expected a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: element {i} is a {type(t).__name__}, expected a Tensor")
    dtype = functools.reduce(promote_types, (t.dtype for t in tensors))
    return [cast_to(t, dtype) for t in tensors]


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join tensors along an existing dim; all other dims must match."""
    tensors = _check_sequence(tensors, "cat")
    first = tensors[0]
    d = _wrap_dim(dim, first.ndim, "cat")
    for i, t in enumerate(tensors):
        if t.ndim != first.ndim or t.shape[:d] + t.shape[d + 1:] != \
                first.shape[:d] + first.shape[d + 1:]:
            raise ValueError(f"cat: tensor {i} has shape {tuple(t.shape)}, expected "
                             f"{tuple(first.shape)} in every dim but {d}")
    return Cat.apply(*tensors, dim=d)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join same-shaped tensors along a new dim."""
    tensors = _check_sequence(tensors, "stack")
    first = tensors[0]
    d = _wrap_dim(dim, first.ndim + 1, "stack")
    for i, t in enumerate(tensors):
        if t.shape != first.shape:
            raise ValueError(f"stack: tensor {i} has shape {tuple(t.shape)}, expected "
                             f"{tuple(first.shape)} like tensor 0")
    return Stack.apply(*tensors, dim=d)


def gather(a: Tensor, dim: int, index: Tensor) -> Tensor:
    """``out[..., j, ...] = a[..., index[..., j, ...], ...]`` along ``dim`` (torch.gather)."""
    require_tensor(a, "gather")
    require_tensor(index, "gather", "index")
    if not dtypes.is_integer(index.dtype):
        raise TypeError(f"gather: index must be an integer tensor, got {index.dtype}")
    if index.ndim != a.ndim:
        raise ValueError(f"gather: index has {index.ndim} dims, the input {a.ndim}")
    if index._backend is not a._backend:
        raise RuntimeError(f"gather: the index is on {index.device}, the input on {a.device}")
    d = _wrap_dim(dim, a.ndim, "gather")
    # as PyTorch: index may be smaller than the input in every dim but ``dim``
    if builtins.any(n > m for i, (n, m) in enumerate(zip(index.shape, a.shape)) if i != d):
        raise ValueError(f"gather: index of shape {tuple(index.shape)} must be no larger than "
                         f"the input {tuple(a.shape)} in every dim but dim {d}")
    if a.ndim:
        a._backend.check_in_range(index.data, a.shape[d], "gather: index",
                                  f"is out of bounds for dim {d} with size {a.shape[d]}")
    return GatherAlongDim.apply(a, index.data, d)


def contiguous(a: Tensor) -> Tensor:
    return Copy.apply(a)


def clone(a: Tensor) -> Tensor:
    return Copy.apply(require_tensor(a, "clone"))


def to_dtype(a: Tensor, dtype: Any) -> Tensor:
    dtype = dtypes.as_dtype(dtype)
    if a.requires_grad and not dtypes.is_floating(dtype):
        # an integer copy can't carry a gradient: cut it from the graph
        return Tensor._make(a.data.astype(dtype), a._backend, False)
    return Cast.apply(a, dtype)


def to_device(a: Tensor, device: Any) -> Tensor:
    target = get_backend(device)
    out = ToDevice.apply(a, target)
    out._backend = target  # the data now lives on ``target``; its gradient moves back
    return out
