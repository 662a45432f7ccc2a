"""Order along a dim, and sampling by it: sort, topk, multinomial. With softmax and
cumsum they are what text generation samples with (temperature, top-k, top-p).

sort and topk choose positions along a dim, which has no gradient (a stable argsort, or
a partition), then pick the values there with gather's ``TakeAlongDim``, whose
backward puts each gradient back where its value came from. multinomial draws category
indices from rows of non-negative weights with the backend's seeded stream
(``manual_seed``) and records no graph.

>>> probs = (logits / temperature).softmax(-1)       # (B, V)
>>> top = probs.topk(50)                             # the 50 likeliest: (B, 50) each
>>> pick = mt.multinomial(top.values, 1)             # (B, 1), a position in top
>>> token = top.indices.gather(-1, pick)             # (B, 1), a vocabulary id
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np

from ..backend import dtypes
from ..tensor import Tensor, _wrap_dim
from ._util import require_float, require_tensor, untracked
from .indexing import TakeAlongDim

ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])  # what sort/topk return

# multinomial with replacement compares every uniform with every cdf entry of its row:
# at most this many elements of the (B, samples, C) comparison exist at once
_COMPARE_BUDGET = 1 << 24


# --- positions, on raw arrays -------------------------------------------------------------
def _along(axis: int, part: slice) -> tuple:
    """An index applying ``part`` to ``axis`` and keeping the dims before it whole."""
    return (slice(None),) * axis + (part,)


def _argsort(backend: Any, array: Any, axis: int, descending: bool) -> Any:
    """A stable argsort along ``axis``. Descending sorts the reversed array ascending and
    reverses back, so equal elements keep their order there too (negating instead would
    overflow the smallest integer and means nothing for bool or unsigned)."""
    if not descending:
        return backend.stable_argsort(array, axis)
    xp = backend.xp
    reversed_order = backend.stable_argsort(xp.flip(array, axis), axis)
    return (array.shape[axis] - 1) - xp.flip(reversed_order, axis)


def _order_keys(xp: Any, array: Any, largest: bool) -> Any:
    """Integer keys whose ascending order is the order of ``array``'s values (descending
    when ``largest``), ties where the values tie: NaN the largest and every NaN equal,
    -0 equal to 0, as NumPy sorts floats. topk partitions and sorts these, not the values:

    - ``largest`` needs no partition index near the end of the row: bitwise not reverses
      an integer order (negation would overflow int64's min and means nothing for bool or
      unsigned), so the k largest are the k smallest keys, and kth stays k - 1. CuPy's
      argpartition sorts the whole row once its rounded kth reaches 1024: kth = n - k for
      top-k of a 50k vocabulary did that at every generated token.
    - no NaN reaches CuPy's partition kernel, which compares with ``<`` and so leaves NaN
      where it lies (a wrong selection), and no bf16 reaches it or Thrust's argsort,
      which have no bf16 type.

    A float's bits as a signed integer of its width order as the float does once a
    negative one's magnitude is negated. Integer operations only: CuPy's kernels flush
    subnormals to zero (-ftz=true) in float arithmetic, which would tie them with 0; and
    no ``where`` on the sign, which NumPy runs as a branch that a random sign mispredicts
    (four times the time of all the rest).
    """
    dtype = array.dtype
    if dtype == dtypes.bool_:
        return xp.logical_not(array) if largest else array
    if dtypes.is_integer(dtype):
        return ~array if largest else array
    signed = np.dtype(f"int{8 * dtype.itemsize}")  # float16/bf16 -> int16, float64 -> int64
    top_bit = signed.type(8 * dtype.itemsize - 1)
    inf = signed.type(np.array(np.inf, dtype).view(signed).item())  # inf's bits
    bits = array.view(signed)  # same itemsize: any strides
    # in place from here on: four arrays, not ten (NumPy's fresh ones fault their pages in)
    keys = bits & signed.type(np.iinfo(signed).max)  # |x|'s bits; a NaN's are above inf's
    nan = inf - keys  # negative only for a NaN (no overflow)
    nan >>= top_bit  # -1 where NaN, else 0
    negative = bits >> top_bit  # -1 where the sign bit is set, else 0
    negative &= ~nan  # a NaN's sign ignored
    xp.minimum(keys, signed.type(inf + 1), out=keys)  # every NaN one magnitude, above inf
    keys ^= negative
    keys -= negative  # -magnitude where negative (two's complement): -0 is 0
    if largest:
        xp.invert(keys, out=keys)
    return keys


def _extreme_positions(backend: Any, array: Any, k: int, axis: int, largest: bool,
                       in_order: bool) -> Any:
    """Positions along ``axis`` of the ``k`` largest (or smallest) elements, from the most
    extreme on when ``in_order``. The backend picks the k smallest of ``_order_keys``
    (a partition in linear time on the CPU; on a GPU a sort, which a CUDA Graph can
    capture); only the k are sorted (stably: equal values stay in the order the
    partition left them), which matters for top-k over a vocabulary of 50k at every
    generated token."""
    xp = backend.xp
    keys = _order_keys(xp, array, largest)
    if k == 0 or k == array.shape[axis]:  # nothing to partition off
        return backend.stable_argsort(keys, axis)[_along(axis, slice(0, k))]
    positions = backend.smallest_positions(keys, k, axis)  # a partition, or a sort
    if in_order:
        chosen = xp.take_along_axis(keys, positions, axis=axis)
        order = backend.stable_argsort(chosen, axis)
        positions = xp.take_along_axis(positions, order, axis=axis)
    return positions


def _positions(a: Tensor, positions_of: Any) -> Tensor:
    """``positions_of(a's array)`` as an int64 Tensor outside the graph (``untracked``:
    recorded while capturing, so a replay sorts the new values)."""
    xp = a._backend.xp
    return untracked(lambda x: xp.asarray(positions_of(x), dtype=np.int64, order="C"), a)


def _select(a: Tensor, positions_of: Any, dim: int) -> ValuesIndices:
    indices = _positions(a, positions_of)
    # the indices go in as an input, so an in-place edit of them before backward is caught
    return ValuesIndices(TakeAlongDim.apply(a, indices, dim, True), indices)


# --- functional wrappers ------------------------------------------------------------------
def sort(a: Tensor, dim: int = -1, descending: bool = False,
         stable: bool = False) -> ValuesIndices:
    """``(values, indices)``: ``a`` sorted along ``dim`` and where each value came from
    (int64). The sort is always stable, descending too: equal elements keep their order
    (torch.sort with stable=True; ``stable`` is accepted for its signature). NaN sorts as
    the largest. Only ``values`` has a gradient.

    >>> mt.sort(mt.tensor([3.0, 1.0, 3.0, 2.0]), descending=True).indices
    tensor([0, 2, 3, 1])
    """
    require_tensor(a, "sort")
    dim = _wrap_dim(dim, a.ndim, "sort")
    if a.ndim == 0:  # one element: itself, at index 0
        values, indices = sort(a.reshape(1), 0, descending)
        return ValuesIndices(values.reshape(()), indices.reshape(()))
    backend, descending = a._backend, bool(descending)
    return _select(a, lambda x: _argsort(backend, x, dim, descending), dim)


def argsort(a: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The int64 positions that sort ``a`` along ``dim`` (``sort(...).indices``); always
    stable, so ``stable`` is accepted for torch's signature. No gradient.

    >>> mt.argsort(mt.tensor([3.0, 1.0, 2.0]))
    tensor([1, 2, 0])
    """
    require_tensor(a, "argsort")
    dim = _wrap_dim(dim, a.ndim, "argsort")
    if a.ndim == 0:
        return argsort(a.reshape(1), 0, descending).reshape(())
    backend, descending = a._backend, bool(descending)
    return _positions(a, lambda x: _argsort(backend, x, dim, descending))


