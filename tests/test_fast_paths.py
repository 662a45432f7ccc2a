"""The CPU fast paths give the reference paths' results.

* attention switches to the tiled, online-softmax path from ``TILED_FROM`` keys (here
  lowered so the test stays small): forward and gradients equal the full path's, in the
  GPT's packed form and in ``scaled_dot_product_attention``;
* long elementwise work split over threads by rows (GELU, attention's softmax both ways)
  equals the same work on one thread, bit for bit;
* GPT's packed attention equals q, k, v split into heads by views and attended by
  ``scaled_dot_product_attention``; KV-cached generation equals recomputing the window;
* the malloc settings that keep freed blocks for reuse are in force.
Tolerances: 1e-5 relative in float32, 1e-10 in float64.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn.functional as F
from minitorch_gpu import nn
from minitorch_gpu.backend import threads
from minitorch_gpu.backend.cpu_kernels import attention as cpu_attention
from minitorch_gpu.ops import attention

TOLERANCE = {np.float32: 1e-5, np.float64: 1e-10}


def close(ours, ref, dtype) -> None:
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol * max(np.abs(ref).max(), 1.0))


def packed_run(qkv: np.ndarray, n_head: int, grad: np.ndarray):
    x = mt.tensor(qkv, requires_grad=True)
    out = F.packed_causal_attention(x, n_head)
    out.backward(mt.tensor(grad))
    return out.data.copy(), x.grad.data.copy()


def split_heads_run(qkv: np.ndarray, n_head: int, grad: np.ndarray):
    """The reference: split, view heads, scaled_dot_product_attention, heads back."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    x = mt.tensor(qkv, requires_grad=True)
    q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in x.split(C, dim=2))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = out.transpose(1, 2).reshape(B, T, C)
    out.backward(mt.tensor(grad))
    return out.data.copy(), x.grad.data.copy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("T", [1, 37, 96])
def test_packed_attention_equals_split_heads(dtype, T):
    rng = np.random.default_rng(T)
    qkv = rng.standard_normal((2, T, 3 * 24)).astype(dtype)
    grad = rng.standard_normal((2, T, 24)).astype(dtype)
    for ours, ref in zip(packed_run(qkv, 3, grad), split_heads_run(qkv, 3, grad)):
        close(ours, ref, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_switches_to_the_tiled_path_from_tiled_from_keys(monkeypatch, paths, dtype,
                                                                   causal):
    rng = np.random.default_rng(1)
    B, H, T, E = 2, 3, 300, 16
    q, k, v, grad = (rng.standard_normal((B, H, T, E)).astype(dtype) for _ in range(4))
    # the CPU's flash kernel declines (its own test is test_cpu_attention.py): this is
    # the switch between the NumPy paths and the dense kernel
    monkeypatch.setattr(cpu_attention, "FUSED_FROM",
                        dict.fromkeys(cpu_attention.FUSED_FROM, 10 ** 9))
    results = {}
    for tiled_from in (10 ** 9, 256):  # the full path, then tiled (300 keys >= 256)
        monkeypatch.setattr(attention, "TILED_FROM", tiled_from)
        tensors = [mt.tensor(a, requires_grad=True) for a in (q, k, v)]
        out = F.scaled_dot_product_attention(*tensors, is_causal=causal)
        out.backward(mt.tensor(grad))
        results[tiled_from] = [out.data.copy()] + [t.grad.data.copy() for t in tensors]
    # below the switch: the CPU kernels' softmax between the products ("dense") where
    # they take the input (float32, numba present), else NumPy's full path
    kernels = mt.tensor(q).backend.fused_kernels()
    dense = kernels is not None and kernels.supports_attention_softmax(q, k, v, None)
    assert paths == ["dense" if dense else "full", "tiled"]
    for ours, ref in zip(results[256], results[10 ** 9]):
        close(ours, ref, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpt_attention_on_the_tiled_path_equals_the_full_path(monkeypatch, dtype):
    rng = np.random.default_rng(2)
    qkv = rng.standard_normal((2, 260, 3 * 32)).astype(dtype)
    grad = rng.standard_normal((2, 260, 32)).astype(dtype)
    full = packed_run(qkv, 4, grad)
    monkeypatch.setattr(attention, "TILED_FROM", 256)
    for ours, ref in zip(packed_run(qkv, 4, grad), full):
        close(ours, ref, dtype)


def test_split_elementwise_work_equals_one_thread(monkeypatch):
    """GELU and attention's softmax split over two threads give the very same numbers."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 50, 40)).astype(np.float32)
    gx = rng.standard_normal((6, 50, 40)).astype(np.float32)
    qkv = rng.standard_normal((6, 20, 3 * 16)).astype(np.float32)
    gq = rng.standard_normal((6, 20, 16)).astype(np.float32)

    def run():
        t = mt.tensor(x, requires_grad=True)
        y = F.gelu(t, approximate="tanh")
        y.backward(mt.tensor(gx))
        return [y.data.copy(), t.grad.data.copy(), *packed_run(qkv, 2, gq)]

    monkeypatch.setattr(threads, "SPLIT_FROM", 10 ** 12)
    one = run()
    monkeypatch.setattr(threads, "SPLIT_FROM", 1)
    monkeypatch.setattr(threads, "_threads", 2)
    assert len(threads.row_pieces(x)) == 2
    for split, whole in zip(run(), one):
        np.testing.assert_array_equal(split, whole)


def test_row_pieces_cover_the_rows_once():
    big = np.zeros((7, 3))
    pieces = threads.row_pieces(big, min_elements=1)
    covered = np.concatenate([np.arange(7)[p] for p in pieces])
    assert covered.tolist() == list(range(7)) and len(pieces) == min(threads.cpu_threads(), 7)
    assert threads.row_pieces(np.float32(1.0).reshape(()), 1) == [...]  # 0-d: all of it
    assert threads.row_pieces(big) == [...]  # short: one thread


def test_run_split_reraises_a_worker_error(monkeypatch):
    monkeypatch.setattr(threads, "_threads", 2)

    def work(piece):
        if piece == 0:
            raise ValueError("piece 0 failed")

    with pytest.raises(ValueError, match="piece 0 failed"):
        threads.run_split(work, [0, 1])


def test_kv_cached_generation_equals_recomputing_the_window():
    mt.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=8,
                                dropout=0.0)).to(mt.float64).eval()
    prompt = mt.tensor(np.random.default_rng(4).integers(0, 11, (2, 5)))
    runs = []
    for use_cache in (True, False):
        mt.manual_seed(7)
        runs.append(model.generate(prompt, 30, temperature=1.0, use_cache=use_cache,
                                   window_shift=4).numpy())
    np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_freed_memory_is_kept_for_reuse_from_the_first_backward():
    from minitorch_gpu.backend import host_memory
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    assert host_memory._applied is True  # glibc took both settings
