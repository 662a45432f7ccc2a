"""The GPT: config checks, GPT-2 names and initialisation, loss and gradients (float64
central differences), overfitting one batch, the KV cache against full recomputation, and
sampling (greedy, temperature, top-k, top-p, seeds)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn as nn
import minitorch_gpu.optim as optim

TINY = dict(block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=8)


def tiny(**changes) -> nn.GPT:
    return nn.GPT(nn.GPTConfig(**{**TINY, **changes}))


def host(t):
    return t.detach().cpu().numpy()


def random_ids(shape, vocab, seed=0):
    return mt.tensor(np.random.default_rng(seed).integers(0, vocab, shape))


# --- config -------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, message", [
    (dict(n_embd=10, n_head=4), r"n_embd \(10\) must be divisible by n_head \(4\)"),
    (dict(block_size=0), "block_size must be a positive int, got 0"),
    (dict(n_layer=1.5), "n_layer must be a positive int, got 1.5"),
    (dict(vocab_size=True), "vocab_size must be a positive int, got True"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
    (dict(bias="yes"), "bias must be true or false"),
])
def test_config_rejects_impossible_shapes(changes, message):
    with pytest.raises(ValueError, match="GPTConfig: " + message):
        nn.GPTConfig(**{**TINY, **changes})


def test_config_takes_numpy_integers_and_each_model_keeps_its_own_copy():
    config = nn.GPTConfig(**{**TINY, "vocab_size": np.int64(13)})
    assert type(config.vocab_size) is int
    a, b = nn.GPT(config), nn.GPT(config)
    b.crop_block_size(4)
    assert a.config.block_size == 8 and config.block_size == 8
    a(random_ids((1, 8), 13))  # still runs the full block


# --- names and initialisation -------------------------------------------------------------
def test_parameter_names_are_gpt2s():
    per_block = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
    expected = (["transformer.wte.weight", "transformer.wpe.weight"]
                + [f"transformer.h.{i}.{n}" for i in range(2) for n in per_block]
                + ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"])
    model = tiny()
    assert list(model.state_dict()) == expected
    assert [n for n, _ in model.named_parameters()] == expected[:-1]  # lm_head is wte
    shapes = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    assert shapes["transformer.h.0.attn.c_attn.weight"] == (24, 8)  # (out, in)
    assert shapes["transformer.h.1.mlp.c_fc.weight"] == (32, 8)
    assert shapes["lm_head.weight"] == (13, 8)
    no_bias = [n for n, _ in tiny(bias=False).named_parameters()]
    assert not any(n.endswith(".bias") for n in no_bias)


def test_gpt2_initialisation():
    model = nn.GPT(nn.GPTConfig(block_size=64, vocab_size=512, n_layer=4, n_head=4, n_embd=128))
    assert model.lm_head.weight is model.transformer.wte.weight
    params = dict(model.named_parameters())
    for name, p in params.items():
        values = host(p)
        if name.endswith("c_proj.weight"):
            assert values.std() == pytest.approx(0.02 / math.sqrt(8), rel=0.05), name
        elif name.endswith(".bias"):
            assert not values.any(), name
        elif "ln_" in name:
            assert (values == 1).all(), name
        else:
            assert values.std() == pytest.approx(0.02, rel=0.05), name
            assert abs(values.mean()) < 2e-3, name


def test_num_params_and_flops_per_token_follow_nanogpt():
    model = tiny()
    c = model.config
    d, L, V, T = c.n_embd, c.n_layer, c.vocab_size, c.block_size
    per_block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    total = V * d + T * d + L * per_block + 2 * d
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - T * d
    assert model.flops_per_token() == 6 * (total - T * d) + 12 * L * d * T
    assert model.flops_per_token(seq_len=4) == 6 * (total - T * d) + 12 * L * d * 4
    assert model.estimate_mfu(2, 0.5, 1e9) == pytest.approx(model.flops_per_token() * T * 2
                                                            / 0.5 / 1e9)


# --- forward, loss, gradients -------------------------------------------------------------
def test_loss_at_initialisation_is_about_ln_vocab():
    model = nn.GPT(nn.GPTConfig(block_size=32, vocab_size=65, n_layer=2, n_head=4, n_embd=64))
    idx, targets = random_ids((8, 32), 65, 1), random_ids((8, 32), 65, 2)
    logits, loss = model(idx, targets)
    assert logits.shape == (8, 32, 65)
    assert loss.item() == pytest.approx(math.log(65), abs=0.05)


def test_without_targets_only_the_last_position_is_scored_unless_asked():
    model = tiny()
    idx = random_ids((3, 6), 13)
    last, loss = model(idx)
    assert loss is None and last.shape == (3, 1, 13)
    every, _ = model(idx, all_logits=True)
    assert every.shape == (3, 6, 13)
    np.testing.assert_allclose(host(last)[:, 0], host(every)[:, -1], rtol=1e-6, atol=1e-7)


def test_shifted_slices_of_one_batch_serve_as_inputs_and_targets():
    model = tiny()
    ids = random_ids((2, 9), 13, 18)
    inputs, targets = ids[:, :-1], ids[:, 1:]  # non-contiguous views
    assert not targets.is_contiguous()
    _, loss = model(inputs, targets)
    _, expected = model(inputs.contiguous(), targets.contiguous())
    assert loss.item() == expected.item()


def test_targets_of_minus_one_are_ignored():
    model = tiny()
    idx, targets = random_ids((2, 8), 13, 3), random_ids((2, 8), 13, 4)
    masked = mt.tensor(np.where(np.arange(8) < 5, host(targets), -1))
    logits, loss = model(idx, masked)
    logp = host(logits).astype(np.float64)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp[:, :5], host(targets)[:, :5, None], -1)
    assert loss.item() == pytest.approx(-picked.mean(), rel=1e-5)


@pytest.mark.parametrize("call, error, message", [
    (lambda m: m(random_ids((1, 9), 13)), ValueError,
     "cannot run a sequence of length 9: the block size is 8"),
    (lambda m: m(mt.randn(2, 4)), TypeError, "idx must be an integer Tensor of token ids, got float32"),
    (lambda m: m(random_ids((4,), 13)), ValueError, r"idx must be \(batch, time\)"),
    (lambda m: m(random_ids((2, 4), 13), random_ids((2, 3), 13)), ValueError,
     r"targets have shape \(2, 3\), expected idx's shape \(2, 4\)"),
    (lambda m: m(random_ids((2, 4), 13), kv_cache=nn.KVCache(m.config, 2)), RuntimeError,
     "kv_cache is for inference"),
])
def test_bad_inputs_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call(tiny())


def test_a_gpt_without_biases_trains():
    model = tiny(bias=False)
    _, loss = model(random_ids((2, 8), 13, 19), random_ids((2, 8), 13, 20))
    loss.backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())


def test_crop_block_size_keeps_the_first_positions():
    model = tiny()
    wpe = host(model.transformer.wpe.weight).copy()
    idx = random_ids((1, 5), 13, 21)
    before = host(model(idx)[0])
    model.crop_block_size(5)
    assert model.config.block_size == 5 and model.transformer.wpe.weight.shape == (5, 8)
    np.testing.assert_array_equal(host(model.transformer.wpe.weight), wpe[:5])
    np.testing.assert_array_equal(host(model(idx)[0]), before)
    assert "transformer.wpe.weight" in dict(model.named_parameters())
    with pytest.raises(ValueError, match="cannot run a sequence of length 6: the block size is 5"):
        model(random_ids((1, 6), 13))
    with pytest.raises(ValueError, match=r"crop_block_size: block_size must be an int in \[1, 5\]"):
        model.crop_block_size(6)


def test_every_parameter_gradient_matches_central_differences_in_float64():
    mt.manual_seed(3)
    model = tiny(dropout=0.0).double()
    idx, targets = random_ids((2, 8), 13, 5), random_ids((2, 8), 13, 6)
    _, loss = model(idx, targets)
    loss.backward()
    rng = np.random.default_rng(0)
    eps = 1e-6
    for name, p in model.named_parameters():
        analytic = host(p.grad)
        flat = p.data.reshape(-1)  # a view: perturb the parameter in place
        for i in rng.choice(flat.size, size=min(4, flat.size), replace=False):
            original = flat[i]
            with mt.no_grad():
                flat[i] = original + eps
                plus = model(idx, targets)[1].item()
                flat[i] = original - eps
                minus = model(idx, targets)[1].item()
                flat[i] = original
            numeric = (plus - minus) / (2 * eps)
            assert analytic.reshape(-1)[i] == pytest.approx(numeric, rel=1e-5, abs=1e-9), \
                f"{name}[{i}]"


def test_a_tiny_gpt_overfits_one_batch():
    mt.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(block_size=16, vocab_size=16, n_layer=2, n_head=2, n_embd=32))
    idx, targets = random_ids((4, 16), 16, 7), random_ids((4, 16), 16, 8)
    optimizer = model.configure_optimizers(weight_decay=0.0, learning_rate=3e-3)
    first = None
    for _ in range(300):
        _, loss = model(idx, targets)
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert first == pytest.approx(math.log(16), abs=0.1)
    assert loss.item() < 0.05


def test_configure_optimizers_decays_only_two_dimensional_weights():
    model = tiny()
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")  # nanoGPT's call
    assert isinstance(optimizer, optim.AdamW)
    by_decay = {g["weight_decay"]: g["params"] for g in optimizer.param_groups}
    assert all(p.ndim == 2 for p in by_decay[0.1]) and all(p.ndim == 1 for p in by_decay[0.0])
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == \
        model.num_params(non_embedding=False)
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.95)


def test_dropout_is_random_in_training_and_off_in_eval():
    model = tiny(dropout=0.3)
    idx = random_ids((2, 8), 13)
    a, b = model(idx, all_logits=True)[0], model(idx, all_logits=True)[0]
    assert not np.allclose(host(a), host(b))
    model.eval()
    a, b = model(idx, all_logits=True)[0], model(idx, all_logits=True)[0]
    np.testing.assert_array_equal(host(a), host(b))


def test_state_dict_round_trip_gives_identical_outputs():
    mt.manual_seed(1)
    source = tiny()
    mt.manual_seed(2)
    target = tiny()
    idx, targets = random_ids((2, 8), 13, 9), random_ids((2, 8), 13, 10)
    target.load_state_dict(source.state_dict())
    assert target.lm_head.weight is target.transformer.wte.weight  # still tied
    for a, b in zip(source(idx, targets), target(idx, targets)):
        np.testing.assert_array_equal(host(a), host(b))


def test_gpt_on_each_device_matches_the_cpu(device):
    cpu_model = tiny()
    model = tiny().to(device)
    model.load_state_dict(cpu_model.state_dict())
    idx, targets = random_ids((2, 8), 13, 11), random_ids((2, 8), 13, 12)
    logits, loss = model(idx.to(device), targets.to(device))
    expected_logits, expected_loss = cpu_model(idx, targets)
    np.testing.assert_allclose(host(logits), host(expected_logits), rtol=1e-4, atol=1e-5)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5)


# --- the KV cache -------------------------------------------------------------------------
# Greedy tokens of the cached and the recomputed path are compared exactly below. The two
# paths' logits differ by float32 rounding (other matrix shapes, so another BLAS blocking:
# 1.5e-8 at most, on OpenBLAS's Haswell and SkylakeX kernels, one thread or two), while at
# every step of these seeded models the top two logits are 6.8e-3 or more apart: no argmax
# can flip. Changing a seed or a size here: check that margin again.
def test_cached_logits_match_full_recomputation_position_by_position():
    mt.manual_seed(4)
    model = nn.GPT(nn.GPTConfig(block_size=16, vocab_size=20, n_layer=2, n_head=4, n_embd=32))
    idx = random_ids((3, 16), 20, 13)
    with mt.no_grad():
        full = host(model(idx, all_logits=True)[0])  # (3, 16, 20)
        cache = nn.KVCache(model.config, batch_size=3)
        pieces = [host(model(idx[:, :5], kv_cache=cache, all_logits=True)[0])]  # the prompt
        pieces.append(host(model(idx[:, 5:9], kv_cache=cache, all_logits=True)[0]))  # a chunk
        for t in range(9, 16):  # then one token at a time
            pieces.append(host(model(idx[:, t:t + 1], kv_cache=cache)[0]))
        assert cache.length == 16
        with pytest.raises(ValueError, match="the kv_cache is full: it holds 16 of 16 positions"):
            model(idx[:, :1], kv_cache=cache)
        other = nn.KVCache(nn.GPTConfig(**{**TINY, "block_size": 16}), batch_size=3)
        with pytest.raises(ValueError, match=r"the kv_cache was made for arch, n_layer, "
                           r"n_kv_head, head_dim, block_size = \('gpt2', 2, 2, 4, 16\), the "
                           r"model has \('gpt2', 2, 4, 8, 16\)"):
            model(idx[:, :1], kv_cache=other)
        with pytest.raises(ValueError, match="the kv_cache holds 2 sequences, idx has 3"):
            model(idx[:, :1], kv_cache=nn.KVCache(model.config, batch_size=2))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("new_tokens", [5, 14])  # 14 runs past block_size: the window slides
def test_cached_and_uncached_greedy_generation_agree(new_tokens):
    model = tiny().eval()
    prompt = random_ids((2, 3), 13, 14)
    cached = model.generate(prompt, new_tokens, temperature=0)
    uncached = model.generate(prompt, new_tokens, temperature=0, use_cache=False)
    assert cached.shape == (2, 3 + new_tokens)
    np.testing.assert_array_equal(host(cached), host(uncached))
    np.testing.assert_array_equal(host(cached)[:, :3], host(prompt))


@pytest.mark.parametrize("shift", [1, 3, 8])
def test_a_window_shift_drops_that_many_tokens_when_the_text_outgrows_the_block(shift):
    model = tiny().eval()  # block_size 8
    prompt = random_ids((2, 3), 13, 17)
    out = host(model.generate(prompt, 20, temperature=0, window_shift=shift))
    np.testing.assert_array_equal(
        out, host(model.generate(prompt, 20, temperature=0, window_shift=shift,
                                 use_cache=False)))
    start = 0  # the rule, recomputed by hand: a full window of 8 drops `shift` tokens
    for t in range(3, out.shape[1]):
        if t - start > 8:
            start = t - (8 + 1 - shift)
        logits = host(model(mt.tensor(out[:, start:t]))[0])[:, -1]
        np.testing.assert_array_equal(out[:, t], logits.argmax(-1))


def test_a_prompt_longer_than_the_block_is_cropped_and_zero_new_tokens_is_the_prompt():
    model = tiny().eval()
    prompt = random_ids((2, 12), 13, 22)  # block_size is 8
    cached = host(model.generate(prompt, 4, temperature=0))
    np.testing.assert_array_equal(cached, host(model.generate(prompt, 4, temperature=0,
                                                              use_cache=False)))
    first = host(model(prompt[:, -8:])[0])[:, -1].argmax(-1)
    np.testing.assert_array_equal(cached[:, 12], first)
    np.testing.assert_array_equal(host(model.generate(prompt, 0)), host(prompt))


def test_greedy_generation_takes_the_argmax_every_step():
    model = tiny().eval()
    out = host(model.generate(random_ids((1, 2), 13), 6, temperature=0))
    for t in range(2, out.shape[1]):
        context = mt.tensor(out[:, max(0, t - 8):t])
        assert out[0, t] == int(host(model(context)[0])[0, -1].argmax())


# --- sampling -----------------------------------------------------------------------------
def test_top_k_of_one_and_a_tiny_top_p_equal_greedy():
    model = tiny().eval()
    prompt = random_ids((3, 2), 13, 15)
    greedy = host(model.generate(prompt, 6, temperature=0))
    np.testing.assert_array_equal(host(model.generate(prompt, 6, top_k=1)), greedy)
    np.testing.assert_array_equal(host(model.generate(prompt, 6, top_p=1e-6)), greedy)


def test_a_fixed_seed_gives_the_same_sample_twice():
    model = tiny().eval()
    prompt = random_ids((2, 2), 13, 16)
    samples = []
    for _ in range(2):
        mt.manual_seed(123)
        samples.append(host(model.generate(prompt, 6, temperature=1.5, top_k=8, top_p=0.9)))
    np.testing.assert_array_equal(samples[0], samples[1])
    mt.manual_seed(124)
    other = host(model.generate(prompt, 6, temperature=1.5))
    assert not np.array_equal(samples[0], other)


def test_generate_tokens_streams_the_tokens_generate_returns():
    model = tiny().eval()
    prompt = random_ids((2, 3), 13, 17)
    mt.manual_seed(5)
    whole = host(model.generate(prompt, 12, temperature=1.0, top_k=6))  # past the block
    mt.manual_seed(5)
    stream = model.generate_tokens(prompt, 12, temperature=1.0, top_k=6)
    tokens = []
    for token in stream:
        assert mt.is_grad_enabled()  # no_grad covers each step, not the caller's code
        assert token.shape == (2, 1)
        tokens.append(host(token))
    np.testing.assert_array_equal(whole[:, 3:], np.concatenate(tokens, axis=1))
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate_tokens(prompt, -1)  # checked at the call, before any next()


def probabilities_logits(probs):
    return mt.tensor(np.log(np.asarray([probs] * 4000)), dtype=mt.float32)


def test_top_k_samples_only_the_k_most_likely_tokens():
    logits = probabilities_logits([0.1, 0.4, 0.05, 0.3, 0.15])
    drawn = host(nn.sample_next_token(logits, top_k=2))[:, 0]
    assert set(np.unique(drawn)) == {1, 3}
    assert (drawn == 1).mean() == pytest.approx(0.4 / 0.7, abs=0.03)


def test_top_p_keeps_the_smallest_set_that_reaches_p():
    logits = probabilities_logits([0.15, 0.5, 0.05, 0.3])  # sorted: 0.5, 0.3, 0.15, 0.05
    assert set(np.unique(host(nn.sample_next_token(logits, top_p=0.7)))) == {1, 3}
    assert set(np.unique(host(nn.sample_next_token(logits, top_p=0.85)))) == {0, 1, 3}
    assert set(np.unique(host(nn.sample_next_token(logits, top_p=1.0)))) == {0, 1, 2, 3}


def test_a_tiny_temperature_is_greedy_not_nan():
    logits = mt.tensor([[1.0, 3.0, 2.0], [0.5, -1.0, 0.0]])
    np.testing.assert_array_equal(host(nn.sample_next_token(logits, temperature=1e-45)),
                                  [[1], [0]])


def test_temperature_sharpens_and_flattens_the_distribution():
    logits = probabilities_logits([0.6, 0.3, 0.1])
    cold = host(nn.sample_next_token(logits, temperature=0.25))[:, 0]
    hot = host(nn.sample_next_token(logits, temperature=4.0))[:, 0]
    p = np.array([0.6, 0.3, 0.1])
    cold_p, hot_p = p ** 4 / (p ** 4).sum(), p ** 0.25 / (p ** 0.25).sum()
    for drawn, expected in ((cold, cold_p), (hot, hot_p)):
        np.testing.assert_allclose(np.bincount(drawn, minlength=3) / drawn.size, expected,
                                   atol=0.03)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(top_k=0), "top_k must be a positive int or None, got 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\] or None, got 0.0"),
    (dict(max_new_tokens=-1), "max_new_tokens must be an int >= 0"),
    (dict(window_shift=9), r"window_shift must be an int in \[1, block_size = 8\], got 9"),
])
def test_generate_rejects_bad_sampling_settings(kwargs, message):
    kwargs = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        tiny().generate(random_ids((1, 2), 13), **kwargs)
