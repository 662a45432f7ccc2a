"""A stream of text -> chunks -> token ids, in worker processes on every core.

``Chunker`` cuts a stream into the chunks the tokenizer cuts a whole text into
(``tokenizer._chunks``: about CHUNK_CHARS characters each, cut only after a lone newline
between two non-spaces), seeing the text a block at a time: so the ids of a streamed corpus
equal the ids of its whole text, whatever its size. ``encode_in_order`` turns batches of
chunks into ids in worker processes, a few batches in flight at a time (memory stays
bounded), and gives them back in order.

>>> chunker = Chunker()
>>> chunks = chunker.feed(block) + chunker.finish()  # [(offset, text), ...]
"""
from __future__ import annotations

import collections
import multiprocessing
import os
import signal
from typing import Any, Deque, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from .tokenizer import CHUNK_CHARS, _CHUNK_BOUNDARY, Tokenizer, tokenizer_from_json

__all__ = ["Chunker", "encode_in_order", "default_workers", "HARD_CUT_CHARS",
           "BATCH_CHARS", "POOL_AFTER_CHARS"]

# A stretch of text this long with no lone newline between non-spaces (minified code, one
# enormous line) is cut where it is, so memory stays bounded; only there can a streamed
# corpus's BPE ids differ from its whole text's.
HARD_CUT_CHARS = 1 << 24
BATCH_CHARS = 1 << 20  # the text of one worker task
IN_FLIGHT_PER_WORKER = 2  # tasks queued per worker: bounded memory, busy workers
POOL_AFTER_CHARS = 1 << 23  # a corpus smaller than this is tokenized here, without a pool


class Chunker:
    """Cuts a stream of text, fed in pieces of any size, into ``(offset, chunk)`` pairs:
    the chunk's first character's position in the stream, and the chunk."""

    def __init__(self, size: int = CHUNK_CHARS, offset: int = 0) -> None:
        self.size = size
        self.offset = offset  # the position of the buffer's first character
        self._buffer = ""
        self._scan_from = size  # where the next search for a cut begins

    def feed(self, text: str) -> List[Tuple[int, str]]:
        """The chunks ``text`` completes; the rest waits for more text or ``finish``."""
        self._buffer += text
        out = []
        while len(self._buffer) > self.size:
            # a match needs the characters on both sides: one found is one the whole text
            # has, and a newline at the buffer's end is searched again when more comes
            cut = _CHUNK_BOUNDARY.search(self._buffer, self._scan_from)
            if cut is not None:
                end = cut.end()
            elif len(self._buffer) >= HARD_CUT_CHARS:
                end = len(self._buffer)
            else:
                self._scan_from = max(self.size, len(self._buffer) - 1)
                break
            out.append((self.offset, self._buffer[:end]))
            self.offset += end
            self._buffer = self._buffer[end:]
            self._scan_from = self.size
        return out

    def finish(self) -> List[Tuple[int, str]]:
        """The last chunk (none when the stream was empty)."""
        if not self._buffer:
            return []
        out = [(self.offset, self._buffer)]
        self.offset += len(self._buffer)
        self._buffer = ""
        return out


def default_workers() -> int:
    """One tokenizing process per core this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


_WORKER_TOKENIZER: Optional[Tokenizer] = None


def _start_worker(tokenizer_json: str) -> None:
    global _WORKER_TOKENIZER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops the pool, quietly
    _WORKER_TOKENIZER = tokenizer_from_json(tokenizer_json)


def _encode_in_worker(chunks: List[str]) -> List[np.ndarray]:
    # one chunk at a time: the processes are the parallelism (BPE's batch encoding would
    # start a thread per core in every process)
    return [_WORKER_TOKENIZER.encode_array(chunk) for chunk in chunks]


def encode_in_order(tokenizer: Tokenizer, batches: Iterable[Tuple[Any, List[str]]],
                    workers: int) -> Iterator[Tuple[Any, List[np.ndarray]]]:
    """``(tag, ids of each chunk)`` for each ``(tag, chunks)`` of ``batches``, in order.
    ``workers`` processes encode them (0: this process does); the first POOL_AFTER_CHARS
    characters are encoded here, so a small corpus never waits for processes to start."""
    pending: Deque[Tuple[Any, Any]] = collections.deque()
    pool = None
    seen = 0
    try:
        for tag, chunks in batches:
            seen += sum(len(c) for c in chunks)
            if pool is None and workers > 0 and seen > POOL_AFTER_CHARS:
                # fork, not spawn: spawn runs the caller's main script again in every
                # worker, and a script without a __main__ guard would prepare again. The
                # tokenizers library makes a forked child encode on one thread
                context = multiprocessing.get_context("fork")
                pool = context.Pool(workers, initializer=_start_worker,
                                    initargs=(tokenizer.to_json(),))
            if pool is None:
                yield tag, tokenizer.encode_chunks(chunks)
                continue
            pending.append((tag, pool.apply_async(_encode_in_worker, (chunks,))))
            while len(pending) > IN_FLIGHT_PER_WORKER * workers:
                done_tag, result = pending.popleft()
                yield done_tag, result.get()
        while pending:
            done_tag, result = pending.popleft()
            yield done_tag, result.get()
    finally:
        if pool is not None:
            pool.terminate()  # after an error or Ctrl-C too: no orphan keeps tokenizing
            pool.join()
