"""The data layer: sources, tokenizers, prepared token files and the batch sampler.

Nothing here touches the network: downloads are monkeypatched to fail, Hugging Face runs
offline, and every cache lives under tmp_path.
"""
import hashlib
import importlib
import json
import os
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.train.config import DataConfig
from minitorch_gpu.data import (BatchSampler, BPETokenizer, CharTokenizer, TokenSplit,
                                read_header, build_tokenizer,
                                cache_root, load_text, load_tokenizer, prepare, prepared_dir,
                                source_fingerprint, token_dtype, tokenizer_from_json)
from minitorch_gpu.data.sources import TINYSHAKESPEARE_URL, stdlib_file_paths

TEXTS = {
    "ascii": "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "unicode": "naïve café — 東京 🚀 Ελληνικά\n",
    "whitespace": "  \t\n\n   x  \r\n\t\t\n ",
    "empty": "",
    "special": "a <|endoftext|> b",
}
CORPUS = "".join(TEXTS.values()) * 20 + "".join(chr(c) for c in range(32, 127))


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train(CORPUS, 300)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def cfg_for(tmp_path: Path, **kwargs) -> DataConfig:
    kwargs.setdefault("cache_dir", str(tmp_path / "cache"))
    return DataConfig(**kwargs)


# --- tokenizers -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TEXTS))
@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_tokenizer_round_trip(kind, name, bpe):
    tok = CharTokenizer.from_text(CORPUS) if kind == "char" else bpe
    text = TEXTS[name]
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(np.asarray(ids, dtype=np.uint16)) == text
    restored = tokenizer_from_json(tok.to_json())
    assert (restored.kind, restored.vocab_size) == (tok.kind, tok.vocab_size)
    assert restored.encode(text) == ids


def test_char_tokenizer_vocabulary_and_ids():
    tok = CharTokenizer.from_text("hello")
    assert tok.chars == ["e", "h", "l", "o"] and tok.vocab_size == 4 and tok.kind == "char"
    assert tok.encode("hole") == [1, 3, 2, 0]
    assert tok.encode_array("hole").dtype == np.int64


@pytest.mark.parametrize("text, missing", [("hellz", "'z'"), ("h\u00e9", "'é'"),
                                           ("\U0001F680", "U+1F680")])
def test_char_tokenizer_unknown_character(text, missing):
    with pytest.raises(ValueError, match="training corpus") as info:
        CharTokenizer.from_text("hello").encode(text)
    assert missing in str(info.value)


@pytest.mark.parametrize("bad, error", [([0, 99], ValueError), ([-1], ValueError),
                                        ([[0, 1]], TypeError), ([0.5], TypeError)])
def test_decode_rejects_bad_ids(bad, error, bpe):
    for tok in (CharTokenizer.from_text("hello"), bpe):
        with pytest.raises(error, match="decode"):
            tok.decode(bad if bad != [0, 99] else [0, tok.vocab_size])


def test_bpe_is_byte_level_and_compresses(bpe):
    assert bpe.kind == "bpe" and 257 < bpe.vocab_size <= 300
    text = "zebra-quagga ∮ unseen words"  # bytes never merged still encode
    assert bpe.decode(bpe.encode(text)) == text
    assert len(bpe.encode(TEXTS["ascii"])) < len(TEXTS["ascii"])


def test_bpe_chunked_encoding_equals_whole_text(bpe):
    text = ("def f(x):\n    return x\n\n\nclass A:\n  pass\n" * 4000)  # several chunks
    assert bpe.encode(text) == bpe.hf.encode(text).ids


