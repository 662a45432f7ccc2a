"""Pretrained models against Hugging Face's transformers itself (development only: skipped
where torch or transformers is missing, as in CI): its tiny random GPT2LMHeadModel and
LlamaForCausalLM, saved with save_pretrained, load here with its logits; a run exported
here loads in AutoModelForCausalLM and AutoTokenizer with ours."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from minitorch_gpu.nn import GPTConfig  # noqa: E402
from minitorch_gpu.pretrained import load_pretrained  # noqa: E402
from minitorch_gpu.pretrained.hf_export import export_hf  # noqa: E402
from test_pretrained import all_logits, assert_rel_close, ids_for, tokenizer_of, \
    write_run  # noqa: E402

SAMPLE = "the king said: good night 🙂 naïve"


def randomize(model, seed: int = 0):
    """Every parameter random and of order one (a fresh model's are 0.02 and zeros, which
    would hide a bias or a norm gain read wrong)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator) * (0.1 if p.ndim == 1 else 0.2)
            gain = p.ndim == 1 and ("ln_" in name or "norm" in name) and name.endswith("weight")
            p.copy_(noise + (1.0 if gain else 0.0))
    return model.eval()


def theirs(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()


def hf_model(arch: str, vocab: int, tied: bool = False):
    if arch == "gpt2":
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                         vocab_size=vocab, attn_implementation="eager")
        return randomize(transformers.GPT2LMHeadModel(config))
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, rope_theta=500.0,
        rms_norm_eps=1e-6, tie_word_embeddings=tied, vocab_size=vocab,
        attn_implementation="eager")
    return randomize(transformers.LlamaForCausalLM(config))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_save_pretrained_folder_loads_here_with_its_logits(tmp_path, arch):
    bpe = tokenizer_of("bpe")
    model = hf_model(arch, bpe.vocab_size)
    model.save_pretrained(tmp_path / arch)  # safetensors
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe.hf).save_pretrained(tmp_path / arch)
    loaded = load_pretrained(tmp_path / arch)
    assert loaded.config.arch == arch and loaded.tokenizer.kind == "bpe"
    if arch == "llama":
        assert loaded.config.n_kv_head == 2 and not loaded.config.tie_embeddings
    assert loaded.tokenizer.encode(SAMPLE) == bpe.encode(SAMPLE)
    ids = ids_for(bpe.vocab_size)
    assert_rel_close(all_logits(loaded.model, ids), theirs(model, ids), 1e-4)


@pytest.mark.parametrize("tokenizer_kind", ["char", "bpe"])
@pytest.mark.parametrize("shape", [
    dict(arch="gpt2", bias=False), dict(arch="gpt2", bias=True),
    dict(arch="gpt2", tie_embeddings=False),
    dict(arch="llama", n_kv_head=2, ffn_hidden=48, rope_theta=500.0),
    dict(arch="llama", n_kv_head=2, ffn_hidden=48, tie_embeddings=True),
    dict(arch="llama", n_kv_head=1, ffn_hidden=48, bias=True),
], ids=["gpt2-no-bias", "gpt2-bias", "gpt2-untied", "llama-gqa-untied", "llama-tied",
        "llama-bias"])
def test_an_exported_run_loads_in_transformers_with_our_logits_and_ids(tmp_path, shape,
                                                                       tokenizer_kind):
    tokenizer = tokenizer_of(tokenizer_kind)
    config = GPTConfig(block_size=16, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4,
                       n_embd=32, **shape)
    saved = write_run(tmp_path / "run", config, tokenizer)
    out = export_hf(tmp_path / "run", tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager").eval()
    assert type(model).__name__ == ("GPT2LMHeadModel" if config.arch == "gpt2"
                                    else "LlamaForCausalLM")
    ids = ids_for(tokenizer.vocab_size)
    assert_rel_close(theirs(model, ids), all_logits(saved, ids), 1e-4)

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tokenizer(SAMPLE)["input_ids"] == tokenizer.encode(SAMPLE)
    assert hf_tokenizer.decode(tokenizer.encode(SAMPLE)) == SAMPLE


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_bf16_export_loads_in_transformers_as_bf16_with_the_same_weights(tmp_path, arch):
    tokenizer = tokenizer_of("char")
    extra = dict(n_kv_head=2, ffn_hidden=48) if arch == "llama" else {}
    config = GPTConfig(block_size=16, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4,
                       n_embd=32, arch=arch, **extra)
    write_run(tmp_path / "run", config, tokenizer)
    out = export_hf(tmp_path / "run", tmp_path / "hf", dtype="bf16")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager").eval()
    assert model.dtype == torch.bfloat16  # config.json's torch_dtype, read as "auto"
    ours = load_pretrained(out)  # the same bf16 values, widened
    ids = ids_for(tokenizer.vocab_size)
    assert_rel_close(theirs(model.float(), ids), all_logits(ours.model, ids), 1e-4)
