"""The scatter family: scatter, scatter_add and scatter_reduce ('sum', 'prod', 'mean',
'amax', 'amin', with or without ``include_self``), as PyTorch defines them.

``index`` names, for each element of ``src``, a position along ``dim`` of a copy of the
input; every other coordinate is the element's own. Errors use PyTorch's words and name
the op. Backward follows PyTorch's formulas (``scatter``'s src gradient is gathered from
where it was written, the input's is cut there), and no Python loop runs over elements.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..autograd import Function
from ..backend import dtypes
from ..tensor import Tensor, _wrap_dim
from ._util import index_along, require_tensor


def _scatter_checks(a: Tensor, dim: int, index: Tensor, src: Any, op: str) -> int:
    require_tensor(a, op)
    require_tensor(index, op, "index")
    if index.dtype != dtypes.int64:
        raise TypeError(f"{op}(): Expected dtype int64 for index, got {index.dtype}")
    dim = _wrap_dim(dim, a.ndim, op)
    if index.ndim != a.ndim and index.numel():
        raise ValueError(f"{op}(): Index tensor must have the same number of dimensions as "
                         f"self tensor ({index.ndim} and {a.ndim})")
    for d in range(index.ndim):
        if d != dim and index.shape[d] > a.shape[d]:
            raise ValueError(f"{op}(): Expected index {tuple(index.shape)} to be smaller than "
                             f"self {tuple(a.shape)} apart from dimension {dim}")
        if isinstance(src, Tensor) and index.shape[d] > src.shape[d]:
            raise ValueError(f"{op}(): Expected index {tuple(index.shape)} to be smaller than "
                             f"src {tuple(src.shape)}")
    if isinstance(src, Tensor) and src.ndim != a.ndim:
        raise ValueError(f"{op}(): src has {src.ndim} dims, self {a.ndim}")
    bound = a.shape[dim] if a.ndim else 1
    # at once on the CPU; on a GPU kept on the device and read at the next host read (no
    # wait here), where CuPy's writes would otherwise wrap a bad index round silently
    a._backend.check_in_range(index.data, bound, f"{op}(): index", f"is out of bounds for "
                              f"dimension {dim} with size {bound}", error=IndexError)
    return dim


def _src_part(src: Any, index: Any) -> tuple:
    """The leading block of ``src`` that ``index`` covers (src may be larger)."""
    return tuple(slice(0, n) for n in index.shape)


def _src_grad(grad_part: Any, src_shape: tuple, index: Any, xp: Any) -> Any:
    """A gradient for src: ``grad_part`` in the block index covers, 0 elsewhere."""
    if tuple(grad_part.shape) == tuple(src_shape):
        return grad_part
    out = xp.zeros(src_shape, dtype=grad_part.dtype)
    out[_src_part(out, index)] = grad_part
    return out


class Scatter(Function):
    """``out = a`` with ``out[index[i][j]][j] = src[i][j]`` along ``dim`` (or ``value``).
    Gradient: ``a``'s passes except where written; ``src``'s is gathered from there."""

    @staticmethod
    def forward(ctx, a, index, src, dim, value):
        xp = ctx.xp
        ctx.dim, ctx.src_shape = dim, None if src is None else src.shape
        ctx.save_for_backward(index)
        out = xp.array(a, copy=True, order="C")
        where = index_along(index, dim, xp)
        out[where] = value if src is None else src[_src_part(src, index)]
        return out

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        (index,) = ctx.saved_tensors
        where = index_along(index, ctx.dim, xp)
        grad_a = None
        if ctx.needs_input_grad[0]:
            grad_a = xp.array(grad, copy=True)
            grad_a[where] = 0
        grad_src = None
        if ctx.src_shape is not None and ctx.needs_input_grad[2]:
            grad_src = _src_grad(grad[where], ctx.src_shape, index, xp)
        return grad_a, None, grad_src, None, None


def _src_operand(a: Tensor, src: Any, op: str) -> Tensor:
    require_tensor(src, op, "src")
    if src.dtype != a.dtype:
        raise TypeError(f"{op}(): Expected self.dtype to be equal to src.dtype "
                        f"({a.dtype} and {src.dtype})")
    return src


def scatter(a: Tensor, dim: int, index: Tensor, src: Any = None, *, value: Any = None,
            reduce: Optional[str] = None) -> Tensor:
    """A copy of ``a`` with ``src[i][j]`` (or the number ``value``) written at
    ``index[i][j]`` along ``dim``. Which write wins where an index repeats is unspecified,
    as in PyTorch. ``src`` may be a number (torch's ``scatter(dim, index, value)``).

    >>> mt.zeros(3).scatter(0, mt.tensor([2, 0]), mt.tensor([1.0, 2.0])).tolist()
    [2.0, 0.0, 1.0]
    """
    if reduce is not None:
        raise ValueError("scatter(): reduce= is not supported here; use scatter_add or "
                         "scatter_reduce(reduce='sum'|'prod'|...)")
    if not isinstance(src, Tensor):
        if value is None:
            value = src
        src = None
        if value is None:
            raise TypeError("scatter(): expected src (a Tensor) or value (a number)")
    dim = _scatter_checks(a, dim, index, src, "scatter")
    if src is not None:
        src = _src_operand(a, src, "scatter")
    if not index.numel():
        return a.clone()
    return Scatter.apply(a, index.data, src, dim, value)


def _flat_positions(where: tuple, shape: tuple, index_shape: tuple, xp: Any) -> Any:
    """Row-major offsets into ``shape`` of the (broadcasting) coordinates ``where``, one
    per element of the index, as int64 (arithmetic, where ``ravel_multi_index`` would
    need its coordinates broadcast first)."""
    flat, stride = 0, 1
    for coordinate, n in zip(reversed(where), reversed(shape)):
        flat = flat + coordinate.astype(np.int64) * stride
        stride *= n
    return xp.broadcast_to(flat, index_shape).reshape(-1)


def _add_at(backend: Any, target: Any, flat: Any, values: Any) -> None:
    """``target[flat] += values`` with repeats adding up. int64 adds as uint64 (the same
    bits, two's complement): CUDA's atomicAdd has no signed 64-bit form."""
    if target.dtype == np.int64:
        backend.scatter_add(target.view(np.uint64), flat, values.astype(np.uint64))
    else:
        backend.scatter_add(target, flat, values)


def _identity(combine: Any, dtype: Any) -> Any:
    """The value ``combine`` (multiply, maximum or minimum) leaves any other unchanged by,
    in ``dtype``."""
    if combine.__name__ == "multiply":
        return True if dtype == np.bool_ else 1
    low = combine.__name__ == "maximum"
    if dtype == np.bool_:
        return not low
    if dtypes.is_integer(dtype):
        info = np.iinfo(dtype)
        return info.min if low else info.max
    return -np.inf if low else np.inf


def _combine_in_rounds(backend: Any, combine: Any, flat: Any, values: Any, size: int,
                       dtype: Any) -> Any:
    """``combine`` (a ufunc) of the ``values`` sent to each of ``size`` positions
    (``flat``), as an array of ``size``; positions nothing is sent to hold junk, which the
    caller masks. Round r combines each position's r-th contribution: distinct positions.

    The number of rounds is one counted host read. Each round updates every contribution:
    those of other rounds write to a spare slot past the end, combining it with
    ``combine``'s identity (no boolean mask, whose size would be a read of its own)."""
    xp = backend.xp
    out = xp.zeros(size + 1, dtype=dtype)  # (size + 1,): [size] is the spare slot
    if not flat.size:
        return out[:size]
    n = flat.size
    order = backend.stable_argsort(flat, 0)
    where, ordered = flat[order], values[order]
    first = xp.concatenate([xp.ones(1, dtype=bool), where[1:] != where[:-1]])
    run = xp.cumsum(first) - 1  # the run (one per position) of each contribution
    starts = xp.zeros(n + 1, dtype=np.int64)  # (n + 1,): each run's first contribution
    starts[xp.where(first, run, n)] = xp.arange(n)
    rank = xp.arange(n) - starts[run]  # place within its run
    rounds = int(backend.to_numpy(rank.max())) + 1
    out[xp.where(rank == 0, where, size)] = ordered
    identity = _identity(combine, dtype)
    for r in range(1, rounds):
        pick = rank == r
        at = xp.where(pick, where, size)
        out[at] = combine(out[at], xp.where(pick, ordered, identity).astype(dtype, copy=False))
    return out[:size]


class ScatterReduce(Function):
    """scatter_add and scatter_reduce: the ``src`` elements that ``index`` sends to one
    position of ``a`` combined with 'sum', 'prod', 'mean', 'amax' or 'amin', with or
    without the element of ``a`` already there (``include_self``).

    Positions are flattened to one number; 'sum' and 'mean' are ``scatter_add``s. 'prod',
    'amax' and 'amin' sort the contributions by position and combine them in rounds, one
    contribution per position per round: as many rounds as the most contributions one
    position gets, each a vectorised update of distinct positions.
    Backward follows PyTorch: 'prod' gives each contribution the product of the others
    (zeros handled as ``prod`` does); 'amax'/'amin' share the gradient equally between the
    contributions equal to the result."""

    @staticmethod
    def forward(ctx, a, index, src, dim, reduce, include_self):
        xp, backend = ctx.xp, ctx.backend
        ctx.dim, ctx.reduce, ctx.include_self, ctx.src_shape = dim, reduce, include_self, \
            src.shape
        where = index_along(index, dim, xp)
        flat = _flat_positions(where, a.shape, index.shape, xp)  # position of each contrib
        values = xp.ascontiguousarray(src[_src_part(src, index)]).reshape(-1)
        hit = xp.zeros(a.size, dtype=bool)
        hit[flat] = True
        base = a.reshape(-1)
        if reduce in ("sum", "mean"):
            out = xp.array(base, copy=True) if include_self else xp.where(hit, 0, base)
            out = out.astype(a.dtype, copy=False)
            _add_at(backend, out, flat, values)
            count = None
            if reduce == "mean":
                count = xp.zeros(a.size, dtype=a.dtype)
                _add_at(backend, count, flat, xp.ones(flat.shape, dtype=a.dtype))
                count = count + (1 if include_self else 0)
                count = xp.where(count == 0, 1, count)
                out = out / count if a.dtype.kind == "f" else out // count
            ctx.save_for_backward(index, flat, count)
            return xp.asarray(out.astype(a.dtype, copy=False).reshape(a.shape), order="C")
        combine = {"prod": xp.multiply, "amax": xp.maximum, "amin": xp.minimum}[reduce]
        combined = _combine_in_rounds(backend, combine, flat, values, a.size, a.dtype)
        if include_self:
            combined = xp.where(hit, combine(combined, base), base)
        else:
            combined = xp.where(hit, combined, base)
        out = combined.reshape(a.shape).astype(a.dtype, copy=False)
        ctx.save_for_backward(a, index, flat, values, out)
        return xp.asarray(out, order="C")

    @staticmethod
    def backward(ctx, grad):
        xp, backend = ctx.xp, ctx.backend
        shape = grad.shape
        if ctx.reduce in ("sum", "mean"):
            index, flat, count = ctx.saved_tensors
            g = grad.reshape(-1)
            if count is not None:
                g = g / count
            hit = xp.zeros(g.size, dtype=bool)
            hit[flat] = True
            grad_a = g if ctx.include_self else xp.where(hit, 0, g)
            grad_src = g[flat].reshape(index.shape)
            return (grad_a.reshape(shape), None, _src_grad(grad_src, ctx.src_shape, index, xp),
                    None, None, None)
        a, index, flat, values, out = ctx.saved_tensors
        g, base, result = grad.reshape(-1), a.reshape(-1), out.reshape(-1)
        hit = xp.zeros(g.size, dtype=bool)
        hit[flat] = True
        self_in = hit if ctx.include_self else xp.zeros_like(hit)
        if ctx.reduce == "prod":
            zero_src = values == 0
            zeros = xp.zeros(g.size, dtype=g.dtype)
            backend.scatter_add(zeros, flat, zero_src.astype(g.dtype))
            zeros = zeros + (self_in & (base == 0))
            others = _combine_in_rounds(backend, xp.multiply, flat,
                                        xp.where(zero_src, 1, values), g.size, g.dtype)
            others = xp.where(self_in & (base != 0), others * base, others)

            def local(x: Any, at: Any) -> Any:  # d result / d x for contributions at ``at``
                return xp.where(zeros[at] == 0, result[at] / xp.where(x == 0, 1, x),
                                xp.where((zeros[at] == 1) & (x == 0), others[at], 0))
            grad_src = g[flat] * local(values, flat)
            grad_a = xp.where(self_in, g * local(base, xp.arange(g.size)),
                              xp.where(hit, 0, g))
        else:  # amax / amin: shared equally between the elements equal to the result
            src_tie = values == result[flat]
            # PyTorch counts a's own element among the ties even when include_self is
            # False (its share then goes nowhere); kept, so gradients match its
            self_tie = hit & (base == result)
            ties = xp.zeros(g.size, dtype=g.dtype)
            backend.scatter_add(ties, flat, src_tie.astype(g.dtype))
            ties = xp.where(ties + self_tie == 0, 1, ties + self_tie)
            grad_src = xp.where(src_tie, g[flat] / ties[flat], 0)
            grad_a = xp.where(hit, xp.where(self_in & self_tie, g / ties, 0), g)
        grad_src = _src_grad(grad_src.reshape(index.shape), ctx.src_shape, index, xp)
        return grad_a.reshape(shape), None, grad_src, None, None, None


def scatter_add(a: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """A copy of ``a`` with ``src[i][j]`` added at ``index[i][j]`` along ``dim``; repeated
    indices all add (torch.scatter_add)."""
    dim = _scatter_checks(a, dim, index, src, "scatter_add")
    src = _src_operand(a, src, "scatter_add")
    if not index.numel():
        return a.clone()
    return ScatterReduce.apply(a, index.data, src, dim, "sum", True)


_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def scatter_reduce(a: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    """A copy of ``a`` where each position ``index`` names along ``dim`` holds the
    ``reduce`` ('sum', 'prod', 'mean', 'amax', 'amin') of the ``src`` elements sent there,
    and of its own element when ``include_self``; other positions keep ``a``'s.

    >>> mt.zeros(2).scatter_reduce(0, mt.tensor([0, 0, 1]), mt.tensor([1.0, 3.0, 5.0]),
    ...                            "amax", include_self=False).tolist()
    [3.0, 5.0]
    """
    if reduce not in _REDUCTIONS:
        raise ValueError(f"scatter_reduce(): reduce argument must be one of {_REDUCTIONS}, "
                         f"got {reduce!r}")
    dim = _scatter_checks(a, dim, index, src, "scatter_reduce")
    src = _src_operand(a, src, "scatter_reduce")
    if not index.numel():
        return a.clone()
    return ScatterReduce.apply(a, index.data, src, dim, reduce, bool(include_self))
