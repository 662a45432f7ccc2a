"""multinomial, and the index outputs of sort/topk that text generation samples with.

The op table (tests/op_table.py) checks sort/topk/cumsum forward against NumPy and
backward against central differences; here: what a table row can't say. multinomial's
draws are repeatable under a seed, never pick a weight of 0, follow the distribution
(20000 draws, per-category tolerances of 5 standard errors under a fixed seed, so the
test is deterministic and a correct sampler fails it with probability ~1e-6), are
distinct without replacement; bad weights raise errors that name the op; the weight
checks are one counted host read. Then the indices of sort (stable, with ties) and topk
against NumPy's argsort; NaN, ties and bf16 ordered as NumPy orders them, with the
device's sorts refusing bf16 as CuPy's do and topk's partition index kept small (CuPy
sorts whole rows past it); and top-k / top-p sampling composed end to end.
"""
from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.backend import cupy_backend, get_backend

DRAWS = 20000
WEIGHTS = np.array([1.0, 0.0, 2.0, 3.0, 0.0, 4.0])  # unnormalised; categories 1 and 4 never


def host(t: mt.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def assert_frequencies(samples: np.ndarray, probs: np.ndarray) -> None:
    """Each category's share of ``samples`` within 5 standard errors of its probability;
    a category of probability 0 never drawn."""
    counts = np.bincount(samples.reshape(-1), minlength=probs.size)
    n = samples.size
    expected = n * probs
    tolerance = 5 * np.sqrt(n * probs * (1 - probs))
    assert (counts[probs == 0] == 0).all(), f"drew a category of weight 0: counts {counts}"
    assert (np.abs(counts - expected) <= tolerance).all(), \
        f"counts {counts}, expected {expected.round(1)} +- {tolerance.round(1)}"


# --- multinomial: repeatable, valid draws --------------------------------------------------
@pytest.mark.parametrize("replacement, num_samples", [(True, 7), (False, 4), (False, 1)])
def test_multinomial_same_seed_same_sample(device: str, replacement: bool,
                                           num_samples: int) -> None:
    probs = mt.tensor(np.stack([WEIGHTS, WEIGHTS[::-1]]), device=device)  # (2, 6)
    mt.manual_seed(42)
    first = host(mt.multinomial(probs, num_samples, replacement))
    again = host(mt.multinomial(probs, num_samples, replacement))
    mt.manual_seed(42)
    repeated = host(mt.multinomial(probs, num_samples, replacement))
    np.testing.assert_array_equal(first, repeated)
    assert first.shape == (2, num_samples) and first.dtype == np.int64
    if num_samples > 1:  # the stream moves on: the next call draws afresh
        assert not np.array_equal(first, again)


@pytest.mark.parametrize("replacement", [True, False])
def test_multinomial_never_draws_a_weight_of_zero(device: str, replacement: bool) -> None:
    # zeros first, last and in runs; the positive weights span 1e-3..1e3 (float32)
    weights = np.array([[0.0, 1e-3, 0.0, 0.0, 1e3, 0.0], [0.0, 0.0, 0.0, 2.0, 5.0, 0.0],
                        [3.0, 0.0, 1.0, 0.0, 0.0, 2.0]], dtype=np.float32)
    probs = mt.tensor(weights, device=device)
    if replacement:
        samples = host(mt.multinomial(probs, 2000, replacement=True))
    else:  # every positive category of a row, each drawn exactly once
        samples = host(mt.multinomial(probs, 2, replacement=False))
    drawn = np.take_along_axis(weights, samples, axis=1)
    assert (drawn > 0).all(), samples
    one_each = host(mt.multinomial(probs[1:], 2))  # row (0, 0, 0, 2, 5, 0) has two
    assert sorted(one_each[0].tolist()) == [3, 4]


@pytest.mark.parametrize("dtype", [mt.float32, mt.float64])
def test_multinomial_frequencies_with_replacement(device: str, dtype) -> None:
    probs = mt.tensor(WEIGHTS, dtype=dtype, device=device)
    samples = host(mt.multinomial(probs, DRAWS, replacement=True))
    assert samples.shape == (DRAWS,) and samples.dtype == np.int64
    assert_frequencies(samples, WEIGHTS / WEIGHTS.sum())


def test_multinomial_rows_draw_from_their_own_weights(device: str) -> None:
    """Each row of a batch follows its own distribution: rows never mix."""
    weights = np.array([[1.0, 3.0, 0.0, 0.0], [0.0, 0.0, 2.0, 2.0]])
    samples = host(mt.multinomial(mt.tensor(weights, device=device), DRAWS, True))
    for row, w in zip(samples, weights):
        assert_frequencies(row, w / w.sum())


def test_multinomial_one_sample_per_row_follows_the_weights(device: str) -> None:
    """num_samples=1 (the text-generation case) over a batch of identical rows."""
    probs = mt.tensor(np.tile(WEIGHTS, (DRAWS, 1)), device=device)  # (20000, 6)
    samples = host(mt.multinomial(probs, 1))
    assert samples.shape == (DRAWS, 1)
    assert_frequencies(samples, WEIGHTS / WEIGHTS.sum())


def test_multinomial_without_replacement_is_sequential_drawing(device: str) -> None:
    """The first draw follows the weights; the second follows them with the first one
    removed, so P(second = j) = sum_i p_i p_j / (1 - p_i) over i != j."""
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    p = weights / weights.sum()
    samples = host(mt.multinomial(mt.tensor(np.tile(weights, (DRAWS, 1)), device=device), 2))
    assert (samples[:, 0] != samples[:, 1]).all()
    assert_frequencies(samples[:, 0], p)
    second = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(4) if i != j)
                       for j in range(4)])
    assert_frequencies(samples[:, 1], second)