def test_bpe_from_file_and_build_tokenizer(tmp_path, bpe):
    hf_file = tmp_path / "hf_tokenizer.json"
    bpe.hf.save(str(hf_file))  # the tokenizers library's own format
    ours = write(tmp_path / "ours.json", bpe.to_json())
    for path in (hf_file, ours):
        assert BPETokenizer.from_file(path).encode(TEXTS["unicode"]) == bpe.encode(
            TEXTS["unicode"])
    cfg = cfg_for(tmp_path, tokenizer="file", tokenizer_path=str(hf_file))
    assert build_tokenizer(cfg, "ignored").vocab_size == bpe.vocab_size
    assert build_tokenizer(cfg_for(tmp_path, tokenizer="char"), "abc").vocab_size == 3
    with pytest.raises(ValueError, match="holds a char tokenizer"):
        BPETokenizer.from_file(write(tmp_path / "char.json", CharTokenizer(["a"]).to_json()))
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_tokenizer(tmp_path / "nope.json")


@pytest.mark.parametrize("text, match", [("[1, 2]", "JSON object"), ("{", "not JSON"),
                                         ('{"kind": "word"}', "kind 'word'"),
                                         ('{"kind": "bpe", "tokenizer": {}}', "broken bpe")])
def test_tokenizer_from_json_errors(text, match):
    with pytest.raises(ValueError, match=match):
        tokenizer_from_json(text)


def test_char_tokenizer_needs_text():
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.from_text("")


def test_char_tokenizer_json_keeps_adjacent_lone_surrogates():
    # a lone high surrogate sorted next to a lone low one once read back as one astral
    # character: the vocabulary shrank and every later id moved
    tok = CharTokenizer.from_text("ab\ud83dx\ude80")
    restored = tokenizer_from_json(tok.to_json())
    assert restored.chars == tok.chars and restored.vocab_size == 5
    assert restored.encode("x\ude80") == tok.encode("x\ude80")


def gapped_byte_level_json(stride: int) -> str:
    """A byte-level BPE tokenizer.json whose 256 ids are 0, stride, 2 * stride, ..."""
    tok = json.loads(BPETokenizer.train("abc", 257).hf.to_str())
    alphabet = sorted(tok["model"]["vocab"], key=tok["model"]["vocab"].get)[:256]
    tok["model"]["vocab"] = {piece: i * stride for i, piece in enumerate(alphabet)}
    tok["model"]["merges"], tok["added_tokens"] = [], []
    return json.dumps(tok)


def test_bpe_vocab_size_covers_ids_that_skip_numbers(tmp_path):
    # the count of tokens (256) was taken for the vocabulary: ids up to 76,500 came out,
    # past the model's embedding, and were wrapped into uint16 token files
    tok = tokenizer_from_json(gapped_byte_level_json(300))
    assert tok.vocab_size == 255 * 300 + 1
    text = "hello, gapped vocabulary\n" * 20
    ids = tok.encode_array(text)
    assert int(ids.max()) < tok.vocab_size and tok.decode(ids) == text
    tokenizer_path = write(tmp_path / "gapped.json", gapped_byte_level_json(300))
    write(tmp_path / "corpus.txt", text)
    data = prepare(cfg_for(tmp_path, source="text_files", path=str(tmp_path / "corpus.txt"),
                           tokenizer="file", tokenizer_path=str(tokenizer_path)),
                   log=lambda line: None)
    assert data.meta["dtype"] == "uint32" and data.vocab_size == tok.vocab_size
    assert np.concatenate([data.train_tokens(), data.val_tokens()]).tolist() == ids.tolist()


def lossy_tokenizer(name: str):
    """A ``tokenizers`` library tokenizer that does not give every text back."""
    import tokenizers
    if name == "word_level":  # [UNK] for every word it doesn't know
        tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"hello": 0, "[UNK]": 1},
                                                               unk_token="[UNK]"))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    elif name == "bpe_without_byte_level":  # drops characters it doesn't know
        tok = tokenizers.Tokenizer(tokenizers.models.BPE())
        tok.train_from_iterator(["hello world"], tokenizers.trainers.BpeTrainer(
            vocab_size=40, show_progress=False))
    else:  # a byte-level BPE behind a lowercasing normalizer
        tok = tokenizers.Tokenizer.from_str(BPETokenizer.train(CORPUS, 300).hf.to_str())
        tok.normalizer = tokenizers.normalizers.Lowercase()
    return tok


