"""The GPT, the Llama and AdamW against PyTorch, where PyTorch is installed (a
development-only reference; it is never a dependency, and this file is skipped without it).

A GPT-2 written directly in torch (``minitorch_gpu.bench.torch_reference``), with the parameter
names nanoGPT uses, loads our state dict key by key; logits, loss, every gradient and three
AdamW steps must agree in float64. A Llama written the same way (``TorchLlama``, Hugging
Face's names) must give our fused ops' logits, loss and every gradient in float32 and
float64, over multi-head, grouped-query and multi-query shapes (``llama_shapes.py``; the
Llama's other tests, Hugging Face's own model among them, are in ``test_llama.py``).
Every check runs with both of the references' attention forms (``ATTENTION_FORMS``:
explicit products, and torch's scaled_dot_product_attention, what ``bench --vs-torch``
times), and their KV-cached steps and greedy generation must give ours.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn as nn

torch = pytest.importorskip("torch")
from llama_shapes import (BASE, SHAPES, assert_close, batch, random_llama,  # noqa: E402
                          shape_params)
from minitorch_gpu.bench.torch_reference import (ATTENTION_FORMS, TorchGPT,  # noqa: E402
                                           TorchKVCache, TorchLlama, torch_adamw)


@pytest.fixture(params=ATTENTION_FORMS)
def pair(request):
    config = nn.GPTConfig(block_size=16, vocab_size=23, n_layer=2, n_head=4, n_embd=32)
    ours = nn.GPT(config).double()
    theirs = TorchGPT.from_ours(ours, request.param)  # every key matches, shapes included
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


def a_model_pair(arch: str, attention: str):
    """(ours, theirs, idx) in float64, with weights that make every part matter: the GPT
    of ``pair`` (block 16) or a grouped-query Llama of llama_shapes (block 8)."""
    if arch == "gpt2":
        config = nn.GPTConfig(block_size=16, vocab_size=23, n_layer=2, n_head=4, n_embd=32)
        mt.manual_seed(3)
        ours = nn.GPT(config).double()
        idx = np.random.default_rng(0).integers(0, 23, (3, 16))
        return ours.eval(), TorchGPT.from_ours(ours, attention), idx
    ours = random_llama(SHAPES["gqa"], mt.float64)
    idx = np.random.default_rng(0).integers(0, ours.config.vocab_size, (3, 8))
    return ours.eval(), TorchLlama.from_ours(ours, attention), idx


MODEL_PAIRS = [pytest.param(arch, attention, id=f"{arch}-{attention}")
               for arch in ("gpt2", "llama") for attention in ATTENTION_FORMS]


@pytest.mark.parametrize("arch, attention", MODEL_PAIRS)
def test_the_torch_kv_cache_gives_our_next_token_logits(arch, attention):
    """The bench's torch generation runs the same arithmetic as ours: the torch model's
    KV-cached steps give the last-position logits of our cached model, token by token: a
    prompt, one position, three positions after the cached ones (the offset causal mask:
    is_causal would align it to the top left), one more."""
    ours, theirs, idx = a_model_pair(arch, attention)
    cache = nn.KVCache(ours.config, 3, dtype=mt.float64)
    t_cache = TorchKVCache(theirs, 3)
    with mt.no_grad(), torch.no_grad():
        for start, end in ((0, 3), (3, 4), (4, 7), (7, 8)):
            logits, _ = ours(mt.tensor(idx[:, start:end]), kv_cache=cache)
            t_logits, _ = theirs(torch.from_numpy(idx[:, start:end]), cache=t_cache)
            assert tuple(t_logits.shape) == tuple(logits.shape) == (3, 1, ours.config.vocab_size)
            np.testing.assert_allclose(logits.numpy(), t_logits.numpy(), rtol=1e-10,
                                       atol=1e-12)
    assert t_cache.length == cache.length == 8


@pytest.mark.parametrize("arch, attention", MODEL_PAIRS)
@pytest.mark.parametrize("window_shift", [1, 3])
def test_greedy_generation_gives_our_tokens(arch, attention, window_shift):
    """Greedy (temperature 0) generation past the window, which slides by
    ``window_shift`` and reruns the rest from position 0, gives our generate's tokens;
    sampled generation gives tokens of the vocabulary, as many."""
    ours, theirs, idx = a_model_pair(arch, attention)
    prompt = idx[:, :4]
    new = 2 * ours.config.block_size + 3  # the window shifts several times
    tokens = ours.generate(mt.tensor(prompt), new, temperature=0, window_shift=window_shift)
    t_tokens = theirs.generate(torch.from_numpy(prompt), new, temperature=0,
                               window_shift=window_shift)
    np.testing.assert_array_equal(tokens.numpy(), t_tokens.numpy())
    torch.manual_seed(0)
    sampled = theirs.generate(torch.from_numpy(prompt), 20, window_shift=window_shift)
    assert tuple(sampled.shape) == (3, 24)
    assert 0 <= int(sampled.min()) <= int(sampled.max()) < ours.config.vocab_size


@pytest.mark.parametrize("model", [TorchGPT, TorchLlama])
def test_an_unknown_attention_form_is_refused(model):
    config = nn.LlamaConfig(**BASE, n_head=4, n_kv_head=2) if model is TorchLlama else \
        nn.GPTConfig(block_size=8, vocab_size=13, n_layer=1, n_head=2, n_embd=8)
    with pytest.raises(ValueError, match="unknown attention 'flash', expected one of "
                                         "explicit, sdpa"):
        model(config, attention="flash")


# --- the Llama ------------------------------------------------------------------------------
@pytest.mark.parametrize("attention", ATTENTION_FORMS)
@pytest.mark.parametrize("dtype, rtol", [(mt.float32, 1e-5), (mt.float64, 1e-10)],
                         ids=["float32", "float64"])
@pytest.mark.parametrize("changes", shape_params())
def test_llama_logits_loss_and_every_gradient_match_pytorch(changes, dtype, rtol, attention):
    """rms_norm, apply_rotary, swiglu and grouped_causal_attention (no key repeated)
    against TorchLlama's plain torch (float32 statistics, rotate-half, and keys repeated
    with repeat_interleave or read by scaled_dot_product_attention's enable_gqa)."""
    ours = random_llama(changes, dtype)
    theirs = TorchLlama.from_ours(ours, attention)  # every key matches, shapes included
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


@pytest.mark.parametrize("attention", ATTENTION_FORMS)
@pytest.mark.parametrize("changes", shape_params("mqa", "gqa-tied"))
def test_three_adamw_steps_of_a_llama_match_pytorch(changes, attention):
    ours = random_llama(changes, mt.float64)
    theirs = TorchLlama.from_ours(ours, attention)
    idx, targets = batch()
    t_params = three_adamw_steps(ours, theirs, idx, targets)
    for name, p in ours.named_parameters():
        assert_close(p.detach().numpy(), t_params[name].detach().numpy(), 1e-9, err_msg=name)
