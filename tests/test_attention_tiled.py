"""The tiled (flash) attention in ops/attention_tiled.py against the vectorised op.

Forward output, log-sum-exp and the three gradients must equal those of
``F.scaled_dot_product_attention`` (its autograd) on sizes off the blocks, blocks larger
than the sequence, L != S, odd head dims, one or two batch dims and the strided head views
a GPT takes out of its (B, T, 3C) projection; and a long sequence must never allocate an
(L, S) array.
"""
from __future__ import annotations

import math
import tracemalloc
from typing import NamedTuple, Tuple

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn.functional as F
from minitorch_gpu.ops.attention_tiled import tiled_attention_backward, tiled_attention_forward

TOLERANCE = {np.float32: 1e-5, np.float64: 1e-10}


class Case(NamedTuple):
    batch: Tuple[int, ...]
    L: int
    S: int
    E: int
    Ev: int
    causal: bool
    block_q: int = 128
    block_k: int = 256
    layout: str = "contiguous"  # or "gpt": heads split from (B, T, 3C); "transposed": col-major


CASES = [
    Case((2, 3), 40, 40, 16, 16, False, 16, 32),
    Case((2, 3), 40, 40, 16, 16, True, 16, 32),
    Case((2,), 300, 300, 24, 40, True, 64, 96),  # sizes off both blocks, odd head dims
    Case((2,), 300, 300, 24, 40, False, 64, 96),
    Case((1, 2), 37, 70, 8, 8, True, 16, 32),  # L < S
    Case((1, 2), 37, 70, 8, 8, False, 16, 32),
    Case((1, 2), 70, 33, 8, 8, False, 16, 32),  # L > S
    Case((1, 2), 70, 33, 8, 8, True, 16, 32),  # L > S: queries past S see every key
    Case((3,), 20, 25, 24, 40, True),  # blocks larger than the sequence
    Case((2, 1), 1, 1, 4, 4, True),
    Case((2, 4), 45, 45, 16, 16, True, 32, 16, "gpt"),
    Case((2, 4), 45, 45, 16, 16, False, 16, 32, "gpt"),
    Case((2, 3), 33, 50, 16, 12, True, 16, 16, "transposed"),
]


def case_id(case: Case) -> str:
    return (f"b{'x'.join(map(str, case.batch))}-L{case.L}-S{case.S}-E{case.E}-Ev{case.Ev}"
            f"-{'causal' if case.causal else 'full'}-{case.block_q}x{case.block_k}-{case.layout}")


def inputs(case: Case, dtype: type, seed: int = 0):
    rng = np.random.default_rng(seed)
    batch, L, S, E, Ev = case.batch, case.L, case.S, case.E, case.Ev
    if case.layout == "gpt":  # as CausalSelfAttention: (B, T, 3C) -> q, k, v (B, nh, T, hs)
        (B, nh), T, hs = batch, L, E
        x = rng.standard_normal((B, T, 3 * nh * hs)).astype(dtype)
        q, k, v = (x[..., i * nh * hs:(i + 1) * nh * hs].reshape(B, T, nh, hs)
                   .transpose(0, 2, 1, 3) for i in range(3))
        assert not q.flags.c_contiguous
    elif case.layout == "transposed":  # columns of unit stride: not readable by BLAS in place
        q, k, v = (np.swapaxes(rng.standard_normal((*batch, d, n)).astype(dtype), -1, -2)
                   for n, d in ((L, E), (S, E), (S, Ev)))
    else:
        q = rng.standard_normal((*batch, L, E)).astype(dtype)
        k = rng.standard_normal((*batch, S, E)).astype(dtype)
        v = rng.standard_normal((*batch, S, Ev)).astype(dtype)
    grad = rng.standard_normal((*batch, L, Ev)).astype(dtype)
    return q, k, v, grad


def reference(q, k, v, grad, causal: bool, scale: float):
    """The vectorised op's output and gradients (its autograd), and the log-sum-exp."""
    qkv = [mt.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*qkv, is_causal=causal, scale=scale)
    out.backward(mt.tensor(grad))
    scores = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., L, S)
    if causal:
        scores[..., np.triu(np.ones(scores.shape[-2:], dtype=bool), k=1)] = -np.inf
    top = scores.max(axis=-1)
    lse = top + np.log(np.exp(scores - top[..., None]).sum(axis=-1))
    return out.detach().numpy(), lse, *[t.grad.numpy() for t in qkv]


def assert_close(ours: np.ndarray, ref: np.ndarray, tol: float, what: str) -> None:
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, what
    # relative to the largest value, or to the inputs' scale (1) where the reference is all
    # zero: one query seeing one key has a zero grad_q, rounding noise one way or the other
    atol = tol * max(np.abs(ref).max(), 1.0)
    np.testing.assert_allclose(ours, ref, rtol=tol, atol=atol, err_msg=what)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_tiled_attention_matches_the_vectorised_op(case: Case, dtype: type) -> None:
    q, k, v, grad = inputs(case, dtype)
    scale = 1.0 / math.sqrt(case.E)
    expected = reference(q, k, v, grad, case.causal, scale)
    blocks = dict(block_q=case.block_q, block_k=case.block_k)
    out, lse = tiled_attention_forward(np, np.matmul, q, k, v, case.causal, scale, **blocks)
    grads = tiled_attention_backward(np, np.matmul, q, k, v, out, lse, grad, case.causal,
                                     scale, **blocks)
    for name, ours, ref in zip(("out", "lse", "grad_q", "grad_k", "grad_v"),
                               (out, lse, *grads), expected):
        assert_close(ours, ref.astype(dtype), TOLERANCE[dtype], name)
    assert all(g.flags.c_contiguous for g in grads)


def test_the_forward_never_allocates_the_score_matrix() -> None:
    heads, L, E = 2, 2048, 32
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, heads, L, E)).astype(np.float32) for _ in range(3))
    tracemalloc.start()
    try:
        out, lse = tiled_attention_forward(np, np.matmul, q, k, v, True, 1 / math.sqrt(E))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one_score_matrix = L * L * 4  # bytes, per head
    # the output, lse and a few (block_q, block_k) tiles per head: ~1.6 MB here, not 16 MB
    assert peak < one_score_matrix / 4, f"peak {peak} bytes"
    assert np.isfinite(out).all() and out.shape == (1, heads, L, E)
