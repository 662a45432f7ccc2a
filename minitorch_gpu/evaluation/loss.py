"""The loss of a model over a whole token split, every token scored once.

>>> result = split_loss(model, data.val_tokens(), batch_size=32)
>>> result.loss, result.perplexity, result.tokens, result.windows

The trainer's evaluation averages ``eval.iters`` random batches (nanoGPT's estimate, noisy
by a few hundredths at 20 batches); this cuts the split into the consecutive windows of
``data/windows.py``'s ``consecutive_windows``: ``n = (len(tokens) - 1) // T`` windows of
``T = block_size`` tokens, window ``i`` reading ``tokens[i*T:(i+1)*T]`` and predicting
``tokens[i*T+1:(i+1)*T+1]``, the leftover tail dropped. The windows are read a batch at a
time, one contiguous slice ``tokens[a:b]`` each, so the split is never held whole: it may
be a memory map or any object with ``len``, ``dtype`` and contiguous slicing.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator, Tuple

import numpy as np

from ..autograd import no_grad
from ..creation import tensor

__all__ = ["SplitLoss", "split_loss", "window_batches"]


@dataclass
class SplitLoss:
    """The mean loss per token over a split's windows."""

    loss: float  # mean cross-entropy per token (nats)
    perplexity: float  # exp(loss)
    tokens: int  # tokens scored: windows x block_size
    windows: int  # consecutive windows of block_size
    block_size: int
    seconds: float

    def summary(self) -> str:
        return (f"loss: {self.loss:.4f} perplexity {self.perplexity:.2f} over "
                f"{self.tokens:,} tokens ({self.windows} windows of {self.block_size}) in "
                f"{self.seconds:.1f} s")

    def record(self) -> dict:
        return {"task": "loss", "loss": self.loss, "perplexity": self.perplexity,
                "tokens": self.tokens, "windows": self.windows, "block_size": self.block_size,
                "seconds": self.seconds}


def window_batches(tokens: Any, block_size: int, batch_size: int
                   ) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """``(inputs, targets)`` int64 arrays ``(k, block_size)``, k <= batch_size, over the
    consecutive windows of ``tokens`` in order; each batch is one slice of the split."""
    if block_size < 1 or batch_size < 1:
        raise ValueError(f"window_batches: block_size and batch_size must be >= 1, got "
                         f"{block_size} and {batch_size}")
    T = block_size
    n = (len(tokens) - 1) // T
    if n < 1:
        raise ValueError(f"{len(tokens)} tokens hold no window of block_size {T} (expected "
                         f"at least {T + 1})")
    for first in range(0, n, batch_size):
        k = min(batch_size, n - first)
        chunk = np.asarray(tokens[first * T:(first + k) * T + 1], dtype=np.int64)  # (k*T+1,)
        yield chunk[:-1].reshape(k, T), chunk[1:].reshape(k, T)


def split_loss(model: Any, tokens: Any, batch_size: int = 32, *,
               progress: bool = False) -> SplitLoss:
    """The mean loss of ``model`` (``model(x, y)`` -> ``(logits, loss)``) over every
    window of ``tokens`` of its block size; the model is left in eval mode. ValueError
    when the split holds no window."""
    T = model.config.block_size
    n = (len(tokens) - 1) // T
    device = model.lm_head.weight.device
    model.eval()
    start = time.perf_counter()
    total = 0.0  # the sum of the windows' token losses, in float64
    from tqdm import tqdm
    bar = tqdm(total=max(n, 0), disable=not progress, file=sys.stderr, unit="window",
               dynamic_ncols=True, desc="loss")
    try:
        with no_grad():
            for inputs, targets in window_batches(tokens, T, batch_size):
                _, loss = model(tensor(inputs, device=device), tensor(targets, device=device))
                total += float(loss.item()) * inputs.size  # the batch's mean times its tokens
                bar.update(len(inputs))
    finally:
        bar.close()
    mean = total / (n * T)
    perplexity = math.exp(mean) if mean < 700 else math.inf
    return SplitLoss(mean, perplexity, n * T, n, T, time.perf_counter() - start)
