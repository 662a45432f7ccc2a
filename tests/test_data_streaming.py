"""Streaming, sharded preparation: shards and their headers, ids equal to the whole text's,
the val split by documents, resume after a crash or a kill, the sampler across shards.

Every corpus is made here, under tmp_path; nothing touches the network.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from minitorch_gpu.data import (BatchSampler, BPETokenizer, DataConfig, ShardError,
                                TokenSplit, load_text, prepare, read_header)
from minitorch_gpu.data import encoding, shards
from minitorch_gpu.data.encoding import Chunker
from minitorch_gpu.data.preparation import _is_val_document
from minitorch_gpu.data import preparation as prepare_module
from minitorch_gpu.data.tokenizer import _chunks

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
         "every jolly box of pies").split()


def make_corpus(folder: Path, documents: int, lines: int = 40, seed: int = 0) -> Path:
    """``documents`` text files of made-up lines, with blank lines, indents and unicode."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(documents):
        out = []
        for i in range(lines):
            words = rng.choice(WORDS, size=int(rng.integers(1, 12)))
            indent = "    " * int(rng.integers(0, 3))
            out.append(indent + " ".join(words) + (" café" if i % 7 == 0 else ""))
            if i % 9 == 0:
                out.append("")
        (folder / f"doc{d:04d}.txt").write_text("\n".join(out) + "\n", encoding="utf-8")
    return folder


def cfg_for(tmp_path: Path, corpus: Path, **kwargs) -> DataConfig:
    settings = dict(source="text_files", path=str(corpus / "*.txt"), tokenizer="char",
                    cache_dir=str(tmp_path / "cache"), workers=0)
    settings.update(kwargs)
    return DataConfig(**settings)


def all_ids(data) -> np.ndarray:
    return np.concatenate([np.asarray(data.train_tokens()), np.asarray(data.val_tokens())])


@pytest.mark.parametrize("documents", [8, 32])  # two sizes, 4x apart
@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_streamed_shards_hold_the_whole_texts_ids(tmp_path, monkeypatch, documents, tokenizer):
    monkeypatch.setattr(prepare_module, "CHUNK_CHARS", 300)  # many chunks, many cuts
    corpus = make_corpus(tmp_path / "corpus", documents)
    cfg = cfg_for(tmp_path, corpus, tokenizer=tokenizer, vocab_size=300, shard_tokens=1000,
                  val_split="position")
    data = prepare(cfg, log=lambda line: None)
    text = load_text(cfg)
    ids = data.tokenizer.encode_array(text)  # the whole text at once
    assert np.array_equal(all_ids(data), ids)
    shard_files = sorted(data.directory.glob("tokens_*.bin"))
    assert [s["name"] for s in data.meta["shards"]] == [p.name for p in shard_files]
    assert len(shard_files) == -(-len(ids) // 1000)
    read_back = []
    for path in shard_files:  # each header says what follows it
        count, dtype = read_header(path)
        assert dtype == np.uint16 and path.stat().st_size == 1024 + 2 * count
        read_back.append(np.fromfile(path, dtype=np.uint16, offset=1024))
        assert len(read_back[-1]) == count
    assert np.array_equal(np.concatenate(read_back), ids)
    assert all(read_header(p)[0] == 1000 for p in shard_files[:-1])  # fixed size, the last the rest
    n_val = int(len(ids) * cfg.val_fraction)
    assert (data.meta["train_tokens"], data.meta["val_tokens"]) == (len(ids) - n_val, n_val)


def test_chunker_cuts_a_stream_where_the_whole_text_is_cut():
    text = load_corpus_text(200)
    for piece_size in (1, 7, 1000, 1 << 16, 1 << 20):
        chunker = Chunker(size=500)
        chunks = []
        for start in range(0, len(text), piece_size):
            chunks += [c for _, c in chunker.feed(text[start:start + piece_size])]
        chunks += [c for _, c in chunker.finish()]
        assert chunks == list(_chunks(text, 500)), piece_size


def load_corpus_text(lines: int) -> str:
    rng = np.random.default_rng(1)
    return "".join(" ".join(rng.choice(WORDS, size=5)) + ("\n\n" if i % 3 else "\n")
                   for i in range(lines))


def test_workers_give_the_same_shards_as_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "CHUNK_CHARS", 300)
    corpus = make_corpus(tmp_path / "corpus", 12)
    here = prepare(cfg_for(tmp_path, corpus, tokenizer="bpe", vocab_size=300,
                           shard_tokens=700, cache_dir=str(tmp_path / "a")),
                   log=lambda line: None)
    monkeypatch.setattr(encoding, "POOL_AFTER_CHARS", 0)  # a pool even for a small corpus
    monkeypatch.setattr(encoding, "BATCH_CHARS", 2000)
    lines = []
    pooled = prepare(cfg_for(tmp_path, corpus, tokenizer="bpe", vocab_size=300,
                             shard_tokens=700, workers=2, cache_dir=str(tmp_path / "b")),
                     log=lines.append)
    assert any("2 worker process(es)" in line for line in lines)
    assert np.array_equal(all_ids(here), all_ids(pooled))
    assert here.meta["splits"] == pooled.meta["splits"]


