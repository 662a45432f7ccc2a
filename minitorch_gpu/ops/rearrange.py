"""Copies that rearrange or select elements by position: repeat, repeat_interleave, flip,
roll, pad, one_hot, masked_select, nonzero (and unflatten, a reshape). The scatter
family, which writes by position, is in ``scatter.py``.

Each result is a fresh row-major array. Backward sends every output gradient back to the
element it was copied from, adding where an element was copied more than once (a sum
over a reshaped axis, or the backend's ``scatter_add``); no Python loop runs over
elements.
"""
from __future__ import annotations

import builtins
from typing import Any, Optional, Sequence

import numpy as np

from ..autograd import Function
from ..backend import dtypes
from ..tensor import Tensor, _wrap_dim
from ._util import check_broadcast, nonzero_positions, require_tensor
from .indexing import getitem
from .views import expand, reshape


def _ints(values: Any, op: str, what: str) -> tuple:
    values = tuple(values) if isinstance(values, (tuple, list)) else (values,)
    for v in values:
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"{op}: {what} must be ints, got {values!r}")
    return tuple(int(v) for v in values)


# --- repeat -------------------------------------------------------------------------------
class Repeat(Function):
    """``np.tile``: the input copied ``reps[d]`` times along each dim. Backward sums the
    copies: the gradient seen as (r0, n0, r1, n1, ...) summed over the r axes."""

    @staticmethod
    def forward(ctx, a, reps):
        ctx.in_shape = a.shape
        ctx.reps = reps
        lead = len(reps) - a.ndim
        return ctx.xp.asarray(ctx.xp.tile(a.reshape((1,) * lead + a.shape), reps), order="C")

    @staticmethod
    def backward(ctx, grad):
        shape = (1,) * (len(ctx.reps) - len(ctx.in_shape)) + tuple(ctx.in_shape)
        split = [n for pair in zip(ctx.reps, shape) for n in pair]  # (r0, n0, r1, n1, ...)
        summed = grad.reshape(split).sum(axis=tuple(range(0, len(split), 2)))
        return summed.reshape(ctx.in_shape), None


def repeat(a: Tensor, *sizes: Any) -> Tensor:
    """``a`` tiled ``sizes[d]`` times along each dim (Tensor.repeat); more sizes than dims
    add leading dims.

    >>> mt.tensor([1, 2]).repeat(2, 2).tolist()
    [[1, 2, 1, 2], [1, 2, 1, 2]]
    """
    require_tensor(a, "repeat")
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    reps = _ints(sizes, "repeat", "sizes")
    if len(reps) < a.ndim:
        raise ValueError(f"repeat: the number of repeats ({len(reps)}) can not be smaller "
                         f"than the number of dims of the tensor ({a.ndim})")
    if builtins.any(r < 0 for r in reps):
        raise ValueError(f"repeat: repeats can not be negative, got {reps}")
    return Repeat.apply(a, reps)


def _sources(counts: Any, total: int, xp: Any) -> Any:
    """The input position of each output of a repeat_interleave by ``counts`` (``total``
    outputs): output j comes from the element whose run of copies covers j (CuPy's
    ``repeat`` takes no array of counts, a search over the runs' ends works on both
    backends)."""
    ends = xp.cumsum(counts)
    return xp.searchsorted(ends, xp.arange(total), side="right").astype(np.int64)


class RepeatInterleave(Function):
    """Each element along ``dim`` copied ``repeats[i]`` times in place: a ``take`` of the
    source position of every output (``source``). Backward sums each run of copies back
    into its element: a segment sum, as ``scatter_add`` of the gradient rows."""

    @staticmethod
    def forward(ctx, a, source, dim):
        xp = ctx.xp
        ctx.in_shape, ctx.dim = a.shape, dim
        ctx.save_for_backward(source)
        return xp.asarray(xp.take(a, source, axis=dim), order="C")

    @staticmethod
    def backward(ctx, grad):
        xp, dim = ctx.xp, ctx.dim
        (source,) = ctx.saved_tensors
        rows = xp.moveaxis(grad, dim, 0)  # (out_n, ...)
        out = xp.zeros((ctx.in_shape[dim],) + rows.shape[1:], dtype=grad.dtype)
        if source.size:
            ctx.backend.scatter_add(out, source, rows)
        return xp.moveaxis(out, 0, dim), None, None


