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


def test_gqa_tiled_path(monkeypatch):
    monkeypatch.setattr(attention_ops, "TILED_FROM", 4)
    rng = np.random.default_rng(2)
    q, k, v = _inputs(rng, L=9, S=11)
    for causal in (False, True):
        ours = _run(q, k, v, is_causal=causal)
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
