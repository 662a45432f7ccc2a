"""HellaSwag and the whole-split loss (evaluation/), in-process, against float64 by hand.

A tiny float64 GPT with a character tokenizer scores a made-up sample in HellaSwag's
format; each ending's log-probability is recomputed from the model's own forward pass on
that ending alone (no padding, no batching), and the split loss from the model's logits
over consecutive windows.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn as nn
from minitorch_gpu.nn.build import build_model
from minitorch_gpu.data import CharTokenizer
from minitorch_gpu.evaluation import HellaSwagError, read_examples, score_hellaswag, split_loss
from minitorch_gpu.evaluation import hellaswag_data, hellaswag_path

CHARS = sorted(set("abcdefghijklmnopqrstuvwxyz .,"))
SAMPLE = [
    {"ind": 10, "ctx": "the cat sat on the", "label": 2,
     "endings": ["mat.", "dog ran away, fast", "hat", "log by the river bank"]},
    {"ind": 11, "ctx": "a man walks", "label": 0,
     "endings": ["home", "to the shop.", "fast", "in the rain, slowly"]},
    {"ind": 12, "ctx": "she reads a book and then", "label": 3,
     "endings": ["sleeps", "eats", "goes out to play in the park", "writes"]},
]


def tiny_model(block_size: int = 64) -> nn.GPT:
    mt.manual_seed(3)
    config = nn.GPTConfig(block_size=block_size, vocab_size=len(CHARS), n_layer=2, n_head=2,
                          n_embd=16, dropout=0.0)
    return build_model(config, mt.float64).eval()


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


def by_hand(model, tokenizer, ctx: str, ending: str):
    """(sum, mean) of the ending's log-probabilities, from one unpadded forward pass."""
    ids = tokenizer.encode(ctx) + tokenizer.encode(" " + ending)
    n = len(tokenizer.encode(" " + ending))
    T = model.config.block_size
    ids = ids[-(T + 1):]
    n = min(n, len(ids) - 1)
    with mt.no_grad():
        logits, _ = model(mt.tensor([ids[:-1]]), all_logits=True)
    logits = np.asarray(logits, dtype=np.float64)[0]  # (L, V)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = [logp[t, ids[t + 1]] for t in range(len(ids) - 1 - n, len(ids) - 1)]
    return sum(picked), sum(picked) / n


def test_scores_match_log_probabilities_by_hand(tmp_path):
    model, tokenizer = tiny_model(), CharTokenizer(CHARS)
    records = []
    summary = score_hellaswag(model, tokenizer, write_jsonl(tmp_path / "s.jsonl", SAMPLE),
                              on_record=records.append)
    assert [r["ind"] for r in records] == [10, 11, 12]
    for example, record in zip(SAMPLE, records):
        expected = [by_hand(model, tokenizer, example["ctx"], e) for e in example["endings"]]
        assert record["sum_logprob"] == pytest.approx([s for s, _ in expected], rel=1e-9)
        assert record["mean_logprob"] == pytest.approx([m for _, m in expected], rel=1e-9)
        assert record["pred"] == int(np.argmax([s for s, _ in expected]))
        assert record["pred_norm"] == int(np.argmax([m for _, m in expected]))
        assert record["label"] == example["label"]
    # the summary is what the per-example records add up to
    assert summary.examples == 3 and summary.cropped == 0
    assert summary.acc == pytest.approx(np.mean([r["pred"] == r["label"] for r in records]))
    assert summary.acc_norm == pytest.approx(
        np.mean([r["pred_norm"] == r["label"] for r in records]))
    assert summary.summary().startswith(f"hellaswag: acc {summary.acc:.4f} acc_norm "
                                        f"{summary.acc_norm:.4f} over 3 examples (0 contexts "
                                        f"cropped)")


def test_limit_and_shards_add_up_to_the_whole(tmp_path):
    model, tokenizer = tiny_model(), CharTokenizer(CHARS)
    path = write_jsonl(tmp_path / "s.jsonl", SAMPLE * 2)
    assert score_hellaswag(model, tokenizer, path, limit=4).examples == 4
    whole = score_hellaswag(model, tokenizer, path)
    parts = [score_hellaswag(model, tokenizer, path, shard=(r, 2)) for r in range(2)]
    assert [p.examples for p in parts] == [3, 3]
    assert sum(p.correct for p in parts) == whole.correct
    assert sum(p.correct_norm for p in parts) == whole.correct_norm
    assert model.training is False  # the mode it was in


def test_a_context_past_the_block_size_is_cropped_from_the_left_and_counted(tmp_path):
    model, tokenizer = tiny_model(block_size=12), CharTokenizer(CHARS)
    records = []
    summary = score_hellaswag(model, tokenizer, write_jsonl(tmp_path / "s.jsonl", SAMPLE),
                              on_record=records.append)
    assert summary.cropped == 3  # every example has an ending that overflows 12 + 1 tokens
    for example, record in zip(SAMPLE, records):
        expected = [by_hand(model, tokenizer, example["ctx"], e) for e in example["endings"]]
        assert record["sum_logprob"] == pytest.approx([s for s, _ in expected], rel=1e-9)
        assert record["mean_logprob"] == pytest.approx([m for _, m in expected], rel=1e-9)


