"""Indexing by tensors: ``a[key]`` with integer or bool index arrays among its ints and
slices (placed as PyTorch places them), the target of ``a[key] = value``, and ``gather``.

Basic keys (ints, slices, None, ...) give views (``Slice`` in ``views.py``); index arrays
give a fresh row-major copy, whose backward scatter-adds, so repeated indices all receive
their gradient.
"""
from __future__ import annotations

import builtins
from typing import Any, Optional

import numpy as np

from ..autograd import Function
from ..backend import dtypes
from ..backend.transfers import check_extremes
from ..tensor import Tensor, _wrap_dim
from ._util import index_along, nonzero_positions, require_tensor
from .views import Slice


def _is_basic_key(key: tuple) -> bool:
    return builtins.all(k is None or k is Ellipsis or isinstance(k, (int, slice, np.integer))
                        and not isinstance(k, bool) for k in key)


def index_key(key: Any, tensor: Tensor) -> Any:
    """An indexing key with Tensors and lists replaced by arrays on ``tensor``'s device,
    and its index arrays checked against ``tensor`` (``_check_index_arrays``): what
    ``t[key]`` and ``t[key] = v`` index with."""
    parts = key if isinstance(key, tuple) else (key,)
    out, on_host = [], set()  # on_host: ids of the index arrays given as lists or NumPy
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
            k = np.asarray(k)  # kept on the host until checked there (_check_index_arrays)
            if k.dtype.kind not in "iub":
                raise IndexError(f"indexing: index arrays must be integer or bool, got {k.dtype}")
            on_host.add(id(k))
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
    if builtins.any(_is_index_array(k) for k in out):
        out = _check_index_arrays(out, tensor, on_host)
    return tuple(out)


def _is_index_array(k: Any) -> bool:
    return hasattr(k, "dtype") and not isinstance(k, (bool, np.generic))


def _check_index_arrays(key: list, tensor: Tensor, on_host: set) -> list:
    """``key`` with its index arrays checked against the dims of ``tensor`` they index,
    and placed on its device.

    An integer array must lie in [-size, size) of its dim, as NumPy demands: CuPy takes
    indices modulo the size instead, so on a GPU a bad index would read or write the
    wrong element without a word. The check is the backend's (``check_in_range``): at
    once on the CPU, on the device and read at the next host read on a GPU (no wait per
    op); an array given on the host (a list; ids in ``on_host``) is checked there at once
    and then sent to the device. A bool mask must have the shape of the dims it spans,
    and becomes the integer arrays of its true positions (NumPy's meaning of it): their
    count decides the result's shape, one counted host read (``nonzero_positions``)
    where CuPy would make it uncounted.
    """
    backend, shape = tensor._backend, tuple(tensor.shape)
    # the dims of ``tensor`` each part of the key consumes (None, ... and a bool scalar:
    # none; a bool mask: as many as it has)
    spans = [0 if k is None or k is Ellipsis or isinstance(k, (bool, np.bool_)) else
             k.ndim if _is_index_array(k) and k.dtype == bool else 1 for k in key]
    rest = len(shape) - sum(spans)  # the dims an Ellipsis stands for
    out, axis = [], 0
    for k, span in zip(key, spans):
        if k is Ellipsis:
            axis += max(rest, 0)
        # (past the last dim: too many indices, which NumPy's and CuPy's own error says)
        elif _is_index_array(k) and axis + span <= len(shape):
            host = id(k) in on_host
            if k.dtype != bool:
                _check_in_bounds(backend, k, host, shape, axis)
            elif k.ndim:  # (a 0-d bool adds a dim of size 1 or 0, sized by CuPy unread)
                _check_mask_shape(k, shape, axis)
                if host:
                    out.extend(backend.asarray(w) for w in np.nonzero(k))
                else:
                    out.extend(nonzero_positions(backend, k))
                axis += span
                continue
        out.append(backend.asarray(k) if id(k) in on_host else k)
        axis += span
    return out


def _check_in_bounds(backend: Any, index: Any, on_host: bool, shape: tuple,
                     axis: int) -> None:
    """IndexError, in NumPy's words, for an integer of ``index`` outside [-size, size) of
    dim ``axis``: at once for a host array, else by ``backend.check_in_range``."""
    size = shape[axis]
    before = f"indexing a tensor of shape {shape}: index"
    after = f"is out of bounds for axis {axis} with size {size}"
    if not on_host:
        backend.check_in_range(index, size, before, after, start=-size, error=IndexError)
    elif index.size:
        check_extremes(int(index.min()), int(index.max()), size, before, after,
                       start=-size, error=IndexError)


def _check_mask_shape(mask: Any, shape: tuple, axis: int) -> None:
    """IndexError, in NumPy's words, unless ``mask`` has the sizes of the dims it spans."""
    for d, n in enumerate(mask.shape):
        if n != shape[axis + d]:
            raise IndexError(f"indexing a tensor of shape {shape}: boolean index did not "
                             f"match indexed array along axis {axis + d}; size of axis is "
                             f"{shape[axis + d]} but size of corresponding boolean axis "
                             f"is {n}")


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


class AdvancedIndex(Function):
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


def getitem(a: Tensor, key: Any) -> Tensor:
    """``a[key]``: a view for ints/slices/None/..., a gathered copy for index arrays
    (placed as PyTorch places them, see ``split_advanced_key``)."""
    key = index_key(key, a)
    try:
        if _is_basic_key(key):
            return Slice.apply(a, key)
        parts = split_advanced_key(key)
        if parts is not None:
            return AdvancedIndex.apply(Slice.apply(a, parts[0]), parts[1])
        return AdvancedIndex.apply(a, key)
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


class TakeAlongDim(Function):
    """``out[i][j] = a[index[i][j]][j]`` along ``dim`` (``take_along_axis``): ``gather``, and
    the values sort and topk pick. ``index`` may be smaller than ``a`` in the other dims
    (gather reads that corner). Backward scatter-adds each gradient back to its position;
    with ``unique`` (every position named at most once, as a sort's are) a plain assignment
    does it."""

    @staticmethod
    def forward(ctx, a, index, dim, unique):
        ctx.in_shape, ctx.dim, ctx.unique = a.shape, dim, unique
        ctx.save_for_backward(index)
        if index.shape != a.shape:  # index may be smaller in the other dims: read that corner
            a = a[tuple(slice(None) if d == dim else slice(0, n)
                        for d, n in enumerate(index.shape))]
        return ctx.xp.asarray(ctx.xp.take_along_axis(a, index, axis=dim), order="C")

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        (index,) = ctx.saved_tensors
        out = xp.zeros(ctx.in_shape, dtype=grad.dtype)
        where = index_along(index, ctx.dim, xp)
        if ctx.unique:
            out[where] = grad  # no position repeats: assign
        else:  # an index may repeat: its gradients add up
            ctx.backend.scatter_add(out, where, grad)
        return out, None, None, None


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
    return TakeAlongDim.apply(a, index.data, d, False)
