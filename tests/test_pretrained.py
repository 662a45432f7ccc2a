"""Pretrained models: Hugging Face GPT-2 and Llama folders built here from known arrays
(config.json by hand, safetensors under Hugging Face's names, a tokenizer.json of the
``tokenizers`` library), checked name by name and against a forward written out in plain
NumPy; sharded and bf16 weights, a padded vocabulary, export and load back, one-line
errors, and the CLI as a user runs it. No torch, no transformers, no network: the checks
against transformers itself are in test_pretrained_transformers.py.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tokenizers
from safetensors import safe_open
from safetensors.numpy import save_file
from threadpoolctl import threadpool_limits

import minitorch_gpu as mt
from minitorch_gpu.checkpoint import save_checkpoint
from minitorch_gpu.data import BPETokenizer, CharTokenizer
from minitorch_gpu.nn.memory import MemoryLimitError
from minitorch_gpu.nn.build import build_model
from minitorch_gpu.nn import GPTConfig
from minitorch_gpu.pretrained import Pretrained, PretrainedError, from_pretrained, \
    load_pretrained
from minitorch_gpu.pretrained.hf_export import export_hf

TEXT = ("the king said to my lord, good night. the queen said and to the lord: good. "
        "naïve café — 日本語 🙂\n") * 30
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
C, P = 32, 16  # width, GPT-2's positions (a Llama's context is LLAMA_CONTEXT)
H, HKV, F, LLAMA_CONTEXT = 4, 2, 48, 32


# --- the folders ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_bpe() -> tokenizers.Tokenizer:
    """A byte-level BPE trained with the tokenizers library itself, as GPT-2's is built."""
    hf = tokenizers.Tokenizer(tokenizers.models.BPE())
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator([TEXT], trainer=trainer)
    assert hf.get_vocab_size() == 300
    return hf


def weights_of(rng, shapes: dict, dtype) -> dict:
    """Random arrays of ``shapes``; norm gains near 1 (keys ending "norm.weight", "ln_*.weight")."""
    out = {}
    for key, shape in shapes.items():
        gain = "norm" in key or ".ln_" in key
        value = rng.standard_normal(shape) * (0.1 if gain else 0.2) + (1.0 if gain and
                                                                       key.endswith("weight")
                                                                       else 0.0)
        out[key] = value.astype(dtype)
    return out


def gpt2_config_json(vocab: int, **changes) -> dict:
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": C,
            "n_layer": 2, "n_head": H, "n_positions": P, "n_ctx": P, "vocab_size": vocab,
            "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", **changes}


