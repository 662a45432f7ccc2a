"""GPT-2, as nanoGPT writes it, on this framework's modules.

The parameter names are GPT-2's (``transformer.wte.weight``, ``transformer.h.0.attn.c_attn
.weight``, ``lm_head.weight``, ...), so a state dict moves key by key between this model
and nanoGPT's. Generation keeps a key/value cache: the prompt is run once, then every new
token costs one position of work.
"""
from __future__ import annotations

import math
from typing import Optional

from ..creation import arange
from ..ops.attention_heads import cached_causal_attention
from ..tensor import Tensor
from . import init
from .causal_lm import CausalLM, KVCache
from .containers import ModuleDict, ModuleList
from .layers import (GELU, CrossEntropyLoss, Dropout, Embedding, LayerNorm, Linear,
                     PackedCausalAttention, residual_projection)
from .lm_config import GPTConfig
from .module import Module
from .parameter import Parameter

__all__ = ["GPT", "GPTConfig", "KVCache", "Block", "CausalSelfAttention", "MLP"]


class CausalSelfAttention(Module):
    """Multi-head self-attention where each position attends to itself and the positions
    before it. One fused op (``core``) does softmax(q k^T / sqrt(hs)) v for all heads at once,
    reading the heads in place from c_attn's (B, T, 3C) output."""

    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v
        self.core = PackedCausalAttention(config.n_head, config.dropout)
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = Dropout(config.dropout)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.layer = layer  # which KVCache slot is ours

    def forward(self, x: Tensor, kv_cache: Optional[KVCache] = None,
                residual: Optional[Tensor] = None) -> Tensor:
        """The attention's output, plus ``residual`` when given (the block's skip
        connection, added in c_proj's node while dropout is off)."""
        qkv = self.c_attn(x)  # (B, T, 3C): q, k, v side by side
        if kv_cache is None:
            y = self.core(qkv)  # (B, T, C), heads side by side
        else:
            y = self._cached_attention(qkv, kv_cache)
        return residual_projection(residual, self.c_proj, self.resid_dropout, y)

    def _cached_attention(self, qkv: Tensor, kv_cache: KVCache) -> Tensor:
        """Attention of these T positions over the cached ones and themselves (inference):
        one op that appends their keys and values to this layer's cache buffers."""
        return cached_causal_attention(qkv, kv_cache.keys[self.layer],
                                       kv_cache.values[self.layer], kv_cache.start,
                                       self.n_head)  # (B, T, C)


class MLP(Module):
    """The feed-forward half of a block: n_embd -> 4 n_embd -> GELU (tanh) -> n_embd."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = GELU(approximate="tanh")
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None) -> Tensor:
        """The feed-forward output, plus ``residual`` when given (in c_proj's node)."""
        return residual_projection(residual, self.c_proj, self.dropout,
                                   self.gelu(self.c_fc(x)))


class Block(Module):
    """A pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)); each
    add runs inside the half's last projection (``residual_projection``)."""

    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, kv_cache: Optional[KVCache] = None) -> Tensor:
        x = self.attn(self.ln_1(x), kv_cache, residual=x)
        return self.mlp(self.ln_2(x), residual=x)


class GPT(CausalLM):
    """GPT-2: token and position embeddings, ``n_layer`` blocks, a final LayerNorm, and a
    language-model head whose weight is the token embedding's (weight tying, unless
    ``tie_embeddings`` is false). Forward, generation and accounting: ``CausalLM``.

    >>> model = GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128))
    >>> logits, loss = model(idx, targets)       # idx, targets: (B, T) int64
    >>> out = model.generate(idx[:, :8], max_new_tokens=50, temperature=0.8, top_k=20)
    """

    arch = "gpt2"

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        config = self._own_config(config)
        self.transformer = ModuleDict(dict(
            wte=Embedding(config.vocab_size, config.n_embd),
            wpe=Embedding(config.block_size, config.n_embd),
            drop=Dropout(config.dropout),
            h=ModuleList(Block(config, i) for i in range(config.n_layer)),
            ln_f=LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias),
        ))
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        self.loss = CrossEntropyLoss(ignore_index=-1)
        if config.tie_embeddings:  # one (vocab, n_embd) matrix embeds tokens and scores them
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 n_layer), as the residual stream
        # adds two of them per block
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: Module) -> None:
        if isinstance(module, Linear):
            init.normal_(module.weight, 0.0, 0.02)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, Embedding):
            init.normal_(module.weight, 0.0, 0.02)

    def _hidden(self, idx: Tensor, start: int, kv_cache: Optional[KVCache]) -> Tensor:
        T = idx.shape[1]
        if isinstance(start, Tensor):  # a decode step's position tensor (1,): positions
            pos = start if T == 1 else start + arange(T, device=idx.device)
        else:
            pos = arange(start, start + T, device=idx.device)  # (T,)
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(pos))  # (B, T, C) + (T, C)
        for block in tr.h:
            x = block(x, kv_cache)
        return tr.ln_f(x)

    def _lookup_tables(self) -> list:
        tr = self.transformer
        return [tr.wpe.weight] + ([] if self.config.tie_embeddings else [tr.wte.weight])

    def _crop(self, block_size: int) -> None:
        """crop_block_size's part for GPT: the first ``block_size`` rows of the position
        table are kept."""
        wpe = self.transformer.wpe
        wpe.weight = Parameter(wpe.weight[:block_size].contiguous())
        wpe.num_embeddings = block_size