def repeat_interleave(a: Tensor, repeats: Any = None, dim: Optional[int] = None, *,
                      output_size: Optional[int] = None) -> Tensor:
    """Each element repeated ``repeats`` times (an int, or a tensor of one count per
    element along ``dim``) in place; without ``dim``, over the flattened input. With only
    an integer tensor, ``repeat_interleave(counts)`` repeats ``arange(len(counts))``.

    >>> mt.repeat_interleave(mt.tensor([1, 2]), 2).tolist()
    [1, 1, 2, 2]
    """
    require_tensor(a, "repeat_interleave")
    if repeats is None:  # torch.repeat_interleave(repeats)
        with a._backend.on_device():
            positions = a._backend.xp.arange(a.numel(), dtype=dtypes.int64)
        return repeat_interleave(Tensor._make(positions, a._backend, False), a, 0,
                                 output_size=output_size)
    if dim is None:
        a, dim = reshape(a, (-1,)), 0
    dim = _wrap_dim(dim, a.ndim, "repeat_interleave")
    if a.ndim == 0:
        a = reshape(a, (1,))
    backend = a._backend
    n = a.shape[dim]
    with backend.on_device():
        if isinstance(repeats, Tensor):
            counts, total = _counts_of(repeats, n, dim, output_size, backend)
        else:
            (count,) = _ints(repeats, "repeat_interleave", "repeats")
            if count < 0:
                raise ValueError(f"repeat_interleave: repeats can not be negative, got "
                                 f"{count}")
            counts, total = backend.xp.full((n,), count, dtype=np.int64), n * count
            if output_size is not None and total != output_size:
                raise ValueError(f"repeat_interleave: output_size {output_size} is not the "
                                 f"sum of repeats, {total}")
        sources = _sources(counts, total, backend.xp)
    return RepeatInterleave.apply(a, sources, dim)


def _counts_of(repeats: Tensor, n: int, dim: int, output_size: Optional[int],
               backend: Any) -> tuple:
    """(counts, total): ``repeats`` as one int64 count per element along ``dim`` (of size
    ``n``) and their sum, the output's size. The sum decides the output's shape, so
    without ``output_size`` it is read (one counted host read, with the smallest count,
    checked here); with it, nothing is read: the counts and their sum are checked by
    ``check_in_range`` (at once on the CPU, at the next host read on a GPU)."""
    xp = backend.xp
    if not dtypes.is_integer(repeats.dtype):
        raise TypeError(f"repeat_interleave: repeats must be an integer tensor, got "
                        f"{repeats.dtype}")
    if repeats.ndim > 1:
        raise ValueError(f"repeat_interleave: repeats must be 0-d or 1-d, got shape "
                         f"{tuple(repeats.shape)}")
    counts = repeats.data.reshape(-1).astype(np.int64)
    if counts.size == 1:
        counts = xp.full((n,), counts[0], dtype=np.int64)
    elif counts.size != n:
        raise ValueError(f"repeat_interleave: repeats must have the same size as input "
                         f"along dim {dim}: got {counts.size} repeats for size {n}")
    if not counts.size:
        total = 0
    elif output_size is None:
        low, total = backend.to_numpy(xp.stack([counts.min(), counts.sum()])).tolist()
        if low < 0:
            raise ValueError(f"repeat_interleave: repeats can not be negative, got {low}")
    else:
        backend.check_in_range(counts, np.iinfo(np.int64).max, "repeat_interleave: repeat",
                               "is negative: repeats can not be negative")
        total = output_size
    if output_size is not None:
        backend.check_in_range(counts.sum(), output_size + 1, "repeat_interleave: the "
                               "repeats sum to", f"where output_size is {output_size}",
                               start=output_size)
    return counts, total


# --- flip, roll, unflatten ----------------------------------------------------------------
def _dims(dims: Any, ndim: int, op: str) -> tuple:
    wrapped = tuple(_wrap_dim(d, ndim, op) for d in _ints(dims, op, "dims"))
    if len(set(wrapped)) != len(wrapped):
        raise ValueError(f"{op}: dims {dims} name a dim more than once")
    return wrapped


class Flip(Function):
    @staticmethod
    def forward(ctx, a, dims):
        ctx.dims = dims
        return ctx.xp.asarray(ctx.xp.flip(a, dims), order="C")

    @staticmethod
    def backward(ctx, grad):
        return ctx.xp.flip(grad, ctx.dims), None


def flip(a: Tensor, dims: Any) -> Tensor:
    """``a`` reversed along each of ``dims`` (a copy, as in PyTorch)."""
    require_tensor(a, "flip")
    dims = _dims(dims, a.ndim, "flip")
    return Flip.apply(a, dims if a.ndim else ())


class Roll(Function):
    @staticmethod
    def forward(ctx, a, shifts, dims):
        ctx.shifts, ctx.dims = shifts, dims
        return ctx.xp.asarray(ctx.xp.roll(a, shifts, dims), order="C")

    @staticmethod
    def backward(ctx, grad):
        return ctx.xp.roll(grad, tuple(-s for s in ctx.shifts), ctx.dims), None, None


