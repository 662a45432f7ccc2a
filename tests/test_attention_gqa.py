"""Grouped-query attention (scaled_dot_product_attention(enable_gqa=True)): query heads
share key/value heads, h -> h // (Hq / Hkv), on every path (full and tiled on the CPU, the
CUDA dense path through the kernels' NumPy stand-ins), against explicitly repeated k/v and
against PyTorch where it is installed. The keys and values are never repeated: their
gradients are summed over the group."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.functional as F
from minitorch_gpu.ops import attention as attention_ops
from minitorch_gpu.ops.attention_heads import cached_causal_attention

from test_kernel_dispatch import standin  # noqa: F401  (the fixture)


def _inputs(rng, hq=6, hkv=2, L=5, S=7, E=4, batch=(2,), dtype=np.float64):
    q = rng.standard_normal(batch + (hq, L, E)).astype(dtype)
    k = rng.standard_normal(batch + (hkv, S, E)).astype(dtype)
    v = rng.standard_normal(batch + (hkv, S, E + 1)).astype(dtype)
    return q, k, v


def _run(q, k, v, gqa=True, **options):
    """(output, dq, dk, dv) as NumPy arrays for a fixed output gradient; ``gqa`` False for
    the reference, whose k, v are already repeated."""
    ts = [mt.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ts, enable_gqa=gqa, **options)
    weight = np.cos(np.arange(out.data.size)).reshape(out.shape)
    (out * mt.tensor(weight, dtype=out.dtype)).sum().backward()
    return [out.detach().numpy()] + [t.grad.numpy() for t in ts]


def _repeated_reference(q, k, v, **options):
    """Attention with k, v repeated to the query's heads by hand, gradients summed back."""
    group = q.shape[-3] // k.shape[-3]
    kr, vr = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    out, dq, dk, dv = _run(q, kr, vr, gqa=False, **options)
    fold = lambda g: g.reshape(g.shape[:-3] + (k.shape[-3], group) + g.shape[-2:]).sum(-3)
    return out, dq, fold(dk), fold(dv)


@pytest.mark.parametrize("causal", [False, True])
def test_gqa_full_path_equals_repeated_kv(causal):
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng)
    for ours, expected in zip(_run(q, k, v, is_causal=causal),
                              _repeated_reference(q, k, v, is_causal=causal)):
        np.testing.assert_allclose(ours, expected, rtol=1e-10, atol=1e-12)


def test_gqa_with_a_per_head_mask():
    rng = np.random.default_rng(1)
    q, k, v = _inputs(rng)
    mask = rng.random((2, 6, 5, 7)) > 0.3
    ours = _run(q, k, v, attn_mask=mt.tensor(mask))
    expected = _repeated_reference(q, k, v, attn_mask=mt.tensor(mask))
    for a, b in zip(ours, expected):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _count_tiled(monkeypatch) -> list:
    """Calls of the tiled forward from here on (a test of the tiled path must see it run)."""
    calls = []
    real = attention_ops.tiled_attention_forward
    monkeypatch.setattr(attention_ops, "tiled_attention_forward",
                        lambda *args: calls.append(1) or real(*args))
    return calls