def gpt2_tensors(vocab: int, dtype=np.float64, seed: int = 0) -> dict:
    """A GPT2LMHeadModel's weights under its names, Conv1D weights stored (in, out), no
    lm_head (tied: save_pretrained leaves it out)."""
    shapes = {"transformer.wte.weight": (vocab, C), "transformer.wpe.weight": (P, C)}
    for i in range(2):
        b = f"transformer.h.{i}."
        shapes.update({b + "ln_1.weight": (C,), b + "ln_1.bias": (C,),
                       b + "attn.c_attn.weight": (C, 3 * C), b + "attn.c_attn.bias": (3 * C,),
                       b + "attn.c_proj.weight": (C, C), b + "attn.c_proj.bias": (C,),
                       b + "ln_2.weight": (C,), b + "ln_2.bias": (C,),
                       b + "mlp.c_fc.weight": (C, 4 * C), b + "mlp.c_fc.bias": (4 * C,),
                       b + "mlp.c_proj.weight": (4 * C, C), b + "mlp.c_proj.bias": (C,)})
    shapes.update({"transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)})
    return weights_of(np.random.default_rng(seed), shapes, dtype)


def llama_config_json(vocab: int, **changes) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": C,
            "intermediate_size": F, "num_hidden_layers": 2, "num_attention_heads": H,
            "num_key_value_heads": HKV, "max_position_embeddings": LLAMA_CONTEXT,
            "rms_norm_eps": 1e-6, "rope_theta": 500.0, "tie_word_embeddings": False,
            "hidden_act": "silu", "vocab_size": vocab, **changes}


def llama_tensors(vocab: int, dtype=np.float64, seed: int = 1) -> dict:
    D = C // H
    shapes = {"model.embed_tokens.weight": (vocab, C)}
    for i in range(2):
        b = f"model.layers.{i}."
        shapes.update({b + "self_attn.q_proj.weight": (H * D, C),
                       b + "self_attn.k_proj.weight": (HKV * D, C),
                       b + "self_attn.v_proj.weight": (HKV * D, C),
                       b + "self_attn.o_proj.weight": (C, H * D),
                       b + "mlp.gate_proj.weight": (F, C), b + "mlp.up_proj.weight": (F, C),
                       b + "mlp.down_proj.weight": (C, F),
                       b + "input_layernorm.weight": (C,),
                       b + "post_attention_layernorm.weight": (C,)})
    shapes.update({"model.norm.weight": (C,), "lm_head.weight": (vocab, C)})
    return weights_of(np.random.default_rng(seed), shapes, dtype)


def write_folder(path: Path, config: dict, tensors: dict, tokenizer=None) -> Path:
    """A Hugging Face model folder: config.json, model.safetensors, tokenizer.json."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save(str(path / "tokenizer.json"))
    return path


def gpt2_file_variant(tensors: dict, variant: str) -> dict:
    """The same GPT-2 as the Hub spells it: "prefixed" (save_pretrained's), "bare" (the
    Hub's gpt2 file: a GPT2Model's keys h.0..., wte.weight, with the causal-mask buffers),
    "lm_head" (prefixed, the tied head written too, and the mask buffers)."""
    out = dict(tensors)
    if variant in ("bare", "lm_head"):
        mask = np.tril(np.ones((P, P), dtype=np.float32))[None, None]
        for i in range(2):
            out[f"transformer.h.{i}.attn.bias"] = mask
            out[f"transformer.h.{i}.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    if variant == "bare":
        out = {k[len("transformer."):]: v for k, v in out.items()}
    if variant == "lm_head":
        out["lm_head.weight"] = tensors["transformer.wte.weight"]
    return out


def expected_state(arch: str, tensors: dict) -> dict:
    """Our state dict's arrays for Hugging Face's (prefixed) ``tensors``: Conv1D weights
    transposed, a tied GPT-2 head the token embedding."""
    out = {k: (v.T if arch == "gpt2" and k.endswith(CONV1D) else v) for k, v in tensors.items()}
    if arch == "gpt2":
        out["lm_head.weight"] = tensors["transformer.wte.weight"]
    return out


def host(t) -> np.ndarray:
    return t.detach().cpu().numpy()


def all_logits(model, ids: np.ndarray) -> np.ndarray:
    with mt.no_grad():
        return host(model(mt.tensor(ids), all_logits=True)[0])


def assert_rel_close(got: np.ndarray, want: np.ndarray, rel: float) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error <= rel, f"relative error {error:.3g} > {rel:g}"


def ids_for(vocab: int, T: int = 12, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, (2, T))


# --- the forwards, in plain NumPy ------------------------------------------------------------
def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """q (B, Hq, T, D), k and v (B, Hkv, T, D); query head h reads key/value head
    h // (Hq / Hkv) (Hugging Face's repeat_kv); (B, T, Hq * D)."""
    B, Hq, T, D = q.shape
    group = Hq // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    return (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(B, T, Hq * D)


def heads(x: np.ndarray, n: int) -> np.ndarray:
    B, T, _ = x.shape
    return x.reshape(B, T, n, -1).transpose(0, 2, 1, 3)


def gpt2_forward(w: dict, ids: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """GPT2LMHeadModel: Conv1D weights (in, out), pre-LN blocks, tanh GELU, tied head."""
    def ln(x, name):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    T = ids.shape[1]
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:T]
    for i in range(2):
        b = f"transformer.h.{i}."
        qkv = ln(x, b + "ln_1") @ w[b + "attn.c_attn.weight"] + w[b + "attn.c_attn.bias"]
        q, k, v = (heads(part, H) for part in np.split(qkv, 3, axis=-1))
        x = x + causal_attention(q, k, v) @ w[b + "attn.c_proj.weight"] + \
            w[b + "attn.c_proj.bias"]
        hidden = gelu_new(ln(x, b + "ln_2") @ w[b + "mlp.c_fc.weight"] + w[b + "mlp.c_fc.bias"])
        x = x + hidden @ w[b + "mlp.c_proj.weight"] + w[b + "mlp.c_proj.bias"]
    return ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].T


