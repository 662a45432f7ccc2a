"""Generation from checkpoints: loading, and streaming text that never shows half a character."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn as nn
from minitorch_gpu.checkpoint import CheckpointError, save_checkpoint
from minitorch_gpu.data import BPETokenizer, CharTokenizer
from minitorch_gpu.pretrained.inference import load_for_inference, resolve_checkpoint, stream_text

TEXT = "naïve café — 日本語のテキスト, emoji 🙂 and plain ascii.\n" * 20


class ScriptedModel:
    """Stands in for a GPT: yields a fixed sequence of token ids, one (1, 1) tensor each."""

    def __init__(self, ids):
        self.ids = ids
        self.lm_head = nn.Linear(2, 2, bias=False)  # stream_text reads the device here

    def generate_tokens(self, idx, max_new_tokens, *sampling, capture=True):
        for i in self.ids[:max_new_tokens]:
            yield mt.tensor([[i]])


@pytest.mark.parametrize("make", [lambda: BPETokenizer.train(TEXT, 300),
                                  lambda: CharTokenizer.from_text(TEXT)],
                         ids=["bpe", "char"])
def test_streamed_pieces_join_to_the_text_and_never_split_a_character(make):
    tokenizer = make()
    target = "café 日本語 🙂 naïve"
    ids = tokenizer.encode(target)
    if tokenizer.kind == "bpe":  # byte-level: some tokens must end inside a character
        partial = [tokenizer.decode(ids[:i]) for i in range(1, len(ids))]
        assert any(p.endswith("\ufffd") for p in partial)
    pieces = list(stream_text(ScriptedModel(ids), tokenizer, "a", len(ids)))
    assert "".join(pieces) == target
    assert not any("\ufffd" in p for p in pieces)


def test_bytes_that_never_make_a_character_are_shown_rather_than_held_forever():
    tokenizer = BPETokenizer.train(TEXT, 300)
    ids = tokenizer.encode("日本語")
    cut = next(i for i in range(1, len(ids) + 1)
               if tokenizer.decode(ids[:i]).endswith("\ufffd"))
    broken = [ids[cut - 1]] * 20  # a character's first bytes, over and over
    pieces = list(stream_text(ScriptedModel(broken), tokenizer, "a", 20))
    assert len(pieces) >= 2 and "".join(pieces) == tokenizer.decode(broken[:8]) * 2 + \
        tokenizer.decode(broken[:4])


def test_an_empty_prompt_is_refused():
    tokenizer = CharTokenizer.from_text(TEXT)
    with pytest.raises(ValueError, match="the prompt encodes to no tokens"):
        list(stream_text(ScriptedModel([1, 2]), tokenizer, "", 2))


def tiny_checkpoint(path, tok, **meta_changes):
    tokenizer = tok
    config = nn.GPTConfig(block_size=8, vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2,
                          n_embd=8)
    model = nn.GPT(config)
    meta = {"model_config": {"block_size": 8, "vocab_size": tokenizer.vocab_size,
                             "n_layer": 1, "n_head": 2, "n_embd": 8, "dropout": 0.0,
                             "bias": True},
            "tokenizer": tokenizer.to_json(), "dtype": "float32", **meta_changes}
    save_checkpoint(path, model.state_dict(), None, meta)
    return model


def test_a_checkpoint_loads_as_the_model_that_was_saved(tmp_path):
    tokenizer = CharTokenizer.from_text(TEXT)
    saved = tiny_checkpoint(tmp_path / "best.ckpt", tokenizer)
    model, loaded_tokenizer, meta = load_for_inference(tmp_path)  # the directory: best.ckpt
    assert not model.training and loaded_tokenizer.encode("café") == tokenizer.encode("café")
    idx = mt.tensor([tokenizer.encode("naïve")])
    with mt.no_grad():
        np.testing.assert_array_equal(model(idx)[0].numpy(), saved.eval()(idx)[0].numpy())


def test_a_directory_prefers_best_then_last(tmp_path):
    tokenizer = CharTokenizer.from_text(TEXT)
    tiny_checkpoint(tmp_path / "last.ckpt", tokenizer)
    assert resolve_checkpoint(tmp_path) == tmp_path / "last.ckpt"
    tiny_checkpoint(tmp_path / "best.ckpt", tokenizer)
    assert resolve_checkpoint(tmp_path) == tmp_path / "best.ckpt"


@pytest.mark.parametrize("change, message", [
    (dict(model_config={"n_layer": 1}), "no usable model config or tokenizer"),
    (dict(tokenizer="{not json"), "no usable model config or tokenizer"),
    (dict(tokenizer=None), "no usable model config or tokenizer"),
    (dict(model_config={"block_size": 8, "vocab_size": 500, "n_layer": 1, "n_head": 2,
                        "n_embd": 8, "dropout": 0.0, "bias": True}),
     "the weights do not fit the model it describes"),
])
def test_a_checkpoint_whose_parts_disagree_is_one_clear_error(tmp_path, change, message):
    tiny_checkpoint(tmp_path / "x.ckpt", CharTokenizer.from_text(TEXT), **change)
    with pytest.raises(CheckpointError, match=message) as info:
        load_for_inference(tmp_path / "x.ckpt")
    assert "\n" not in str(info.value)


def test_a_padded_vocabulary_is_cut_to_the_tokenizers_so_padding_is_never_drawn(tmp_path):
    """model.pad_vocab_to (nanoGPT's 50304 for GPT-2's 50257): the padding ids have logits
    but no text. The loaded model scores only the tokenizer's ids, the same logits as the
    padded model's first rows, so sampling is among real tokens."""
    tokenizer = CharTokenizer.from_text(TEXT)
    vocab, padded = tokenizer.vocab_size, -(-tokenizer.vocab_size // 64) * 64 + 64
    config = nn.GPTConfig(block_size=8, vocab_size=padded, n_layer=1, n_head=2, n_embd=8)
    mt.manual_seed(0)
    saved = nn.GPT(config)
    save_checkpoint(tmp_path / "best.ckpt", saved.state_dict(), None,
                    {"model_config": {"block_size": 8, "vocab_size": padded, "n_layer": 1,
                                      "n_head": 2, "n_embd": 8, "dropout": 0.0, "bias": True},
                     "tokenizer": tokenizer.to_json(), "dtype": "float32"})
    model, _, meta = load_for_inference(tmp_path)
    assert model.config.vocab_size == vocab and meta["model_config"]["vocab_size"] == padded
    idx = mt.tensor([tokenizer.encode("naïve")])
    with mt.no_grad():
        np.testing.assert_allclose(model(idx)[0].numpy(),
                                   saved.eval()(idx)[0].numpy()[..., :vocab], rtol=1e-6)
    mt.manual_seed(1)  # near-uniform draws: most ids of the padded table are padding
    text = "".join(stream_text(model, tokenizer, "a", 300, temperature=100.0))
    assert len(text) == 300
    exact, _, _ = load_for_inference(tmp_path, keep_padding=True)  # the model as trained
    assert exact.config.vocab_size == padded


@pytest.mark.parametrize("arch, fields", [
    ("llama", dict(n_kv_head=1)), ("llama", dict(tie_embeddings=True)),
    ("gpt2", dict(tie_embeddings=False)),
], ids=["llama", "llama-tied", "gpt2-untied"])
def test_a_llama_or_untied_checkpoint_loads_with_its_padded_vocabulary_cut(tmp_path, arch,
                                                                           fields):
    """The Llama's model.embed_tokens.weight and an untied lm_head.weight are vocabulary
    rows too: both are cut back to the tokenizer's, and the logits are the saved model's."""
    import dataclasses
    tokenizer = CharTokenizer.from_text(TEXT)
    vocab, padded = tokenizer.vocab_size, -(-tokenizer.vocab_size // 64) * 64 + 64
    config = nn.GPTConfig(arch=arch, block_size=8, vocab_size=padded, n_layer=2, n_head=2,
                          n_embd=8, **fields)
    mt.manual_seed(0)
    saved = nn.model_for(config)
    save_checkpoint(tmp_path / "best.ckpt", saved.state_dict(), None,
                    {"model_config": dataclasses.asdict(config),
                     "tokenizer": tokenizer.to_json(), "dtype": "float32"})
    model, _, meta = load_for_inference(tmp_path)
    assert type(model) is type(saved) and model.config.vocab_size == vocab
    assert model.config.tie_embeddings == config.tie_embeddings
    idx = mt.tensor([tokenizer.encode("naïve")])
    with mt.no_grad():
        np.testing.assert_allclose(model(idx)[0].numpy(),
                                   saved.eval()(idx)[0].numpy()[..., :vocab], rtol=1e-5)
    mt.manual_seed(1)
    assert len("".join(stream_text(model, tokenizer, "a", 20, temperature=100.0))) == 20
    exact, _, _ = load_for_inference(tmp_path, keep_padding=True)
    assert exact.config.vocab_size == padded


def test_the_prompt_is_checked_when_the_stream_is_made_not_at_its_first_token():
    """So a caller can refuse a prompt before printing any of it."""
    tokenizer = CharTokenizer.from_text(TEXT)
    with pytest.raises(ValueError, match="the prompt encodes to no tokens"):
        stream_text(ScriptedModel([1, 2]), tokenizer, "", 2)
    with pytest.raises(ValueError, match="'Z'"):
        stream_text(ScriptedModel([1, 2]), tokenizer, "Zebra", 2)
