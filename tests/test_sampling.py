"""multinomial, and the index outputs of sort/topk that text generation samples with.

The op table (tests/op_table.py) checks sort/topk/cumsum forward against NumPy and
backward against central differences; here: what a table row can't say. multinomial's
draws are repeatable under a seed, never pick a weight of 0, follow the distribution
(20000 draws, per-category tolerances of 5 standard errors under a fixed seed, so the
test is deterministic and a correct sampler fails it with probability ~1e-6), are
distinct without replacement; bad weights raise errors that name the op. Then the
indices of sort (stable, with ties) and topk against NumPy's argsort, and top-k / top-p
sampling composed end to end.
"""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt

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
