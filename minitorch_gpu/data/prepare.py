"""Corpus -> tokenizer + token files on disk, done once per corpus and data config.

``prepare(cfg)`` writes ``<cache>/prepared/<key>/`` holding ``train.bin`` and ``val.bin`` (raw
uint16 ids, uint32 when the vocabulary exceeds 65536), ``tokenizer.json`` and ``meta.json``.
The key hashes the source's fingerprint and every data setting but ``cache_dir``, so a
second call with nothing changed only reads ``meta.json``.

>>> data = prepare(DataConfig(source="python_stdlib", max_chars=100_000))
>>> data.train_tokens()[:8]  # a read-only np.memmap
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from .config import DataConfig
from .sources import cache_root, describe_source, load_text, source_fingerprint
from .tokenizer import Tokenizer, build_tokenizer, load_tokenizer

__all__ = ["PreparedData", "prepare", "prepared_dir", "token_dtype", "PREPARE_FORMAT"]

PREPARE_FORMAT = 1  # bump when the files' layout changes: old prepared folders are then unused
MIN_SPLIT_TOKENS = 2  # a split needs an input and its next token

Log = Callable[[str], None]


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding ids below ``vocab_size``: uint16 up to 65536."""
    if vocab_size < 1:
        raise ValueError(f"token_dtype: expected vocab_size >= 1, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def _settings(cfg: DataConfig) -> Dict[str, Any]:
    """The data config without the fields that do not change the tokens."""
    settings = dataclasses.asdict(cfg)
    settings.pop("cache_dir")
    return settings


def _tokenizer_fingerprint(cfg: DataConfig) -> Optional[str]:
    if cfg.tokenizer != "file" or not cfg.tokenizer_path:
        return None
    path = Path(cfg.tokenizer_path).expanduser()
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _key(cfg: DataConfig) -> Tuple[str, str]:
    """The prepared folder's key and the source fingerprint it contains."""
    fingerprint = source_fingerprint(cfg)
    ingredients = {"format": PREPARE_FORMAT, "source": fingerprint,
                   "tokenizer_file": _tokenizer_fingerprint(cfg), "data": _settings(cfg)}
    encoded = json.dumps(ingredients, sort_keys=True).encode("utf-8")
    return hashlib.sha256(encoded).hexdigest()[:16], fingerprint


def _directory(cfg: DataConfig, key: str) -> Path:
    return cache_root(cfg) / "prepared" / f"{cfg.source}-{key}"


def prepared_dir(cfg: DataConfig) -> Path:
    """The folder ``prepare(cfg)`` writes to (it need not exist yet)."""
    return _directory(cfg, _key(cfg)[0])


@dataclass
class PreparedData:
    """A prepared corpus: its folder, its ``meta.json`` and its tokenizer."""

    directory: Path
    meta: Dict[str, Any]
    tokenizer: Tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def train_path(self) -> Path:
        return self.directory / "train.bin"

    @property
    def val_path(self) -> Path:
        return self.directory / "val.bin"

    def _tokens(self, path: Path, count: int) -> np.memmap:
        return np.memmap(path, dtype=np.dtype(self.meta["dtype"]), mode="r", shape=(count,))

    def train_tokens(self) -> np.memmap:
        """The training ids, read-only and memory-mapped: (train_tokens,)."""
        return self._tokens(self.train_path, int(self.meta["train_tokens"]))

    def val_tokens(self) -> np.memmap:
        """The validation ids, read-only and memory-mapped: (val_tokens,)."""
        return self._tokens(self.val_path, int(self.meta["val_tokens"]))


def _load_if_complete(directory: Path, key: str) -> Optional[PreparedData]:
    """The prepared data in ``directory`` when its meta.json has ``key`` and the token files
    have the sizes it records; else None."""
    try:
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split in ("train", "val"):
            if (directory / f"{split}.bin").stat().st_size != meta[f"{split}_tokens"] * itemsize:
                return None
        if meta.get("key") != key or meta.get("format") != PREPARE_FORMAT:
            return None
        tokenizer = load_tokenizer(directory / "tokenizer.json")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return PreparedData(directory, meta, tokenizer)


def _check_not_empty(text: str, cfg: DataConfig) -> None:
    """ValueError naming the source when the corpus has nothing to learn: no characters, or
    only the newlines that end and separate its files, or only whitespace."""
    if text.strip():
        return
    what = "no text" if not text.strip("\n") else f"only whitespace ({len(text):,} characters)"
    raise ValueError(f"prepare: the corpus is empty: {describe_source(cfg)} holds {what}; "
                     f"point data.path (or data.paths, data.dataset) at some text")


def _split(ids: np.ndarray, cfg: DataConfig, characters: int) -> tuple:
    n_val = int(len(ids) * cfg.val_fraction)
    n_train = len(ids) - n_val
    if min(n_train, n_val) < MIN_SPLIT_TOKENS:
        empty = ": an empty val split" if n_val == 0 else ""
        raise ValueError(f"prepare: the corpus is too small: {describe_source(cfg)} gave "
                         f"{characters:,} characters, {len(ids):,} tokens, split into "
                         f"{n_train:,} train and {n_val:,} val tokens "
                         f"(data.val_fraction={cfg.val_fraction}{empty}); each split needs "
                         f"at least {MIN_SPLIT_TOKENS} tokens. Use more text (data.max_chars, "
                         f"data.path) or change data.val_fraction")
    return ids[:n_train], ids[n_train:]


def _write_atomically(directory: Path, key: str, files: Dict[str, Any], meta: Dict[str, Any],
                      replace_complete: bool) -> Optional[PreparedData]:
    """Build the folder beside ``directory`` and rename it into place, meta.json last, so a
    prepare killed half-way never looks complete. Returns None when our folder is in place,
    or the complete folder another prepare of the same key put there first (then ours is
    dropped: the two hold the same tokens, and whoever reads theirs keeps reading it).
    ``replace_complete`` (force) replaces a complete folder found at the start."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    try:
        for name, content in files.items():
            if isinstance(content, np.ndarray):
                content.tofile(tmp / name)
            else:
                (tmp / name).write_text(content, encoding="utf-8")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
        for _ in range(3):  # each retry follows another prepare's rename into our path
            if not replace_complete:
                theirs = _load_if_complete(directory, key)
                if theirs is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
                    return theirs
            replace_complete = False  # one that appears later was made after we started
            if directory.exists():  # stale, incomplete or forced: move aside, then delete
                old = Path(tempfile.mkdtemp(dir=directory.parent,
                                            prefix=f".{directory.name}.old-"))
                with contextlib.suppress(FileNotFoundError):  # another prepare moved it
                    os.replace(directory, old / "dir")
                shutil.rmtree(old, ignore_errors=True)
            try:
                os.replace(tmp, directory)
                return None
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        raise RuntimeError(f"prepare: other prepares keep replacing {directory}; run one "
                           f"prepare of this config at a time")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def prepare(cfg: DataConfig, *, force: bool = False, log: Log = print) -> PreparedData:
    """Tokenize ``cfg``'s corpus into ``prepared_dir(cfg)`` unless that is already done (or
    ``force``); the PreparedData to train on."""
    key, fingerprint = _key(cfg)
    directory = _directory(cfg, key)
    if not force:
        ready = _load_if_complete(directory, key)
        if ready is not None:
            log(f"data: using prepared tokens in {directory} ({ready.meta['train_tokens']:,} "
                f"train + {ready.meta['val_tokens']:,} val tokens, {ready.meta['tokenizer']} "
                f"vocab {ready.vocab_size:,})")
            return ready

    started = time.perf_counter()
    text = load_text(cfg, log=log)
    loaded = time.perf_counter()
    _check_not_empty(text, cfg)
    log(f"data: read {len(text):,} characters from {cfg.source} in {loaded - started:.1f}s")
    key, fingerprint = _key(cfg)  # again: a download may have created the source file
    directory = _directory(cfg, key)

    tokenizer = build_tokenizer(cfg, text)
    built = time.perf_counter()
    if cfg.tokenizer == "bpe":
        log(f"data: trained a byte-level BPE of vocab {tokenizer.vocab_size:,} in "
            f"{built - loaded:.1f}s")
    dtype = token_dtype(tokenizer.vocab_size)
    ids = tokenizer.encode_array(text)  # (tokens,)
    if ids.size and not 0 <= int(ids.min()) <= int(ids.max()) < tokenizer.vocab_size:
        raise ValueError(f"prepare: the {tokenizer.kind} tokenizer gave ids in [{ids.min()}, "
                         f"{ids.max()}], outside its vocabulary [0, {tokenizer.vocab_size})")
    ids = ids.astype(dtype)  # the check above: no id wraps around
    train, val = _split(ids, cfg, len(text))
    encoded = time.perf_counter()
    log(f"data: {len(ids):,} tokens ({tokenizer.kind}, vocab {tokenizer.vocab_size:,}, "
        f"{len(text) / max(len(ids), 1):.2f} chars/token) in {encoded - built:.1f}s")

    meta = {"format": PREPARE_FORMAT, "key": key, "tokenizer": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size, "dtype": dtype.name,
            "train_tokens": int(len(train)), "val_tokens": int(len(val)),
            "characters": len(text), "source_fingerprint": fingerprint,
            "data_config": dataclasses.asdict(cfg),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(time.perf_counter() - started, 3)}
    theirs = _write_atomically(directory, key, {"train.bin": train, "val.bin": val,
                                                "tokenizer.json": tokenizer.to_json()}, meta,
                               replace_complete=force)
    if theirs is not None:
        log(f"data: another prepare of this config finished first; using its tokens in "
            f"{directory}")
        return theirs
    log(f"data: wrote {len(train):,} train + {len(val):,} val tokens ({dtype.name}) to "
        f"{directory} in {time.perf_counter() - started:.1f}s")
    return PreparedData(directory, meta, tokenizer)