def llama_forward(w: dict, ids: np.ndarray, theta: float = 500.0, eps: float = 1e-6,
                  tied: bool = False) -> np.ndarray:
    """LlamaForCausalLM: RMSNorm, rotate-half rotary positions of base ``theta``,
    grouped-query attention, SwiGLU, an untied head (unless ``tied``)."""
    def rms(x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w[name]

    def rotate(x):  # (B, heads, T, D)
        D = x.shape[-1]
        angles = np.outer(np.arange(x.shape[2]), theta ** (-np.arange(0, D, 2) / D))
        cos, sin = (np.concatenate([f(angles)] * 2, axis=-1) for f in (np.cos, np.sin))
        rotated = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1)
        return x * cos + rotated * sin

    def silu(x):
        return x / (1 + np.exp(-x))

    x = w["model.embed_tokens.weight"][ids]
    for i in range(2):
        b = f"model.layers.{i}."
        h = rms(x, b + "input_layernorm.weight")
        q = rotate(heads(h @ w[b + "self_attn.q_proj.weight"].T, H))
        k = rotate(heads(h @ w[b + "self_attn.k_proj.weight"].T, HKV))
        v = heads(h @ w[b + "self_attn.v_proj.weight"].T, HKV)
        x = x + causal_attention(q, k, v) @ w[b + "self_attn.o_proj.weight"].T
        h = rms(x, b + "post_attention_layernorm.weight")
        gated = silu(h @ w[b + "mlp.gate_proj.weight"].T) * (h @ w[b + "mlp.up_proj.weight"].T)
        x = x + gated @ w[b + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
    return rms(x, "model.norm.weight") @ head.T


# --- loading Hugging Face folders -------------------------------------------------------------
@pytest.mark.parametrize("variant", ["prefixed", "bare", "lm_head"])
def test_a_gpt2_folder_loads_name_by_name_and_computes_gpt2(tmp_path, hf_bpe, variant):
    tensors = gpt2_tensors(300)
    folder = write_folder(tmp_path / "gpt2", gpt2_config_json(300),
                          gpt2_file_variant(tensors, variant), hf_bpe)
    loaded = load_pretrained(folder, dtype="float64")
    assert isinstance(loaded, Pretrained) and loaded.kind == "hf" and loaded.path == folder
    assert loaded.config.arch == "gpt2" and loaded.config.vocab_size == 300
    assert (loaded.config.n_embd, loaded.config.n_layer, loaded.config.n_head,
            loaded.config.block_size, loaded.config.bias,
            loaded.config.tie_embeddings) == (C, 2, H, P, True, True)
    assert not loaded.model.training
    expected = expected_state("gpt2", tensors)
    state = loaded.model.state_dict()
    assert sorted(state) == sorted(expected)
    for key, value in state.items():
        assert host(value).dtype == np.float64, key
        np.testing.assert_array_equal(host(value), expected[key], err_msg=key)
    assert loaded.model.lm_head.weight is loaded.model.transformer.wte.weight
    ids = ids_for(300)
    assert_rel_close(all_logits(loaded.model, ids), gpt2_forward(tensors, ids), 1e-10)
    # the tokenizer is the folder's, with its ids
    assert loaded.tokenizer.kind == "bpe" and loaded.tokenizer.vocab_size == 300
    sample = "the queen said good night 🙂"
    assert loaded.tokenizer.encode(sample) == hf_bpe.encode(sample).ids
    assert loaded.tokenizer.decode(loaded.tokenizer.encode(sample)) == sample


def test_a_llama_folder_loads_name_by_name_and_computes_llama(tmp_path, hf_bpe):
    tensors = llama_tensors(300)
    folder = write_folder(tmp_path / "llama", llama_config_json(300, bos_token_id=1,
                                                                eos_token_id=2),
                          tensors, hf_bpe)
    loaded = load_pretrained(folder, dtype="float64")
    c = loaded.config
    assert (c.arch, c.n_embd, c.n_layer, c.n_head, c.n_kv_head, c.ffn_hidden, c.block_size,
            c.rope_theta, c.norm_eps, c.bias, c.tie_embeddings) == \
        ("llama", C, 2, H, HKV, F, LLAMA_CONTEXT, 500.0, 1e-6, False, False)
    assert loaded.meta == {"bos_token_id": 1, "eos_token_id": 2}
    state = loaded.model.state_dict()
    assert sorted(state) == sorted(tensors)
    for key, value in state.items():
        np.testing.assert_array_equal(host(value), tensors[key], err_msg=key)
    ids = ids_for(300, T=20)
    assert_rel_close(all_logits(loaded.model, ids), llama_forward(tensors, ids), 1e-10)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_float32_weights_load_as_float32_and_agree_to_float32_rounding(tmp_path, hf_bpe, arch):
    tensors = (gpt2_tensors if arch == "gpt2" else llama_tensors)(300, np.float32)
    config = (gpt2_config_json if arch == "gpt2" else llama_config_json)(300)
    write_folder(tmp_path / arch, config, tensors, hf_bpe)
    model = from_pretrained(tmp_path / arch)  # float32 by default
    assert all(host(v).dtype == np.float32 for v in model.state_dict().values())
    wide = {k: v.astype(np.float64) for k, v in tensors.items()}
    ids = ids_for(300)
    want = gpt2_forward(wide, ids) if arch == "gpt2" else llama_forward(wide, ids)
    assert_rel_close(all_logits(model, ids), want, 1e-5)


def test_a_sharded_llama_loads_as_the_same_model(tmp_path, hf_bpe):
    tensors = llama_tensors(300)
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(llama_config_json(300)))
    keys = list(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[:len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, part in shards.items():
        save_file({k: tensors[k] for k in part}, str(folder / name))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(v.nbytes for v in tensors.values())},
         "weight_map": {k: name for name, part in shards.items() for k in part}}))
    hf_bpe.save(str(folder / "tokenizer.json"))
    loaded = load_pretrained(folder, dtype="float64")
    for key, value in loaded.model.state_dict().items():
        np.testing.assert_array_equal(host(value), tensors[key], err_msg=key)
    ids = ids_for(300)
    assert_rel_close(all_logits(loaded.model, ids), llama_forward(tensors, ids), 1e-10)


