"""A whole token split as consecutive windows: every token scored once, not a sample.

>>> inputs, targets = consecutive_windows(data.val_tokens(), block_size=64)  # (n, 64) each
>>> # targets[i, t] is the token after inputs[i, t]; n = (len(tokens) - 1) // 64

The trainer's evaluation averages random batches (nanoGPT's estimate); this is what
``scripts/eval_val_loss.py`` and ``scripts/reference_train_torch.py`` score instead.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["consecutive_windows"]


def consecutive_windows(tokens: np.ndarray, block_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(inputs, targets)``, int64 arrays (n, block_size): ``tokens`` cut into the ``n``
    whole windows that fit, each with its next tokens; the leftover tail is dropped."""
    if block_size < 1:
        raise ValueError(f"consecutive_windows: block_size must be >= 1, got {block_size}")
    n = (len(tokens) - 1) // block_size
    if n < 1:
        raise ValueError(f"consecutive_windows: {len(tokens)} tokens hold no window of "
                         f"block_size {block_size} (expected at least {block_size + 1})")
    end = n * block_size
    inputs = np.asarray(tokens[:end], dtype=np.int64).reshape(n, block_size)
    targets = np.asarray(tokens[1:end + 1], dtype=np.int64).reshape(n, block_size)
    return inputs, targets