@pytest.mark.parametrize("name", ["word_level", "bpe_without_byte_level", "lowercasing"])
def test_a_given_tokenizer_must_encode_the_corpus_losslessly(tmp_path, name):
    # these turned the corpus into [UNK]s, dropped what they did not know, or lowercased it,
    # and prepare trained on that without a word
    lossy_tokenizer(name).save(str(tmp_path / f"{name}.json"))
    write(tmp_path / "corpus.txt", "Hello world, hello again!\n" * 20)
    cfg = cfg_for(tmp_path, source="text_files", path=str(tmp_path / "corpus.txt"),
                  tokenizer="file", tokenizer_path=str(tmp_path / f"{name}.json"))
    with pytest.raises(ValueError, match="does not encode this corpus losslessly") as info:
        prepare(cfg, log=lambda line: None)
    assert f"{name}.json" in str(info.value) and "byte-level BPE" in str(info.value)


# --- sources ----------------------------------------------------------------------------------
def test_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "env"))
    assert cache_root(DataConfig(cache_dir=str(tmp_path / "cfg"))) == tmp_path / "cfg"
    assert cache_root(DataConfig()) == tmp_path / "env"
    monkeypatch.delenv("MINITORCH_GPU_CACHE")
    assert cache_root(DataConfig()) == Path.home() / ".cache" / "minitorch_gpu"


def test_text_files_globs(tmp_path):
    write(tmp_path / "b.txt", "bee\n")
    write(tmp_path / "a.txt", "ay")  # no final newline: one is added before the blank line
    write(tmp_path / "sub" / "deep" / "c.txt", "sea\n")
    write(tmp_path / "skip.md", "not text\n")
    cfg = cfg_for(tmp_path, source="text_files", path=str(tmp_path / "*.txt"),
                  paths=[str(tmp_path / "**" / "c.txt"), str(tmp_path / "a.txt")])
    assert load_text(cfg) == "ay\n\nbee\n\nsea\n"  # sorted, recursive, repeats dropped
    assert load_text(cfg_for(tmp_path, source="text_files", path=str(tmp_path / "b.txt"),
                             max_chars=2)) == "be"


def test_text_files_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path / "notes.txt", "home text\n")
    assert load_text(cfg_for(tmp_path, source="text_files", path="~/notes.txt")) == "home text\n"


def test_text_files_reads_a_file_named_twice_once(tmp_path, monkeypatch):
    # a relative name, a name through "..", a link: each spelling was read again
    write(tmp_path / "a.txt", "alpha\n")
    write(tmp_path / "b.txt", "beta\n")
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "a.txt", tmp_path / "sub" / "link.txt")
    monkeypatch.chdir(tmp_path)
    cfg = cfg_for(tmp_path, source="text_files", path=str(tmp_path / "*.txt"),
                  paths=["a.txt", "./b.txt", "sub/../a.txt", "sub/link.txt"])
    assert load_text(cfg) == "alpha\n\nbeta\n"


def test_text_files_takes_an_existing_name_with_glob_characters_as_it_is(tmp_path):
    # "notes[1].txt" was read as a pattern (a class of "1") and matched no file
    write(tmp_path / "notes[1].txt", "bracketed\n")
    cfg = cfg_for(tmp_path, source="text_files", path=str(tmp_path / "notes[1].txt"))
    assert load_text(cfg) == "bracketed\n"