def roll(a: Tensor, shifts: Any, dims: Any = None) -> Tensor:
    """Elements shifted ``shifts`` places along ``dims`` (a tuple each, or ints), wrapping
    round; without ``dims``, along the flattened tensor, keeping its shape."""
    require_tensor(a, "roll")
    shifts = _ints(shifts, "roll", "shifts")
    if dims is None:
        if len(shifts) != 1:
            raise ValueError(f"roll: without dims, shifts must be one int, got {shifts}")
        return reshape(Roll.apply(reshape(a, (-1,)), shifts, (0,)), a.shape)
    dims = tuple(_wrap_dim(d, a.ndim, "roll") for d in _ints(dims, "roll", "dims"))
    if len(shifts) != len(dims):
        raise ValueError(f"roll: shifts and dims must have the same length, got "
                         f"{len(shifts)} and {len(dims)}")
    if a.ndim == 0:
        return Roll.apply(a, (), ())
    return Roll.apply(a, shifts, dims)


def unflatten(a: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
    """Dim ``dim`` split into ``sizes`` (one may be -1): a view when the strides allow."""
    require_tensor(a, "unflatten")
    d = _wrap_dim(dim, a.ndim, "unflatten")
    sizes = _ints(sizes, "unflatten", "sizes")
    if not sizes:
        raise ValueError("unflatten: sizes must be non-empty")
    known = int(np.prod([s for s in sizes if s != -1]))
    if (-1 not in sizes and known != a.shape[d]) or sizes.count(-1) > 1:
        raise ValueError(f"unflatten: sizes {sizes} don't multiply up to the size of dim "
                         f"{d} ({a.shape[d]}) of a tensor of shape {tuple(a.shape)}")
    return reshape(a, a.shape[:d] + sizes + a.shape[d + 1:])


# --- pad ----------------------------------------------------------------------------------
class ConstantPad(Function):
    """Constant padding by (before, after) widths per dim; a negative width crops. The
    input's kept block is copied into a filled array; backward reads it back."""

    @staticmethod
    def forward(ctx, a, widths, value):
        xp = ctx.xp
        out_shape = tuple(n + lo + hi for n, (lo, hi) in zip(a.shape, widths))
        ctx.in_shape = a.shape
        ctx.src = tuple(slice(builtins.max(-lo, 0), n - builtins.max(-hi, 0))
                        for n, (lo, hi) in zip(a.shape, widths))
        ctx.dst = tuple(slice(builtins.max(lo, 0), m - builtins.max(hi, 0))
                        for m, (lo, hi) in zip(out_shape, widths))
        out = xp.full(out_shape, value, dtype=a.dtype)
        out[ctx.dst] = a[ctx.src]
        return out

    @staticmethod
    def backward(ctx, grad):
        out = ctx.xp.zeros(ctx.in_shape, dtype=grad.dtype)
        out[ctx.src] = grad[ctx.dst]
        return out, None, None


class IndexPad(Function):
    """'reflect'/'replicate' padding: along each padded dim, output position j copies
    input position ``sources[d][j]``. Backward scatter-adds dim by dim, last dim first."""

    @staticmethod
    def forward(ctx, a, sources):
        xp = ctx.xp
        ctx.in_shape, ctx.sources = a.shape, sources
        out = a
        for d, source in sources.items():
            out = xp.take(out, source, axis=d)
        return xp.asarray(out, order="C")

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        for d in sorted(ctx.sources, reverse=True):
            rows = xp.moveaxis(grad, d, 0)
            summed = xp.zeros((ctx.in_shape[d],) + rows.shape[1:], dtype=grad.dtype)
            ctx.backend.scatter_add(summed, ctx.sources[d], rows)
            grad = xp.moveaxis(summed, 0, d)
        return grad, None


_PAD_MODES = {"constant", "reflect", "replicate"}


def pad(a: Tensor, pad: Sequence[int], mode: str = "constant",
        value: Optional[float] = None) -> Tensor:
    """Pad ``a`` as torch.nn.functional.pad: ``pad`` lists (before, after) widths from the
    last dim backwards, ``(left, right, top, bottom, ...)``. 'constant' fills with
    ``value`` (0 by default) over any number of dims, and a negative width crops;
    'reflect' and 'replicate' pad the last 1 to 3 dims.

    >>> F.pad(mt.ones(2, 3), (1, 1)).shape
    (2, 5)
    """
    require_tensor(a, "pad")
    widths = _ints(pad, "pad", "pad widths")
    if len(widths) % 2:
        raise ValueError(f"pad: pad must have an even length (before, after per dim), got "
                         f"{len(widths)} values")
    padded = len(widths) // 2
    if padded > a.ndim:
        raise ValueError(f"pad: pad of length {len(widths)} pads {padded} dims, but the "
                         f"input has only {a.ndim} (shape {tuple(a.shape)})")
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode {mode!r} is not supported; expected one of "
                         f"{sorted(_PAD_MODES)} (circular is not here)")
    pairs = [(0, 0)] * (a.ndim - padded) + [
        (widths[2 * i], widths[2 * i + 1]) for i in reversed(range(padded))]
    if mode == "constant":
        for d, (lo, hi) in enumerate(pairs):
            if a.shape[d] + lo + hi < 0:
                raise ValueError(f"pad: padding ({lo}, {hi}) of dim {d} of size "
                                 f"{a.shape[d]} gives a negative size")
        return ConstantPad.apply(a, tuple(pairs), 0 if value is None else value)
    if value not in (None, 0):
        raise ValueError(f"pad: value is only used in constant mode, got mode={mode!r}")
    if padded > 3 or a.ndim < padded + 1:
        raise ValueError(f"pad: {mode} pads the last 1 to 3 dims of an input with at least "
                         f"one more dim; got pad of length {len(widths)} for shape "
                         f"{tuple(a.shape)}")
    sources = {}
    for d in range(a.ndim - padded, a.ndim):
        lo, hi = pairs[d]
        n = a.shape[d]
        if builtins.min(lo, hi) < 0:
            raise ValueError(f"pad: {mode} padding widths must be non-negative, got {widths}")
        if mode == "reflect" and builtins.max(lo, hi) >= n:
            raise ValueError(f"pad: padding size should be less than the corresponding input "
                             f"dimension, but got: padding ({lo}, {hi}) at dimension {d} of "
                             f"input {tuple(a.shape)}")
        if mode == "replicate" and n == 0:
            raise ValueError(f"pad: replicate needs a non-empty dim {d}, got shape "
                             f"{tuple(a.shape)}")
        source = np.pad(np.arange(n), (lo, hi), mode="reflect" if mode == "reflect" else "edge")
        sources[d] = a._backend.asarray(source.astype(np.int64))
    return IndexPad.apply(a, sources)


