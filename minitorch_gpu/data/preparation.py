"""The work of one prepare, in its ``.partial`` folder: the tokenizer, the shards of each
stream, the manifest after every finished shard, and at the end each split as ranges of
shards. ``prepare.py`` decides whether it is needed and moves its folder into place.

A stream is the text of one split's documents (``documents`` val split) or of the whole
corpus (``position``), joined as ``load_text`` joins it, cut into chunks (``Chunker``) and
tokenized in order. After each finished shard the manifest records, per stream, where to
resume: the first character of the chunk that shard ends in, and how many of that chunk's
tokens the shards already hold. A resumed prepare reads the corpus again from its start,
skips the text before that point without tokenizing it, and re-encodes that one chunk.
"""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..system.atomic import atomic_write
from .config import DataConfig
from .encoding import BATCH_CHARS, Chunker, default_workers, encode_in_order
from .shards import ShardWriter, read_header
from .sources import describe_source, document_count, joined_pieces
from .tokenizer import (CHUNK_CHARS, BPETokenizer, CharTokenizer, Tokenizer, _check_lossless,
                        load_tokenizer)

__all__ = ["PREPARE_FORMAT", "token_dtype", "val_split_of", "read_manifest", "Preparation"]

PREPARE_FORMAT = 2  # bump when the files' layout changes: old prepared folders are then unused
MIN_SPLIT_TOKENS = 2  # a split needs an input and its next token

