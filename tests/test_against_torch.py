"""The GPT, the Llama and AdamW against PyTorch, where PyTorch is installed (a
development-only reference; it is never a dependency, and this file is skipped without it).

A GPT-2 written directly in torch (``minitorch_gpu.torch_reference``), with the parameter
names nanoGPT uses, loads our state dict key by key; logits, loss, every gradient and three
AdamW steps must agree in float64. A Llama written the same way (``TorchLlama``, Hugging
Face's names) must give our fused ops' logits, loss and every gradient in float32 and
float64, over multi-head, grouped-query and multi-query shapes (``llama_shapes.py``; the
Llama's other tests, Hugging Face's own model among them, are in ``test_llama.py``).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn as nn

torch = pytest.importorskip("torch")
from llama_shapes import assert_close, batch, random_llama, shape_params  # noqa: E402
from minitorch_gpu.torch_reference import (TorchGPT, TorchLlama,  # noqa: E402  (needs torch)
                                           torch_adamw)


@pytest.fixture
def pair():
    config = nn.GPTConfig(block_size=16, vocab_size=23, n_layer=2, n_head=4, n_embd=32)
    ours = nn.GPT(config).double()
    theirs = TorchGPT.from_ours(ours)  # every key matches, shapes included
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 23, (3, 16)), rng.integers(0, 23, (3, 16))
    return ours, theirs, idx, targets


def test_logits_loss_and_every_gradient_match_pytorch(pair):
    ours, theirs, idx, targets = pair
    logits, loss = ours(mt.tensor(idx), mt.tensor(targets))
    loss.backward()
    t_logits, t_loss = theirs(torch.from_numpy(idx), torch.from_numpy(targets))
    t_loss.backward()
    np.testing.assert_allclose(logits.detach().numpy(), t_logits.detach().numpy(), rtol=1e-10,
                               atol=1e-12)
    assert loss.item() == pytest.approx(t_loss.item(), rel=1e-12)
    assert loss.item() == pytest.approx(math.log(23), abs=0.1)
    t_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), t_params[name].grad.numpy(), rtol=1e-8,
                                   atol=1e-12, err_msg=name)


def three_adamw_steps(ours, theirs, idx, targets) -> dict:
    """Three AdamW steps of both models under the same groups and settings (nanoGPT's
    weight decay on 2-D weights only); theirs' parameters by name, to compare with ours."""
    opt = ours.configure_optimizers(weight_decay=0.1, learning_rate=1e-2, betas=(0.9, 0.95))
    t_opt = torch_adamw(theirs, weight_decay=0.1, lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(3):
        opt.zero_grad()
        ours(mt.tensor(idx), mt.tensor(targets))[1].backward()
        opt.step()
        t_opt.zero_grad()
        theirs(torch.from_numpy(idx), torch.from_numpy(targets))[1].backward()
        t_opt.step()
    return dict(theirs.named_parameters())


def test_three_adamw_steps_match_pytorch(pair):
    ours, theirs, idx, targets = pair
    t_params = three_adamw_steps(ours, theirs, idx, targets)
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), t_params[name].detach().numpy(),
                                   rtol=1e-9, atol=1e-12, err_msg=name)


def test_a_pytorch_state_dict_loads_key_by_key(pair):
    ours, theirs, idx, targets = pair
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.01 * torch.randn_like(p))  # now different from ours
    result = ours.load_state_dict(theirs.state_dict())  # torch tensors, as they are
    assert result.missing_keys == [] and result.unexpected_keys == []
    ours.load_state_dict(dict(theirs.named_parameters()), strict=False)  # requiring grad
    logits, _ = ours(mt.tensor(idx), mt.tensor(targets))
    t_logits, _ = theirs(torch.from_numpy(idx), torch.from_numpy(targets))
    np.testing.assert_allclose(logits.detach().numpy(), t_logits.detach().numpy(), rtol=1e-10,
                               atol=1e-12)


def test_the_torch_kv_cache_gives_our_next_token_logits(pair):
    """The bench's torch generation runs the same arithmetic as ours: the torch model's
    KV-cached steps give the last-position logits of our cached model, token by token."""
    from minitorch_gpu.torch_reference import TorchKVCache
    ours, theirs, idx, _ = pair
    ours.eval()
    cache = nn.KVCache(ours.config, 3, dtype=mt.float64)
    t_cache = TorchKVCache(theirs, 3)
    with mt.no_grad(), torch.no_grad():
        for start, end in ((0, 5), (5, 6), (6, 9), (9, 10)):  # a prompt, then steps
            logits, _ = ours(mt.tensor(idx[:, start:end]), kv_cache=cache)
            t_logits, _ = theirs(torch.from_numpy(idx[:, start:end]), cache=t_cache)
            np.testing.assert_allclose(logits.numpy(), t_logits.numpy(), rtol=1e-10,
                                       atol=1e-12)
        tokens = theirs.generate(torch.from_numpy(idx[:, :4]), 20, window_shift=4)
    assert tuple(tokens.shape) == (3, 24) and int(tokens.max()) < 23


# --- the Llama ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, rtol", [(mt.float32, 1e-5), (mt.float64, 1e-10)],
                         ids=["float32", "float64"])
@pytest.mark.parametrize("changes", shape_params())
def test_llama_logits_loss_and_every_gradient_match_pytorch(changes, dtype, rtol):
    """rms_norm, apply_rotary, swiglu and grouped_causal_attention (no key repeated)
    against TorchLlama's plain torch (float32 statistics, rotate-half, repeat_interleave)."""
    ours = random_llama(changes, dtype)
    theirs = TorchLlama.from_ours(ours)  # every key matches, shapes included
    idx, targets = batch()
    logits, loss = ours(mt.tensor(idx), mt.tensor(targets))
    loss.backward()
    t_logits, t_loss = theirs(torch.from_numpy(idx), torch.from_numpy(targets))
    t_loss.backward()
    assert logits.dtype == dtype and t_logits.dtype == getattr(torch, str(dtype))
    assert_close(logits.detach().numpy(), t_logits.detach().numpy(), rtol)
    assert loss.item() == pytest.approx(t_loss.item(), rel=rtol)
    t_params = dict(theirs.named_parameters())
    ours_params = dict(ours.named_parameters())
    assert list(ours_params) == list(t_params)  # a tied head is the embedding, in both
    for name, p in ours_params.items():
        assert_close(p.grad.numpy(), t_params[name].grad.numpy(), rtol, err_msg=name)


@pytest.mark.parametrize("changes", shape_params("mqa", "gqa-tied"))
def test_three_adamw_steps_of_a_llama_match_pytorch(changes):
    ours = random_llama(changes, mt.float64)
    theirs = TorchLlama.from_ours(ours)
    idx, targets = batch()
    t_params = three_adamw_steps(ours, theirs, idx, targets)
    for name, p in ours.named_parameters():
        assert_close(p.detach().numpy(), t_params[name].detach().numpy(), 1e-9, err_msg=name)