# --- one_hot, nonzero, masked_select ------------------------------------------------------
def one_hot(a: Tensor, num_classes: int = -1) -> Tensor:
    """int64 tensor of shape ``a.shape + (num_classes,)`` with a 1 at each class id;
    ``num_classes=-1`` takes the largest id + 1.

    >>> F.one_hot(mt.tensor([0, 2]), 3).tolist()
    [[1, 0, 0], [0, 0, 1]]
    """
    require_tensor(a, "one_hot")
    if not dtypes.is_integer(a.dtype):
        raise TypeError(f"one_hot: expected an integer (int64) tensor of class ids, got "
                        f"{a.dtype}")
    backend = a._backend
    xp = backend.xp
    with backend.on_device():
        ids = a.data.astype(np.int64)
        if num_classes == -1:  # the output's shape depends on the ids: one counted read
            if not ids.size:
                raise ValueError("one_hot: can not infer the number of classes of an empty "
                                 "tensor")
            low, high = backend.to_numpy(xp.stack([ids.min(), ids.max()])).tolist()
            if low < 0:
                raise ValueError(f"one_hot: class values must be non-negative, got {low}")
            num_classes = high + 1
        else:  # at once on the CPU, at the next host read on a GPU: no wait here
            backend.check_in_range(ids, num_classes, "one_hot: class value",
                                   f"is out of range: class values must be non-negative "
                                   f"and smaller than num_classes ({num_classes})")
        out = (ids[..., None] == xp.arange(num_classes)).astype(np.int64)
        return Tensor._make(xp.asarray(out, order="C"), backend, False)


def nonzero(a: Tensor, *, as_tuple: bool = False) -> Any:
    """The positions of the non-zero elements: an int64 (n, ndim) tensor, one row per
    element in row-major order; with ``as_tuple``, one 1-D tensor per dim."""
    require_tensor(a, "nonzero")
    xp, backend = a._backend.xp, a._backend
    data = a.data if a.ndim else a.data.reshape(1)
    with backend.on_device():
        where = nonzero_positions(backend, data)  # one counted read: how many there are
        if as_tuple:
            return tuple(Tensor._make(w, backend, False) for w in where)
        if not a.ndim:
            return Tensor._make(xp.zeros((int(where[0].size), 0), dtype=np.int64), backend,
                                False)
        return Tensor._make(xp.asarray(xp.stack(where, axis=1), order="C"), backend, False)


def masked_select(a: Tensor, mask: Tensor) -> Tensor:
    """The elements of ``a`` where ``mask`` (bool, broadcast with ``a``) is true, as a 1-D
    tensor in row-major order; backward scatters the gradient back to them."""
    require_tensor(a, "masked_select")
    require_tensor(mask, "masked_select", "mask")
    if mask.dtype != dtypes.bool_:
        raise TypeError(f"masked_select: expected mask to be a bool tensor, got {mask.dtype}")
    shape = check_broadcast("masked_select", tuple(a.shape), tuple(mask.shape))
    return getitem(expand(a, shape), expand(mask, shape))
