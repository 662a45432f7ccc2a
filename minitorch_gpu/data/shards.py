"""Token shards on disk, and a split read across them.

A shard is one file: a header of 256 little-endian int32 (1,024 bytes), then its token ids,
on the model of llm.c's ``.bin`` shards::

    header[0]  SHARD_MAGIC (20261207)
    header[1]  SHARD_VERSION (1)
    header[2]  the number of tokens that follow
    header[3]  bytes per token: 2 (uint16, a vocabulary up to 65,536) or 4 (uint32)
    header[4:] zero

    np.memmap(path, dtype=np.uint16, mode="r", offset=1024, shape=(header[2],))

``ShardWriter`` cuts one stream of ids into shards of ``shard_tokens`` each (the last holds
the rest); a shard is written under a ``.tmp`` name and renamed when whole, so a file with a
shard's name is always complete. ``TokenSplit`` is a split of the corpus (train or val) as
ranges of shards: ``len``, contiguous slices and ``windows`` read through a memory map that
lives for one call only, so sampling a corpus larger than memory never keeps its pages
mapped (nanoGPT's memmap lesson).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["SHARD_MAGIC", "SHARD_VERSION", "HEADER_BYTES", "ShardError", "read_header",
           "write_header", "ShardWriter", "ShardRange", "TokenSplit"]

SHARD_MAGIC = 20261207
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS
MAX_SHARD_TOKENS = (1 << 31) - 1  # header[2] is an int32


class ShardError(ValueError):
    """A file that is not a whole shard of this format."""


def write_header(f, count: int, dtype: np.dtype) -> None:
    """The header of a shard of ``count`` tokens of ``dtype``, at the file's start."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = SHARD_MAGIC, SHARD_VERSION, count, np.dtype(dtype).itemsize
    f.seek(0)
    f.write(header.tobytes())


def read_header(path: Union[str, Path]) -> Tuple[int, np.dtype]:
    """The token count and dtype of the shard at ``path``; ShardError, naming it, for a file
    with another magic or version, an odd token size, or a size that is not its header's."""
    path = Path(path)
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise ShardError(f"{path}: {len(raw)} bytes, shorter than a shard's "
                         f"{HEADER_BYTES}-byte header")
    magic, version, count, itemsize = (int(v) for v in np.frombuffer(raw, "<i4")[:4])
    if magic != SHARD_MAGIC or version != SHARD_VERSION:
        raise ShardError(f"{path}: not a token shard (magic {magic}, version {version}; "
                         f"expected {SHARD_MAGIC}, {SHARD_VERSION})")
    if itemsize not in (2, 4):
        raise ShardError(f"{path}: {itemsize} bytes per token, expected 2 or 4")
    expected = HEADER_BYTES + count * itemsize
    size = path.stat().st_size
    if count < 0 or size != expected:
        raise ShardError(f"{path}: {size:,} bytes, expected {expected:,} for its header's "
                         f"{count:,} tokens: the shard is truncated or damaged")
    return count, np.dtype(np.uint16 if itemsize == 2 else np.uint32)


class ShardWriter:
    """Appends ids to shards ``<prefix>_000000.bin``, ``<prefix>_000001.bin``, ... in
    ``directory``, each ``shard_tokens`` long but the last. ``on_shard(name, tokens)`` is
    called once a shard's file is whole, and ``position`` counts the tokens written."""

    def __init__(self, directory: Path, prefix: str, dtype: np.dtype, shard_tokens: int,
                 first_index: int = 0, on_shard: Optional[Callable[[str, int], None]] = None
                 ) -> None:
        if not 1 <= shard_tokens <= MAX_SHARD_TOKENS:
            raise ValueError(f"data.shard_tokens: expected an int in [1, {MAX_SHARD_TOKENS:,}]"
                             f", got {shard_tokens!r}")
        self.directory, self.prefix, self.dtype = Path(directory), prefix, np.dtype(dtype)
        self.shard_tokens = int(shard_tokens)
        self.index = first_index
        self.on_shard = on_shard
        self._file = None
        self._count = 0

    def name(self, index: int) -> str:
        return f"{self.prefix}_{index:06d}.bin"

    def write(self, ids: np.ndarray) -> None:
        """Append ``ids`` (any integer dtype, all inside the vocabulary), closing each shard
        that fills up."""
        ids = np.asarray(ids).astype(self.dtype, copy=False)
        while ids.size:
            if self._file is None:
                self._file = open(self.directory / (self.name(self.index) + ".tmp"), "wb")
                write_header(self._file, 0, self.dtype)
            room = self.shard_tokens - self._count
            part, ids = ids[:room], ids[room:]
            self._file.write(part.tobytes())
            self._count += part.size
            if self._count == self.shard_tokens:
                self._close_shard()

    def close(self) -> None:
        """Close the last, partly filled shard (none when the stream ended on a shard's
        edge)."""
        if self._file is not None:
            self._close_shard()

    def abandon(self) -> None:
        """Drop the shard being written (after an error or Ctrl-C): the finished ones stay."""
        if self._file is not None:
            self._file.close()
            Path(self._file.name).unlink(missing_ok=True)
            self._file = None

    def _close_shard(self) -> None:
        f, count = self._file, self._count
        write_header(f, count, self.dtype)
        f.flush()
        os.fsync(f.fileno())  # its bytes are on disk before its name says it is whole
        f.close()
        name = self.name(self.index)
        os.replace(f.name, self.directory / name)
        self._file, self._count = None, 0
        self.index += 1
        if self.on_shard is not None:
            self.on_shard(name, count)