def topk(a: Tensor, k: int, dim: int = -1, largest: bool = True,
         sorted: bool = True) -> ValuesIndices:  # noqa: A002 - torch's name
    """``(values, indices)`` of the ``k`` largest (``largest=False``: smallest) elements
    along ``dim``, the most extreme first; with ``sorted=False`` in no particular order.
    Which of several equal elements is chosen is unspecified, as in PyTorch.

    >>> mt.topk(mt.tensor([[0.1, 0.6, 0.3]]), 2).indices
    tensor([[1, 2]])
    """
    require_tensor(a, "topk")
    dim = _wrap_dim(dim, a.ndim, "topk")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise TypeError(f"topk: k must be an int, got {type(k).__name__}")
    size = a.shape[dim] if a.ndim else 1
    if not 0 <= k <= size:
        raise ValueError(f"topk: k must be in [0, {size}] (the size of dim {dim} of a tensor "
                         f"of shape {tuple(a.shape)}), got k={k}")
    if a.ndim == 0:  # a 0-d tensor has one element along its one "dim"
        values, indices = topk(a.reshape(1), k, 0, largest, sorted)
        return ValuesIndices(values.reshape(()), indices.reshape(())) if k else \
            ValuesIndices(values, indices)
    backend, k, largest = a._backend, int(k), bool(largest)
    return _select(a, lambda x: _extreme_positions(backend, x, k, dim, largest, sorted), dim)