GOOD = json.dumps(SAMPLE[0])


@pytest.mark.parametrize("lines, message", [
    ([GOOD, "{not json"], "s.jsonl line 2: not valid JSON"),
    ([GOOD, "", json.dumps({**SAMPLE[0], "endings": ["a", "b", "c"]})],
     "s.jsonl line 3: endings must be a list of 4 strings, got 3 of them"),
    ([json.dumps({**SAMPLE[0], "label": 7})], "line 1: label must be an int in 0..3, got 7"),
    ([json.dumps({**SAMPLE[0], "label": "2"})], "line 1: label must be an int in 0..3, got '2'"),
    ([json.dumps({"ctx": "a", "label": 0})], "line 1: missing key(s) endings"),
    (["[1, 2]"], "line 1: expected a JSON object"),
    ([json.dumps({**SAMPLE[0], "ctx": "the CAT"})], "line 1 (ind 10): the model's tokenizer "
                                                    "cannot encode it"),
])
def test_bad_lines_are_named(tmp_path, lines, message):
    path = write_jsonl(tmp_path / "s.jsonl", lines)
    with pytest.raises(HellaSwagError) as info:
        score_hellaswag(tiny_model(), CharTokenizer(CHARS), path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_examples_are_read_one_line_at_a_time(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [GOOD, GOOD, "{broken"])
    examples = read_examples(path, limit=2)  # the broken line is never reached
    assert [e.line for e in examples] == [1, 2]


def test_without_a_file_and_offline_the_error_says_to_give_one(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "cache"))

    def offline(path):
        raise hellaswag_data._Offline("no host name resolves")

    def failing(path):
        raise HellaSwagError("the Hub said no")
    tried = []
    monkeypatch.setattr(hellaswag_data, "_download", failing)
    monkeypatch.setattr(hellaswag_data, "_from_datasets", lambda path: tried.append(path) or
                        failing(path))
    with pytest.raises(HellaSwagError, match="the Hub said no.*offline, pass --data FILE.jsonl"):
        hellaswag_path(None)
    assert len(tried) == 1  # a download that failed online: the datasets copy is tried
    monkeypatch.setattr(hellaswag_data, "_download", offline)
    with pytest.raises(HellaSwagError, match="no host name resolves\\); offline, pass --data"):
        hellaswag_path(None)
    assert len(tried) == 1  # no network: the Hub is not tried (it would retry for a minute)
    assert not (tmp_path / "cache" / "hellaswag" / "hellaswag_val.jsonl").exists()
    with pytest.raises(HellaSwagError, match="nope.jsonl: no such file"):
        hellaswag_path(str(tmp_path / "nope.jsonl"))


def test_a_short_download_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "cache"))
    target = hellaswag_data.validation_set_path()
    target.parent.mkdir(parents=True)
    with pytest.raises(HellaSwagError, match="gave 2 examples, expected 10042"):
        hellaswag_data._write_checked(target, [b"{}\n", b"{}"], "a test")
    assert list(target.parent.iterdir()) == []


class ShardedTokens:
    """A split held in pieces: only len, dtype and contiguous slices, as the contract says."""

    def __init__(self, tokens: np.ndarray, piece: int = 7) -> None:
        self.pieces = [tokens[i:i + piece] for i in range(0, len(tokens), piece)]
        self.dtype = tokens.dtype
        self.length = len(tokens)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, item):
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError(f"only contiguous slices, got {item!r}")
        start, stop, _ = item.indices(self.length)
        return np.concatenate(self.pieces)[start:stop]


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_split_loss_is_the_mean_over_consecutive_windows(batch_size):
    model = tiny_model(block_size=8)
    tokens = np.random.default_rng(0).integers(0, len(CHARS), 8 * 9 + 5).astype(np.uint16)
    n = (len(tokens) - 1) // 8  # 9 windows, the tail of 4 dropped
    inputs = tokens[:n * 8].astype(np.int64).reshape(n, 8)
    targets = tokens[1:n * 8 + 1].astype(np.int64).reshape(n, 8)
    with mt.no_grad():
        logits, _ = model(mt.tensor(inputs), mt.tensor(targets))
    logits = np.asarray(logits, dtype=np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, targets[..., None], -1).mean()
    result = split_loss(model, ShardedTokens(tokens), batch_size)
    assert (result.windows, result.tokens, result.block_size) == (9, 72, 8)
    assert result.loss == pytest.approx(expected, rel=1e-10)
    assert result.perplexity == pytest.approx(math.exp(expected), rel=1e-10)


def test_split_loss_refuses_a_split_with_no_window():
    with pytest.raises(ValueError, match="8 tokens hold no window of block_size 8"):
        split_loss(tiny_model(block_size=8), np.zeros(8, dtype=np.uint16))