@pytest.mark.parametrize("name, content, byte", [
    ("image.png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "0x89 at offset 0"),
    ("latin1.txt", "café au lait\n".encode("latin-1"), "0xe9 at offset 3"),
    ("utf16.txt", "hello\n".encode("utf-16"), "0xff at offset 0"),
])
def test_text_files_refuses_files_that_are_not_utf8(tmp_path, name, content, byte):
    # they were read with replacement characters, so a glob that picked up a binary file
    # trained the model on U+FFFD noise
    write(tmp_path / "good.txt", "fine\r\nline\n")
    (tmp_path / name).write_bytes(content)
    cfg = cfg_for(tmp_path, source="text_files", path=str(tmp_path / "*"))
    with pytest.raises(ValueError, match="is not UTF-8 text") as info:
        load_text(cfg)
    assert name in str(info.value) and byte in str(info.value)
    (tmp_path / name).unlink()
    assert load_text(cfg) == "fine\nline\n"  # newlines as before: "\r\n" reads as "\n"


@pytest.mark.parametrize("pattern", ["*.nothing", "missing.txt", "**/none/*.txt"])
def test_text_files_no_match_names_the_pattern(tmp_path, pattern):
    cfg = cfg_for(tmp_path, source="text_files", path=str(tmp_path / pattern))
    with pytest.raises(FileNotFoundError, match="matches no file") as info:
        load_text(cfg)
    assert pattern in str(info.value)


def test_python_stdlib(tmp_path):
    paths = stdlib_file_paths()
    root = Path(sysconfig.get_paths()["stdlib"])
    names = {p.relative_to(root).as_posix() for p in paths}
    assert {"os.py", "json/decoder.py", "collections/__init__.py"} <= names
    assert not any(part in {"site-packages", "test", "tests", "idlelib"}
                   for p in paths for part in p.relative_to(root).parts[:-1])
    assert [p.relative_to(root).as_posix() for p in paths] == sorted(names)
    text = load_text(cfg_for(tmp_path, source="python_stdlib", max_chars=200_000))
    assert len(text) == 200_000 and "def " in text and "import " in text
    first = paths[0].read_text(encoding="utf-8", errors="replace")
    assert text.startswith(first if first.endswith("\n") else first + "\n")
    assert source_fingerprint(cfg_for(tmp_path, source="python_stdlib")) == \
        source_fingerprint(cfg_for(tmp_path, source="python_stdlib"))


def test_tinyshakespeare_local_path_notes_a_variant(tmp_path):
    local = write(tmp_path / "shakes.txt", "ROMEO:\nBut soft!\n")
    notes = []
    text = load_text(cfg_for(tmp_path, source="tinyshakespeare", path=str(local)),
                     log=notes.append)
    assert text == "ROMEO:\nBut soft!\n"
    assert any("sha256 differs" in n for n in notes)


def test_tinyshakespeare_uses_the_cached_copy(tmp_path, monkeypatch):
    cfg = cfg_for(tmp_path, source="tinyshakespeare")
    write(cache_root(cfg) / "tinyshakespeare" / "input.txt", "cached\n")
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    assert load_text(cfg) == "cached\n"


def _no_network(*args, **kwargs):
    raise urllib.error.URLError("no network in tests")


def test_tinyshakespeare_offline_error_says_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    cfg = cfg_for(tmp_path, source="tinyshakespeare")
    with pytest.raises(RuntimeError, match="download .* failed") as info:
        load_text(cfg, log=lambda line: None)
    message = str(info.value)
    assert TINYSHAKESPEARE_URL in message and "data.path" in message
    assert str(cache_root(cfg) / "tinyshakespeare" / "input.txt") in message
    assert not (cache_root(cfg) / "tinyshakespeare" / "input.txt").exists()


class _Reply:
    """What urlopen returns, holding ``payload``: the download without a network."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read(self):
        return self.payload


def test_tinyshakespeare_download_checks_the_hash(tmp_path, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: _Reply(b"not shakespeare"))
    cfg = cfg_for(tmp_path, source="tinyshakespeare")
    with pytest.raises(RuntimeError, match="sha256"):
        load_text(cfg, log=lambda line: None)
    assert not any((cache_root(cfg) / "tinyshakespeare").glob("*"))  # nothing half-written


def test_tinyshakespeare_download_into_an_unwritable_cache_says_what_to_do(tmp_path,
                                                                          monkeypatch):
    # a read-only cache gave a bare OSError from mkdir or mkstemp
    payload = b"ROMEO:\nBut soft!\n"
    sources = importlib.import_module("minitorch_gpu.data.sources")
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: _Reply(payload))
    monkeypatch.setattr(sources, "TINYSHAKESPEARE_SHA256",
                        hashlib.sha256(payload).hexdigest())
    write(tmp_path / "not_a_folder", "x")  # stands in for a read-only folder (tests run as root)
    cfg = cfg_for(tmp_path, source="tinyshakespeare", cache_dir=str(tmp_path / "not_a_folder"))
    with pytest.raises(RuntimeError, match="can't save it") as info:
        load_text(cfg, log=lambda line: None)
    assert "data.cache_dir" in str(info.value) and "data.path" in str(info.value)
    assert str(tmp_path / "not_a_folder") in str(info.value)


def test_tinyshakespeare_download_is_saved_once_then_read(tmp_path, monkeypatch):
    # the save after a good download raised NameError (atomic_write was not imported)
    payload = b"ROMEO:\nBut soft!\n"
    sources = importlib.import_module("minitorch_gpu.data.sources")
    calls = []
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda *a, **k: calls.append(a) or _Reply(payload))
    monkeypatch.setattr(sources, "TINYSHAKESPEARE_SHA256",
                        hashlib.sha256(payload).hexdigest())
    cfg = cfg_for(tmp_path, source="tinyshakespeare", cache_dir=str(tmp_path / "cache"))
    assert load_text(cfg, log=lambda line: None) == payload.decode()
    assert load_text(cfg, log=lambda line: None) == payload.decode()
    assert len(calls) == 1
    saved = list((tmp_path / "cache").rglob("*.txt"))
    assert [p.read_bytes() for p in saved] == [payload]
    assert not [p for p in (tmp_path / "cache").rglob("*") if ".tmp" in p.name]


@pytest.fixture
def hf_offline(monkeypatch):
    """Hugging Face datasets with the network off, both for this import and a fresh one."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if hasattr(datasets.config, name):
            monkeypatch.setattr(datasets.config, name, True)
    return datasets


def test_hf_dataset_from_disk_and_missing_field(tmp_path, hf_offline):
    saved = tmp_path / "saved"
    hf_offline.Dataset.from_dict({"text": ["first story", "second story\n"],
                                  "id": [1, 2]}).save_to_disk(str(saved))
    cfg = cfg_for(tmp_path, source="hf_dataset", path=str(saved))
    assert load_text(cfg) == "first story\n\nsecond story\n"
    assert load_text(cfg_for(tmp_path, source="hf_dataset", path=str(saved),
                             max_chars=5)) == "first"
    with pytest.raises(ValueError, match=r"'body' is not a column.*\['text', 'id'\]"):
        load_text(cfg_for(tmp_path, source="hf_dataset", path=str(saved), text_field="body"))
    with pytest.raises(TypeError, match="'id': expected a column of strings, got int"):
        load_text(cfg_for(tmp_path, source="hf_dataset", path=str(saved), text_field="id"))


def test_hf_dataset_from_local_text_file(tmp_path, hf_offline):
    local = write(tmp_path / "corpus.txt", "line one\nline two\n\nafter a blank line\n")
    cfg = cfg_for(tmp_path, source="hf_dataset", path=str(local))
    assert load_text(cfg) == local.read_text()  # the file as it is, not line by line
    jsonl = write(tmp_path / "c.jsonl", '{"body": "a"}\n{"body": "b"}\n')
    assert load_text(cfg_for(tmp_path, source="hf_dataset", path=str(jsonl),
                             text_field="body")) == "a\n\nb"
    with pytest.raises(ValueError, match="expected a"):
        load_text(cfg_for(tmp_path, source="hf_dataset", path=str(write(tmp_path / "x.doc",
                                                                          "x"))))


def test_unknown_source(tmp_path):
    with pytest.raises(ValueError, match="got 'ftp'"):
        load_text(cfg_for(tmp_path, source="ftp"))


# --- prepare ----------------------------------------------------------------------------------
def text_files_cfg(tmp_path, **kwargs) -> DataConfig:
    if not (tmp_path / "corpus").exists():
        write(tmp_path / "corpus" / "a.txt", TEXTS["ascii"] * 30)
        write(tmp_path / "corpus" / "b.txt", TEXTS["unicode"] * 30)
    return cfg_for(tmp_path, source="text_files", path=str(tmp_path / "corpus" / "*.txt"),
                   **kwargs)


@pytest.mark.parametrize("tokenizer, vocab_size", [("char", 4096), ("bpe", 300)])
def test_prepare_writes_tokens_tokenizer_and_meta(tmp_path, tokenizer, vocab_size):
    cfg = text_files_cfg(tmp_path, tokenizer=tokenizer, vocab_size=vocab_size,
                         val_fraction=0.25, val_split="position")
    lines = []
    data = prepare(cfg, log=lines.append)
    assert data.directory == prepared_dir(cfg) and data.directory.parent.parent == \
        tmp_path / "cache"
    assert {p.name for p in data.directory.iterdir()} == {"tokens_000000.bin",
                                                          "tokenizer.json", "manifest.json"}
    meta = json.loads((data.directory / "manifest.json").read_text())
    assert meta == data.meta and meta["tokenizer"] == tokenizer and meta["dtype"] == "uint16"
    assert meta["complete"] and meta["val_split"] == "position" and meta["documents"] == 2
    text = load_text(cfg)
    ids = data.tokenizer.encode(text)
    n_val = int(len(ids) * 0.25)
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(ids) - n_val, n_val)
    assert meta["characters"] == len(text) and meta["vocab_size"] == data.vocab_size
    train, val = data.train_tokens(), data.val_tokens()
    assert isinstance(train, TokenSplit) and train.dtype == np.uint16
    shard = data.directory / "tokens_000000.bin"
    assert read_header(shard) == (len(ids), np.uint16)
    assert shard.stat().st_size == 1024 + 2 * len(ids)
    assert data.shard_paths("train") == data.shard_paths("val") == [shard]
    assert np.concatenate([train, val]).tolist() == ids
    assert load_tokenizer(data.directory / "tokenizer.json").encode(text) == ids
    assert any("tokens" in line for line in lines)