def multinomial(probs: Tensor, num_samples: int = 1, replacement: bool = False) -> Tensor:
    """Category indices (int64) drawn from each row of weights: ``probs`` (C,) gives
    (num_samples,), (B, C) gives (B, num_samples). Weights must be finite and
    non-negative with a positive sum per row; they need not sum to 1, and a weight of 0 is
    never drawn. Without ``replacement`` a row's indices are distinct, in the order drawn.
    The draws come from the backend's seeded stream (``manual_seed``); no graph.

    >>> mt.multinomial(mt.tensor([[0.0, 1.0, 3.0]]), 4, replacement=True).shape
    (1, 4)
    """
    require_tensor(probs, "multinomial", "probs")
    require_float(probs, "multinomial", "probs")
    if probs.ndim not in (1, 2):
        raise ValueError(f"multinomial: expected probs of 1 or 2 dims, (C,) or (B, C), got "
                         f"shape {tuple(probs.shape)}")
    if not isinstance(num_samples, (int, np.integer)) or isinstance(num_samples, bool) \
            or num_samples < 1:
        raise ValueError(f"multinomial: expected num_samples to be an int >= 1, got "
                         f"{num_samples!r}")
    num_samples = int(num_samples)
    backend, xp = probs._backend, probs._backend.xp
    categories = probs.shape[-1]
    if categories == 0:
        raise ValueError(f"multinomial: probs has no categories (shape {tuple(probs.shape)})")
    rows = probs.shape[0] if probs.ndim == 2 else 1

    def draw(p: Any) -> Any:  # the check and the draw, both again in a captured replay
        # float64 holds every float dtype exactly, and keeps the cdf of 50k categories precise
        weights = p.reshape(rows, categories).astype(np.float64)  # (B, C)
        _check_weights(backend, weights, 1 if replacement else num_samples)
        # scaled so that each row's largest weight is 1: a row's sum can't overflow
        weights = weights / weights.max(axis=1, keepdims=True)
        if replacement or num_samples == 1:  # one draw without replacement is one with it
            samples = _inverse_cdf(backend, weights, num_samples)
        else:
            samples = _exponential_race(backend, weights, num_samples)
        samples = xp.asarray(samples, dtype=np.int64, order="C")  # (B, num_samples)
        return samples if p.ndim == 2 else samples[0]
    return untracked(draw, probs)


