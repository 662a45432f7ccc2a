"""What the Llama tests share (tests/test_llama.py, tests/test_against_torch.py): the table
of tiny shapes every parity test runs over, and a Llama of one of them with weights that
make every part of it matter."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn as nn

BASE = dict(block_size=8, vocab_size=13, n_layer=2, n_embd=16, ffn_hidden=24, rope_theta=100.0)

# multi-head, grouped-query and multi-query attention, tied and untied heads, with and
# without biases, and odd sizes: a vocabulary of 13, head dim 6, an ffn of 20, 7 positions
SHAPES = {
    "mha": dict(n_head=4, n_kv_head=4),
    "gqa": dict(n_head=4, n_kv_head=2),
    "mqa": dict(n_head=4, n_kv_head=1),
    "gqa-tied": dict(n_head=4, n_kv_head=2, tie_embeddings=True),
    "mqa-bias": dict(n_head=4, n_kv_head=1, bias=True),
    "mha-tied-bias-hd6": dict(n_head=2, n_kv_head=2, n_embd=12, ffn_hidden=20, bias=True,
                              tie_embeddings=True, rope_theta=10000.0),
    "gqa-bias-hd6": dict(n_head=4, n_kv_head=2, n_embd=24, ffn_hidden=20, bias=True),
}


def shape_params(*names: str) -> list:
    """pytest params of the named SHAPES (every one when no name is given), ids their names."""
    return [pytest.param(SHAPES[name], id=name) for name in names or SHAPES]

BATCH, T = 3, 7  # one position short of the block


def config_of(changes: dict) -> nn.LlamaConfig:
    return nn.LlamaConfig(**{**BASE, **changes})


def random_llama(changes: dict, dtype=mt.float32, seed: int = 1) -> nn.Llama:
    """A Llama of ``BASE`` with ``changes``, every parameter drawn afresh: matrices
    N(0, 1/fan_in), biases N(0, 0.2^2), RMSNorm gains N(1, 0.2^2). Llama's own
    initialisation (std 0.02, zero biases, unit gains) leaves attention almost uniform:
    the q and k gradients are then a millionth of the others, and a wrong rotation or
    grouping hides under any tolerance scaled to the tensor."""
    model = nn.Llama(config_of(changes))
    if dtype == mt.float64:
        model = model.double()
    rng = np.random.default_rng(seed)
    with mt.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                values = rng.normal(0.0, p.shape[1] ** -0.5, p.shape)
            else:
                values = rng.normal(1.0 if "norm" in name else 0.0, 0.2, p.shape)
            p.data[...] = values.astype(p.data.dtype)
    return model


def batch(vocab: int = BASE["vocab_size"], seed: int = 2):
    """(idx, targets) as NumPy int64 arrays (BATCH, T), one target ignored (-1)."""
    rng = np.random.default_rng(seed)
    idx, targets = rng.integers(0, vocab, (2, BATCH, T))
    targets[0, 3] = -1
    return idx, targets


def assert_close(actual, expected, rtol: float, err_msg: str = "") -> None:
    """|actual - expected| <= rtol |expected| + rtol max|expected|: relative to each entry
    and, for entries near zero, to the tensor's largest. Gradients are sums over positions
    and heads; an entry that sums to near zero keeps the rounding of its terms, which are
    the size of the tensor's large entries, not of the result (torch's own float32 gradient
    differs from its float64 one by as much there)."""
    expected = np.asarray(expected)
    np.testing.assert_allclose(actual, expected, rtol=rtol,
                               atol=rtol * float(np.abs(expected).max()), err_msg=err_msg)
