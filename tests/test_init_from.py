"""model.init_from: a run that starts from a pretrained model's shape, tokenizer and weights.

A Hugging Face GPT-2 folder and one of this project's runs are built here from known
arrays; the trainer starts from them (nanoGPT's init_from) with a learning rate so small
that the first step moves nothing, so the checkpoint it writes holds the source's weights.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from minitorch_gpu.checkpoint import load_checkpoint
from minitorch_gpu.train.config import config_from_dict
from minitorch_gpu.data.tokenizer import BPETokenizer
from minitorch_gpu.train.trainer import Trainer, TrainingError
from conftest import corpus_text

C, LAYERS, HEADS, CONTEXT = 32, 2, 4, 32
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_gpt2_folder(path: Path, tokenizer: BPETokenizer) -> dict:
    """A GPT2LMHeadModel folder (Conv1D weights stored (in, out)); our-named arrays back."""
    rng = np.random.default_rng(0)
    V = tokenizer.vocab_size
    ours = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (CONTEXT, C),
            "transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}
    for i in range(LAYERS):
        b = f"transformer.h.{i}."
        ours.update({b + "ln_1.weight": (C,), b + "ln_1.bias": (C,), b + "ln_2.weight": (C,),
                     b + "ln_2.bias": (C,), b + "attn.c_attn.weight": (3 * C, C),
                     b + "attn.c_attn.bias": (3 * C,), b + "attn.c_proj.weight": (C, C),
                     b + "attn.c_proj.bias": (C,), b + "mlp.c_fc.weight": (4 * C, C),
                     b + "mlp.c_fc.bias": (4 * C,), b + "mlp.c_proj.weight": (C, 4 * C),
                     b + "mlp.c_proj.bias": (C,)})
    arrays = {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in ours.items()}
    stored = {k: np.ascontiguousarray(a.T) if k.endswith(CONV1D) else a
              for k, a in arrays.items()}
    path.mkdir()
    save_file(stored, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(dict(
        model_type="gpt2", n_embd=C, n_layer=LAYERS, n_head=HEADS, n_positions=CONTEXT,
        vocab_size=V, layer_norm_epsilon=1e-5, activation_function="gelu_new")))
    (path / "tokenizer.json").write_text(tokenizer.to_tokenizers_json())
    return arrays


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "cache"))
    text = corpus_text()
    (tmp_path / "corpus.txt").write_text(text)
    tokenizer = BPETokenizer.train(text, 300)
    arrays = hf_gpt2_folder(tmp_path / "gpt2", tokenizer)
    return tmp_path, arrays, tokenizer


def run_config(tmp_path: Path, init_from: str, model: dict = None, data: dict = None,
               run: str = "ft", iters: int = 1) -> dict:
    return {"model": {"init_from": init_from, **(model or {})},
            "data": {"source": "text_files", "path": str(tmp_path / "corpus.txt"),
                     **(data or {})},
            "train": {"batch_size": 2, "max_iters": iters, "lr": 1e-12, "weight_decay": 0.0,
                      "warmup_iters": 0, "decay_lr": False},
            "eval": {"interval": 1, "iters": 1},
            "checkpoint": {"dir": str(tmp_path / "ckpts"), "run_name": run},
            "system": {"seed": 3}}


def trained_weights(tmp_path: Path, raw: dict) -> dict:
    result = Trainer(config_from_dict(raw), progress=False, log=lambda _: None).fit()
    return load_checkpoint(result.last_checkpoint or result.best_checkpoint).model


def test_a_run_starts_from_a_hugging_face_folder(source):
    tmp_path, arrays, tokenizer = source
    raw = run_config(tmp_path, str(tmp_path / "gpt2"), model={"dropout": 0.1})
    weights = trained_weights(tmp_path, raw)
    assert sorted(weights) == sorted(list(arrays) + ["lm_head.weight"])
    for key, array in arrays.items():
        np.testing.assert_allclose(weights[key], array, rtol=1e-6, atol=1e-9, err_msg=key)
    np.testing.assert_array_equal(weights["lm_head.weight"], weights["transformer.wte.weight"])
    saved = load_checkpoint(tmp_path / "ckpts" / "ft" / "last.ckpt").meta
    assert saved["model_config"]["n_layer"] == LAYERS
    assert saved["model_config"]["dropout"] == 0.1  # the run's own
    assert json.loads(saved["tokenizer"])["kind"] == "bpe"
    run_tokens = json.loads((tmp_path / "ckpts" / "ft" / "tokenizer.json").read_text())
    assert run_tokens == json.loads(tokenizer.to_json())


def test_block_size_crops_the_context(source):
    tmp_path, arrays, _ = source
    weights = trained_weights(tmp_path, run_config(tmp_path, str(tmp_path / "gpt2"),
                                                   model={"block_size": 8}))
    np.testing.assert_allclose(weights["transformer.wpe.weight"],
                               arrays["transformer.wpe.weight"][:8], rtol=1e-6, atol=1e-9)


def test_a_run_starts_from_a_run_of_ours(source):
    tmp_path, arrays, _ = source
    first = trained_weights(tmp_path, run_config(tmp_path, str(tmp_path / "gpt2"), run="a"))
    second = trained_weights(tmp_path, run_config(tmp_path, str(tmp_path / "ckpts" / "a"),
                                                  run="b"))
    for key in first:
        np.testing.assert_allclose(second[key], first[key], rtol=1e-6, atol=1e-9, err_msg=key)


@pytest.mark.parametrize("model,data,words", [
    ({"n_layer": 3}, {}, ["model.n_layer", "3", "disagrees", "2", "leave it out"]),
    ({"n_embd": 64}, {}, ["model.n_embd", "64", str(C)]),
    ({"arch": "llama"}, {}, ["model.arch", "llama", "gpt2"]),
    ({"block_size": 4 * CONTEXT}, {}, ["model.block_size", str(4 * CONTEXT), str(CONTEXT)]),
    ({}, {"tokenizer": "char"}, ["data.tokenizer", "comes from model.init_from"]),
    ({}, {"vocab_size": 1000}, ["data.vocab_size", "comes from model.init_from"]),
])
def test_keys_that_disagree_with_the_source_are_refused(source, model, data, words):
    tmp_path, _, _ = source
    raw = run_config(tmp_path, str(tmp_path / "gpt2"), model=model, data=data)
    with pytest.raises(TrainingError) as info:
        Trainer(config_from_dict(raw), progress=False, log=lambda _: None).fit()
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_keys_that_agree_with_the_source_are_accepted(source):
    tmp_path, arrays, _ = source
    raw = run_config(tmp_path, str(tmp_path / "gpt2"),
                     model={"n_layer": LAYERS, "n_embd": C, "arch": "gpt2", "bias": True})
    weights = trained_weights(tmp_path, raw)
    np.testing.assert_allclose(weights["transformer.wte.weight"],
                               arrays["transformer.wte.weight"], rtol=1e-6, atol=1e-9)


def test_a_missing_source_is_one_line(source):
    tmp_path, _, _ = source
    with pytest.raises(TrainingError, match="no such file or folder") as info:
        Trainer(config_from_dict(run_config(tmp_path, str(tmp_path / "nothing"))),
                progress=False, log=lambda _: None).fit()
    assert "\n" not in str(info.value)


def test_scratch_is_the_default_and_reads_no_source(tmp_path):
    cfg = config_from_dict({})
    assert cfg.model.init_from == "scratch"


def test_the_finetune_recipe_loads():
    from minitorch_gpu.train.config import load_config
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" /
                      "finetune_shakespeare.yaml")
    assert cfg.model.init_from == "hf:gpt2"
    assert cfg.model.given == {"init_from", "block_size", "dropout"}