def test_prepare_skips_when_nothing_changed_and_redoes_when_something_did(tmp_path):
    cfg = text_files_cfg(tmp_path)
    first = prepare(cfg, log=lambda line: None)
    lines = []
    again = prepare(cfg, log=lines.append)
    assert again.directory == first.directory and again.meta == first.meta
    assert len(lines) == 1 and lines[0].startswith("data: using prepared tokens in")

    # a changed field, a changed file, force: each prepares again
    changed = text_files_cfg(tmp_path, val_fraction=0.2)
    assert prepared_dir(changed) != first.directory
    lines = []
    prepare(changed, log=lines.append)
    assert not any("using prepared" in line for line in lines)

    write(tmp_path / "corpus" / "a.txt", TEXTS["ascii"] * 31)
    lines = []
    edited = prepare(cfg, log=lines.append)
    assert edited.directory != first.directory and not any("using prepared" in line
                                                            for line in lines)
    assert edited.meta["train_tokens"] > first.meta["train_tokens"]

    created = edited.meta["created"], (edited.directory / "manifest.json").stat().st_mtime_ns
    time.sleep(0.01)
    lines = []
    forced = prepare(cfg, force=True, log=lines.append)
    assert forced.directory == edited.directory
    assert (forced.directory / "manifest.json").stat().st_mtime_ns != created[1]
    assert not any("using prepared" in line for line in lines)