def test_val_split_by_documents_holds_whole_documents(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", 10)
    cfg = cfg_for(tmp_path, corpus, val_fraction=0.2, shard_tokens=500)
    data = prepare(cfg, log=lambda line: None)
    assert data.meta["val_split"] == "documents"  # auto: 10 documents >= 1 / 0.2
    val_docs = [i for i in range(10) if _is_val_document(i, 0.2)]
    assert val_docs == [2, 7]
    texts = [(corpus / f"doc{i:04d}.txt").read_text() for i in range(10)]
    tok = data.tokenizer
    want_val = tok.encode_array("\n".join(texts[i] for i in val_docs))
    want_train = tok.encode_array("\n".join(t for i, t in enumerate(texts) if i not in val_docs))
    assert np.array_equal(np.asarray(data.val_tokens()), want_val)
    assert np.array_equal(np.asarray(data.train_tokens()), want_train)
    assert {Path(p).name.split("_")[0] for p in data.shard_paths("val")} == {"val"}
    assert data.meta["documents"] == 10


def test_a_few_documents_split_by_position_and_too_few_for_documents_is_an_error(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", 3)
    assert prepare(cfg_for(tmp_path, corpus), log=lambda line: None).meta["val_split"] == \
        "position"  # auto: 3 documents, fewer than 1 / 0.1
    with pytest.raises(ValueError, match=r"empty val split.*every 10-th of 3 documents.*"
                                         r"val_split: position"):
        prepare(cfg_for(tmp_path, corpus, val_split="documents"), log=lambda line: None)


def test_bpe_is_trained_on_a_bounded_sample(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", 6)
    cfg = cfg_for(tmp_path, corpus, tokenizer="bpe", vocab_size=300,
                  tokenizer_sample_chars=3000)
    lines = []
    data = prepare(cfg, log=lines.append)
    sample = load_text(cfg)[:3000]
    assert data.tokenizer.to_json() == BPETokenizer.train(sample, 300).to_json()
    assert any("on the first 3,000 characters" in line for line in lines)
    assert np.array_equal(all_ids(data), data.tokenizer.encode_array(load_text(cfg)))


def test_local_datasets_file_through_the_streaming_path(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    rows = [{"text": f"story {i}: " + " ".join(WORDS[i % 5:i % 5 + 6]), "id": i}
            for i in range(40)] + [{"text": None, "id": 99}]
    path = tmp_path / "stories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(source="hf_dataset", path=str(path), tokenizer="char",
                     cache_dir=str(tmp_path / "cache"), workers=0, shard_tokens=300)
    data = prepare(cfg, log=lambda line: None)
    assert data.meta["val_split"] == "documents"  # a stream: documents
    assert data.meta["documents"] == 40
    texts = [r["text"] for r in rows if r["text"] is not None]
    val = [t for i, t in enumerate(texts) if _is_val_document(i, 0.1)]
    assert data.tokenizer.decode(np.asarray(data.val_tokens())) == "\n\n".join(val)
    assert data.tokenizer.decode(np.asarray(data.train_tokens())) == \
        "\n\n".join(t for i, t in enumerate(texts) if not _is_val_document(i, 0.1))


def test_resume_after_a_crash_continues_from_the_finished_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "CHUNK_CHARS", 300)  # shards end inside chunks
    corpus = make_corpus(tmp_path / "corpus", 20)
    for split in ("position", "documents"):
        cfg = cfg_for(tmp_path, corpus, tokenizer="bpe", vocab_size=300, shard_tokens=400,
                      val_split=split, val_fraction=0.2, cache_dir=str(tmp_path / split))
        whole = prepare(DataConfig(**{**cfg.__dict__, "cache_dir": str(tmp_path / "w" / split)}),
                        log=lambda line: None)
        close = shards.ShardWriter._close_shard
        calls = []

        def crash_at_the_fourth_shard(self):
            calls.append(self.name(self.index))
            if len(calls) == 4:
                raise RuntimeError("the machine went down")
            return close(self)

        monkeypatch.setattr(shards.ShardWriter, "_close_shard", crash_at_the_fourth_shard)
        with pytest.raises(RuntimeError, match="went down"):
            prepare(cfg, log=lambda line: None)
        monkeypatch.setattr(shards.ShardWriter, "_close_shard", close)
        partial = next((tmp_path / split / "prepared").glob("*.partial"))
        manifest = json.loads((partial / "manifest.json").read_text())
        kept = [s["name"] for stream in manifest["streams"].values() for s in stream["shards"]]
        assert len(kept) == 3 and not manifest["complete"]
        assert not list(partial.glob("*.tmp"))  # the shard being written is dropped
        lines = []
        resumed = prepare(cfg, log=lines.append)
        assert any("continuing the prepare" in line and "3 finished shard(s)" in line
                   for line in lines)
        assert np.array_equal(np.asarray(resumed.train_tokens()),
                              np.asarray(whole.train_tokens()))
        assert np.array_equal(np.asarray(resumed.val_tokens()), np.asarray(whole.val_tokens()))
        assert resumed.meta["splits"] == whole.meta["splits"]
        assert not partial.exists()


def test_resume_after_the_process_is_killed(tmp_path):
    # a real process, killed (SIGKILL: no handler runs) once it has finished a shard; its
    # shard writes are slowed so that the kill lands half-way
    corpus = make_corpus(tmp_path / "corpus", 30)
    cfg = cfg_for(tmp_path, corpus, tokenizer="char", shard_tokens=2000)
    script = textwrap.dedent(f"""
        import time
        from minitorch_gpu.data import DataConfig, prepare, shards
        import importlib
        importlib.import_module("minitorch_gpu.data.preparation").CHUNK_CHARS = 300
        close = shards.ShardWriter._close_shard
        def slow(self):
            close(self)
            time.sleep(0.3)
        shards.ShardWriter._close_shard = slow
        prepare(DataConfig(**{cfg.__dict__!r}), log=lambda line: None)
    """)
    child = subprocess.Popen([sys.executable, "-c", script])
    prepared = tmp_path / "cache" / "prepared"
    deadline = time.monotonic() + 60
    manifest = {}
    while time.monotonic() < deadline and child.poll() is None:
        for path in prepared.glob("*.partial/manifest.json"):
            try:
                manifest = json.loads(path.read_text())
            except ValueError:
                continue
        if any(s["shards"] for s in manifest.get("streams", {}).values()):
            break
        time.sleep(0.05)
    assert child.poll() is None, "the prepare finished before it could be killed"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    kept = sum(len(s["shards"]) for s in manifest["streams"].values())
    assert kept >= 1
    lines = []
    resumed = prepare(cfg, log=lines.append)
    assert any("continuing the prepare" in line for line in lines)
    whole = prepare(DataConfig(**{**cfg.__dict__, "cache_dir": str(tmp_path / "whole")}),
                    log=lambda line: None)
    assert np.array_equal(all_ids(resumed), all_ids(whole))


def test_a_damaged_shard_header_is_named(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"\0" * 1024)
    with pytest.raises(ShardError, match="not a token shard"):
        read_header(path)
    path.write_bytes(b"\0" * 10)
    with pytest.raises(ShardError, match="shorter than a shard's 1024-byte header"):
        read_header(path)


def test_sampler_reads_windows_across_shards_and_resumes_exactly(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", 6)
    data = prepare(cfg_for(tmp_path, corpus, shard_tokens=97, val_split="position"),
                   log=lambda line: None)
    train = data.train_tokens()
    assert isinstance(train, TokenSplit) and len(data.shard_paths("train")) > 10
    flat = np.asarray(train)
    assert np.array_equal(train[90:300], flat[90:300]) and train[-1] == flat[-1]
    starts = np.array([0, 90, 96, 193, len(flat) - 33])  # windows across shard edges
    assert np.array_equal(train.windows(starts, 33), flat[starts[:, None] + np.arange(33)])

    def draws(sampler, n):
        return [tuple(t.numpy().copy() for t in sampler.next_batch()) for _ in range(n)]

    over_shards = draws(BatchSampler(train, 32, 4, seed=3), 4)
    over_array = draws(BatchSampler(flat, 32, 4, seed=3), 4)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(over_shards, over_array))
    first = BatchSampler(train, 32, 4, seed=3)
    draws(first, 2)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = BatchSampler(train, 32, 4, seed=0)
    resumed.load_state_dict(state)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(draws(resumed, 2), over_shards[2:]))
    with pytest.raises(ValueError, match="the data changed"):
        BatchSampler(flat[:-5], 32, 4, seed=0).load_state_dict(state)


def test_an_empty_file_still_adds_its_newline(tmp_path):
    # the separator before a document is not its last character: files "x", "" and "y\n"
    # join as they always did, each ending with a newline and a blank line between them
    folder = tmp_path / "c"
    folder.mkdir()
    for name, text in (("a.txt", "x"), ("b.txt", ""), ("c.txt", "y\n")):
        (folder / name).write_text(text)
    assert load_text(cfg_for(tmp_path, folder)) == "x\n\n\n\ny\n"


def test_training_from_many_shards_resumes_exactly(tmp_path, monkeypatch):
    """A run trained on a corpus in shards of 150 tokens, in halves, then resumed: the
    losses and weights of the run in one go (float64, dropout on)."""
    from minitorch_gpu.checkpoint import load_checkpoint
    from minitorch_gpu.train.config import load_config
    from minitorch_gpu.train.trainer import Trainer

    corpus = make_corpus(tmp_path / "corpus", 12)
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "cache"))
    config = tmp_path / "sharded.yaml"
    config.write_text(textwrap.dedent(f"""\
        model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: 0.1}}
        data: {{source: text_files, path: '{corpus}/*.txt', tokenizer: char, shard_tokens: 150,
                workers: 0, val_fraction: 0.25}}
        train: {{batch_size: 4, max_iters: 10, warmup_iters: 2, lr: 3.0e-3, log_interval: 1,
                 lr_decay_iters: 10}}
        eval: {{interval: 5, iters: 2}}
        checkpoint: {{dir: {tmp_path / 'ckpts'}}}
        system: {{seed: 7, dtype: float64}}
    """))
    quiet = lambda *_: None  # noqa: E731
    straight = Trainer(load_config(config, ["checkpoint.run_name=straight"]), log=quiet,
                       progress=False).fit()
    prepared = next((tmp_path / "cache" / "prepared").glob("text_files-*"))
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["val_split"] == "documents" and len(manifest["shards"]) > 20
    Trainer(load_config(config, ["checkpoint.run_name=halves", "train.max_iters=5"]),
            log=quiet, progress=False).fit()
    resumed = Trainer(load_config(config, ["checkpoint.run_name=halves", "train.resume=true"]),
                      log=quiet, progress=False).fit()

    def losses(run):
        lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines if '"train"' in line]

    np.testing.assert_allclose(losses(resumed), losses(straight), rtol=1e-10)
    a, b = (load_checkpoint(r.last_checkpoint).model for r in (straight, resumed))
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("damage", ["truncate", "delete", "manifest"])
def test_a_damaged_partial_prepare_starts_again(tmp_path, monkeypatch, damage):
    # a shard of the unfinished prepare cut short or gone, or a manifest missing a resume
    # point: it was installed as finished, or raised KeyError on every later prepare
    corpus = make_corpus(tmp_path / "corpus", 8)
    cfg = cfg_for(tmp_path, corpus, shard_tokens=500, val_split="position")
    whole = prepare(DataConfig(**{**cfg.__dict__, "cache_dir": str(tmp_path / "whole")}),
                    log=lambda line: None)
    close = shards.ShardWriter._close_shard
    calls = []

    def crash_at_the_fourth_shard(self):
        calls.append(None)
        if len(calls) == 4:
            raise RuntimeError("the machine went down")
        return close(self)

    monkeypatch.setattr(shards.ShardWriter, "_close_shard", crash_at_the_fourth_shard)
    with pytest.raises(RuntimeError):
        prepare(cfg, log=lambda line: None)
    monkeypatch.setattr(shards.ShardWriter, "_close_shard", close)
    partial = next((tmp_path / "cache" / "prepared").glob("*.partial"))
    shard = partial / "tokens_000001.bin"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:1124])
    elif damage == "delete":
        shard.unlink()
    else:
        manifest = json.loads((partial / "manifest.json").read_text())
        del manifest["streams"]["tokens"]["resume"]
        (partial / "manifest.json").write_text(json.dumps(manifest))
    lines = []
    again = prepare(cfg, log=lines.append)
    assert any("is damaged" in line and "starting again" in line for line in lines)
    assert np.array_equal(all_ids(again), all_ids(whole))
