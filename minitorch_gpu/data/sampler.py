"""Random training batches from a token split, reproducible and resumable.

The tokens are a numpy array (or memmap) or a ``TokenSplit`` read across shard files, whose
windows may cross from one shard into the next; a split's offsets are drawn over all of it.

>>> sampler = BatchSampler(data.train_tokens(), block_size=64, batch_size=12, seed=1337)
>>> x, y = sampler.next_batch()  # int64 Tensors (12, 64); y[:, t] is the token after x[:, t]
>>> state = sampler.state_dict()  # JSON-safe; load_state_dict(state) resumes the same draws

The sampler runs one batch ahead: ``next_batch`` draws the batch after the one it returns
and starts its copy to the device (``Backend.host_to_device_async``: on a GPU through
page-locked memory on a side stream, so it crosses while the step runs). The draws are
those of a sampler without the lookahead, and ``state_dict`` is the state before the batch
drawn ahead, so a resumed run draws that batch again: the stream of batches is the same.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

from ..backend import get_backend
from ..backend.transfers import Upload
from ..tensor import Tensor
from .shards import TokenSplit

__all__ = ["BatchSampler"]


class _Drawn(NamedTuple):
    """A batch drawn ahead: the generator's state before it, and its upload."""

    rng_state: Dict[str, Any]
    upload: Upload


class BatchSampler:
    """``batch_size`` windows of ``block_size + 1`` tokens at random offsets, drawn from the
    sampler's own PCG64 stream (seeded by ``seed``), as (inputs, next-token targets)."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, seed: int,
                 device: Any = "cpu") -> None:
        for name, value in (("block_size", block_size), ("batch_size", batch_size)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BatchSampler: expected {name} to be an int >= 1, got "
                                 f"{value!r}")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"BatchSampler: expected seed to be an int >= 0 (system.seed), "
                             f"got {seed!r}")
        if not isinstance(tokens, (np.ndarray, TokenSplit)):
            raise TypeError(f"BatchSampler: expected tokens as a numpy array (or memmap) or "
                            f"a TokenSplit, got {type(tokens).__name__}")
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"BatchSampler: expected a 1-D integer array of tokens, got "
                             f"{tokens.dtype} of shape {tokens.shape}")
        if len(tokens) < block_size + 1:
            raise ValueError(f"BatchSampler: the split has {len(tokens)} tokens, fewer than "
                             f"block_size + 1 = {block_size + 1} that one sequence and its "
                             f"targets need; use a smaller model.block_size (or more data)")
        self.tokens = tokens
        self.block_size = int(block_size)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.device = device
        self._backend = get_backend(device)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._window = np.arange(self.block_size + 1)  # (T+1,)
        self._ahead: Optional[_Drawn] = None  # the next batch, drawn and on its way

    def next_batch(self) -> Tuple[Tensor, Tensor]:
        """``(x, y)``: int64 Tensors of shape (batch_size, block_size) on ``device``, with
        ``y[:, t] == tokens[offset + t + 1]`` the target of ``x[:, t]``."""
        current = self._ahead if self._ahead is not None else self._draw()
        self._ahead = self._draw()  # copies to the device while this batch is used
        x, y = current.upload.result()
        return Tensor._make(x, self._backend, False), Tensor._make(y, self._backend, False)

    def _draw(self) -> _Drawn:
        """Draw a batch's offsets and start its copy to the device."""
        rng_state = self._rng.bit_generator.state  # a new dict: where this batch starts
        # offsets in [0, len - block_size - 1], so the last target is at most tokens[-1]
        ix = self._rng.integers(0, len(self.tokens) - self.block_size, size=self.batch_size)
        if isinstance(self.tokens, TokenSplit):  # (B, T+1), the tokens' dtype
            rows = self.tokens.windows(ix, self.block_size + 1)
        else:
            rows = self.tokens[ix[:, None] + self._window]
        # x (B, T) and y (B, T), the targets: x shifted by one, as int64
        upload = self._backend.host_to_device_async((rows[:, :-1], rows[:, 1:]), np.int64)
        return _Drawn(rng_state, upload)

    def state_dict(self) -> Dict[str, Any]:
        """The random stream's position (JSON-serialisable): before the batch drawn ahead,
        so that a sampler loading it draws that batch next, as this one returns it."""
        state = self._ahead.rng_state if self._ahead is not None else \
            self._rng.bit_generator.state
        return {"seed": self.seed, "tokens": len(self.tokens),
                "bit_generator": copy.deepcopy(state)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict``): the next batches are those an
        uninterrupted sampler would have drawn."""
        if not isinstance(state, dict) or "bit_generator" not in state:
            raise ValueError(f"BatchSampler.load_state_dict: expected a dict with key "
                             f"'bit_generator' (from state_dict()), got {state!r:.200}")
        generator = state["bit_generator"]
        name = generator.get("bit_generator") if isinstance(generator, dict) else None
        if name != "PCG64":
            raise ValueError(f"BatchSampler.load_state_dict: expected a PCG64 state, got "
                             f"bit generator {name!r}")
        if state.get("tokens", len(self.tokens)) != len(self.tokens):
            raise ValueError(f"BatchSampler.load_state_dict: the state was drawn over "
                             f"{state['tokens']:,} tokens, this split has "
                             f"{len(self.tokens):,}: the data changed since it was saved")
        self._rng.bit_generator.state = copy.deepcopy(generator)
        self.seed = int(state.get("seed", self.seed))
        self._ahead = None  # drawn from the old position: drawn again from the new one

    def __repr__(self) -> str:
        return (f"BatchSampler({len(self.tokens):,} tokens, block_size={self.block_size}, "
                f"batch_size={self.batch_size}, seed={self.seed}, device={self.device!r})")
