"""Random training batches from a token array, reproducible and resumable.

>>> sampler = BatchSampler(data.train_tokens(), block_size=64, batch_size=12, seed=1337)
>>> x, y = sampler.next_batch()  # int64 Tensors (12, 64); y[:, t] is the token after x[:, t]
>>> state = sampler.state_dict()  # JSON-safe; load_state_dict(state) resumes the same draws
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Tuple

import numpy as np

from ..creation import tensor
from ..tensor import Tensor

__all__ = ["BatchSampler"]


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
        if not isinstance(tokens, np.ndarray):
            raise TypeError(f"BatchSampler: expected tokens as a numpy array (or memmap), got "
                            f"{type(tokens).__name__}")
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
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._window = np.arange(self.block_size + 1)  # (T+1,)

    def next_batch(self) -> Tuple[Tensor, Tensor]:
        """``(x, y)``: int64 Tensors of shape (batch_size, block_size) on ``device``, with
        ``y[:, t] == tokens[offset + t + 1]`` the target of ``x[:, t]``."""
        # offsets in [0, len - block_size - 1], so the last target is at most tokens[-1]
        ix = self._rng.integers(0, len(self.tokens) - self.block_size, size=self.batch_size)
        rows = np.asarray(self.tokens[ix[:, None] + self._window], dtype=np.int64)  # (B, T+1)
        x = np.ascontiguousarray(rows[:, :-1])  # (B, T)
        y = np.ascontiguousarray(rows[:, 1:])  # (B, T)
        return tensor(x, device=self.device), tensor(y, device=self.device)

    def state_dict(self) -> Dict[str, Any]:
        """The random stream's position (JSON-serialisable)."""
        return {"seed": self.seed, "bit_generator": copy.deepcopy(self._rng.bit_generator.state)}

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
        self._rng.bit_generator.state = copy.deepcopy(generator)
        self.seed = int(state.get("seed", self.seed))

    def __repr__(self) -> str:
        return (f"BatchSampler({len(self.tokens):,} tokens, block_size={self.block_size}, "
                f"batch_size={self.batch_size}, seed={self.seed}, device={self.device!r})")
