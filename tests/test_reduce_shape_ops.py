"""Reductions, scans and the rearranging/scattering ops against PyTorch (forward values,
dtypes and gradients; skipped where torch is absent), and their errors.

Each case is one lambda ``fn(lib, F, *tensors)`` run on both sides: ``lib`` is
``minitorch_gpu`` or ``torch``, ``F`` the matching functional module. The table rows in
``op_table.py`` check the same ops against NumPy with central differences; here the
point is PyTorch's exact semantics (zeros in prod, ties in amax, argument spellings).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.functional as MF


def _torch() -> Any:
    return pytest.importorskip("torch")


RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4))
X3 = RNG.standard_normal((2, 3, 5))
WITH_ZEROS = np.array([[1.5, 0.0, -2.0, 3.0], [0.0, 2.0, 0.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
INT = np.array([[3, 0, 2], [1, 1, 5]])
BOOL = np.array([[True, False, True], [False, False, False]])
IDX_DIM1 = np.array([[0, 0, 3], [2, 1, 1], [3, 3, 3]])  # into (3, 4) along dim 1, from (3, 3)
IDX_DIM0 = np.array([[0, 2, 2, 1], [0, 0, 1, 1]])  # into (3, 4) along dim 0, from (2, 4)
TIES = np.array([[1.0, 2.0, 2.0, 0.5], [3.0, 3.0, 3.0, 3.0], [0.0, -1.0, 0.0, 5.0]])

# (name, fn(lib, F, *tensors), inputs: float arrays get grads, integer/bool ones don't)
CASES: list = [
    ("logsumexp", lambda m, F, x: m.logsumexp(x, 1), (X,)),
    ("logsumexp-dims-keepdim", lambda m, F, x: x.logsumexp((0, 2), keepdim=True), (X3,)),
    ("logsumexp-inf", lambda m, F, x: m.logsumexp(x * 0 + float("-inf"), 1), (X,)),
    ("prod-all", lambda m, F, x: x.prod(), (X,)),
    ("prod-dim", lambda m, F, x: m.prod(x, 1, keepdim=True), (X,)),
    ("prod-one-zero-rows", lambda m, F, x: x.prod(1), (WITH_ZEROS,)),
    ("prod-zeros-all", lambda m, F, x: x.prod(), (WITH_ZEROS,)),
    ("prod-zeros-dim0", lambda m, F, x: x.prod(0), (WITH_ZEROS,)),
    ("prod-int", lambda m, F, i: i.prod(1), (INT,)),
    ("prod-dtype", lambda m, F, i: i.prod(dtype=m.float64), (INT,)),
    ("cumsum-dtype", lambda m, F, i: i.cumsum(1, dtype=m.float64), (INT,)),
    ("cumprod", lambda m, F, x: m.cumprod(x, 1), (X,)),
    ("cumprod-dim0", lambda m, F, x: x.cumprod(0), (X3,)),
    ("cumprod-zeros", lambda m, F, x: x.cumprod(1), (WITH_ZEROS,)),
    ("cumprod-zeros-dim0", lambda m, F, x: x.cumprod(0), (WITH_ZEROS.T.copy(),)),
    ("cumprod-int", lambda m, F, i: m.cumprod(i, 1), (INT,)),
    ("var-mean", lambda m, F, x: m.var_mean(x, 1), (X,)),
    ("var-mean-all", lambda m, F, x: m.var_mean(x), (X,)),
    ("var-mean-correction", lambda m, F, x: m.var_mean(x, (0, 2), correction=0, keepdim=True),
     (X3,)),
    ("var-mean-unbiased", lambda m, F, x: m.var_mean(x, 1, False), (X,)),
    ("std-mean", lambda m, F, x: m.std_mean(x, -1, keepdim=True), (X3,)),
    ("std-mean-correction2", lambda m, F, x: m.std_mean(x, dim=1, correction=2), (X,)),
    ("any-dim", lambda m, F, b: b.any(1), (BOOL,)),
    ("any-keepdim", lambda m, F, i: m.any(i, 0, keepdim=True), (INT,)),
    ("all-dim", lambda m, F, b: m.all(b, -1), (BOOL,)),
    ("all-dims", lambda m, F, i: i.all((0, 1)), (INT,)),
    ("any-all", lambda m, F, x: (x.any(), x.all()), (X,)),
    ("sum-dtype", lambda m, F, i: i.sum(1, dtype=m.float64), (INT,)),
    ("sum-dtype-float", lambda m, F, x: x.sum(dtype=m.float32), (X,)),
    ("mean-dtype", lambda m, F, i: i.mean(dtype=m.float64), (INT,)),
    ("argsort", lambda m, F, x: x.argsort(), (X,)),
    ("argsort-desc-stable", lambda m, F, x: m.argsort(x, dim=1, descending=True, stable=True),
     (TIES,)),
    ("argsort-dim0-stable", lambda m, F, x: x.argsort(dim=0, stable=True), (TIES,)),
    ("repeat", lambda m, F, x: x.repeat(2, 3), (X,)),
    ("repeat-new-dims", lambda m, F, x: x.repeat(2, 1, 3), (X,)),
    ("repeat-tuple", lambda m, F, x: x.repeat((1, 2, 1)), (X3,)),
    ("repeat-interleave-int", lambda m, F, x: x.repeat_interleave(2), (X,)),
    ("repeat-interleave-dim", lambda m, F, x: m.repeat_interleave(x, 3, dim=0), (X,)),
    ("repeat-interleave-tensor",
     lambda m, F, x, r: x.repeat_interleave(r, dim=1, output_size=7), (X, np.array([2, 0, 1, 4]))),
    ("repeat-interleave-counts", lambda m, F, r: m.repeat_interleave(r), (np.array([2, 0, 3]),)),
    ("flip", lambda m, F, x: x.flip(0), (X,)),
    ("flip-dims", lambda m, F, x: m.flip(x, (0, 2)), (X3,)),
    ("flip-negative", lambda m, F, x: x.flip(-1, 0), (X3,)),
    ("roll", lambda m, F, x: x.roll(1, 1), (X,)),
    ("roll-flat", lambda m, F, x: m.roll(x, 5), (X,)),
    ("roll-tuples", lambda m, F, x: x.roll((2, -1), (2, 0)), (X3,)),
    ("unflatten", lambda m, F, x: x.unflatten(1, (2, 2)), (X,)),
    ("unflatten-infer", lambda m, F, x: m.unflatten(x, -1, (-1, 5)), (X3,)),
    ("pad-last", lambda m, F, x: F.pad(x, (1, 2)), (X,)),
    ("pad-two-dims-value", lambda m, F, x: F.pad(x, (1, 0, 2, 3), value=1.5), (X,)),
    ("pad-three-dims", lambda m, F, x: F.pad(x, (0, 1, 1, 1, 2, 0)), (X3,)),
    ("pad-negative-crops", lambda m, F, x: F.pad(x, (-1, 2, 1, -1)), (X,)),
    ("pad-reflect", lambda m, F, x: F.pad(x, (2, 3), mode="reflect"), (X,)),
    ("pad-reflect-2d", lambda m, F, x: F.pad(x, (1, 2, 2, 1), mode="reflect"), (X3,)),
    ("pad-replicate", lambda m, F, x: F.pad(x, (3, 1), mode="replicate"), (X,)),
    ("pad-replicate-2d", lambda m, F, x: F.pad(x, (2, 0, 1, 3), mode="replicate"), (X3,)),
    ("one-hot", lambda m, F, i: F.one_hot(i), (INT,)),
    ("one-hot-classes", lambda m, F, i: F.one_hot(i, num_classes=7), (INT,)),
    ("eye", lambda m, F: (m.eye(3), m.eye(2, 4), m.eye(3, dtype=m.int64)), ()),
    ("linspace", lambda m, F: (m.linspace(-1, 2, 7, dtype=m.float64), m.linspace(0, 1, 1),
                               m.linspace(3, 0, 0), m.linspace(0, 10, 4, dtype=m.int64)), ()),
    ("scatter", lambda m, F, x, s, i: x.scatter(1, i, s), (X, X[:, :3].copy() + 5, IDX_DIM1)),
    ("scatter-dim0", lambda m, F, x, s, i: m.scatter(x, 0, i, s), (X, X[:2] * 3, IDX_DIM0)),
    # forward only for src: PyTorch's own backward refuses a src larger than index
    ("scatter-larger-src", lambda m, F, x, s, i: x.scatter(0, i, s.detach()),
     (X, X3[0] * 2, IDX_DIM0[:, :3])),
    ("scatter-add-larger-src", lambda m, F, x, s, i: x.scatter_add(1, i, s.detach()),
     (X, X3[0] * 2, IDX_DIM1[:2])),
    ("scatter-value", lambda m, F, x, i: x.scatter(1, i, 2.5), (X, IDX_DIM1)),
    ("scatter-add", lambda m, F, x, s, i: x.scatter_add(1, i, s), (X, X[:, 1:].copy(), IDX_DIM1)),
    ("scatter-add-dim0", lambda m, F, x, s, i: m.scatter_add(x, 0, i, s), (X, X[:2] * 2, IDX_DIM0)),
    ("scatter-add-int", lambda m, F, a, s, i: a.scatter_add(1, i, s),
     (np.array([[1, -5, 3]]), np.array([[-7, 2, 4]]), np.array([[0, 0, 2]]))),
    ("scatter-reduce-mean-int", lambda m, F, a, s, i: a.scatter_reduce(1, i, s, "mean"),
     (np.array([[1, -5, 3]]), np.array([[-7, 2, 4]]), np.array([[0, 0, 2]]))),
    ("masked-select", lambda m, F, x, b: x.masked_select(b), (X[:2, :3].copy(), BOOL)),
    ("masked-select-broadcast", lambda m, F, x, b: m.masked_select(x, b[:1]), (X[:2, :3].copy(), BOOL)),
    ("nonzero", lambda m, F, i: i.nonzero(), (INT,)),
    ("nonzero-tuple", lambda m, F, x: m.nonzero(x > 0, as_tuple=True), (X3,)),
    ("nonzero-none", lambda m, F, b: b[1].nonzero(), (BOOL,)),
]
for _reduce in ("sum", "prod", "mean", "amax", "amin"):
    for _self in (True, False):
        _tag = f"scatter-reduce-{_reduce}-{'self' if _self else 'noself'}"
        CASES.append((_tag, lambda m, F, x, s, i, r=_reduce, inc=_self:
                      x.scatter_reduce(1, i, s, r, include_self=inc), (TIES, TIES[:, :3] * 1, IDX_DIM1)))
        CASES.append((_tag + "-zeros", lambda m, F, x, s, i, r=_reduce, inc=_self:
                      m.scatter_reduce(x, 0, i, s, reduce=r, include_self=inc),
                      (WITH_ZEROS, WITH_ZEROS[:2] + WITH_ZEROS[1:], IDX_DIM0)))


def _outputs(result: Any) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _run(lib: Any, F: Any, fn: Callable, arrays: tuple) -> tuple:
    """``fn`` on leaves made from ``arrays`` (float ones in float64 with grad); the
    outputs, and each float leaf's gradient of a weighted sum of the float outputs."""
    torch = lib if lib is not mt else None
    leaves = []
    for a in arrays:
        a = np.asarray(a)
        t = torch.tensor(a) if torch else mt.tensor(a)
        if a.dtype.kind == "f":
            t.requires_grad_(True)
        leaves.append(t)
    outs = _outputs(fn(lib, F, *leaves))
    loss = None
    for k, o in enumerate(outs):
        if o.requires_grad:
            w = np.cos(np.arange(int(np.prod(o.shape)), dtype=np.float64) + k).reshape(o.shape)
            w = torch.tensor(w, dtype=o.dtype) if torch else mt.tensor(w, dtype=o.dtype)
            term = (o * w).sum()
            loss = term if loss is None else loss + term
    grads = []
    if loss is not None:
        loss.backward()
    for t in leaves:
        if t.requires_grad:
            grads.append(None if t.grad is None else np.asarray(t.grad.detach().cpu().numpy()))
    values = [np.asarray(o.detach().cpu().numpy()) for o in outs]
    return values, [str(o.dtype).replace("torch.", "") for o in outs], grads