def test_bf16_weights_are_widened_to_float32_exactly(tmp_path, hf_bpe):
    tensors = llama_tensors(300, ml_dtypes.bfloat16)
    write_folder(tmp_path / "bf16", llama_config_json(300, torch_dtype="bfloat16"), tensors,
                 hf_bpe)
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), framework="numpy") as f:
        assert f.get_slice("lm_head.weight").get_dtype() == "BF16"
    model = from_pretrained(tmp_path / "bf16")
    for key, value in model.state_dict().items():
        assert host(value).dtype == np.float32, key
        np.testing.assert_array_equal(host(value), tensors[key].astype(np.float32),
                                      err_msg=key)
    wide = {k: v.astype(np.float64) for k, v in tensors.items()}
    ids = ids_for(300)
    assert_rel_close(all_logits(model, ids), llama_forward(wide, ids), 1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_padded_vocabulary_is_cut_to_the_tokenizers_unless_kept(tmp_path, hf_bpe, arch):
    padded = 320  # the tokenizer has 300
    tensors = (gpt2_tensors if arch == "gpt2" else llama_tensors)(padded)
    config = (gpt2_config_json if arch == "gpt2" else llama_config_json)(padded)
    folder = write_folder(tmp_path / arch, config, tensors, hf_bpe)
    expected = expected_state(arch, tensors)
    ids = ids_for(300)
    full = gpt2_forward(tensors, ids) if arch == "gpt2" else llama_forward(tensors, ids)

    cut = load_pretrained(folder, dtype="float64")
    assert cut.config.vocab_size == 300 and cut.model.config.vocab_size == 300
    for key, value in cut.model.state_dict().items():
        want = expected[key][:300] if value.shape[0] != expected[key].shape[0] else expected[key]
        np.testing.assert_array_equal(host(value), want, err_msg=key)
    assert host(cut.model.lm_head.weight).shape == (300, C)
    assert_rel_close(all_logits(cut.model, ids), full[..., :300], 1e-10)

    kept = load_pretrained(folder, dtype="float64", keep_padding=True)
    assert kept.config.vocab_size == padded
    assert host(kept.model.lm_head.weight).shape == (padded, C)
    np.testing.assert_array_equal(host(kept.model.lm_head.weight), expected["lm_head.weight"])
    assert_rel_close(all_logits(kept.model, ids), full, 1e-10)


def test_block_size_crops_the_context(tmp_path, hf_bpe):
    tensors = gpt2_tensors(300)
    folder = write_folder(tmp_path / "gpt2", gpt2_config_json(300), tensors, hf_bpe)
    loaded = load_pretrained(folder, dtype="float64", block_size=8)
    assert loaded.config.block_size == 8
    np.testing.assert_array_equal(host(loaded.model.transformer.wpe.weight),
                                  tensors["transformer.wpe.weight"][:8])
    ids = ids_for(300, T=8)
    assert_rel_close(all_logits(loaded.model, ids), gpt2_forward(tensors, ids), 1e-10)
    # a run's checkpoint, the same way
    tokenizer = CharTokenizer.from_text(TEXT)
    saved = write_run(tmp_path / "run", GPTConfig(block_size=16, vocab_size=tokenizer.vocab_size,
                                                  n_layer=1, n_head=2, n_embd=16), tokenizer)
    run = load_pretrained(tmp_path / "run", block_size=8)
    assert run.config.block_size == 8 == run.model.config.block_size
    ids = ids_for(tokenizer.vocab_size, T=8)
    np.testing.assert_array_equal(all_logits(run.model, ids), all_logits(saved, ids))


def test_gpt2s_vocab_json_and_merges_txt_are_its_tokenizer_without_tokenizer_json(tmp_path,
                                                                                  hf_bpe):
    folder = write_folder(tmp_path / "gpt2", gpt2_config_json(300), gpt2_tensors(300))
    hf_bpe.model.save(str(folder))  # vocab.json, merges.txt
    tokenizer = load_pretrained(folder).tokenizer
    # <|endoftext|> is one token, as with the tokenizer.json (it was split into bytes)
    sample = "the queen said good night 🙂<|endoftext|>the king"
    assert tokenizer.kind == "bpe" and tokenizer.encode(sample) == hf_bpe.encode(sample).ids
    assert hf_bpe.token_to_id("<|endoftext|>") in tokenizer.encode(sample)
    assert tokenizer.decode(tokenizer.encode(sample)) == sample


def test_a_tied_head_is_the_embedding_whatever_else_the_file_holds(tmp_path):
    """Hugging Face ties lm_head to the token embedding: a tied config's file holding an
    lm_head.weight of other values (written by other means) gives the embedding's head.
    It was read over the shared array, so the embedding itself became the head's."""
    tensors = gpt2_tensors(300)
    folder = write_folder(tmp_path / "gpt2", gpt2_config_json(300), {
        **tensors, "lm_head.weight": tensors["transformer.wte.weight"] * 2})
    model = from_pretrained(folder, dtype="float64")
    np.testing.assert_array_equal(host(model.transformer.wte.weight),
                                  tensors["transformer.wte.weight"])
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = ids_for(300)
    assert_rel_close(all_logits(model, ids), gpt2_forward(tensors, ids), 1e-10)


def test_a_folder_without_a_tokenizer_loads_with_none(tmp_path):
    folder = write_folder(tmp_path / "bare", gpt2_config_json(300), gpt2_tensors(300))
    loaded = load_pretrained(folder)
    assert loaded.tokenizer is None and loaded.config.vocab_size == 300


def test_the_package_root_loads_pretrained_models(tmp_path, hf_bpe):
    tensors = llama_tensors(300)
    folder = write_folder(tmp_path / "llama", llama_config_json(300), tensors, hf_bpe)
    model = mt.from_pretrained(str(folder), dtype="float64")
    assert type(model).__name__ == "Llama" and not model.training
    ids = ids_for(300)
    assert_rel_close(all_logits(model, ids), llama_forward(tensors, ids), 1e-10)


# --- export, and load back ---------------------------------------------------------------------
def randomized(config: GPTConfig, seed: int = 3):
    """A model of ``config`` whose every parameter (biases, norm gains too) is random."""
    model = build_model(config)
    rng = np.random.default_rng(seed)
    state = {}
    for key, value in model.state_dict().items():
        shape = tuple(value.shape)
        base = 1.0 if len(shape) == 1 and ("ln_" in key or "norm" in key) and \
            key.endswith("weight") else 0.0
        state[key] = (base + rng.standard_normal(shape) * (0.1 if len(shape) == 1 else 0.2)
                      ).astype(np.float32)
    model.load_state_dict(state)
    return model.eval()


def write_run(run_dir: Path, config: GPTConfig, tokenizer, seed: int = 3):
    """A run directory with a best.ckpt as the trainer saves it; the model saved."""
    model = randomized(config, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_checkpoint(run_dir / "best.ckpt", model.state_dict(), None,
                    {"model_config": dataclasses.asdict(config),
                     "tokenizer": tokenizer.to_json(), "dtype": "float32", "iter": 10})
    return model


def tokenizer_of(kind: str):
    return CharTokenizer.from_text(TEXT) if kind == "char" else BPETokenizer.train(TEXT, 300)


EXPORTS = {
    "gpt2-no-bias": dict(arch="gpt2", bias=False),
    "gpt2-bias": dict(arch="gpt2", bias=True),
    "gpt2-untied": dict(arch="gpt2", bias=True, tie_embeddings=False),
    "llama-gqa-untied": dict(arch="llama", n_kv_head=2, ffn_hidden=48, rope_theta=500.0),
    "llama-tied": dict(arch="llama", n_kv_head=2, ffn_hidden=48, tie_embeddings=True),
    "llama-bias": dict(arch="llama", n_kv_head=1, ffn_hidden=48, bias=True),
}


@pytest.mark.parametrize("tokenizer_kind", ["char", "bpe"])
@pytest.mark.parametrize("shape", list(EXPORTS))
def test_an_exported_run_loads_back_with_the_same_logits_and_tokenizer(tmp_path, shape,
                                                                       tokenizer_kind):
    tokenizer = tokenizer_of(tokenizer_kind)
    config = GPTConfig(block_size=16, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4,
                       n_embd=32, **EXPORTS[shape])
    saved = write_run(tmp_path / "run", config, tokenizer)
    out = export_hf(tmp_path / "run", tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == \
        ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["model_type"] == config.arch and \
        hf_config["tie_word_embeddings"] == config.tie_embeddings
    with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
        keys = set(f.keys())
        assert {f.get_slice(k).get_dtype() for k in keys} == {"F32"}
    assert ("lm_head.weight" in keys) == (not config.tie_embeddings)
    if config.arch == "gpt2":  # Conv1D (in, out) in the file
        np.testing.assert_array_equal(
            f_tensor(out, "transformer.h.0.attn.c_attn.weight"),
            host(saved.transformer.h[0].attn.c_attn.weight).T)

    back = load_pretrained(out)
    assert back.kind == "hf" and back.config.arch == config.arch
    assert back.tokenizer.kind == tokenizer.kind
    assert back.tokenizer.vocab_size == tokenizer.vocab_size
    sample = "the king said: good night 🙂 naïve"
    assert back.tokenizer.encode(sample) == tokenizer.encode(sample)
    assert back.tokenizer.decode(tokenizer.encode(sample)) == sample
    ids = ids_for(tokenizer.vocab_size)
    np.testing.assert_allclose(all_logits(back.model, ids), all_logits(saved, ids),
                               rtol=0, atol=1e-6)
    if config.bias or config.arch == "llama":  # the same arrays, the same arithmetic
        np.testing.assert_array_equal(all_logits(back.model, ids), all_logits(saved, ids))
    # the run itself, loaded the same way, is the model that was saved
    run = load_pretrained(tmp_path / "run")
    assert run.kind == "checkpoint" and run.path == tmp_path / "run" / "best.ckpt"
    np.testing.assert_array_equal(all_logits(run.model, ids), all_logits(saved, ids))


def f_tensor(folder: Path, key: str) -> np.ndarray:
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        return f.get_tensor(key)


def test_a_padded_run_exports_its_padding_and_loads_back_cut(tmp_path):
    tokenizer = CharTokenizer.from_text(TEXT)
    config = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32)
    assert tokenizer.vocab_size < 64
    saved = write_run(tmp_path / "run", config, tokenizer)
    out = export_hf(tmp_path / "run", tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 64
    ids = ids_for(tokenizer.vocab_size)
    np.testing.assert_array_equal(
        all_logits(load_pretrained(out, keep_padding=True).model, ids), all_logits(saved, ids))
    cut = load_pretrained(out)
    assert cut.config.vocab_size == tokenizer.vocab_size
    # a narrower head: another BLAS blocking, so float32 rounding rather than equal bits
    np.testing.assert_allclose(all_logits(cut.model, ids),
                               all_logits(saved, ids)[..., :tokenizer.vocab_size],
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_bf16_export_stores_bf16_and_loads_within_its_rounding(tmp_path, arch):
    tokenizer = CharTokenizer.from_text(TEXT)
    extra = dict(n_kv_head=2, ffn_hidden=48) if arch == "llama" else {}
    config = GPTConfig(block_size=16, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4,
                       n_embd=32, arch=arch, **extra)
    saved = write_run(tmp_path / "run", config, tokenizer)
    out = export_hf(tmp_path / "run", tmp_path / "hf", dtype="bf16")
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    back = load_pretrained(out)
    for key, value in back.model.state_dict().items():
        rounded = host(saved.state_dict()[key]).astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(host(value), rounded, err_msg=key)
    ids = ids_for(tokenizer.vocab_size)
    assert_rel_close(all_logits(back.model, ids), all_logits(saved, ids), 5e-2)


def test_an_hf_folder_exports_as_itself(tmp_path, hf_bpe):
    tensors = gpt2_tensors(300, np.float32)
    folder = write_folder(tmp_path / "gpt2", gpt2_config_json(300, bos_token_id=299,
                                                              eos_token_id=299),
                          gpt2_file_variant(tensors, "bare"), hf_bpe)
    out = export_hf(folder, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (299, 299)
    with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
        assert set(f.keys()) == set(tensors)
        for key in tensors:
            np.testing.assert_array_equal(f.get_tensor(key), tensors[key], err_msg=key)
    assert json.loads((out / "tokenizer.json").read_text())["model"]["vocab"] == \
        hf_bpe.get_vocab()
    # Llama 3 lists its end-of-turn ids: the list was dropped (written as null)
    folder = write_folder(tmp_path / "llama", llama_config_json(300, bos_token_id=1,
                                                                eos_token_id=[2, 3]),
                          llama_tensors(300, np.float32), hf_bpe)
    assert load_pretrained(folder).meta == {"bos_token_id": 1, "eos_token_id": [2, 3]}
    config = json.loads((export_hf(folder, tmp_path / "llama_out") / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, [2, 3])


def test_export_overwrites_only_when_asked(tmp_path):
    tokenizer = CharTokenizer.from_text(TEXT)
    config = GPTConfig(block_size=16, vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2,
                       n_embd=16)
    write_run(tmp_path / "run", config, tokenizer)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("keep me")
    with pytest.raises(PretrainedError) as info:
        export_hf(tmp_path / "run", tmp_path / "out")
    assert_one_line(info.value, "is not empty", "--overwrite")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["notes.txt"]
    export_hf(tmp_path / "run", tmp_path / "out", overwrite=True)
    assert (tmp_path / "out" / "config.json").is_file()
    assert (tmp_path / "out" / "notes.txt").read_text() == "keep me"
    # a model without a tokenizer over that export: the run's tokenizer.json was left
    # there, and the GPT-2's 300 tokens were cut to its 32 characters on load
    folder = write_folder(tmp_path / "gpt2", gpt2_config_json(300), gpt2_tensors(300))
    export_hf(folder, tmp_path / "out", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == \
        ["config.json", "model.safetensors", "notes.txt"]
    again = load_pretrained(tmp_path / "out")
    assert again.tokenizer is None and again.config.vocab_size == 300
    (tmp_path / "file").write_text("x")
    with pytest.raises(PretrainedError) as info:
        export_hf(tmp_path / "run", tmp_path / "file")
    assert_one_line(info.value, "is not a folder")
    with pytest.raises(PretrainedError) as info:
        export_hf(tmp_path / "run", tmp_path / "new", dtype="float16")
    assert_one_line(info.value, "dtype must be one of float32, bf16")


# --- bad inputs: one line each -------------------------------------------------------------------
def assert_one_line(error: Exception, *fragments: str) -> None:
    message = str(error)
    assert message and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


def good_gpt2(path: Path, hf_bpe=None, config_changes=None, tensors=None) -> Path:
    return write_folder(path, gpt2_config_json(300, **(config_changes or {})),
                        gpt2_tensors(300, np.float32) if tensors is None else tensors, hf_bpe)


def good_llama(path: Path, config_changes=None, tensors=None) -> Path:
    return write_folder(path, llama_config_json(300, **(config_changes or {})),
                        llama_tensors(300, np.float32) if tensors is None else tensors)


def without(tensors: dict, key: str) -> dict:
    return {k: v for k, v in tensors.items() if k != key}


def _truncated(path: Path) -> Path:
    folder = good_gpt2(path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:len(data) // 2])
    return folder


def _pickle_only(path: Path) -> Path:
    folder = good_gpt2(path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really a pickle")
    return folder


def _config_only(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(gpt2_config_json(300)))
    return path


def _bad_index(path: Path) -> Path:
    folder = good_llama(path)
    (folder / "model.safetensors").rename(folder / "a.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "a.safetensors",
                        "lm_head.weight": "../elsewhere.safetensors"}}))
    return folder


def _no_config(path: Path) -> Path:
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"")
    return path


def _broken_json(path: Path) -> Path:
    folder = good_gpt2(path)
    (folder / "config.json").write_text("{not json")
    return folder


def _int_weights(path: Path) -> Path:
    tensors = gpt2_tensors(300, np.float32)
    tensors["transformer.wpe.weight"] = np.zeros((P, C), dtype=np.int32)
    return good_gpt2(path, tensors=tensors)


BAD_FOLDERS = {
    "missing folder": (lambda p: p / "nowhere", "no such file or folder"),
    "no config.json": (_no_config, "neither a Hugging Face model folder (no config.json)"),
    "unknown model_type": (lambda p: good_gpt2(p, config_changes={"model_type": "mistral"}),
                           "model_type 'mistral' is not one this project builds"),
    "broken config.json": (_broken_json, "not readable JSON"),
    "shape disagrees": (lambda p: good_gpt2(p, config_changes={"n_positions": 32}),
                        "transformer.wpe.weight has shape (16, 32), but config.json's model "
                        "needs (32, 32)"),
    "more position rows than declared": (
        lambda p: good_gpt2(p, config_changes={"n_positions": 8}),
        "transformer.wpe.weight has 16 rows, but config.json's model has 8"),
    "conv1d shape": (lambda p: good_gpt2(p, tensors={
        **gpt2_tensors(300, np.float32),
        "transformer.h.1.mlp.c_fc.weight": np.zeros((4 * C, C), np.float32)}),
        "transformer.h.1.mlp.c_fc.weight has shape (128, 32), but config.json's model needs "
        "(32, 128) (stored transposed, as Conv1D)"),
    "missing weight": (lambda p: good_llama(p, tensors=without(llama_tensors(300, np.float32),
                                                               "model.layers.1.mlp.up_proj"
                                                               ".weight")),
                       "1 weight(s) of the llama that config.json describes are not in the "
                       "weights files: model.layers.1.mlp.up_proj.weight"),
    "untied head missing": (lambda p: good_llama(p, tensors=without(
        llama_tensors(300, np.float32), "lm_head.weight")), "lm_head.weight"),
    "unexpected weight": (lambda p: good_gpt2(p, tensors={
        **gpt2_tensors(300, np.float32), "transformer.h.2.ln_1.weight": np.ones(C, np.float32)}),
        "1 tensor(s) that the gpt2 config.json describes has no place for: "
        "transformer.h.2.ln_1.weight"),
    "integer weights": (_int_weights, "transformer.wpe.weight is I32; expected floats"),
    "both spellings": (lambda p: good_gpt2(p, tensors={
        **gpt2_tensors(300, np.float32), "wte.weight": np.zeros((300, C), np.float32)}),
        "hold both transformer.wte.weight and wte.weight, one weight spelt two ways"),
    "pickle only": (_pickle_only, "holds pytorch_model.bin, not safetensors"),
    "no weights": (_config_only, "no model.safetensors"),
    "truncated": (_truncated, "not a readable safetensors file"),
    "index names a file outside": (_bad_index, "'../elsewhere.safetensors', which is not a "
                                               "file in the folder"),
    "rope_scaling llama3": (lambda p: good_llama(p, config_changes={"rope_scaling": {
        "rope_type": "llama3", "factor": 8.0}}), "rope_scaling"),
    "rope_parameters yarn": (lambda p: good_llama(p, config_changes={"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 500.0}}), "rotary scaling 'yarn'"),
    "exact gelu": (lambda p: good_gpt2(p, config_changes={"activation_function": "gelu"}),
                   "activation_function = 'gelu'"),
    "mlp_bias without attention_bias": (
        lambda p: good_llama(p, config_changes={"mlp_bias": True}),
        "mlp_bias = True: must equal attention_bias (False)"),
    "head_dim": (lambda p: good_llama(p, config_changes={"head_dim": 16}), "head_dim = 16"),
    "heads do not divide": (lambda p: good_llama(p, config_changes={"num_key_value_heads": 3}),
                            "n_kv_head"),
    "hidden_size a string": (lambda p: good_llama(p, config_changes={"hidden_size": "32"}),
                             "hidden_size must be a positive int, got '32'"),
    "inverse layer scaling": (
        lambda p: good_gpt2(p, config_changes={"scale_attn_by_inverse_layer_idx": True}),
        "scale_attn_by_inverse_layer_idx"),
}


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_a_bad_folder_is_one_line_naming_the_problem(tmp_path, case):
    make, fragment = BAD_FOLDERS[case]
    source = make(tmp_path / "model")
    with pytest.raises(PretrainedError) as info:
        load_pretrained(source)
    assert_one_line(info.value, fragment)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path, hf_bpe):
    folder = write_folder(tmp_path / "small", gpt2_config_json(280), gpt2_tensors(280), hf_bpe)
    with pytest.raises(PretrainedError) as info:
        load_pretrained(folder)
    assert_one_line(info.value, "the tokenizer has 300 tokens but config.json's vocab_size "
                                "is 280")


@pytest.mark.parametrize("source", ["folder", "run"])
@pytest.mark.parametrize("options, fragment", [
    (dict(dtype="bf16"), "dtype must be one of float32, float64, got 'bf16'"),
    (dict(block_size=0), "block_size must be a positive int, got 0"),
    (dict(block_size=True), "block_size must be a positive int, got True"),
    (dict(block_size="8"), "block_size must be a positive int, got '8'"),
])
def test_bad_options_are_one_line(tmp_path, source, options, fragment):
    """A run's block_size was checked by crop_block_size, after the checkpoint was read:
    a ValueError of its own, or a TypeError comparing a string."""
    if source == "folder":
        path = good_gpt2(tmp_path / "gpt2")
    else:
        tokenizer = CharTokenizer.from_text(TEXT)
        path = tmp_path / "run"
        write_run(path, GPTConfig(block_size=16, vocab_size=tokenizer.vocab_size, n_layer=1,
                                  n_head=2, n_embd=16), tokenizer)
    with pytest.raises(PretrainedError) as info:
        load_pretrained(path, **options)
    assert_one_line(info.value, fragment)


def test_a_model_past_the_memory_is_refused_in_one_line_before_anything_is_read(tmp_path):
    """A config.json claiming a 70B-sized Llama: the default check refuses it from the
    config alone (the weights file here is a few bytes, never opened)."""
    folder = tmp_path / "huge"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(llama_config_json(
        128256, hidden_size=65536, intermediate_size=229376, num_hidden_layers=400,
        num_attention_heads=512, num_key_value_heads=64, max_position_embeddings=131072)))
    (folder / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(MemoryLimitError) as info:
        load_pretrained(folder)
    assert_one_line(info.value, "check_memory=False")
    run = cli("generate", folder, "--prompt", "a", cwd=tmp_path)
    assert_cli_error(run, "generate", "--ignore-memory-check")


def test_a_memory_check_runs_before_any_weight_is_read(tmp_path):
    folder = good_llama(tmp_path / "llama")
    (folder / "model.safetensors").write_bytes(b"not read")  # a refusal comes first
    seen = []

    def refuse(config, dtype):
        seen.append((config.arch, config.n_kv_head, dtype))
        raise PretrainedError("too big")

    with pytest.raises(PretrainedError, match="too big"):
        load_pretrained(folder, dtype="float64", check_memory=refuse)
    assert seen == [("llama", HKV, "float64")]


@pytest.mark.parametrize("name, fragment", [
    ("minitorch-gpu-tests/no-such-model", "offline, download the model folder"),
    ("../etc", "expected a Hub model name such as hf:gpt2"),
    ("a/b/c", "expected a Hub model name such as hf:gpt2"),
    ("", "expected a Hub model name such as hf:gpt2"),
])
def test_hub_names_offline_or_invalid_are_one_line(tmp_path, monkeypatch, name, fragment):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # read from the environment when first imported
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf_home"))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    with pytest.raises(PretrainedError) as info:
        load_pretrained("hf:" + name)
    assert_one_line(info.value, f"hf:{name}", fragment)
    if "offline" in fragment:
        assert f"https://huggingface.co/{name}" in str(info.value)


def hub_cache(home: Path, name: str, folder_writer) -> Path:
    """huggingface_hub's cache under ``home`` holding the model ``name``, as a download
    leaves it: models--OWNER--NAME/refs/main naming a snapshot folder."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = home / "hub" / ("models--" + name.replace("/", "--"))
    folder_writer(repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def test_a_cached_hub_model_loads_offline(tmp_path, monkeypatch, hf_bpe):
    home = tmp_path / "hf_home"
    tensors = llama_tensors(300)
    snapshot = hub_cache(home, "tests/tiny-llama", lambda p: write_folder(
        p, llama_config_json(300), tensors, hf_bpe))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # read from the environment when first imported
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    loaded = load_pretrained("hf:tests/tiny-llama", dtype="float64")
    assert loaded.kind == "hf" and loaded.path == snapshot and loaded.source == \
        "hf:tests/tiny-llama"
    ids = ids_for(300)
    assert_rel_close(all_logits(loaded.model, ids), llama_forward(tensors, ids), 1e-10)
    run = cli("generate", "hf:tests/tiny-llama", "--prompt", "the king", "--max-new-tokens", 3,
              cwd=tmp_path, env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(home),
                                 "HF_HUB_CACHE": str(home / "hub")})
    assert run.returncode == 0 and run.stdout.startswith("the king"), run.stderr


# --- the CLI ---------------------------------------------------------------------------------------
def cli(*args, cwd: Path, env=None) -> subprocess.CompletedProcess:
    environment = {**os.environ, "MINITORCH_GPU_CACHE": str(cwd / "cache"),
                   "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                   "OPENBLAS_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "minitorch_gpu", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=240, env=environment)


def assert_cli_error(run: subprocess.CompletedProcess, command: str, fragment: str) -> None:
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"minitorch-gpu {command}: error: "), \
        run.stderr
    assert fragment in lines[0] and run.stdout == ""


def test_generate_samples_from_a_folder_and_greedy_matches_the_api(tmp_path, hf_bpe):
    folder = write_folder(tmp_path / "llama", llama_config_json(300),
                          llama_tensors(300, np.float32), hf_bpe)
    run = cli("generate", folder, "--prompt", "the king", "--max-new-tokens", 5, "--seed", 1,
              cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("the king") and len(run.stdout) > len("the king\n")

    greedy = cli("generate", folder, "--prompt", "the king", "--max-new-tokens", 5,
                 "--temperature", 0, cwd=tmp_path)
    assert greedy.returncode == 0, greedy.stderr
    loaded = load_pretrained(folder)
    prompt = loaded.tokenizer.encode("the king")
    # on one BLAS thread, as the CLI's process (``cli`` sets OPENBLAS_NUM_THREADS=1): the
    # same arithmetic, so the same logits to the bit and the same greedy tokens (OpenBLAS
    # may sum a product in another order on two threads than on one)
    with threadpool_limits(limits=1, user_api="blas"):
        out = loaded.model.generate(mt.tensor([prompt]), 5, temperature=0.0)
    assert greedy.stdout == loaded.tokenizer.decode(host(out)[0].tolist()) + "\n"


def test_generate_needs_a_tokenizer(tmp_path):
    folder = good_gpt2(tmp_path / "no_tokenizer")
    run = cli("generate", folder, "--prompt", "a", "--max-new-tokens", 2, cwd=tmp_path)
    assert_cli_error(run, "generate", "has no tokenizer")


@pytest.mark.parametrize("source, fragment", [
    ("nowhere", "no such file or folder"),
    ("hf:bad//name", "expected a Hub model name"),
    ("hf:minitorch-gpu-tests/no-such-model", "offline, download the model folder"),
])
def test_generate_and_export_of_a_bad_source_are_one_line(tmp_path, source, fragment):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"),
           "HF_HUB_CACHE": str(tmp_path / "hf_home" / "hub")}
    assert_cli_error(cli("generate", source, "--prompt", "a", cwd=tmp_path, env=env),
                     "generate", fragment)
    assert_cli_error(cli("export", source, tmp_path / "out", cwd=tmp_path, env=env), "export",
                     fragment)
    assert not (tmp_path / "out").exists()


def test_export_a_run_then_generate_from_the_export(tmp_path):
    tokenizer = CharTokenizer.from_text(TEXT)
    config = GPTConfig(block_size=16, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4,
                       n_embd=32, arch="llama", n_kv_head=2)
    write_run(tmp_path / "run", config, tokenizer)
    run = cli("export", tmp_path / "run", tmp_path / "hf", "--format", "hf", "--dtype", "bf16",
              cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert str(tmp_path / "hf") in run.stdout and "model.safetensors" in run.stdout
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == \
        "bfloat16"
    gen = cli("generate", tmp_path / "hf", "--prompt", "the queen", "--max-new-tokens", 5,
              "--seed", 1, cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("the queen") and len(gen.stdout) == len("the queen") + 5 + 1
    again = cli("export", tmp_path / "run", tmp_path / "hf", cwd=tmp_path)
    assert_cli_error(again, "export", "the folder is not empty")
    assert cli("export", tmp_path / "run", tmp_path / "hf", "--overwrite",
               cwd=tmp_path).returncode == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == \
        "float32"
