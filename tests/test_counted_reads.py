"""Every host read an op makes goes through ``Backend.to_numpy``, which counts it.

An output whose shape depends on values (nonzero, a boolean mask, one_hot without
num_classes, repeat_interleave by a tensor of counts, scatter_reduce's rounds) needs one
read, counted; a value check (scatter's indices, one_hot's ids against num_classes,
repeat_interleave's counts against output_size) needs none: it is the backend's
``check_in_range``, at once on the CPU, deferred on a GPU. Reads that CuPy makes inside
``nonzero``, ``bool()`` or ``int()`` of a device array would be invisible to the counter;
these tests pin the count on the CPU as it is, on the CPU taking a GPU's branches, and on
the GPU.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.backend import get_backend
from minitorch_gpu.backend.transfers import DeferredChecks

F = mt.functional


@pytest.fixture(params=[False, True], ids=["as-is", "gpu-branches"])
def backend(request, device, monkeypatch):
    """``device``'s backend; on the CPU also with reads not free (a GPU's branches), with
    checks of its own either way."""
    backend = get_backend(device)
    if request.param:
        if device != "cpu":
            pytest.skip("a GPU takes its own branches already")
        monkeypatch.setattr(backend, "reads_are_free", False)
    monkeypatch.setattr(backend, "_deferred_checks", DeferredChecks())
    return backend


def _t(values, d, dtype=None):
    return mt.tensor(values, dtype=dtype, device=d)


def _set_by_mask(d):
    x = _t([1.0, 2.0, 3.0, 4.0], d)
    x[_t([True, False, False, True], d)] = 0.0
    return x


def _put_by_mask(d):
    x = _t([[1, 2], [3, 4]], d)
    x[_t([[False, True], [True, True]], d)] = _t([7, 8, 9], d)
    return x


SRC = [1.0, 5.0, -2.0, 3.0, 4.0]
INDEX = [2, 0, 2, 2, 0]

# (name, op on a device, host reads it makes, its result as a list)
READS = [
    ("nonzero", lambda d: mt.nonzero(_t([[0, 3, 0], [1, 0, 2]], d)), 1,
     [[0, 1], [1, 0], [1, 2]]),
    ("nonzero-as-tuple", lambda d: mt.nonzero(_t([0.0, np.nan, 2.0], d), as_tuple=True)[0],
     1, [1, 2]),
    ("nonzero-none", lambda d: mt.nonzero(_t([0, 0], d)), 1, []),
    ("nonzero-empty", lambda d: mt.nonzero(mt.zeros(0, 2, device=d)), 0, []),
    ("nonzero-0d", lambda d: mt.nonzero(_t(5, d)), 1, [[]]),
    ("mask-read", lambda d: _t([[1, 2], [3, 4]], d)[_t([[True, False], [False, True]], d)],
     1, [1, 4]),
    ("mask-of-a-dim", lambda d: _t([[1, 2], [3, 4]], d)[:, _t([False, True], d)], 1,
     [[2], [4]]),
    ("mask-list", lambda d: _t([1, 2, 3], d)[[True, False, True]], 0, [1, 3]),
    ("masked_select", lambda d: _t([[1, 2], [3, 4]], d).masked_select(_t([True, False], d)),
     1, [1, 3]),
    ("mask-write", _set_by_mask, 1, [0.0, 2.0, 3.0, 0.0]),
    ("mask-write-values", _put_by_mask, 1, [[1, 7], [8, 9]]),
    ("one_hot-inferred", lambda d: F.one_hot(_t([2, 0], d)), 1, [[0, 0, 1], [1, 0, 0]]),
    ("one_hot-num_classes", lambda d: F.one_hot(_t([1], d), 2), 0, [[0, 1]]),
    ("repeat_interleave-int", lambda d: _t([1, 2], d).repeat_interleave(2), 0, [1, 1, 2, 2]),
    ("repeat_interleave-counts", lambda d: _t([1, 2, 3], d).repeat_interleave(_t([2, 0, 1], d)),
     1, [1, 1, 3]),
    ("repeat_interleave-output_size",
     lambda d: _t([1, 2], d).repeat_interleave(_t([1, 2], d), output_size=3), 0, [1, 2, 2]),
    ("repeat_interleave-positions", lambda d: mt.repeat_interleave(_t([2, 1], d)), 1,
     [0, 0, 1]),
    ("index-tensor", lambda d: _t([1, 2, 3], d)[_t([-1, 0], d)], 0, [3, 1]),
    ("scatter", lambda d: mt.zeros(3, device=d).scatter(0, _t([2, 0], d), _t([1.0, 2.0], d)),
     0, [2.0, 0.0, 1.0]),
    ("scatter_add", lambda d: mt.zeros(3, device=d).scatter_add(0, _t(INDEX, d), _t(SRC, d)),
     0, [9.0, 0.0, 2.0]),
    ("scatter_reduce-mean", lambda d: mt.zeros(3, device=d).scatter_reduce(
        0, _t(INDEX, d), _t(SRC, d), "mean", include_self=False), 0, [4.5, 0.0, 0.6666667]),
    ("scatter_reduce-amax", lambda d: mt.zeros(3, device=d).scatter_reduce(
        0, _t(INDEX, d), _t(SRC, d), "amax", include_self=False), 1, [5.0, 0.0, 3.0]),
    ("scatter_reduce-amin", lambda d: mt.ones(3, device=d).scatter_reduce(
        0, _t(INDEX, d), _t(SRC, d), "amin"), 1, [1.0, 1.0, -2.0]),
    ("scatter_reduce-prod", lambda d: mt.ones(3, device=d).scatter_reduce(
        0, _t(INDEX, d), _t(SRC, d), "prod"), 1, [20.0, 1.0, -6.0]),
]


@pytest.mark.parametrize("name, op, count, expected", READS, ids=[r[0] for r in READS])
def test_each_read_is_counted_and_a_check_reads_nothing(backend, name, op, count, expected):
    with backend.count_host_reads() as reads:
        out = op(str(backend.device))
    assert reads.count == count, f"{name}: {reads.count} host reads, expected {count}"
    np.testing.assert_allclose(np.asarray(out.tolist(), dtype=float).reshape(-1),
                               np.asarray(expected, dtype=float).reshape(-1), rtol=1e-7)
    backend.raise_deferred_errors()


# (name, op on a device, error, message): value checks, at once or at the next read
BAD_VALUES = [
    ("one_hot-past-num_classes", lambda d: F.one_hot(_t([0, 3], d), 3), ValueError,
     r"^one_hot: class value 3 is out of range: class values must be non-negative and "
     r"smaller than num_classes \(3\)"),
    ("one_hot-negative", lambda d: F.one_hot(_t([-1, 0], d), 3), ValueError,
     r"^one_hot: class value -1 is out of range"),
    ("one_hot-inferred-negative", lambda d: F.one_hot(_t([-2, 0], d)), ValueError,
     r"^one_hot: class values must be non-negative, got -2$"),
    ("repeat_interleave-negative", lambda d: _t([1, 2], d).repeat_interleave(_t([2, -1], d)),
     ValueError, r"^repeat_interleave: repeats can not be negative, got -1$"),
    ("repeat_interleave-negative-output_size",
     lambda d: _t([1, 2], d).repeat_interleave(_t([-1, 2], d), output_size=1), ValueError,
     r"^repeat_interleave: repeat -1 is negative: repeats can not be negative"),
    ("repeat_interleave-output_size", lambda d: _t([1, 2], d).repeat_interleave(
        _t([1, 2], d), output_size=4), ValueError,
     r"^repeat_interleave: the repeats sum to 3 where output_size is 4"),
    ("scatter-past-the-end", lambda d: mt.zeros(2, 3, device=d).scatter(
        1, _t([[0, 3]], d), mt.ones(2, 3, device=d)), IndexError,
     r"^scatter\(\): index 3 is out of bounds for dimension 1 with size 3"),
]


@pytest.mark.parametrize("name, op, error, message", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_values_raise_naming_op_value_and_range(backend, name, op, error, message):
    with pytest.raises(error, match=message):
        try:
            op(str(backend.device))
        except (IndexError, ValueError) as exc:
            if backend.reads_are_free or re.search(message, str(exc)):
                raise  # the op's own error, at once
            # NumPy refusing an index the op computed from the bad value, which CuPy
            # would wrap: the check deferred as on a GPU is still pending
        backend.raise_deferred_errors()


@pytest.mark.parametrize("reduce", ["prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [mt.float64, mt.int64])
def test_scatter_reduce_in_rounds_matches_a_loop_and_its_gradients_agree(
        backend, reduce, include_self, dtype):
    """Many contributions per position (up to 9 rounds), some positions none."""
    rng = np.random.default_rng(3)
    a = rng.integers(-3, 4, (4, 6))
    src = rng.integers(-3, 4, (4, 9))
    index = rng.integers(0, 4, (4, 9))
    index[:, 0] = 5  # column 5 of each row is hit by one element only
    combine = {"prod": np.multiply, "amax": np.maximum, "amin": np.minimum}[reduce]
    want = a.copy()
    for row in range(4):
        for position in set(index[row]):
            values = list(src[row][index[row] == position])
            if include_self:
                values.append(a[row, position])
            want[row, position] = combine.reduce(np.array(values))
    d = str(backend.device)
    x = mt.tensor(a, dtype=dtype, device=d, requires_grad=dtype == mt.float64)
    s = mt.tensor(src, dtype=dtype, device=d, requires_grad=dtype == mt.float64)
    out = x.scatter_reduce(1, mt.tensor(index, device=d), s, reduce, include_self=include_self)
    np.testing.assert_array_equal(np.asarray(out.tolist()), want)
    if dtype == mt.float64:  # the gradients through the rounds, against the CPU's own
        out.sum().backward()
        x0, s0 = mt.tensor(a, dtype=dtype, requires_grad=True), \
            mt.tensor(src, dtype=dtype, requires_grad=True)
        with_reads_free = get_backend("cpu").reads_are_free
        get_backend("cpu").reads_are_free = True
        try:
            x0.scatter_reduce(1, mt.tensor(index), s0, reduce,
                              include_self=include_self).sum().backward()
        finally:
            get_backend("cpu").reads_are_free = with_reads_free
        np.testing.assert_allclose(np.asarray(x.grad.tolist()), x0.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(s.grad.tolist()), s0.grad.numpy(), rtol=1e-12)