# -inf - -inf in logsumexp's gradient: nan, as in PyTorch, with NumPy's warning
QUIET = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.mark.parametrize("name, fn, arrays", [
    pytest.param(*c, id=c[0], marks=[QUIET] if c[0].endswith("-inf") else []) for c in CASES])
def test_matches_torch(name: str, fn: Callable, arrays: tuple) -> None:
    torch = _torch()
    ours, our_dtypes, our_grads = _run(mt, MF, fn, arrays)
    theirs, their_dtypes, their_grads = _run(torch, torch.nn.functional, fn, arrays)
    assert our_dtypes == their_dtypes
    for o, t in zip(ours, theirs):
        assert o.shape == t.shape
        # float32 results may differ in summation order: a few ulps
        np.testing.assert_allclose(o, t, rtol=1e-5 if o.dtype == np.float32 else 1e-10,
                                   atol=1e-12)
    assert len(our_grads) == len(their_grads)
    for o, t in zip(our_grads, their_grads):
        t = np.zeros_like(o) if t is None and o is not None else t
        o = np.zeros_like(t) if o is None and t is not None else o
        if o is not None:
            np.testing.assert_allclose(o, t, rtol=1e-10, atol=1e-12)


def test_linspace_float32_within_an_ulp_of_torch() -> None:
    torch = _torch()
    for start, end, steps in [(-1.3, 5.7, 101), (0, 1, 1000), (2.5, -1, 7)]:
        np.testing.assert_allclose(mt.linspace(start, end, steps).numpy(),
                                   torch.linspace(start, end, steps).numpy(), rtol=0, atol=5e-7)


