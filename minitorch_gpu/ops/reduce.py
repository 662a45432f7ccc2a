"""Reductions over any dims with ``keepdim``: sum, mean, var/std (and var_mean/std_mean),
amax/amin, max/min, arg*, logsumexp, prod, any/all; and the scans cumsum and cumprod.

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
from ._util import (expand_reduced, normalize_dims, reduced_count, require_tensor, untracked,
                    widened)
from .conversions import to_dtype
from .indexing import gather
from .promotion import float_input

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


def sum(a: Tensor, dim: Any = None, keepdim: bool = False, *,  # noqa: A001
        dtype: Any = None) -> Tensor:
    """The sum over ``dim`` (all dims when None); ``dtype`` casts the input first."""
    require_tensor(a, "sum")
    if dtype is not None:
        a = to_dtype(a, dtype)
    return Sum.apply(a, normalize_dims(dim, a.ndim, "sum"), keepdim)


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


def mean(a: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """The mean over ``dim`` (all dims when None); ``dtype`` casts the input first."""
    require_tensor(a, "mean")
    if dtype is not None:
        a = to_dtype(a, dtype)
    if a.dtype.kind in "iub":
        raise TypeError(f"mean: expected a floating-point input, got {a.dtype}")
    return Mean.apply(a, normalize_dims(dim, a.ndim, "mean"), keepdim)


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


def var_mean(a: Tensor, dim: Any = None, unbiased: Optional[bool] = None,
             keepdim: bool = False, *, correction: Optional[int] = None) -> tuple:
    """``(var, mean)`` over the same dims (as torch.var_mean)."""
    return (var(a, dim, unbiased, keepdim, correction=correction),
            mean(a, dim, keepdim))


def std_mean(a: Tensor, dim: Any = None, unbiased: Optional[bool] = None,
             keepdim: bool = False, *, correction: Optional[int] = None) -> tuple:
    """``(std, mean)`` over the same dims (as torch.std_mean)."""
    return (std(a, dim, unbiased, keepdim, correction=correction),
            mean(a, dim, keepdim))


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
    axis = None if dim is None else _wrap_dim(dim, a.ndim, op)
    ndim = a.ndim

    def compute(x: Any) -> Any:
        if axis is None:  # an index into the flattened tensor, as PyTorch
            out = fn(x.reshape(-1))
            if keepdim:
                out = out.reshape((1,) * ndim)
        else:
            out = fn(x, axis=axis, keepdims=keepdim)
        return xp.asarray(out, dtype=xp.int64)
    return untracked(compute, a)


def argmax(a: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
    return _arg(a, dim, keepdim, "argmax")


def argmin(a: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
    return _arg(a, dim, keepdim, "argmin")


def _truth(a: Tensor, dim: Any, keepdim: bool, op: str) -> Tensor:
    require_tensor(a, op)
    axes = normalize_dims(dim, a.ndim, op)
    fn = a.data.any if op == "any" else a.data.all
    out = fn(axis=axes, keepdims=keepdim) if axes is not None or keepdim else fn()
    return Tensor._make(a._backend.xp.asarray(out, order="C"), a._backend, False)


def any(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """Whether any element is non-zero, over ``dim`` (an int or a tuple; all dims when
    None); a bool tensor."""
    return _truth(a, dim, keepdim, "any")


def all(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """Whether every element is non-zero, over ``dim``; a bool tensor."""
    return _truth(a, dim, keepdim, "all")


def _reverse_cumsum(x: Any, axis: int, xp: Any) -> Any:
    """``out[i] = x[i:].sum()`` along ``axis``."""
    return xp.flip(xp.cumsum(xp.flip(x, axis), axis=axis), axis)


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
        return _reverse_cumsum(widened(grad), ctx.dim, ctx.xp), None


def cumsum(a: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    """Running sums along ``dim``: ``out[..., i, ...] = a[..., :i+1, ...].sum(dim)``;
    integer and bool inputs give int64.

    >>> mt.cumsum(mt.tensor([1, 2, 3]), 0)
    tensor([1, 3, 6])
    """
    return _running(CumSum, a, dim, dtype, "cumsum")


class CumProd(Function):
    """Running products along a dim. d out_j / d a_i (j >= i) is out_j / a_i before the
    first zero of the row; at the first zero it is the running product with that zero
    taken as 1; past it, every running product keeps the zero: 0 (as PyTorch)."""

    @staticmethod
    def forward(ctx, a, dim):
        xp = ctx.xp
        ctx.dim = dim
        if a.dtype.kind in "iub":
            return xp.asarray(xp.cumprod(a, axis=dim, dtype=xp.int64), order="C")
        out = xp.cumprod(widened(a), axis=dim).astype(a.dtype, order="C", copy=False)
        ctx.save_for_backward(a, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        xp, dim = ctx.xp, ctx.dim
        a, out = ctx.saved_tensors
        zero = a == 0
        zeros_so_far = xp.cumsum(zero, axis=dim)
        before = zeros_so_far == 0  # before the row's first zero
        first_zero = zero & (zeros_so_far == 1)
        local = _reverse_cumsum(grad * out, dim, xp) / xp.where(before, a, 1)
        skip_zero = xp.cumprod(xp.where(first_zero, 1, a), axis=dim)  # that zero as 1
        at_zero = _reverse_cumsum(grad * skip_zero, dim, xp)
        return xp.where(before, local, xp.where(first_zero, at_zero, 0)), None


def cumprod(a: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    """Running products along ``dim``; integer and bool inputs give int64.

    >>> mt.cumprod(mt.tensor([1, 2, 3]), 0)
    tensor([1, 2, 6])
    """
    return _running(CumProd, a, dim, dtype, "cumprod")


def _running(scan: type, a: Tensor, dim: int, dtype: Any, op: str) -> Tensor:
    """``scan`` (CumSum or CumProd) of ``a`` along ``dim``, after the checks and the cast
    cumsum and cumprod share."""
    require_tensor(a, op)
    if dtype is not None:
        a = to_dtype(a, dtype)
    dim = _wrap_dim(dim, a.ndim, op)
    if a.ndim == 0:  # one element: its own running sum or product
        return scan.apply(a.reshape(1), 0).reshape(())
    return scan.apply(a, dim)


class LogSumExp(Function):
    """``log(sum(exp(a)))`` over dims, shifted by the max so nothing overflows; the
    gradient is the softmax over the same dims (one fused node)."""

    @staticmethod
    def forward(ctx, a, axes, keepdim):
        xp = ctx.xp
        wide = widened(a)
        peak = wide.max(axis=axes, keepdims=True)
        peak = xp.where(xp.isfinite(peak), peak, 0)  # all -inf (or an inf): no shift
        out = xp.log(xp.exp(wide - peak).sum(axis=axes, keepdims=True)) + peak  # keepdims
        ctx.save_for_backward(a, out)
        ctx.axes, ctx.keepdim = axes, keepdim
        if not keepdim:
            out = out.reshape([n for i, n in enumerate(out.shape)
                               if axes is not None and i not in axes])
        return xp.asarray(out, dtype=a.dtype, order="C")

    @staticmethod
    def backward(ctx, grad):
        a, out = ctx.saved_tensors
        grad = expand_reduced(grad, a.shape, ctx.axes, ctx.keepdim, ctx.xp)
        return grad * ctx.xp.exp(widened(a) - out).astype(a.dtype), None, None


def logsumexp(a: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
    """``log(exp(a).sum(dim))`` computed stably (shifted by the max); integer inputs give
    the default float. Its gradient is ``softmax(a, dim)``.

    >>> mt.logsumexp(mt.tensor([0.0, 0.0]), 0)   # log 2
    tensor(0.6931)
    """
    a = float_input(a, "logsumexp")
    return LogSumExp.apply(a, normalize_dims(dim, a.ndim, "logsumexp"), keepdim)


class Prod(Function):
    """The product over dims. d prod / d a_i is the product of the others: out / a_i when
    no element of the group is 0; with one zero, only the zero's gradient is non-zero
    (the product of the rest); with two or more, every gradient is 0 (as PyTorch)."""

    @staticmethod
    def forward(ctx, a, axes, keepdim):
        ctx.save_for_backward(a)
        ctx.axes, ctx.keepdim = axes, keepdim
        dtype = ctx.xp.int64 if a.dtype.kind in "iub" else None
        return ctx.xp.asarray(a.prod(axis=axes, keepdims=keepdim, dtype=dtype), order="C")

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        (a,) = ctx.saved_tensors
        grad = expand_reduced(grad, a.shape, ctx.axes, ctx.keepdim, xp)
        zero = a == 0
        zeros = zero.sum(axis=ctx.axes, keepdims=True)
        others = xp.where(zero, 1, a).prod(axis=ctx.axes, keepdims=True)  # nonzero product
        # no zero: out / a_i; the one zero: the product of the rest; else 0
        local = xp.where(zeros == 0, others / xp.where(zero, 1, a),
                         xp.where((zeros == 1) & zero, others, 0))
        return grad * local, None, None


def prod(a: Tensor, dim: Optional[int] = None, keepdim: bool = False, *,
         dtype: Any = None) -> Tensor:
    """The product of all elements, or along one ``dim``; integer and bool inputs give
    int64; ``dtype`` casts the input first. Zeros get PyTorch's gradient."""
    require_tensor(a, "prod")
    if dtype is not None:
        a = to_dtype(a, dtype)
    axes = None if dim is None else normalize_dims(_wrap_dim(dim, a.ndim, "prod"), a.ndim,
                                                   "prod")
    if axes is None and dim is not None:  # a 0-d tensor along its one "dim"
        keepdim = False
    return Prod.apply(a, axes, keepdim)
