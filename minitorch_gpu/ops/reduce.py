"""Reductions over any dims with ``keepdim``: sum, mean, var/std, amax/amin, max/min, arg*;
and cumsum, the running sum along a dim.

The backward of a reduction broadcasts the gradient back over the reduced dims: a view
of the gradient (``broadcast_to``), not a copy. Results are row-major (``order="C"``) even
for a permuted input, as in PyTorch, so ``.view`` works on them.
"""
from __future__ import annotations

import builtins
from collections import namedtuple
from typing import Any, Optional

from ..autograd import Function
from ..tensor import Tensor, _wrap_dim
from ._util import expand_reduced, normalize_dims, reduced_count, require_tensor, widened
from .shape import gather

MinMax = namedtuple("MinMax", ["values", "indices"])  # what max(dim)/min(dim) return


class Sum(Function):
    @staticmethod
    def forward(ctx, a, axes, keepdim):
        ctx.in_shape, ctx.axes, ctx.keepdim = a.shape, axes, keepdim
        # integer and bool sums are int64 (NumPy would give uint64 for unsigned inputs)
        dtype = ctx.xp.int64 if a.dtype.kind in "iub" else None
        return ctx.xp.asarray(a.sum(axis=axes, keepdims=keepdim, dtype=dtype), order="C")

    @staticmethod
    def backward(ctx, grad):
        return expand_reduced(grad, ctx.in_shape, ctx.axes, ctx.keepdim, ctx.xp), None, None


class Mean(Function):
    @staticmethod
    def forward(ctx, a, axes, keepdim):
        ctx.in_shape, ctx.axes, ctx.keepdim = a.shape, axes, keepdim
        ctx.count = reduced_count(a.shape, axes)
        return ctx.xp.asarray(a.mean(axis=axes, keepdims=keepdim), order="C")

    @staticmethod
    def backward(ctx, grad):
        grad = grad / ctx.count
        return expand_reduced(grad, ctx.in_shape, ctx.axes, ctx.keepdim, ctx.xp), None, None


class Var(Function):
    """Variance with ``correction`` (1: unbiased, Bessel; 0: population)."""

    @staticmethod
    def forward(ctx, a, axes, keepdim, correction):
        xp = ctx.xp
        centered = a - a.mean(axis=axes, keepdims=True)
        dof = reduced_count(a.shape, axes) - correction
        ctx.save_for_backward(centered)
        ctx.axes, ctx.keepdim, ctx.dof = axes, keepdim, dof
        out = (centered * centered).sum(axis=axes, keepdims=keepdim) / builtins.max(dof, 0)
        return xp.asarray(out, dtype=a.dtype, order="C")

    @staticmethod
    def backward(ctx, grad):
        (centered,) = ctx.saved_tensors
        grad = expand_reduced(grad, centered.shape, ctx.axes, ctx.keepdim, ctx.xp)
        # no degrees of freedom left: the variance divides by 0, and so does its gradient
        # (as in PyTorch: nan where centered is 0, e.g. unbiased over one element, else
        # +-inf), rather than a ZeroDivisionError
        scale = 2.0 / ctx.dof if ctx.dof > 0 else float("inf")
        return grad * centered * scale, None, None, None


class Extremum(Function):
    """amax/amin: ties share the gradient equally (as PyTorch's amax/amin do)."""

    @staticmethod
    def forward(ctx, a, axes, keepdim, largest):
        out = a.max(axis=axes, keepdims=True) if largest else a.min(axis=axes, keepdims=True)
        ctx.save_for_backward(a == out)
        ctx.axes, ctx.keepdim = axes, keepdim
        if not keepdim:
            out = out.reshape([n for i, n in enumerate(out.shape)
                               if axes is not None and i not in axes])
        return ctx.xp.asarray(out, order="C")

    @staticmethod
    def backward(ctx, grad):
        (hit,) = ctx.saved_tensors
        grad = expand_reduced(grad, hit.shape, ctx.axes, ctx.keepdim, ctx.xp)
        ties = hit.sum(axis=ctx.axes, keepdims=True)
        return grad * hit / ties, None, None, None


class CumSum(Function):
    """Running sums along a dim. Input element i feeds outputs i, i+1, ...: its gradient
    is the output gradient summed from i to the end, a cumulative sum run backwards."""

    @staticmethod
    def forward(ctx, a, dim):
        xp = ctx.xp
        ctx.dim = dim
        if a.dtype.kind in "iub":  # integer and bool running sums are int64, as in PyTorch
            return xp.asarray(xp.cumsum(a, axis=dim, dtype=xp.int64), order="C")
        # bf16/fp16 accumulate in float32 (a long running sum would drift), rounded back
        return xp.cumsum(widened(a), axis=dim).astype(a.dtype, order="C", copy=False)

    @staticmethod
    def backward(ctx, grad):
        xp, dim = ctx.xp, ctx.dim
        return xp.flip(xp.cumsum(widened(xp.flip(grad, dim)), axis=dim), dim), None