Log = Callable[[str], None]


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding ids below ``vocab_size``: uint16 up to 65536."""
    if vocab_size < 1:
        raise ValueError(f"token_dtype: expected vocab_size >= 1, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def val_split_of(cfg: DataConfig) -> str:
    """``data.val_split`` with ``auto`` decided: documents for a corpus of at least
    1/val_fraction documents, or a dataset streamed (its length unknown)."""
    if cfg.val_split not in ("auto", "position", "documents"):
        raise ValueError(f"data.val_split: expected auto, position or documents, got "
                         f"{cfg.val_split!r}")
    if cfg.val_split != "auto":
        return cfg.val_split
    count = document_count(cfg)  # None: a stream of rows, of unknown length
    return "documents" if count is None or count * cfg.val_fraction >= 1 else "position"


def _is_val_document(index: int, fraction: float) -> bool:
    return math.floor((index + 1) * fraction + 0.5) > math.floor(index * fraction + 0.5)


def read_manifest(directory: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_manifest(directory: Path, manifest: Dict[str, Any]) -> None:
    with atomic_write(directory / "manifest.json") as f:  # never half a manifest
        f.write((json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def _check_not_empty(sample: str, cfg: DataConfig) -> None:
    """ValueError naming the source when the corpus has nothing to learn: no characters, or
    only the newlines that end and separate its files, or only whitespace."""
    if sample.strip():
        return
    what = "no text" if not sample.strip("\n") else \
        f"only whitespace ({len(sample):,} characters)"
    raise ValueError(f"prepare: the corpus is empty: {describe_source(cfg)} holds {what}; "
                     f"point data.path (or data.paths, data.dataset) at some text")


def _too_small(cfg: DataConfig, characters: int, n_train: int, n_val: int,
               hint: str = "") -> ValueError:
    empty = ": an empty val split" if n_val == 0 else ""
    return ValueError(
        f"prepare: the corpus is too small: {describe_source(cfg)} gave {characters:,} "
        f"characters, {n_train + n_val:,} tokens, split into {n_train:,} train and "
        f"{n_val:,} val tokens (data.val_fraction={cfg.val_fraction}{empty}); each split "
        f"needs at least {MIN_SPLIT_TOKENS} tokens. Use more text (data.max_chars, "
        f"data.path) or change data.val_fraction{hint}")


class Preparation:
    """One prepare's work in ``work``: tokenizer, shards, manifest; resumable."""

    def __init__(self, cfg: DataConfig, key: str, fingerprint: str, work: Path,
                 log: Log) -> None:
        self.cfg, self.key, self.fingerprint, self.work, self.log = \
            cfg, key, fingerprint, work, log
        self.split = val_split_of(cfg)
        self.streams = ["tokens"] if self.split == "position" else ["train", "val"]

    # --- the tokenizer ------------------------------------------------------------------
    def _pieces(self, route: Optional[Callable[[int], int]] = None
                ) -> Iterator[Tuple[int, int, str]]:
        return joined_pieces(self.cfg, route, log=self.log)

    def _sample(self) -> str:
        """The corpus's first data.tokenizer_sample_chars characters."""
        parts, left = [], self.cfg.tokenizer_sample_chars
        for _, _, piece in self._pieces():
            parts.append(piece[:left])
            left -= len(parts[-1])
            if left <= 0:
                break
        return "".join(parts)

    def _build_tokenizer(self) -> Tokenizer:
        cfg, started = self.cfg, time.perf_counter()
        sample = self._sample()
        _check_not_empty(sample, cfg)
        if cfg.tokenizer == "char":  # every character of the corpus: one more pass
            chars = set(sample)
            if len(sample) >= cfg.tokenizer_sample_chars:
                for _, _, piece in self._pieces():
                    chars.update(piece)
            return CharTokenizer(sorted(chars))
        if cfg.tokenizer == "bpe":
            tokenizer = BPETokenizer.train(sample, cfg.vocab_size)
            whole = "all" if len(sample) < cfg.tokenizer_sample_chars else "the first"
            self.log(f"data: trained a byte-level BPE of vocab {tokenizer.vocab_size:,} on "
                     f"{whole} {len(sample):,} characters in "
                     f"{time.perf_counter() - started:.1f}s")
            return tokenizer
        if cfg.tokenizer == "file":
            if not cfg.tokenizer_path:
                raise ValueError("data.tokenizer_path: expected the path of a tokenizer.json "
                                 "for tokenizer: file, got none")
            tokenizer = load_tokenizer(cfg.tokenizer_path)
            _check_lossless(tokenizer, sample, f"data.tokenizer_path {cfg.tokenizer_path!r}")
            return tokenizer
        raise ValueError(f"data.tokenizer: expected one of char, bpe, file, got "
                         f"{cfg.tokenizer!r}")

    # --- the shards ---------------------------------------------------------------------
    def _start_or_resume(self, force: bool) -> Tuple[Tokenizer, Dict[str, Any]]:
        manifest = None if force else read_manifest(self.work)
        if manifest is not None and manifest.get("key") == self.key and \
                manifest.get("format") == PREPARE_FORMAT and not manifest.get("complete"):
            try:
                tokenizer = load_tokenizer(self.work / "tokenizer.json")
                shards = self._check_partial(manifest)
                self.log(f"data: continuing the prepare in {self.work} after its {shards} "
                         f"finished shard(s)")
                return tokenizer, manifest
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.log(f"data: the unfinished prepare in {self.work} is damaged ({exc}); "
                         f"starting again")
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        tokenizer = self._build_tokenizer()
        (self.work / "tokenizer.json").write_text(tokenizer.to_json(), encoding="utf-8")
        manifest = {"format": PREPARE_FORMAT, "key": self.key, "complete": False,
                    "tokenizer": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                    "dtype": token_dtype(tokenizer.vocab_size).name,
                    "val_split": self.split, "shard_tokens": self.cfg.shard_tokens,
                    "streams": {name: {"shards": [], "resume": {"chars": 0, "skip_tokens": 0}}
                                for name in self.streams}}
        _write_manifest(self.work, manifest)
        return tokenizer, manifest

    def _check_partial(self, manifest: Dict[str, Any]) -> int:
        """The number of finished shards a partial manifest lists; ValueError (KeyError,
        TypeError) when it lacks a stream or a resume point, or a shard's file is not the
        whole shard it lists (truncated, deleted, another dtype)."""
        dtype, streams = np.dtype(manifest["dtype"]), manifest["streams"]
        if sorted(streams) != sorted(self.streams):
            raise ValueError(f"streams {sorted(streams)}, expected {sorted(self.streams)}")
        count = 0
        for name in self.streams:
            resume = streams[name]["resume"]
            if not all(isinstance(resume[key], int) and resume[key] >= 0
                       for key in ("chars", "skip_tokens")):
                raise ValueError(f"stream {name}: a bad resume point {resume!r}")
            for shard in streams[name]["shards"]:
                if read_header(self.work / shard["name"]) != (shard["tokens"], dtype):
                    raise ValueError(f"shard {shard['name']} does not hold the "
                                     f"{shard['tokens']:,} {dtype.name} tokens listed")
                count += 1
        return count

    def run(self, force: bool) -> Dict[str, Any]:
        cfg, started = self.cfg, time.perf_counter()
        tokenizer, manifest = self._start_or_resume(force)
        built = time.perf_counter()
        dtype = np.dtype(manifest["dtype"])
        streams = manifest["streams"]
        resume = {name: streams[name]["resume"] for name in self.streams}
        starts = [resume[name]["chars"] for name in self.streams]  # each stream's text
        seen = [0] * len(self.streams)  # the characters of each stream read so far
        chunkers = [Chunker(CHUNK_CHARS, start) for start in starts]
        skip = [resume[name]["skip_tokens"] for name in self.streams]
        # per stream: the chunk being written, (its first character, its first token)
        chunk_at: List[Optional[Tuple[int, int]]] = [None] * len(self.streams)
        written = [sum(s["tokens"] for s in streams[name]["shards"]) for name in self.streams]
        closed = list(written)

        def on_shard(k: int) -> Callable[[str, int], None]:
            def finished(name: str, count: int) -> None:
                stream = streams[self.streams[k]]
                stream["shards"].append({"name": name, "tokens": count})
                closed[k] += count
                start, first_token = chunk_at[k]
                stream["resume"] = {"chars": start, "skip_tokens": closed[k] - first_token}
                _write_manifest(self.work, manifest)
            return finished

        writers = [ShardWriter(self.work, name, dtype, cfg.shard_tokens,
                               len(streams[name]["shards"]), on_shard(k))
                   for k, name in enumerate(self.streams)]
        route = None if self.split == "position" else \
            (lambda i: int(_is_val_document(i, cfg.val_fraction)))
        counts = {"characters": 0, "documents": 0}
        total_docs = document_count(cfg) if cfg.source != "hf_dataset" else None
        from tqdm import tqdm
        bar = tqdm(total=total_docs, unit="doc", disable=None, file=sys.stderr,
                   dynamic_ncols=True, desc="data: tokenizing")

        def batches() -> Iterator[Tuple[Any, List[str]]]:
            """(tags, chunks) of about BATCH_CHARS; a tag is (stream, offset)."""
            tags, chunks, size, last_doc = [], [], 0, -1
            for doc, k, piece in self._pieces(route):
                if doc != last_doc:
                    counts["documents"] += 1
                    bar.update(1)
                    last_doc = doc
                counts["characters"] += len(piece)
                at, seen[k] = seen[k], seen[k] + len(piece)
                if seen[k] <= starts[k]:
                    continue  # before the resume point: in an earlier prepare's shards
                piece = piece[max(starts[k] - at, 0):]
                for cut in range(0, len(piece), BATCH_CHARS):  # a huge row: in slices
                    for offset, chunk in chunkers[k].feed(piece[cut:cut + BATCH_CHARS]):
                        tags.append((k, offset))
                        chunks.append(chunk)
                        size += len(chunk)
                    if size >= BATCH_CHARS:
                        yield tags, chunks
                        tags, chunks, size = [], [], 0
            for k, chunker in enumerate(chunkers):
                for offset, chunk in chunker.finish():
                    tags.append((k, offset))
                    chunks.append(chunk)
            if chunks:
                yield tags, chunks

        workers = default_workers() if cfg.workers is None else cfg.workers
        tokens_at = time.perf_counter()
        try:
            for tags, ids_list in encode_in_order(tokenizer, batches(), workers):
                for (k, offset), ids in zip(tags, ids_list):
                    if ids.size and not 0 <= int(ids.min()) <= int(ids.max()) < \
                            tokenizer.vocab_size:
                        raise ValueError(
                            f"prepare: the {tokenizer.kind} tokenizer gave ids in "
                            f"[{ids.min()}, {ids.max()}], outside its vocabulary "
                            f"[0, {tokenizer.vocab_size})")
                    if skip[k] > ids.size:  # the resume point's chunk encodes shorter
                        raise RuntimeError(f"prepare: resuming, the chunk at character "
                                           f"{offset:,} gave {ids.size:,} tokens, fewer "
                                           f"than the {skip[k]:,} its shards hold; prepare "
                                           f"again with --force")
                    chunk_at[k] = (offset, written[k] - skip[k])
                    writers[k].write(ids[skip[k]:])
                    written[k] += ids.size - skip[k]
                    skip[k] = 0
                rate = sum(written) / max(time.perf_counter() - tokens_at, 1e-9)
                bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)
            for writer in writers:
                writer.close()
        except BaseException:
            for writer in writers:
                writer.abandon()  # the finished shards stay, listed in the manifest
            raise
        finally:
            bar.close()
        encoded = time.perf_counter()
        total = sum(written)
        self.log(f"data: {total:,} tokens ({tokenizer.kind}, vocab {tokenizer.vocab_size:,}, "
                 f"{counts['characters'] / max(total, 1):.2f} chars/token) from "
                 f"{counts['documents']:,} document(s) in {encoded - built:.1f}s "
                 f"({workers} worker process(es))")
        return self._finish(manifest, counts, started)

    def _finish(self, manifest: Dict[str, Any], counts: Dict[str, int],
                started: float) -> Dict[str, Any]:
        """The complete manifest: the shards, and each split as ranges of them."""
        cfg, streams = self.cfg, manifest["streams"]
        if self.split == "position":
            shards = streams["tokens"]["shards"]
            total = sum(s["tokens"] for s in shards)
            n_val = int(total * cfg.val_fraction)
            n_train = total - n_val
            if min(n_train, n_val) < MIN_SPLIT_TOKENS:
                raise _too_small(cfg, counts["characters"], n_train, n_val)
            splits: Dict[str, List[List[Any]]] = {"train": [], "val": []}
            at = 0
            for shard in shards:
                end = at + shard["tokens"]
                if at < n_train:
                    splits["train"].append([shard["name"], 0, min(end, n_train) - at])
                if end > n_train:
                    splits["val"].append([shard["name"], max(n_train - at, 0), shard["tokens"]])
                at = end
        else:
            splits = {name: [[s["name"], 0, s["tokens"]] for s in streams[name]["shards"]]
                      for name in ("train", "val")}
            n_train, n_val = (sum(s["tokens"] for s in streams[name]["shards"])
                              for name in ("train", "val"))
            if min(n_train, n_val) < MIN_SPLIT_TOKENS:
                raise _too_small(cfg, counts["characters"], n_train, n_val,
                                 f" (the val split is every {1 / cfg.val_fraction:.4g}-th of "
                                 f"{counts['documents']:,} documents: data.val_split: "
                                 f"position splits by tokens instead)")
        manifest.update(
            complete=True, splits=splits,
            shards=[s for name in self.streams for s in streams[name]["shards"]],
            train_tokens=int(n_train), val_tokens=int(n_val),
            characters=counts["characters"], documents=counts["documents"],
            source_fingerprint=self.fingerprint, data_config=dataclasses.asdict(cfg),
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            seconds=round(time.perf_counter() - started, 3))
        _write_manifest(self.work, manifest)
        return manifest


