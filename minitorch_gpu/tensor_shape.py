"""Tensor's shape methods: views (view, reshape, transpose, permute, expand, ...), indexing
(``t[key]``, gather, index_select, masked_select, nonzero) and the copies that rearrange
or scatter. Each forwards to its op in ``ops``; ``tensor.py`` copies this family onto
``Tensor`` (see ``attach_methods``)."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from . import ops as _ops
from .tensor import Tensor, _shape_args, _wrap_dim


class TensorShape:
    """Tensor's shape and indexing methods (attached onto ``Tensor``)."""

    # --- views --------------------------------------------------------------------------
    def view(self, *shape: Any) -> "Tensor":
        """``view(2, 3)``, ``view((2, 3))``, or ``view(dtype)``: the same bytes read as
        another dtype (the last dim scaled by the ratio of the itemsizes, as PyTorch)."""
        if len(shape) == 1 and not isinstance(shape[0], (tuple, list, int, np.integer)):
            return _ops.views.view_dtype(self, shape[0])
        return _ops.view(self, _shape_args(shape))

    def view_as(self, other: "Tensor") -> "Tensor":
        return _ops.view(self, other.shape)

    def reshape(self, *shape: Any) -> "Tensor":
        return _ops.reshape(self, _shape_args(shape))

    def reshape_as(self, other: "Tensor") -> "Tensor":
        return _ops.reshape(self, other.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        return _ops.flatten(self, start_dim, end_dim)

    def unflatten(self, dim: int, sizes: Sequence[int]) -> "Tensor":
        return _ops.unflatten(self, dim, sizes)

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        return _ops.transpose(self, dim0, dim1)

    def swapaxes(self, axis0: int, axis1: int) -> "Tensor":
        return _ops.transpose(self, axis0, axis1)

    swapdims = swapaxes

    def t(self) -> "Tensor":
        if self.ndim > 2:
            raise ValueError(f"t: expected a tensor of at most 2 dims, got {self.ndim}; "
                             "use transpose(dim0, dim1) or mT")
        return self if self.ndim < 2 else _ops.transpose(self, 0, 1)

    @property
    def T(self) -> "Tensor":
        """All dims reversed (a view)."""
        return _ops.permute(self, tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self) -> "Tensor":
        """The last two dims swapped (a view): the batched matrix transpose."""
        if self.ndim < 2:
            raise ValueError(f"mT: expected at least 2 dims, got shape {tuple(self.shape)}")
        return _ops.transpose(self, -2, -1)

    def permute(self, *dims: Any) -> "Tensor":
        return _ops.permute(self, _shape_args(dims))

    def movedim(self, source: Any, destination: Any) -> "Tensor":
        """Move dims ``source`` to positions ``destination`` (ints or sequences): a view."""
        src = [_wrap_dim(d, self.ndim, "movedim") for d in
               (source if isinstance(source, (tuple, list)) else (source,))]
        dst = [_wrap_dim(d, self.ndim, "movedim") for d in
               (destination if isinstance(destination, (tuple, list)) else (destination,))]
        if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
            raise ValueError(f"movedim: source {source} and destination {destination} must "
                             "be as many distinct dims")
        rest = iter(d for d in range(self.ndim) if d not in src)
        placed = dict(zip(dst, src))
        return _ops.permute(self, tuple(placed[i] if i in placed else next(rest)
                                        for i in range(self.ndim)))

    moveaxis = movedim

    def unsqueeze(self, dim: int) -> "Tensor":
        return _ops.unsqueeze(self, dim)

    def squeeze(self, dim: Any = None) -> "Tensor":
        return _ops.squeeze(self, dim)

    def expand(self, *shape: Any) -> "Tensor":
        return _ops.expand(self, _shape_args(shape))

    def expand_as(self, other: "Tensor") -> "Tensor":
        return _ops.expand(self, other.shape)

    def narrow(self, dim: int, start: int, length: int) -> "Tensor":
        return _ops.narrow(self, dim, start, length)

    def split(self, split_size: Any, dim: int = 0) -> tuple:
        return _ops.split(self, split_size, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        return _ops.chunk(self, chunks, dim)

    def unbind(self, dim: int = 0) -> tuple:
        """The slices along ``dim``, each without it (views)."""
        d = _wrap_dim(dim, self.ndim, "unbind")
        return tuple(self[(slice(None),) * d + (i,)] for i in range(self.shape[d]))


    # --- indexing -----------------------------------------------------------------------
    def __getitem__(self, key: Any) -> "Tensor":
        return _ops.getitem(self, key)

    def gather(self, dim: int, index: "Tensor") -> "Tensor":
        return _ops.gather(self, dim, index)

    def index_select(self, dim: int, index: "Tensor") -> "Tensor":
        """The entries ``index`` (1-D integers) along ``dim``: a copy."""
        if not isinstance(index, Tensor) or index.ndim > 1 or index.dtype.kind not in "iu":
            raise TypeError("index_select: index must be a 0-d or 1-D integer tensor")
        d = _wrap_dim(dim, self.ndim, "index_select")
        return self[(slice(None),) * d + (index.reshape(-1),)]

    def masked_select(self, mask: "Tensor") -> "Tensor":
        return _ops.masked_select(self, mask)

    def nonzero(self, *, as_tuple: bool = False) -> Any:
        return _ops.nonzero(self, as_tuple=as_tuple)


    # --- copies that rearrange, and scatter ---------------------------------------------
    def repeat(self, *sizes: Any) -> "Tensor":
        return _ops.repeat(self, *sizes)

    def repeat_interleave(self, repeats: Any, dim: Optional[int] = None, *,
                          output_size: Optional[int] = None) -> "Tensor":
        return _ops.repeat_interleave(self, repeats, dim, output_size=output_size)

    def flip(self, *dims: Any) -> "Tensor":
        return _ops.flip(self, _shape_args(dims))

    def roll(self, shifts: Any, dims: Any = None) -> "Tensor":
        return _ops.roll(self, shifts, dims)

    def scatter(self, dim: int, index: "Tensor", src: Any = None, *, value: Any = None,
                reduce: Optional[str] = None) -> "Tensor":
        return _ops.scatter(self, dim, index, src, value=value, reduce=reduce)

    def scatter_add(self, dim: int, index: "Tensor", src: "Tensor") -> "Tensor":
        return _ops.scatter_add(self, dim, index, src)

    def scatter_reduce(self, dim: int, index: "Tensor", src: "Tensor", reduce: str, *,
                       include_self: bool = True) -> "Tensor":
        return _ops.scatter_reduce(self, dim, index, src, reduce, include_self=include_self)