def test_multinomial_without_replacement_gives_distinct_indices(device: str) -> None:
    probs = mt.rand(5, 10, device=device) + 0.01  # (5, 10), all positive
    everything = host(mt.multinomial(probs, 10))  # a permutation per row
    assert (np.sort(everything, axis=1) == np.arange(10)).all()
    some = host(mt.multinomial(probs, 4))
    assert all(len(set(row)) == 4 for row in some.tolist())


def test_multinomial_records_no_graph(device: str) -> None:
    probs = mt.tensor(WEIGHTS, device=device, requires_grad=True)
    samples = mt.multinomial(probs, 3)
    assert not samples.requires_grad and samples.grad_fn is None
    assert samples.device == device


# --- multinomial: errors ------------------------------------------------------------------
@pytest.mark.parametrize("weights, num_samples, replacement, error, match", [
    ([0.5, -0.1, 0.6], 1, True, ValueError, r"multinomial: probs must be non-negative"),
    ([[1.0, 2.0], [0.0, 0.0]], 1, True, ValueError, r"multinomial: row 1 of probs sums to 0"),
    ([1.0, np.inf], 1, True, ValueError, r"multinomial: probs must be finite"),
    ([[1.0, 1.0], [np.nan, 1.0]], 2, False, ValueError,
     r"multinomial: probs must be finite, got inf or nan in row 1"),
    ([1.0, 2.0], 0, True, ValueError, r"multinomial: expected num_samples to be an int >= 1"),
    ([1.0, 2.0], -3, False, ValueError, r"multinomial: expected num_samples"),
    ([1.0, 2.0], 3, False, ValueError, r"cannot draw 3 samples without replacement from 2"),
    ([[1.0, 2.0, 3.0], [1.0, 0.0, 0.0]], 2, False, ValueError,
     r"multinomial: cannot draw 2 samples without replacement from row 1, which has only 1"),
    (2.0, 1, True, ValueError, r"multinomial: expected probs of 1 or 2 dims.*got shape \(\)"),
    (np.ones((2, 2, 3)), 1, True, ValueError, r"multinomial: expected probs of 1 or 2 dims"),
    (np.ones((3, 0)), 1, True, ValueError, r"multinomial: probs has no categories"),
])
def test_multinomial_rejects_bad_input(device: str, weights, num_samples, replacement, error,
                                       match) -> None:
    probs = mt.tensor(weights, device=device)
    with pytest.raises(error, match=match):
        mt.multinomial(probs, num_samples, replacement)