def test_prepare_cache_dir_does_not_change_the_key(tmp_path):
    a = text_files_cfg(tmp_path)
    b = text_files_cfg(tmp_path, cache_dir=str(tmp_path / "other"))
    assert prepared_dir(a).name == prepared_dir(b).name


def test_prepare_redoes_an_incomplete_folder(tmp_path):
    cfg = text_files_cfg(tmp_path)
    data = prepare(cfg, log=lambda line: None)
    shard = data.shard_paths("val")[-1]
    with open(shard, "ab") as f:  # a damaged shard no longer matches its header
        f.write(b"\0\0")
    lines = []
    again = prepare(cfg, log=lines.append)
    assert not any("using prepared" in line for line in lines)
    assert read_header(again.shard_paths("val")[-1])[0] == again.meta["shards"][-1]["tokens"]
    leftovers = [p.name for p in data.directory.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_prepare_notices_a_rewrite_that_keeps_size_and_mtime(tmp_path):
    # cp -p, rsync -t or tar put an older version back with its times: the fingerprint
    # (size, mtime) did not change and the stale tokens were used
    cfg = text_files_cfg(tmp_path)
    first = prepare(cfg, log=lambda line: None)
    path = tmp_path / "corpus" / "a.txt"
    before = path.stat()
    time.sleep(0.02)  # past the file system's clock tick
    write(path, TEXTS["ascii"].upper() * 30)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size
    again = prepare(cfg, log=lambda line: None)
    assert again.directory != first.directory
    assert "FIRST CITIZEN" in again.tokenizer.decode(again.train_tokens()[:100])


def test_a_concurrent_prepare_waits_then_uses_the_folder_the_first_finished(tmp_path,
                                                                            monkeypatch):
    # two runs of one config at once: the second waits on the lock, then reads the first's
    # folder instead of tokenizing the corpus again beside it
    preparation = importlib.import_module("minitorch_gpu.data.preparation")
    cfg = text_files_cfg(tmp_path)
    build = preparation.Preparation._build_tokenizer
    building = threading.Event()

    def slow_build(self):
        building.set()
        time.sleep(0.5)  # the second prepare arrives while the first holds the lock
        return build(self)

    monkeypatch.setattr(preparation.Preparation, "_build_tokenizer", slow_build)
    results, lines = {}, []
    first = threading.Thread(target=lambda: results.update(first=prepare(
        cfg, log=lambda line: None)))
    first.start()
    assert building.wait(10)
    results["second"] = prepare(cfg, log=lines.append)
    first.join()
    assert results["second"].directory == results["first"].directory
    assert results["second"].meta == results["first"].meta
    assert any("waiting for another prepare" in line for line in lines)
    assert any("another prepare of this config finished first" in line for line in lines)
    parent = results["first"].directory.parent
    assert sorted(p.name for p in parent.iterdir()) == [results["first"].directory.name]


@pytest.mark.parametrize("vocab_size, dtype", [(1, np.uint16), (65535, np.uint16),
                                               (65536, np.uint16), (65537, np.uint32),
                                               (200_000, np.uint32)])
def test_token_dtype(vocab_size, dtype):
    assert token_dtype(vocab_size) == np.dtype(dtype)


def test_token_dtype_rejects_empty_vocabulary():
    with pytest.raises(ValueError, match="vocab_size"):
        token_dtype(0)


def test_prepare_too_small_corpus(tmp_path):
    write(tmp_path / "tiny.txt", "abc")
    cfg = cfg_for(tmp_path, source="text_files", path=str(tmp_path / "tiny.txt"))
    with pytest.raises(ValueError, match="too small") as info:
        prepare(cfg, log=lambda line: None)
    assert "4 tokens" in str(info.value)  # "abc" + the final newline
    assert not (tmp_path / "cache" / "prepared").exists() or \
        not any((tmp_path / "cache" / "prepared").iterdir())


def test_prepare_python_stdlib_bpe(tmp_path):
    cfg = cfg_for(tmp_path, source="python_stdlib", max_chars=100_000, tokenizer="bpe",
                  vocab_size=512)
    data = prepare(cfg, log=lambda line: None)
    assert data.vocab_size == 512 and data.tokenizer.kind == "bpe"
    assert data.meta["characters"] == 100_000
    assert "def " in data.tokenizer.decode(data.val_tokens()[:2000])


# --- sampler ----------------------------------------------------------------------------------
TOKENS = np.arange(1000, dtype=np.uint16) % 977


def batches(sampler, n):
    return [tuple(t.numpy().copy() for t in sampler.next_batch()) for _ in range(n)]


@pytest.mark.parametrize("block_size, batch_size", [(8, 4), (1, 1), (999, 3), (16, 1)])
def test_sampler_shapes_dtype_and_shift(block_size, batch_size):
    x, y = BatchSampler(TOKENS, block_size, batch_size, seed=0).next_batch()
    assert isinstance(x, mt.Tensor) and x.shape == y.shape == (batch_size, block_size)
    assert x.dtype == mt.int64 and y.dtype == mt.int64
    x, y = x.numpy(), y.numpy()
    assert (x[:, 1:] == y[:, :-1]).all()
    starts = x[:, 0].astype(np.int64)  # TOKENS[i] == i here below 977
    expected = TOKENS[starts[:, None] + np.arange(block_size + 1)]
    assert (np.concatenate([x, y[:, -1:]], axis=1) == expected).all()


def test_sampler_reads_a_memmap(tmp_path):
    path = tmp_path / "tokens.bin"
    TOKENS.tofile(path)
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    got = batches(BatchSampler(tokens, 8, 4, seed=3), 3)
    assert all(np.array_equal(a[0], b[0]) for a, b in
               zip(got, batches(BatchSampler(TOKENS, 8, 4, seed=3), 3)))


def test_sampler_determinism():
    same = [batches(BatchSampler(TOKENS, 8, 4, seed=7), 5) for _ in range(2)]
    other = batches(BatchSampler(TOKENS, 8, 4, seed=8), 5)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(*same))
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(same[0], other))