def test_gqa_tiled_path(monkeypatch):
    monkeypatch.setattr(attention_ops, "TILED_FROM", 4)
    tiled = _count_tiled(monkeypatch)
    rng = np.random.default_rng(2)
    q, k, v = _inputs(rng, L=9, S=11)
    for causal in (False, True):
        ours = _run(q, k, v, is_causal=causal)
        assert tiled, "the tiled path did not run"
        tiled.clear()
        monkeypatch.setattr(attention_ops, "TILED_FROM", 10 ** 9)
        expected = _repeated_reference(q, k, v, is_causal=causal)
        monkeypatch.setattr(attention_ops, "TILED_FROM", 4)
        for a, b in zip(ours, expected):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_gqa_dense_kernel_branch(standin):  # noqa: F811
    calls = standin(True)
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, E=8, dtype=np.float32)
    ours = _run(q, k, v, is_causal=True)
    assert {"attention_softmax_forward", "attention_softmax_backward"} <= set(calls)
    standin(False)
    expected = _repeated_reference(q.astype(np.float64), k.astype(np.float64),
                                   v.astype(np.float64), is_causal=True)
    for a, b in zip(ours, expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_gqa_refuses_heads_that_do_not_divide():
    q, k, v = mt.randn(1, 5, 3, 4), mt.randn(1, 2, 3, 4), mt.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="enable_gqa"):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def test_gqa_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    q, k, v = _inputs(rng)
    ours = _run(q, k, v, is_causal=True)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                           enable_gqa=True)
    weight = np.cos(np.arange(out.numel())).reshape(out.shape)
    (out * torch.tensor(weight)).sum().backward()
    for a, b in zip(ours, [out.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(),
                           tv.grad.numpy()]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


# --- grouped_causal_attention: a Llama's form on its projections ---------------------------
PROJECTIONS = [  # (B, T, n_head, n_kv_head, head_dim)
    (2, 5, 4, 2, 3),   # grouped-query
    (1, 6, 3, 1, 4),   # multi-query
    (2, 4, 2, 2, 5),   # multi-head
    (1, 9, 6, 3, 2),   # three groups of two
]


def _projections(rng, B, T, H, Hkv, D, dtype=np.float64):
    return (rng.standard_normal((B, T, H * D)).astype(dtype),
            rng.standard_normal((B, T, Hkv * D)).astype(dtype),
            rng.standard_normal((B, T, Hkv * D)).astype(dtype))


def _grouped(q, k, v, H, Hkv):
    """(output, dq, dk, dv) of grouped_causal_attention for a fixed output gradient."""
    ts = [mt.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.grouped_causal_attention(*ts, H, Hkv)
    weight = np.cos(np.arange(out.data.size)).reshape(out.shape)
    (out * mt.tensor(weight, dtype=out.dtype)).sum().backward()
    return [out.detach().numpy()] + [t.grad.numpy() for t in ts]


def _heads_reference(q, k, v, H, Hkv):
    """The same through scaled_dot_product_attention(enable_gqa=True) on (B, heads, T, D)
    copies of the projections, gradients back in the projections' layout."""
    B, T, _ = q.shape
    D = q.shape[2] // H
    as_heads = lambda a, n: np.ascontiguousarray(a.reshape(B, T, n, D).transpose(0, 2, 1, 3))
    ts = [mt.tensor(as_heads(a, n), requires_grad=True) for a, n in ((q, H), (k, Hkv), (v, Hkv))]
    out = F.scaled_dot_product_attention(*ts, is_causal=True, enable_gqa=True)
    weight = np.cos(np.arange(q.size)).reshape(q.shape)  # _grouped's, in the heads' layout
    (out * mt.tensor(as_heads(weight, H))).sum().backward()
    back = lambda g: g.transpose(0, 2, 1, 3).reshape(B, T, -1)
    return [back(out.detach().numpy())] + [back(t.grad.numpy()) for t in ts]


@pytest.mark.parametrize("shape", PROJECTIONS, ids=str)
def test_grouped_causal_attention_equals_sdpa_on_head_views(shape):
    B, T, H, Hkv, D = shape
    q, k, v = _projections(np.random.default_rng(5), B, T, H, Hkv, D)
    for a, b in zip(_grouped(q, k, v, H, Hkv), _heads_reference(q, k, v, H, Hkv)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", PROJECTIONS[:2], ids=str)
def test_grouped_causal_attention_gradcheck(shape):
    from minitorch_gpu.testing import gradcheck
    B, T, H, Hkv, D = shape
    ts = [mt.tensor(a, requires_grad=True) for a in _projections(np.random.default_rng(6),
                                                                 B, T, H, Hkv, D)]
    assert gradcheck(lambda a, b, c: F.grouped_causal_attention(a, b, c, H, Hkv), ts)


def test_grouped_causal_attention_tiled_path(monkeypatch):
    rng = np.random.default_rng(7)
    q, k, v = _projections(rng, 2, 9, 4, 2, 3)
    expected = _grouped(q, k, v, 4, 2)
    monkeypatch.setattr(attention_ops, "TILED_FROM", 4)
    tiled = _count_tiled(monkeypatch)
    ours = _grouped(q, k, v, 4, 2)
    assert tiled, "the tiled path did not run"
    for a, b in zip(ours, expected):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_grouped_causal_attention_kernel_branches(standin):  # noqa: F811
    """Through the CUDA dense path's stand-ins (the kernels' NumPy twins): the grouped views
    reach the kernels as they are, and k's and v's gradients come back summed per group."""
    calls = standin(True)
    q, k, v = _projections(np.random.default_rng(8), 2, 6, 4, 2, 8, np.float32)
    ours = _grouped(q, k, v, 4, 2)
    assert {"attention_softmax_forward", "attention_softmax_backward"} <= set(calls)
    standin(False)
    expected = _grouped(*(a.astype(np.float64) for a in (q, k, v)), 4, 2)
    for a, b in zip(ours, expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_cached_grouped_attention_continues_the_prompt():
    """A prompt, then one position at a time, through a (B, n_kv_head, capacity, D) cache:
    each step's output equals the full causal attention's row, and the cache holds the
    keys and values in head layout."""
    B, T, H, Hkv, D = 2, 7, 4, 2, 3
    q, k, v = _projections(np.random.default_rng(9), B, T, H, Hkv, D)
    full = _grouped(q, k, v, H, Hkv)[0]
    keys, values = mt.zeros(B, Hkv, 10, D, dtype=mt.float64), mt.zeros(B, Hkv, 10, D,
                                                                     dtype=mt.float64)
    with mt.no_grad():
        got = [F.cached_grouped_attention(mt.tensor(q[:, :4]), mt.tensor(k[:, :4]),
                                          mt.tensor(v[:, :4]), keys, values, 0, H).numpy()]
        for t in range(4, T):
            got.append(F.cached_grouped_attention(
                mt.tensor(q[:, t:t + 1]), mt.tensor(k[:, t:t + 1]), mt.tensor(v[:, t:t + 1]),
                keys, values, t, H).numpy())
    np.testing.assert_allclose(np.concatenate(got, axis=1), full, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(keys.numpy()[:, :, :T],
                                  k.reshape(B, T, Hkv, D).transpose(0, 2, 1, 3))


@pytest.mark.parametrize("call, message", [
    (lambda: F.grouped_causal_attention(mt.randn(1, 3, 12), mt.randn(1, 3, 4),
                                        mt.randn(1, 3, 4), 3, 2), r"n_kv_head \(2\) must divide n_head \(3\)"),
    (lambda: F.grouped_causal_attention(mt.randn(1, 3, 12), mt.randn(1, 3, 5),
                                        mt.randn(1, 3, 5), 4, 2), r"expected k \(B, S"),
    (lambda: F.grouped_causal_attention(mt.randn(3, 12), mt.randn(3, 6), mt.randn(3, 6), 4,
                                        2), r"expected q \(B, T, n_head"),
    (lambda: F.grouped_causal_attention(mt.randn(1, 3, 12), mt.randn(1, 4, 6),
                                        mt.randn(1, 4, 6), 4, 2), "positions"),
    (lambda: F.grouped_causal_attention(mt.randn(1, 3, 12), mt.randn(1, 3, 6),
                                        mt.randn(1, 3, 6), 4, 2, dropout_p=1.0), "dropout_p"),
    (lambda: F.grouped_causal_attention(mt.randn(1, 3, 12), mt.randn(1, 3, 6),
                                        mt.randn(1, 3, 6), 4, 2, dropout_p="0.1"), "dropout_p"),
    (lambda: F.grouped_causal_attention(mt.randn(1, 3, 12), mt.randn(3, 6), mt.randn(3, 6), 4,
                                        2), r"expected k \(B, S, n_kv_head \* head_dim\) = "
                                            r"\(1, S, 6\)"),
    (lambda: _cached(q_len=2, k_len=4), "q has 2 new positions, k and v 4"),
    (lambda: _cached(start=7), r"start must be an int in \[0, capacity - T\] = \[0, 6\]"),
    (lambda: _cached(cache_batch=2), r"expected keys of shape \(B, n_kv_head, capacity, "
                                     r"head_dim\) = \(1, 2, 8, 3\)"),
    (lambda: _cached(head_dim=4), "expected keys of shape"),
])
def test_grouped_causal_attention_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _cached(q_len=2, k_len=2, start=0, cache_batch=1, head_dim=3):
    """cached_grouped_attention with one thing wrong (4 query heads over 2, head dim 3, a
    cache of 8 positions); the cache must be untouched when it refuses."""
    keys = mt.zeros(cache_batch, 2, 8, head_dim)
    values = mt.zeros(cache_batch, 2, 8, head_dim)
    try:
        with mt.no_grad():
            F.cached_grouped_attention(mt.randn(1, q_len, 12), mt.randn(1, k_len, 6),
                                       mt.randn(1, k_len, 6), keys, values, start, 4)
    finally:
        assert not keys.numpy().any() and not values.numpy().any(), "the cache was written"


def test_cached_grouped_attention_refuses_grad_mode():
    q = mt.randn(1, 2, 12, requires_grad=True)
    with pytest.raises(RuntimeError, match="a KV cache is for inference"):
        F.cached_grouped_attention(q, mt.randn(1, 2, 6), mt.randn(1, 2, 6),
                                   mt.zeros(1, 2, 8, 3), mt.zeros(1, 2, 8, 3), 0, 4)


@pytest.mark.parametrize("n_head, start, cache_heads, message", [
    (3, 0, 2, "the cache holds 2 heads, n_head is 3"),
    (4, 0, 2, "the cache holds 2 heads, n_head is 4"),
    (5, 0, 2, r"expected qkv \(B, T, 3 \* C\) with C a multiple of n_head = 5"),
    (2, -1, 2, r"start must be an int in \[0, capacity - T\] = \[0, 1\]"),
    (2, 2, 2, r"start must be an int in \[0, capacity - T\] = \[0, 1\]"),
])
def test_cached_causal_attention_checks_the_cache_before_writing(n_head, start, cache_heads,
                                                                 message):
    """GPT's cached op: a head count or a start the cache does not hold is refused, and
    the cache is left untouched (a wrong n_head used to give wrong numbers silently)."""
    keys, values = mt.zeros(1, cache_heads, 4, 6), mt.zeros(1, cache_heads, 4, 6)
    with mt.no_grad(), pytest.raises(ValueError, match=message):
        cached_causal_attention(mt.randn(1, 3, 36), keys, values, start, n_head)
    assert not keys.numpy().any() and not values.numpy().any()