def test_multinomial_rejects_integer_weights(device: str) -> None:
    with pytest.raises(TypeError, match="multinomial: expected a floating-point probs"):
        mt.multinomial(mt.tensor([1, 2, 3], device=device), 1)
    with pytest.raises(TypeError, match="multinomial: expected probs to be a Tensor"):
        mt.multinomial([0.5, 0.5], 1)


@pytest.mark.parametrize("replacement, num_samples", [(True, 50), (False, 3), (False, 1)])
def test_multinomial_checks_its_weights_in_one_counted_host_read(device: str,
                                                                 replacement: bool,
                                                                 num_samples: int) -> None:
    """The checks wait for the device once, through ``to_numpy``, so ``host_reads`` sees
    it (a ``bool()`` of a device array waits as long, uncounted); no other read."""
    probs = mt.tensor(np.tile(WEIGHTS, (3, 1)), device=device)
    backend = get_backend(device)
    with backend.count_host_reads() as reads:
        samples = mt.multinomial(probs, num_samples, replacement)
    assert reads.count == 1 and samples.shape == (3, num_samples)


@pytest.mark.parametrize("weights, num_samples, replacement", [
    ([[1.0, 2.0], [np.nan, 1.0]], 1, True),
    ([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]], 2, False),
])
def test_multinomial_errors_read_through_the_counter(device: str, weights, num_samples,
                                                     replacement) -> None:
    backend = get_backend(device)
    probs = mt.tensor(weights, device=device)
    with backend.count_host_reads() as reads, pytest.raises(ValueError, match="row 1"):
        mt.multinomial(probs, num_samples, replacement)
    assert reads.count == 2  # the flags, then what names the row