def _check_weights(backend: Any, weights: Any, distinct: int) -> None:
    """Every weight finite and >= 0, and ``distinct`` positive ones in every row (the
    samples drawn without replacement; 1 with replacement).

    The common case costs one host read of three bools, through ``backend.to_numpy`` so
    that ``host_reads`` counts it: a ``bool()`` of a device array waits for the device
    just the same, but uncounted. A failure reads the weights back to name the row. Not
    a deferred check (``Backend.check_in_range``): those keep one integer per message,
    and the draw would go on from weights that are no distribution."""
    xp = backend.xp
    positive = weights > 0  # (B, C)
    if not backend.reads_are_free and type(backend).capture_hook is not None:
        # a GPU capturing a CUDA Graph may not wait for the device: the rows that are no
        # distribution are counted on it and read at the next host read, as
        # check_in_range's checks are (the draw goes on meanwhile)
        bad = (~((weights >= 0) & xp.isfinite(weights))).any(axis=1) | \
            (positive.sum(axis=1) < distinct)
        backend.check_in_range(bad.sum(keepdims=True), 1, "multinomial: rows of probs with a "
                               "weight that is inf, nan or negative, or too few positive:",
                               "(expected 0)")
        return
    flags = xp.stack([((weights >= 0) & xp.isfinite(weights)).all(),  # nan >= 0 is False
                      positive.any(axis=1).all(),
                      (positive.sum(axis=1) >= distinct).all()])
    finite_and_signed, every_row_positive, enough = backend.to_numpy(flags).tolist()
    if finite_and_signed and every_row_positive and enough:
        return
    if not (finite_and_signed and every_row_positive):
        _raise_bad_weight(backend.to_numpy(weights))
    categories = weights.shape[1]
    if distinct > categories:
        raise ValueError(f"multinomial: cannot draw {distinct} samples without "
                         f"replacement from {categories} categories")
    counts = backend.to_numpy(positive.sum(axis=1))  # (B,)
    row = int(np.argmax(counts < distinct))
    raise ValueError(f"multinomial: cannot draw {distinct} samples without replacement "
                     f"from row {row}, which has only {int(counts[row])} positive weights")


def _raise_bad_weight(weights: np.ndarray) -> None:
    """The error for the first thing wrong with host ``weights`` (B, C): inf or nan, a
    negative weight, or a row with none positive."""
    if not np.isfinite(weights).all():
        row = int(np.argmax(~np.isfinite(weights).all(axis=1)))
        raise ValueError(f"multinomial: probs must be finite, got inf or nan in row {row}")
    if (weights < 0).any():
        row = int(np.argmax((weights < 0).any(axis=1)))
        raise ValueError(f"multinomial: probs must be non-negative, got "
                         f"{float(weights.min())} in row {row}")
    row = int(np.argmax(weights.max(axis=1) <= 0))
    raise ValueError(f"multinomial: row {row} of probs sums to 0; expected at least one "
                     "positive weight per row")


def _inverse_cdf(backend: Any, weights: Any, num_samples: int) -> Any:
    """With replacement: a uniform u falls in category j when cdf[j-1] <= u < cdf[j]."""
    xp = backend.xp
    cdf = xp.cumsum(weights, axis=1)  # (B, C)
    # x / x is exactly 1, so the last entry is 1 and every u in [0, 1) lands in the row; a
    # weight of 0 repeats its left neighbour's entry exactly: an empty interval, never hit
    cdf /= cdf[:, -1:]
    uniforms = backend.rand((weights.shape[0], num_samples), dtypes.float64)  # (B, n)
    # the category of u is the number of cdf entries <= u, counted for a chunk of samples
    # at a time so that the (B, chunk, C) comparison stays within _COMPARE_BUDGET
    chunk = max(1, _COMPARE_BUDGET // max(cdf.size, 1))
    pieces = [(cdf[:, None, :] <= uniforms[:, start:start + chunk, None]).sum(axis=2)
              for start in range(0, num_samples, chunk)]
    return pieces[0] if len(pieces) == 1 else xp.concatenate(pieces, axis=1)


def _exponential_race(backend: Any, weights: Any, num_samples: int) -> Any:
    """Without replacement: each category arrives at time E / w with E ~ Exp(1); the first
    ``num_samples`` to arrive are the sample, in arrival order. That has the law of
    drawing one category at a time and renormalising the rest (log w - log E is Gumbel:
    the Gumbel-top-k trick)."""
    xp = backend.xp
    positive = weights > 0  # (B, C)
    uniforms = backend.rand(weights.shape, dtypes.float64)
    exponential = -xp.log1p(-uniforms)  # in [0, inf): 1 - u is in (0, 1]
    # compared as log E - log w, finite for every positive weight (E / w overflows to inf
    # for a subnormal w and would tie with the weights of 0, which arrive never: inf)
    arrival = xp.where(positive,
                       xp.log(exponential) - xp.log(xp.where(positive, weights, 1.0)), xp.inf)
    return _extreme_positions(backend, arrival, num_samples, 1, largest=False, in_order=True)