def test_repeat_interleave_backward_is_a_segment_sum() -> None:
    x = mt.tensor([1.0, 2.0, 3.0], dtype=mt.float64, requires_grad=True)
    y = x.repeat_interleave(mt.tensor([3, 0, 2]))
    (y * mt.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=mt.float64)).sum().backward()
    assert y.tolist() == [1.0, 1.0, 1.0, 3.0, 3.0]
    assert x.grad.tolist() == [6.0, 0.0, 9.0]


# --- errors -------------------------------------------------------------------------------
ERRORS = [
    (lambda: mt.logsumexp(mt.ones(2, 3), 2), IndexError, "logsumexp: dim 2"),
    (lambda: mt.prod(mt.ones(2, 3), -3), IndexError, "prod: dim -3"),
    (lambda: mt.cumprod(mt.ones(2), 1), IndexError, "cumprod: dim 1"),
    (lambda: mt.any(mt.ones(2), 1), IndexError, "any: dim 1"),
    (lambda: mt.ones(2, 3).flip(0, 0), ValueError, "flip: dims"),
    (lambda: mt.ones(2, 3).roll((1, 2), 0), ValueError, "roll: shifts and dims"),
    (lambda: mt.ones(2, 3).repeat(2), ValueError, "repeat: the number of repeats"),
    (lambda: mt.ones(2, 3).repeat_interleave(mt.tensor([1, 2]), dim=1), ValueError,
     "repeat_interleave: repeats must have the same size"),
    (lambda: mt.ones(4).repeat_interleave(2, output_size=7), ValueError, "output_size"),
    (lambda: mt.ones(2, 6).unflatten(1, (4, 2)), ValueError, "unflatten"),
    (lambda: MF.pad(mt.ones(2, 3), (1,)), ValueError, "pad: pad must have an even length"),
    (lambda: MF.pad(mt.ones(3), (1, 1, 1, 1)), ValueError, "pad: pad of length 4"),
    (lambda: MF.pad(mt.ones(2, 3), (3, 0), mode="reflect"), ValueError,
     "padding size should be less than"),
    (lambda: MF.pad(mt.ones(2, 3), (1, 1), mode="circular"), ValueError, "circular"),
    (lambda: MF.one_hot(mt.tensor([0, 3]), 3), ValueError, "smaller than num_classes"),
    (lambda: MF.one_hot(mt.tensor([-1, 0])), ValueError, "non-negative"),
    (lambda: MF.one_hot(mt.tensor([0.0])), TypeError, "one_hot"),
    (lambda: mt.zeros(2, 3).scatter(1, mt.tensor([[0, 3]]), mt.ones(2, 3)), IndexError,
     "scatter(): index 3 is out of bounds for dimension 1 with size 3"),
    (lambda: mt.zeros(2, 3).scatter_add(0, mt.tensor([[-1, 0]]), mt.ones(2, 3)), IndexError,
     "scatter_add(): index -1 is out of bounds for dimension 0 with size 2"),
    (lambda: mt.zeros(2, 3).scatter_reduce(1, mt.tensor([[5]]), mt.ones(2, 3), "sum"),
     IndexError, "scatter_reduce(): index 5 is out of bounds"),
    (lambda: mt.zeros(2, 3).scatter_reduce(1, mt.tensor([[0]]), mt.ones(2, 3), "max"),
     ValueError, "reduce argument must be one of"),
    (lambda: mt.zeros(2, 3).scatter(1, mt.tensor([[0]], dtype=mt.int32), mt.ones(2, 3)),
     TypeError, "Expected dtype int64 for index"),
    (lambda: mt.zeros(2, 3).scatter(3, mt.tensor([[0]]), mt.ones(2, 3)), IndexError,
     "scatter: dim 3"),
    (lambda: mt.zeros(2, 3).scatter_add(1, mt.tensor([[0, 1]]), mt.ones(2, 1)), ValueError,
     "smaller than src"),
    (lambda: mt.zeros(2, 3).scatter(1, mt.tensor([[0]]), mt.ones(2, 3, dtype=mt.float64)),
     TypeError, "self.dtype to be equal to src.dtype"),
    (lambda: mt.ones(2, 3).masked_select(mt.ones(2, 3)), TypeError, "bool"),
    (lambda: mt.ones(2, 3).masked_select(mt.ones(3, 2, dtype=mt.bool)), ValueError,
     "masked_select: shapes cannot broadcast"),
    (lambda: mt.argsort(mt.ones(2), 1), IndexError, "argsort: dim 1"),
    (lambda: mt.eye(-1), ValueError, "eye"),
    (lambda: mt.linspace(0, 1, -2), ValueError, "linspace"),
    (lambda: mt.linspace(0, 1, 5, dtype=mt.bool), NotImplementedError, "linspace: dtype bool"),
]


@pytest.mark.parametrize("make, error, words", ERRORS, ids=[e[2] for e in ERRORS])
def test_errors(make: Callable, error: type, words: str) -> None:
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value)