def test_sampler_resume_continues_identically():
    straight = batches(BatchSampler(TOKENS, 8, 4, seed=11), 6)
    first = BatchSampler(TOKENS, 8, 4, seed=11)
    head = batches(first, 3)
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    resumed = BatchSampler(TOKENS, 8, 4, seed=999)
    resumed.load_state_dict(state)
    tail = batches(resumed, 3)
    for want, got in zip(straight, head + tail):
        assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])


def test_sampler_covers_the_last_token():
    tokens = np.arange(12, dtype=np.uint16)
    sampler = BatchSampler(tokens, 10, 64, seed=0)
    last = {int(sampler.next_batch()[1].numpy()[:, -1].max()) for _ in range(4)}
    assert last == {11}  # offsets reach len - block_size - 1, never beyond


def test_sampler_too_short():
    with pytest.raises(ValueError, match=r"10 tokens.*block_size \+ 1 = 65.*model.block_size"):
        BatchSampler(np.arange(10, dtype=np.uint16), 64, 4, seed=0)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"block_size": 0}, ValueError, "block_size"),
    ({"batch_size": 2.0}, ValueError, "batch_size"),
    ({"tokens": [1, 2, 3]}, TypeError, "numpy array"),
    ({"tokens": np.zeros((4, 4), dtype=np.int64)}, ValueError, "1-D"),
    ({"tokens": np.zeros(100, dtype=np.float32)}, ValueError, "integer"),
    ({"seed": -1}, ValueError, "seed to be an int >= 0"),
])
def test_sampler_bad_arguments(kwargs, error, match):
    args = {"tokens": TOKENS, "block_size": 8, "batch_size": 4, "seed": 0, **kwargs}
    with pytest.raises(error, match=match):
        BatchSampler(**args)


def test_sampler_load_state_dict_rejects_foreign_state():
    sampler = BatchSampler(TOKENS, 8, 4, seed=0)
    with pytest.raises(ValueError, match="bit_generator"):
        sampler.load_state_dict({"seed": 1})
    with pytest.raises(ValueError, match="PCG64"):
        sampler.load_state_dict({"bit_generator": {"bit_generator": "MT19937"}})


def test_prepared_data_feeds_the_sampler(tmp_path):
    data = prepare(text_files_cfg(tmp_path), log=lambda line: None)
    x, y = BatchSampler(data.val_tokens(), 16, 2, seed=0).next_batch()
    assert x.shape == (2, 16) and int(x.numpy().max()) < data.vocab_size
    assert os.path.commonpath([data.directory, tmp_path]) == str(tmp_path)
