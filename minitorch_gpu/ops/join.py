"""Joins: ``cat`` along an existing dim, ``stack`` along a new one. The inputs are cast to
their common dtype first; the result is a fresh row-major array whatever their layouts,
as PyTorch's is (NumPy would keep a permuted layout, and ``.view`` of the result would
then fail where PyTorch's succeeds)."""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from ..autograd import Function
from ..tensor import Tensor, _wrap_dim
from .promotion import cast_to, promote_types


def _check_sequence(tensors: Sequence[Tensor], op: str) -> list:
    """The tensors, checked, cast to their common dtype (int64 with float32 is float32)."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{op}: expected a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: element {i} is a {type(t).__name__}, expected a Tensor")
    dtype = functools.reduce(promote_types, (t.dtype for t in tensors))
    return [cast_to(t, dtype) for t in tensors]


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