# --- functional wrappers ------------------------------------------------------------------
def sum(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    require_tensor(a, "sum")
    return Sum.apply(a, normalize_dims(dim, a.ndim, "sum"), keepdim)


def mean(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    require_tensor(a, "mean")
    if a.dtype.kind in "iub":
        raise TypeError(f"mean: expected a floating-point input, got {a.dtype}")
    return Mean.apply(a, normalize_dims(dim, a.ndim, "mean"), keepdim)


def _correction(op: str, unbiased: Optional[bool], correction: Optional[int]) -> int:
    if unbiased is not None and correction is not None:
        raise ValueError(f"{op}: give unbiased or correction, not both")
    if correction is not None:
        return int(correction)
    return 0 if unbiased is False else 1


def var(a: Tensor, dim: Any = None, unbiased: Optional[bool] = None, keepdim: bool = False,
        *, correction: Optional[int] = None) -> Tensor:
    require_tensor(a, "var")
    if a.dtype.kind in "iub":
        raise TypeError(f"var/std: expected a floating-point input, got {a.dtype}")
    return Var.apply(a, normalize_dims(dim, a.ndim, "var"), keepdim,
                     _correction("var", unbiased, correction))


def std(a: Tensor, dim: Any = None, unbiased: Optional[bool] = None, keepdim: bool = False,
        *, correction: Optional[int] = None) -> Tensor:
    return var(a, dim, unbiased, keepdim, correction=correction).sqrt()


def _check_nonempty(a: Tensor, op: str, axes: Optional[tuple] = None) -> None:
    """An extremum needs an element in each group it reduces: the whole tensor, or the
    ``axes`` (an empty tensor reduced along a non-empty dim gives an empty result)."""
    sizes = a.shape if axes is None else [a.shape[d] for d in axes]
    if 0 in sizes:
        raise ValueError(f"{op}: expected a non-empty tensor, got shape {tuple(a.shape)}"
                         + ("" if axes is None else f" reduced over dims {axes}"))


def amax(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    require_tensor(a, "amax")
    axes = normalize_dims(dim, a.ndim, "amax")
    _check_nonempty(a, "amax", axes)
    return Extremum.apply(a, axes, keepdim, True)


def amin(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    require_tensor(a, "amin")
    axes = normalize_dims(dim, a.ndim, "amin")
    _check_nonempty(a, "amin", axes)
    return Extremum.apply(a, axes, keepdim, False)


def _max_min(a: Tensor, dim: Optional[int], keepdim: bool, largest: bool) -> Any:
    op = "max" if largest else "min"
    require_tensor(a, op)
    if dim is None:
        _check_nonempty(a, op)
        return Extremum.apply(a, None, False, largest)
    dim = _wrap_dim(dim, a.ndim, op)
    if a.ndim == 0:  # one element: itself, at index 0
        return MinMax(Extremum.apply(a, None, False, largest), (argmax if largest else argmin)(a))
    _check_nonempty(a, op, (dim,))
    indices = (argmax if largest else argmin)(a, dim, keepdim=True)
    values = gather(a, dim, indices)
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return MinMax(values, indices)


def max(a: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Any:  # noqa: A001
    """The largest element; with ``dim``, ``(values, indices)`` along it (as torch.max)."""
    return _max_min(a, dim, keepdim, True)


def min(a: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Any:  # noqa: A001
    """The smallest element; with ``dim``, ``(values, indices)`` along it (as torch.min)."""
    return _max_min(a, dim, keepdim, False)


def _arg(a: Tensor, dim: Optional[int], keepdim: bool, op: str) -> Tensor:
    require_tensor(a, op)
    if dim is not None and a.ndim == 0:
        _wrap_dim(dim, 0, op)  # 0 and -1 name the one "dim" of a 0-d tensor
        dim = None
    _check_nonempty(a, op, None if dim is None else (_wrap_dim(dim, a.ndim, op),))
    xp = a._backend.xp
    fn = xp.argmax if op == "argmax" else xp.argmin
    if dim is None:  # an index into the flattened tensor, as PyTorch
        out = fn(a.data.reshape(-1))
        if keepdim:
            out = out.reshape((1,) * a.ndim)
    else:
        out = fn(a.data, axis=_wrap_dim(dim, a.ndim, op), keepdims=keepdim)
    return Tensor._make(xp.asarray(out, dtype=xp.int64), a._backend, False)


def argmax(a: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
    return _arg(a, dim, keepdim, "argmax")


def argmin(a: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
    return _arg(a, dim, keepdim, "argmin")


def cumsum(a: Tensor, dim: int) -> Tensor:
    """Running sums along ``dim``: ``out[..., i, ...] = a[..., :i+1, ...].sum(dim)``;
    integer and bool inputs give int64.

    >>> mt.cumsum(mt.tensor([1, 2, 3]), 0)
    tensor([1, 3, 6])
    """
    require_tensor(a, "cumsum")
    dim = _wrap_dim(dim, a.ndim, "cumsum")
    if a.ndim == 0:  # one element: its own running sum
        return cumsum(a.reshape(1), 0).reshape(())
    return CumSum.apply(a, dim)


def any(a: Tensor) -> Tensor:  # noqa: A001
    return Tensor._make(a._backend.xp.asarray(a.data.any()), a._backend, False)


def all(a: Tensor) -> Tensor:  # noqa: A001
    return Tensor._make(a._backend.xp.asarray(a.data.all()), a._backend, False)