class ShardRange(NamedTuple):
    """Tokens ``[start, stop)`` of the shard at ``path``."""

    path: Path
    start: int
    stop: int


class TokenSplit:
    """A split (train or val) as consecutive ranges of shards: a 1-D sequence of token ids
    that ``len``, ``tokens[a:b]``, ``tokens[i]``, ``windows`` and ``np.asarray`` read. Each
    read maps the shards it touches and lets the map go when it returns."""

    def __init__(self, ranges: Sequence[ShardRange], dtype: np.dtype) -> None:
        self.ranges: List[ShardRange] = [r for r in ranges if r.stop > r.start]
        self.dtype = np.dtype(dtype)
        lengths = [r.stop - r.start for r in self.ranges]
        self._starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])  # (n+1,)

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def ndim(self) -> int:
        return 1

    @property
    def shape(self) -> Tuple[int]:
        return (len(self),)

    def _map(self, k: int) -> np.memmap:
        r = self.ranges[k]
        return np.memmap(r.path, dtype=self.dtype, mode="r", offset=HEADER_BYTES)[r.start:r.stop]

    def _read(self, start: int, stop: int, maps: Optional[dict] = None) -> np.ndarray:
        """Tokens ``[start, stop)`` (within bounds) as a new array; ``maps`` keeps the
        shards mapped for the rest of one call."""
        maps = {} if maps is None else maps
        out = np.empty(stop - start, dtype=self.dtype)
        k = int(np.searchsorted(self._starts, start, side="right")) - 1
        at = start
        while at < stop:
            first, last = int(self._starts[k]), int(self._starts[k + 1])
            take = min(stop, last) - at
            if k not in maps:
                maps[k] = self._map(k)
            out[at - start:at - start + take] = maps[k][at - first:at - first + take]
            at += take
            k += 1
        return out

    def __getitem__(self, index: Union[int, slice]) -> Union[int, np.ndarray]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return self._read(0, len(self))[index] if len(self) else \
                    np.empty(0, self.dtype)
            return self._read(start, max(start, stop))
        if isinstance(index, (int, np.integer)):
            i = int(index) + (len(self) if index < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"TokenSplit: index {index} out of range for "
                                 f"{len(self):,} tokens")
            return self._read(i, i + 1)[0]
        raise TypeError(f"TokenSplit: expected an int or a slice, got {type(index).__name__}")

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """``(len(starts), length)``: the ``length`` tokens from each offset in ``starts``,
        a window that crosses from one shard into the next read from both."""
        maps: dict = {}  # each shard mapped once for the batch, and let go after it
        out = np.empty((len(starts), length), dtype=self.dtype)
        for row, s in enumerate(starts):
            out[row] = self._read(int(s), int(s) + length, maps)
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self._read(0, len(self))
        return whole if dtype is None else whole.astype(dtype)

    def __iter__(self) -> Iterator[int]:
        return iter(self._read(0, len(self)))

    def __repr__(self) -> str:
        shards = len({r.path for r in self.ranges})
        return f"TokenSplit({len(self):,} {self.dtype.name} tokens in {shards} shard(s))"
