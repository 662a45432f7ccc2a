"""A block's skip connection added inside its last projection's node (``F.linear``'s
``residual``, ``nn.layers.residual_projection``): the same values and gradients as
``x + proj(y)`` written out, in float64 and under bf16 autocast; fused only while the
dropout does nothing; the GPT and the Llama train and generate as they did unfused.
(The op itself is also a row of the op table: ``linear-residual``.)"""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn.functional as F
from minitorch_gpu.nn import GPTConfig, layers, model_for
from minitorch_gpu.nn import gpt as gpt_module
from minitorch_gpu.nn import llama as llama_module


def unfused(residual, proj, dropout, y):
    """What ``residual_projection`` replaces, written out."""
    out = dropout(proj(y))
    return out if residual is None else residual + out


def _leaf(rng, *shape, dtype=np.float64):
    return mt.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def test_the_fused_add_is_one_node_with_the_written_out_values_and_gradients():
    rng = np.random.default_rng(0)
    proj = mt.nn.Linear(6, 4).to(mt.float64)
    y, r = _leaf(rng, 2, 3, 6), _leaf(rng, 2, 3, 4)
    dropout = mt.nn.Dropout(0.0)
    results = []
    for fn in (layers.residual_projection, unfused):
        for t in (y, r, proj.weight, proj.bias):
            t.grad = None
        out = fn(r, proj, dropout, y)
        results.append((type(out.grad_fn).__name__, out.data.copy()))
        out.backward(mt.tensor(np.linspace(-1, 1, int(np.prod(out.shape))).reshape(out.shape)))
        results[-1] += tuple(t.grad.data.copy() for t in (y, r, proj.weight, proj.bias))
    (fused_node, *fused), (plain_node, *plain) = results
    assert (fused_node, plain_node) == ("Linear", "Add")
    for ours, ref in zip(fused, plain):
        np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-13)


def test_an_active_dropout_keeps_the_add_outside_and_eval_mode_fuses_it():
    rng = np.random.default_rng(1)
    proj, dropout = mt.nn.Linear(5, 5), mt.nn.Dropout(0.5)
    y, r = _leaf(rng, 4, 5, dtype=np.float32), _leaf(rng, 4, 5, dtype=np.float32)
    mt.manual_seed(3)
    out = layers.residual_projection(r, proj, dropout, y)
    mt.manual_seed(3)
    ref = unfused(r, proj, dropout, y)
    assert type(out.grad_fn).__name__ == "Add"
    np.testing.assert_array_equal(out.data, ref.data)
    dropout.eval()
    assert type(layers.residual_projection(r, proj, dropout, y).grad_fn).__name__ == "Linear"
    assert type(layers.residual_projection(None, proj, dropout, y).grad_fn).__name__ == \
        "Linear"


def test_under_bf16_autocast_the_sum_is_the_float32_residual_stream():
    rng = np.random.default_rng(2)
    x, w, b = (_leaf(rng, *s, dtype=np.float32) for s in ((3, 8), (4, 8), (4,)))
    r = _leaf(rng, 3, 4, dtype=np.float32)
    with mt.autocast("bf16"):
        fused = F.linear(x, w, b, residual=r)
        plain = r + F.linear(x, w, b)
    assert fused.dtype == plain.dtype == mt.float32
    # the fused sum rounds once (float32), the written-out one after the product (bf16)
    np.testing.assert_allclose(fused.data, plain.data, rtol=1e-2, atol=2e-2)
    fused.sum().backward()
    grads = [t.grad.data.copy() for t in (x, w, b, r)]
    for t in (x, w, b, r):
        t.grad = None
    plain.sum().backward()
    for ours, ref, t in zip(grads, [t.grad.data for t in (x, w, b, r)], (x, w, b, r)):
        assert ours.dtype == t.dtype
        np.testing.assert_allclose(ours, ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("residual, error, message", [
    (np.ones((3, 5)), ValueError, r"residual has shape \(3, 5\), expected the output's "
                                  r"\(3, 4\)"),
    (np.ones(4), ValueError, r"residual has shape \(4,\), expected the output's \(3, 4\) "
                             r"\(it is added, not broadcast\)"),
    (np.ones((3, 4), np.int64), TypeError, "residual"),
])
def test_a_residual_of_another_shape_or_an_integer_one_is_refused(residual, error, message):
    x, w = mt.randn(3, 8), mt.randn(4, 8)
    with pytest.raises(error, match=message):
        F.linear(x, w, residual=mt.tensor(residual))


def _tiny(arch):
    extra = dict(n_kv_head=2, ffn_hidden=64) if arch == "llama" else {}
    return GPTConfig(arch=arch, n_layer=2, n_head=4, n_embd=32, block_size=16,
                     vocab_size=40, dropout=0.0, **extra)


@pytest.mark.parametrize("arch, module", [("gpt2", gpt_module), ("llama", llama_module)])
def test_models_train_and_generate_as_with_the_add_written_out(arch, module, monkeypatch):
    """Losses and every gradient of a float64 step, and a greedy KV-cached generation,
    with the blocks' adds fused and written out (the module's residual_projection
    swapped for ``unfused``)."""
    rng = np.random.default_rng(4)
    idx, targets = (mt.tensor(rng.integers(0, 40, (3, 16))) for _ in range(2))
    runs = []
    for fuse in (True, False):
        if not fuse:
            monkeypatch.setattr(module, "residual_projection", unfused)
        mt.manual_seed(0)
        model = model_for(_tiny(arch)).to(mt.float64)
        _, loss = model(idx, targets)
        loss.backward()
        model.eval()
        tokens = model.generate(idx[:1, :4], 12, temperature=0.0)
        runs.append((loss.item(), {k: p.grad.data for k, p in model.named_parameters()},
                     tokens.data))
    (loss_f, grads_f, tokens_f), (loss_u, grads_u, tokens_u) = runs
    assert loss_f == pytest.approx(loss_u, rel=1e-12)
    for name in grads_u:
        np.testing.assert_allclose(grads_f[name], grads_u[name], rtol=1e-9, atol=1e-12,
                                   err_msg=name)
    np.testing.assert_array_equal(tokens_f, tokens_u)