# --- sort and topk: the indices -----------------------------------------------------------
def test_sort_is_stable_with_ties(device: str) -> None:
    x = np.array([[1.0, 3.0, 1.0, 3.0, 2.0], [0.0, 0.0, 0.0, -1.0, -1.0]])
    t = mt.tensor(x, device=device)
    ascending, descending = t.sort(-1), mt.sort(t, descending=True)
    np.testing.assert_array_equal(host(ascending.indices), np.argsort(x, -1, kind="stable"))
    np.testing.assert_array_equal(host(descending.indices), [[1, 3, 4, 0, 2], [0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(host(descending.values), -np.sort(-x, axis=-1))
    assert ascending.indices.dtype == np.int64 and not ascending.indices.requires_grad


def test_sort_integer_and_bool_tensors(device: str) -> None:
    for values in ([3, -9223372036854775808, 7, 3], [True, False, True]):
        x = np.array(values)
        out = mt.tensor(x, device=device).sort(descending=True)
        assert out.values.dtype == x.dtype and out.indices.dtype == np.int64
        order = np.argsort(-x.astype(np.float64), kind="stable")  # -x overflows int64.min
        np.testing.assert_array_equal(host(out.indices), order)
        np.testing.assert_array_equal(host(out.values), x[order])


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_indices_equal_argsort(device: str, dim: int, largest: bool) -> None:
    x = np.random.default_rng(3).permutation(60).reshape(3, 4, 5) * 0.5  # distinct
    k = 2
    out = mt.tensor(x, device=device).topk(k, dim=dim, largest=largest)
    order = np.take(np.argsort(-x if largest else x, axis=dim), np.arange(k), axis=dim)
    np.testing.assert_array_equal(host(out.indices), order)
    np.testing.assert_array_equal(host(out.values), np.take_along_axis(x, order, axis=dim))


def test_topk_of_a_vocabulary(device: str) -> None:
    """The top-50 of 50257 logits, the size GPT-2 samples from (the partition path)."""
    logits = np.random.default_rng(4).standard_normal((2, 50257))
    out = mt.tensor(logits, device=device).topk(50)
    np.testing.assert_array_equal(host(out.indices), np.argsort(-logits, axis=-1)[:, :50])


def test_topk_unsorted_picks_the_same_set(device: str) -> None:
    x = np.random.default_rng(5).permutation(40).reshape(4, 10).astype(np.float64)
    out = mt.tensor(x, device=device).topk(4, sorted=False)
    np.testing.assert_array_equal(np.sort(host(out.indices), axis=1),
                                  np.sort(np.argsort(-x, axis=1)[:, :4], axis=1))


def test_topk_k_zero_and_errors(device: str) -> None:
    x = mt.randn(3, 5, device=device)
    empty = x.topk(0)
    assert empty.values.shape == (3, 0) and empty.indices.shape == (3, 0)
    with pytest.raises(ValueError, match=r"topk: k must be in \[0, 5\].*got k=6"):
        x.topk(6)
    with pytest.raises(ValueError, match=r"topk: k must be in \[0, 3\].*got k=-1"):
        mt.topk(x, -1, dim=0)
    with pytest.raises(IndexError, match="topk: dim 2 is out of range"):
        x.topk(1, dim=2)
    with pytest.raises(TypeError, match="topk: k must be an int"):
        x.topk(1.5)
    with pytest.raises(IndexError, match="sort: dim -3 is out of range"):
        x.sort(-3)


# --- sort and topk on bf16, NaN, and CuPy's sorts ----------------------------------------
# NaN (either sign), ties, infinities and both zeros: NumPy's order is the reference (NaN
# the largest, every NaN equal, -0 equal to 0, ties in their order)
AWKWARD = [0.5, np.nan, -np.inf, -0.0, 0.5, 2.0, np.inf, 0.0, -np.nan, -1.5, 0.5, -3.0]


def stable_order(x: np.ndarray, descending: bool) -> np.ndarray:
    """np's stable order of ``x`` along the last dim, descending by reversing, as the
    ops' stable descending sort keeps equal elements in their order."""
    if not descending:
        return np.argsort(x, axis=-1, kind="stable")
    n = x.shape[-1]
    return (n - 1) - np.argsort(x[..., ::-1], axis=-1, kind="stable")[..., ::-1]


@pytest.mark.parametrize("dtype", [mt.bfloat16, mt.float32, mt.float64])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort_order_nan_ties_and_bf16_as_numpy(device: str, dtype,
                                                          descending: bool) -> None:
    x = mt.tensor([AWKWARD, AWKWARD[::-1]], dtype=dtype, device=device)
    wide = host(x).astype(np.float64)
    order = stable_order(wide, descending)
    out = x.sort(-1, descending=descending)
    assert out.values.dtype == dtype
    np.testing.assert_array_equal(host(out.indices), order)
    np.testing.assert_array_equal(host(out.values).astype(np.float64),
                                  np.take_along_axis(wide, order, axis=-1))
    np.testing.assert_array_equal(host(x.argsort(descending=descending)), order)


@pytest.mark.parametrize("dtype", [mt.bfloat16, mt.float32, mt.float64])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k", [1, 4, 12])
def test_topk_picks_nan_ties_and_bf16_as_numpy(device: str, dtype, largest: bool,
                                               k: int) -> None:
    """The k values are NumPy's k first in order; which of equal values at the k-th place
    is chosen is open (as in PyTorch), so the indices are checked to point at them."""
    x = mt.tensor([AWKWARD, AWKWARD[::-1]], dtype=dtype, device=device)
    wide = host(x).astype(np.float64)
    out = x.topk(k, largest=largest)
    expected = np.take_along_axis(wide, stable_order(wide, largest), axis=-1)[:, :k]
    assert out.values.dtype == dtype and out.indices.shape == (2, k)
    np.testing.assert_array_equal(host(out.values).astype(np.float64), expected)
    np.testing.assert_array_equal(np.take_along_axis(wide, host(out.indices), axis=-1),
                                  expected)
    assert all(len(set(row)) == k for row in host(out.indices).tolist())


@pytest.fixture
def cupy_like_sorts(device, monkeypatch):
    """The device's argsort and argpartition refusing bf16 as CuPy's do (Thrust has no
    bf16 type id: NotImplementedError), and argpartition recording each call's dtype and
    kth. CuPy's argpartition sorts the whole row once max(32, 1 << kth.bit_length())
    reaches 1024 (_ndarray_argpartition in cupy/_core/_routines_sorting.pyx), and its
    selection kernel compares with ``<``, which leaves a NaN where it lies."""
    xp = get_backend(device).xp
    real_argsort, real_argpartition = xp.argsort, xp.argpartition
    calls = []

    def refuse_bf16(a):
        if a.dtype == mt.bfloat16:
            raise NotImplementedError("Sorting arrays with dtype 'bfloat16' is not supported")

    def argsort(a, axis=-1, **kwargs):
        refuse_bf16(a)
        calls.append(("argsort", a.dtype, None))
        return real_argsort(a, axis=axis, **kwargs)

    def argpartition(a, kth, axis=-1):
        refuse_bf16(a)
        calls.append(("argpartition", a.dtype, kth))
        return real_argpartition(a, kth, axis=axis)

    monkeypatch.setattr(xp, "argsort", argsort)
    monkeypatch.setattr(xp, "argpartition", argpartition)
    return calls


@pytest.mark.parametrize("largest", [True, False])
def test_topk_of_a_vocabulary_partitions_by_a_small_kth(device: str, cupy_like_sorts,
                                                        largest: bool) -> None:
    """top-50 of GPT-2's 50257 logits: kth = n - k for the largest made CuPy sort every
    row; keys reversed in order keep kth at k - 1, and are integers (no NaN, no bf16).
    On a GPU no partition at all: CuPy 14.2's argpartition reads back to the host, which
    a CUDA Graph's capture refuses; the integer keys are sorted by Thrust instead."""
    logits = np.random.default_rng(7).standard_normal((2, 50257))
    logits[0, 123] = np.nan  # the largest, as NumPy orders it
    out = mt.tensor(logits, device=device).topk(50, largest=largest)
    partitions = [(dtype, kth) for name, dtype, kth in cupy_like_sorts
                  if name == "argpartition"]
    if device == "cpu":
        assert partitions and all(kth == 49 and max(32, 1 << kth.bit_length()) < 1024
                                  and dtype.kind in "iu" for dtype, kth in partitions)
    else:
        sorts = [dtype for name, dtype, _ in cupy_like_sorts if name == "argsort"]
        assert not partitions and sorts and all(dtype.kind in "iu" for dtype in sorts)
    order = stable_order(logits, largest)[:, :50]
    np.testing.assert_array_equal(host(out.indices), order)
    np.testing.assert_array_equal(host(out.values), np.take_along_axis(logits, order, -1))


@pytest.mark.parametrize("k", [3, 12])  # 12: the whole row, sorted without a partition
def test_topk_of_bf16_never_sorts_bf16(device: str, cupy_like_sorts, k: int) -> None:
    x = mt.tensor([AWKWARD], dtype=mt.bfloat16, device=device)
    wide = host(x).astype(np.float64)
    for largest in (True, False):
        out = x.topk(k, largest=largest)
        expected = np.take_along_axis(wide, stable_order(wide, largest), axis=-1)[:, :k]
        np.testing.assert_array_equal(host(out.values).astype(np.float64), expected)


def test_cuda_stable_argsort_sorts_bf16_as_float32(monkeypatch) -> None:
    """CupyBackend.stable_argsort against a CuPy whose argsort refuses bf16 as Thrust
    does: it must hand over float32 (exact for bf16, same order, NaN still last)."""
    seen = []

    def thrust_argsort(a, axis=-1):
        seen.append(a.dtype)
        if a.dtype == mt.bfloat16:
            raise NotImplementedError("Sorting arrays with dtype 'bfloat16' is not supported")
        return np.argsort(a, axis=axis, kind="stable")  # Thrust's is stable, NaN last

    monkeypatch.setattr(cupy_backend, "cupy", types.SimpleNamespace(argsort=thrust_argsort))
    gpu = types.SimpleNamespace(_cuda_device=contextlib.nullcontext())
    x = np.array([AWKWARD, AWKWARD[::-1]], dtype=mt.bfloat16)
    order = cupy_backend.CupyBackend.stable_argsort(gpu, x, 1)
    assert seen == [np.float32]
    np.testing.assert_array_equal(order, stable_order(x.astype(np.float64), False))
    ints = np.array([3, 1, 2])
    np.testing.assert_array_equal(cupy_backend.CupyBackend.stable_argsort(gpu, ints, 0),
                                  [1, 2, 0])
    assert seen[-1] == ints.dtype  # other dtypes go to CuPy as they are


def test_zero_dim_inputs(device: str) -> None:
    x = mt.tensor(2.5, device=device)
    values, indices = x.sort()
    assert values.shape == () and values.item() == 2.5 and indices.item() == 0
    assert x.topk(1).indices.shape == () and x.cumsum(0).item() == 2.5


def test_editing_the_indices_before_backward_is_caught(device: str) -> None:
    x = mt.randn(4, device=device, dtype=mt.float64, requires_grad=True)
    values, indices = x.sort()
    with mt.no_grad():
        indices.add_(0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        values.sum().backward()


def test_cumsum_dtypes(device: str) -> None:
    ints = mt.tensor([[1, 2], [3, 4]], dtype=mt.int32, device=device)
    assert ints.cumsum(0).dtype == np.int64
    np.testing.assert_array_equal(host(ints.cumsum(0)), [[1, 2], [4, 6]])
    flags = mt.tensor([True, False, True], device=device)
    np.testing.assert_array_equal(host(mt.cumsum(flags, 0)), [1, 1, 2])
    # bf16 adds in float32: a bf16 running sum of ones would stall at 256 (257 rounds down)
    halves = mt.ones(300, dtype=mt.bfloat16, device=device)
    assert halves.cumsum(0).dtype == mt.bfloat16 and halves.cumsum(0)[-1].item() == 300
    with pytest.raises(IndexError, match="cumsum: dim 1 is out of range"):
        mt.cumsum(flags, 1)


# --- sampling composed: temperature, top-k, top-p ---------------------------------------
def test_top_k_sampling_draws_only_from_the_k_likeliest(device: str) -> None:
    logits = mt.tensor(np.random.default_rng(6).standard_normal((4, 100)), device=device)
    top = (logits / 0.7).softmax(-1).topk(5)  # (4, 5) each
    tokens = top.indices.gather(-1, mt.multinomial(top.values, 200, replacement=True))
    allowed = np.argsort(-host(logits), axis=-1)[:, :5]
    assert all(set(row) <= set(keep) for row, keep in zip(host(tokens).tolist(), allowed))


def test_top_p_sampling_draws_only_from_the_nucleus(device: str) -> None:
    """Keep the smallest set of likeliest tokens whose probability reaches top_p."""
    probs = np.array([[0.5, 0.05, 0.3, 0.1, 0.05], [0.02, 0.9, 0.04, 0.02, 0.02]])
    top_p = 0.75
    ranked = mt.tensor(probs, device=device).sort(-1, descending=True)
    cumulative = ranked.values.cumsum(-1)
    # drop a token once the likelier ones before it already reach top_p
    keep = (cumulative - ranked.values) < top_p  # (2, 5)
    nucleus = mt.where(keep, ranked.values, 0.0)
    tokens = host(ranked.indices.gather(-1, mt.multinomial(nucleus, 500, True)))
    assert set(tokens[0].tolist()) == {0, 2} and set(tokens[1].tolist()) == {1}
