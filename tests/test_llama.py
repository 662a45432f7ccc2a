"""The Llama: Hugging Face's names and order, Hugging Face's own LlamaForCausalLM on our
weights (where transformers is installed), the KV cache of n_kv_head heads against full
recomputation, config errors, accounting, training and bf16 autocast.

Logits, loss and every gradient against a plain PyTorch Llama (float32 and float64, every
shape in ``llama_shapes.py``) are in ``test_against_torch.py``, beside the GPT's.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn as nn
from llama_shapes import BASE, SHAPES, assert_close, batch, config_of, random_llama, shape_params


def host(t):
    return t.detach().cpu().numpy()


def random_ids(shape, vocab=BASE["vocab_size"], seed=0):
    return mt.tensor(np.random.default_rng(seed).integers(0, vocab, shape))


# --- names and shapes ---------------------------------------------------------------------
def expected_state(tied: bool, bias: bool) -> list:
    """Hugging Face's LlamaForCausalLM state dict for BASE with n_head 4, n_kv_head 2,
    written out by hand: (name, shape) in its order. A tied head is still listed (as
    Hugging Face's state dict lists it), once more at the end."""
    C, Hkv_D, F, V = 16, 2 * 4, 24, 13
    per_layer = [("self_attn.q_proj", (C, C)), ("self_attn.k_proj", (Hkv_D, C)),
                 ("self_attn.v_proj", (Hkv_D, C)), ("self_attn.o_proj", (C, C)),
                 ("mlp.gate_proj", (F, C)), ("mlp.up_proj", (F, C)), ("mlp.down_proj", (C, F))]
    state = [("model.embed_tokens.weight", (V, C))]
    for i in range(2):
        for name, shape in per_layer:
            state.append((f"model.layers.{i}.{name}.weight", shape))
            if bias:
                state.append((f"model.layers.{i}.{name}.bias", shape[:1]))
        state += [(f"model.layers.{i}.input_layernorm.weight", (C,)),
                  (f"model.layers.{i}.post_attention_layernorm.weight", (C,))]
    return state + [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_state_dict_is_hugging_faces_names_shapes_and_order(tied, bias):
    model = nn.Llama(config_of(dict(n_head=4, n_kv_head=2, tie_embeddings=tied, bias=bias)))
    expected = expected_state(tied, bias)
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == expected
    parameters = [n for n, _ in model.named_parameters()]
    assert parameters == [n for n, _ in expected][:-1 if tied else None]  # a tied head once
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied


def test_hugging_faces_llama_loads_our_state_dict_and_gives_our_logits():
    """transformers' LlamaForCausalLM of the same shape takes our state dict with
    strict=True and gives our logits, in float32 to 1e-5 as TorchLlama does. Hugging Face
    computes its rotary angles in float32 (position * inv_freq), ours in float64: an
    angle is off by about position * 6e-8 radians there, under 1e-6 at these 7 positions
    but about 1e-4 at position 4,096, where a comparison would need rel 1e-4. Its eager
    attention is asked for: the same arithmetic whatever SDPA backend torch would pick."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    for name in ("mha", "gqa-tied", "mqa-bias", "gqa-bias-hd6"):
        ours = random_llama(SHAPES[name])
        c = ours.config
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.ffn_hidden,
            num_hidden_layers=c.n_layer, num_attention_heads=c.n_head,
            num_key_value_heads=c.n_kv_head, max_position_embeddings=c.block_size,
            rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
            tie_word_embeddings=c.tie_embeddings, attention_bias=c.bias, mlp_bias=c.bias,
            attn_implementation="eager")).eval()
        assert list(hf.state_dict()) == list(ours.state_dict()), name  # order included
        state = {k: torch.from_numpy(host(v).copy()) for k, v in ours.state_dict().items()}
        result = hf.load_state_dict(state, strict=True)
        assert not result.missing_keys and not result.unexpected_keys, name
        idx, _ = batch()
        with torch.no_grad():
            theirs = hf(torch.from_numpy(idx)).logits.numpy()
        logits, _ = ours(mt.tensor(idx), all_logits=True)
        assert_close(host(logits), theirs, 1e-5, err_msg=name)


# --- the KV cache -------------------------------------------------------------------------
@pytest.mark.parametrize("changes", shape_params("mha", "gqa", "mqa", "mqa-bias"))
def test_cached_logits_match_full_recomputation_position_by_position(changes):
    model = random_llama(changes).eval()
    c = model.config
    idx = random_ids((2, c.block_size), seed=3)
    with mt.no_grad():
        cache = nn.KVCache(c, batch_size=2)
        assert cache.keys[0].shape == cache.values[1].shape == \
            (2, c.n_kv_head, c.block_size, c.head_dim)  # n_kv_head heads, not n_head
        steps = [(0, 3), (3, 5)] + [(t, t + 1) for t in range(5, c.block_size)]  # a prompt,
        for start, end in steps:  # a chunk after cached positions, then single tokens
            cached = host(model(idx[:, start:end], kv_cache=cache, all_logits=True)[0])
            for t in range(start, end):
                full = host(model(idx[:, :t + 1], all_logits=True)[0])[:, -1]
                assert_close(cached[:, t - start], full, 1e-5, err_msg=f"position {t}")
        assert cache.length == c.block_size


def test_a_cache_made_for_another_model_is_refused_naming_n_kv_head():
    model = nn.Llama(config_of(SHAPES["gqa"]))
    other = nn.KVCache(config_of(SHAPES["mqa"]), batch_size=1)
    with mt.no_grad(), pytest.raises(ValueError, match=r"the kv_cache was made for arch, "
                                     r"n_layer, n_kv_head, head_dim, block_size = "
                                     r"\('llama', 2, 1, 4, 8\), the model has "
                                     r"\('llama', 2, 2, 4, 8\)"):
        model(random_ids((1, 2)), kv_cache=other)


@pytest.mark.parametrize("shift", [1, 5])
@pytest.mark.parametrize("changes", shape_params("mha", "gqa", "mqa"))
def test_cached_and_uncached_greedy_generation_agree_past_the_block(changes, shift):
    model = random_llama(changes).eval()  # block_size 8: 15 new tokens shift the window
    prompt = random_ids((2, 3), seed=4)
    cached = host(model.generate(prompt, 15, temperature=0, window_shift=shift))
    uncached = host(model.generate(prompt, 15, temperature=0, window_shift=shift,
                                   use_cache=False))
    assert cached.shape == (2, 18)
    # token ids, exactly: the two paths' float32 logits (other matrix shapes, another BLAS
    # blocking) differ by 3e-6 at most, on OpenBLAS's Haswell and SkylakeX kernels, one
    # thread or two; the top two logits of every step of these seeded models by 3.7e-3 or
    # more. Changing a seed or a size here: check that margin again.
    np.testing.assert_array_equal(cached, uncached)
    np.testing.assert_array_equal(cached[:, :3], host(prompt))


# --- config errors ------------------------------------------------------------------------
@pytest.mark.parametrize("changes, message", [
    (dict(n_head=4, n_kv_head=3), r"n_kv_head \(3\) must divide n_head \(4\)"),
    (dict(n_head=4, n_kv_head=8), r"n_kv_head \(8\) must divide n_head \(4\)"),
    (dict(n_embd=12, n_head=4, n_kv_head=2), "n_embd // n_head, the head size 3, must be "
                                             "even for rotary positions"),
    (dict(n_head=4, n_kv_head=0), "n_kv_head must be a positive int or null, got 0"),
    (dict(n_head=4, block_size=None), "block_size must be a positive int, got None"),
    (dict(n_head=4, rope_theta=0.0), "rope_theta must be a positive number"),
])
def test_config_rejects_impossible_llama_shapes(changes, message):
    with pytest.raises(ValueError, match="GPTConfig: " + message):
        config_of(changes)


@pytest.mark.parametrize("build, config, message", [
    (nn.GPT, lambda: config_of(dict(n_head=4)), "GPT: expected a GPTConfig of arch 'gpt2', "
                                                "got arch 'llama'"),
    (nn.Llama, lambda: nn.GPTConfig(), "Llama: expected a GPTConfig of arch 'llama', got "
                                       "arch 'gpt2'"),
    (nn.Llama, lambda: dict(BASE, n_head=4), "got dict"),
])
def test_each_model_refuses_the_other_arch(build, config, message):
    with pytest.raises(TypeError, match=message):
        build(config())


def test_a_gpt_config_cannot_group_its_heads():
    with pytest.raises(ValueError, match=r"n_kv_head \(2\) must be null \(or n_head, 4\) under "
                                         "arch gpt2"):
        nn.GPTConfig(n_head=4, n_kv_head=2, n_embd=16)


@pytest.mark.parametrize("changes, message", [
    (dict(ffn_hidden=7), "ffn_hidden must be null under arch gpt2"),
    (dict(rope_theta=5.0), "rope_theta must be 10000.0 under arch gpt2"),
    (dict(ffn_multiple_of=32), "ffn_multiple_of must be 64 under arch gpt2"),
])
def test_a_gpt_config_refuses_the_llama_fields_it_would_ignore(changes, message):
    with pytest.raises(ValueError, match="GPTConfig: " + message):
        nn.GPTConfig(n_head=4, n_embd=16, **changes)


def test_replace_changes_a_gpt_configs_heads():
    """A GPT-2 config stores no head count of its own (n_kv_head None, kv_heads n_head),
    so dataclasses.replace of n_head works as it did before the Llama fields."""
    config = nn.GPTConfig(n_head=2, n_embd=8, n_kv_head=2)
    assert config.n_kv_head is None and config.kv_heads == 2
    assert dataclasses.replace(config, n_head=4).kv_heads == 4


# --- accounting, training, bf16 -----------------------------------------------------------
@pytest.mark.parametrize("changes", shape_params("gqa", "gqa-tied", "mqa-bias"))
def test_num_params_and_flops_per_token_count_the_head_once_when_tied(changes):
    model = nn.Llama(config_of(changes))
    c = model.config
    C, V, L, T, D = c.n_embd, c.vocab_size, c.n_layer, c.block_size, c.head_dim
    q_o = 2 * C * c.n_head * D + (c.n_head * D + C) * c.bias
    k_v = 2 * (C * c.n_kv_head * D + c.n_kv_head * D * c.bias)
    mlp = 3 * C * c.ffn_hidden + (2 * c.ffn_hidden + C) * c.bias
    body = L * (q_o + k_v + mlp + 2 * C) + C
    total = body + V * C * (1 if c.tie_embeddings else 2)
    assert model.num_params(non_embedding=False) == total
    assert sum(p.numel() for p in model.parameters()) == total
    # untied, the embedding is a lookup and leaves the count; tied, it is also the head
    assert model.num_params() == body + V * C
    assert model.flops_per_token() == 6 * (body + V * C) + 12 * L * C * T
    assert model.flops_per_token(seq_len=3) == 6 * (body + V * C) + 12 * L * C * 3


@pytest.mark.parametrize("changes", shape_params("gqa", "gqa-tied"))
def test_a_few_adamw_steps_learn_a_repeated_sequence(changes):
    mt.manual_seed(5)
    model = nn.Llama(config_of(changes))
    ids = mt.tensor(np.tile(np.array([3, 1, 4, 1, 5, 9, 2, 6, 5]), (2, 1)))  # (2, 9)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    optimizer = model.configure_optimizers(weight_decay=0.0, learning_rate=1e-2)
    losses = []
    for _ in range(25):
        _, loss = model(inputs, targets)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[0] == pytest.approx(math.log(13), abs=0.1)  # near uniform at init
    assert all(b < a for a, b in zip(losses, losses[1:])), losses  # every step helps
    assert losses[-1] < 0.3 * losses[0], losses


@pytest.mark.parametrize("changes", shape_params("gqa", "mqa-bias"))
def test_a_llama_under_bf16_autocast_stays_close_to_float32(changes):
    model = random_llama(changes)
    idx, targets = (mt.tensor(a) for a in batch())
    logits32, loss32 = model(idx, targets)
    with mt.autocast("bf16"):
        logits16, loss16 = model(idx, targets)
    loss16.backward()
    assert logits16.dtype == mt.bfloat16 and loss16.dtype == mt.float32
    assert all(p.grad is not None and p.grad.dtype == mt.float32 for p in model.parameters())
    assert float(loss16) == pytest.approx(float(loss32), rel=2e-2)
    error = np.abs(host(logits16.float()) - host(logits32)).max()
    assert error < 0.05 * np.abs(host(logits32)).max(), error


def test_crop_block_size_changes_only_the_limit():
    """A Llama has no position table: cropping its context keeps every weight and the
    logits of the positions that still fit, and refuses longer inputs."""
    model = nn.Llama(config_of(SHAPES["gqa"]))
    idx = random_ids((2, 5))
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    with mt.no_grad():
        full, _ = model(idx, all_logits=True)
        model.crop_block_size(5)
        cropped, _ = model(idx, all_logits=True)
    assert model.config.block_size == 5
    np.testing.assert_array_equal(cropped.numpy(), full.numpy())
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), before[key])
    with pytest.raises(ValueError, match="block size is 5"):
        model(random_ids((1, 6)))
    with pytest.raises(ValueError, match=r"crop_block_size: block_size must be an int in \[1, 5\]"):
        model.crop_block_size(6)
