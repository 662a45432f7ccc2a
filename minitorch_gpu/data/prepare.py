"""Corpus -> tokenizer + token shards on disk, streamed, once per corpus and data config.

``prepare(cfg)`` writes ``<cache>/prepared/<source>-<key>/`` holding ``tokenizer.json``, the
token shards (``shards.py``: a 1 KiB header, then uint16 ids, uint32 past 65,536 tokens)
and ``manifest.json``, which lists the shards and where each split lies in them. The key
hashes the source's fingerprint and every data setting that changes the tokens, so a second
call with nothing changed only reads the manifest.

The corpus streams through: documents a block at a time (``sources.documents``), cut into
chunks (``encoding.Chunker``), tokenized in worker processes, appended to shards. Memory
stays bounded whatever the corpus's size; a BPE is trained on the corpus's first
``data.tokenizer_sample_chars`` characters (a corpus below that: on all of it).

The work goes on in ``<name>.partial/``, whose manifest (replaced atomically) lists every
finished shard and where the stream resumes after it; Ctrl-C or a crash keeps the finished
shards, and the next prepare continues from them. The folder is renamed into place once
whole. One prepare of a key runs at a time (a lock file beside it); another waits, then
uses what the first made.

The val split (``data.val_split``): ``position``, nanoGPT's, the last ``val_fraction`` of
the tokens; ``documents``, whole documents, every (1/val_fraction)-th (document ``i`` when
``floor((i + 1) f + 1/2) > floor(i f + 1/2)``), in shards of their own; ``auto``,
``documents`` for a corpus of at least 1/val_fraction documents (files, dataset rows), else
``position`` (tinyshakespeare, one file, a few).

>>> data = prepare(DataConfig(source="python_stdlib", max_chars=100_000))
>>> data.train_tokens()[:8]  # a TokenSplit: slices read the shards
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .config import DataConfig
from .preparation import PREPARE_FORMAT, Preparation, read_manifest, token_dtype, val_split_of
from .shards import ShardRange, TokenSplit, read_header
from .sources import cache_root, fetch_source, source_fingerprint
from .tokenizer import Tokenizer, load_tokenizer

__all__ = ["PreparedData", "prepare", "prepared_dir", "token_dtype", "val_split_of",
           "PREPARE_FORMAT"]

NOT_TOKENS = ("cache_dir", "workers")  # data settings that do not change the tokens

Log = Callable[[str], None]


def _settings(cfg: DataConfig) -> Dict[str, Any]:
    """The data config without the fields that do not change the tokens."""
    settings = dataclasses.asdict(cfg)
    for name in NOT_TOKENS:
        settings.pop(name)
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
    """A prepared corpus: its folder, its ``manifest.json`` (``meta``) and its tokenizer."""

    directory: Path
    meta: Dict[str, Any]
    tokenizer: Tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def shard_paths(self, split: str) -> List[Path]:
        """The shard files ``split`` (train or val) reads, in order."""
        return list(dict.fromkeys(r.path for r in self._ranges(split)))

    def _ranges(self, split: str) -> List[ShardRange]:
        return [ShardRange(self.directory / name, start, stop)
                for name, start, stop in self.meta["splits"][split]]

    def train_tokens(self) -> TokenSplit:
        """The training ids, read from the shards: (train_tokens,)."""
        return TokenSplit(self._ranges("train"), np.dtype(self.meta["dtype"]))

    def val_tokens(self) -> TokenSplit:
        """The validation ids, read from the shards: (val_tokens,)."""
        return TokenSplit(self._ranges("val"), np.dtype(self.meta["dtype"]))


def _load_if_complete(directory: Path, key: str) -> Optional[PreparedData]:
    """The prepared data in ``directory`` when its manifest is complete, has ``key``, and
    every shard it names has the header and size it records; else None."""
    meta = read_manifest(directory)
    try:
        if meta is None or not meta.get("complete") or meta.get("key") != key or \
                meta.get("format") != PREPARE_FORMAT:
            return None
        dtype = np.dtype(meta["dtype"])
        for shard in meta["shards"]:
            if read_header(directory / shard["name"]) != (shard["tokens"], dtype):
                return None
        tokenizer = load_tokenizer(directory / "tokenizer.json")
    except (OSError, ValueError, KeyError, TypeError):  # ShardError is a ValueError
        return None
    return PreparedData(directory, meta, tokenizer)


@contextlib.contextmanager
def _one_prepare_at_a_time(directory: Path, log: Log) -> Iterator[None]:
    """Hold ``<name>.lock`` beside ``directory`` (flock): a second prepare of the key waits
    here until the first is done, then finds its folder."""
    path = directory.with_name(directory.name + ".lock")
    directory.parent.mkdir(parents=True, exist_ok=True)
    while True:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"data: waiting for another prepare of this config (it holds {path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:  # the holder before us may have deleted the file: lock the one at the path
            same = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):  # ours only: a file someone deleted
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:  # and another made stays
                path.unlink()  # while still locked: a waiter then sees it is gone, retries
        f.close()


def _replace_directory(work: Path, directory: Path) -> None:
    """Rename the whole ``work`` folder to ``directory``; an old one there (stale, damaged
    or forced) is moved aside first, then deleted."""
    if directory.exists():
        old = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.old-"))
        os.replace(directory, old / "dir")
        shutil.rmtree(old, ignore_errors=True)
    os.replace(work, directory)


def prepare(cfg: DataConfig, *, force: bool = False, log: Log = print) -> PreparedData:
    """Tokenize ``cfg``'s corpus into ``prepared_dir(cfg)`` unless that is already done (or
    ``force``); the PreparedData to train on. An interrupted prepare continues where it
    stopped (``force`` starts again)."""
    key, fingerprint = _key(cfg)
    directory = _directory(cfg, key)
    if not force:
        ready = _load_if_complete(directory, key)
        if ready is not None:
            _log_ready(ready, directory, log)
            return ready
    fetch_source(cfg, log)  # a download changes the fingerprint: the key after it
    key, fingerprint = _key(cfg)
    directory = _directory(cfg, key)
    started = time.perf_counter()
    with _one_prepare_at_a_time(directory, log):
        if not force:
            theirs = _load_if_complete(directory, key)
            if theirs is not None:
                log(f"data: another prepare of this config finished first; using its tokens "
                    f"in {directory}")
                return theirs
        work = directory.with_name(directory.name + ".partial")
        preparation = Preparation(cfg, key, fingerprint, work, log)
        try:
            meta = preparation.run(force)
        except (ValueError, TypeError):  # the corpus itself is the problem: nothing to keep
            shutil.rmtree(work, ignore_errors=True)
            raise
        except KeyboardInterrupt:
            done = read_manifest(work) or {"streams": {}}
            shards = sum(len(s["shards"]) for s in done["streams"].values())
            log(f"data: interrupted; {shards} finished shard(s) kept in {work}: prepare "
                f"again to continue")
            raise
        if _load_if_complete(work, key) is None:  # a shard lost or cut short on the way
            raise RuntimeError(f"prepare: the shards in {work} do not match their manifest "
                               f"after writing; prepare again with --force")
        _replace_directory(work, directory)
    log(f"data: wrote {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens "
        f"({meta['dtype']}, {len(meta['shards'])} shard(s), val split by "
        f"{meta['val_split']}) to {directory} in {time.perf_counter() - started:.1f}s")
    return PreparedData(directory, meta, load_tokenizer(directory / "tokenizer.json"))


def _log_ready(ready: PreparedData, directory: Path, log: Log) -> None:
    log(f"data: using prepared tokens in {directory} ({ready.meta['train_tokens']:,} "
        f"train + {ready.meta['val_tokens']:,} val tokens, {ready.meta['tokenizer']} "
        f"vocab {ready.vocab_size:,})")
