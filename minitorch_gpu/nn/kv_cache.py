"""The key/value cache of generation: every layer's keys and values in buffers of
``block_size`` positions, allocated once. ``CausalLM.forward(idx, kv_cache=cache)`` runs
``idx`` as the positions after the cached ones (their start a Python int, ``length``);
``CausalLM.decode_step`` runs one position given as a tensor (``position``), which a
captured step can be told anew at every call (``nn.decoder``)."""
from __future__ import annotations

from typing import Optional

from ..backend import dtypes
from ..creation import zeros
from ..tensor import Tensor
from .lm_config import GPTConfig

__all__ = ["KVCache"]


class KVCache:
    """Keys and values of every layer for the positions processed so far, in buffers of
    ``block_size`` positions allocated once: (B, n_kv_head, block_size, head_dim) per
    layer (a grouped-query model caches its n_kv_head heads, not the query's n_head).

    ``model.forward(idx, kv_cache=cache)`` runs ``idx`` as the positions after the cached
    ones and appends their keys and values (``ops.attention_heads``: cached_causal_attention
    for a GPT, cached_grouped_attention for a Llama).
    """

    def __init__(self, config: GPTConfig, batch_size: int, device: object = "cpu",
                 dtype: object = dtypes.float32) -> None:
        shape = (batch_size, config.kv_heads, config.block_size, config.head_dim)
        self.keys = [zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.values = [zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.shape = shape  # (B, n_kv_head, capacity, head_dim) of every layer's buffers
        self.n_layer = config.n_layer
        self.arch = config.arch  # a Llama's cached keys are rotated, a GPT's are not
        self.capacity = config.block_size
        self.batch_size = batch_size
        self.length = 0  # positions held
        # during ``CausalLM.decode_step``: its position tensor (1,), which the attention
        # ops read in place of ``length`` (so a captured step is told where it writes)
        self.position: Optional[Tensor] = None

    @property
    def start(self) -> "int | Tensor":
        """Where the positions being run begin: ``length``, or a decode step's position
        tensor."""
        return self.length if self.position is None else self.position

    def check_fits(self, config: GPTConfig, batch: int, new: int,
                   where: str = "forward") -> None:
        """ValueError (naming ``where``) unless this cache was made for a model of
        ``config`` and a batch of ``batch`` sequences, and has room for ``new`` more
        positions."""
        expected = (self.arch, self.n_layer, self.shape[1], self.shape[3], self.capacity)
        actual = (config.arch, config.n_layer, config.kv_heads, config.head_dim,
                  config.block_size)
        if expected != actual:
            raise ValueError(f"{where}: the kv_cache was made for arch, n_layer, n_kv_head, "
                             f"head_dim, block_size = {expected}, the model has {actual}")
        if batch != self.batch_size:
            raise ValueError(f"{where}: the kv_cache holds {self.batch_size} sequences, "
                             f"idx has {batch}")
        if self.length + new > self.capacity:
            raise ValueError(f"{where}: the kv_cache is full: it holds {self.length} of "
                             f"{self.capacity} positions and {new} more do not fit (start a "
                             f"new cache with the last tokens, as generate does)")
