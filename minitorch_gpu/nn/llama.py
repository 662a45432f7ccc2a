"""The Llama family on this framework's modules: RMSNorm before each sublayer, rotary
position embeddings instead of a learned position table, a SwiGLU MLP, grouped-query
attention, no biases.

The parameter names are Hugging Face's ``LlamaForCausalLM`` (``model.embed_tokens.weight``,
``model.layers.0.self_attn.q_proj.weight``, ``model.layers.0.mlp.gate_proj.weight``,
``model.layers.0.input_layernorm.weight``, ``model.norm.weight``, ``lm_head.weight``), in
its order, so a state dict moves key by key, as the GPT's follow nanoGPT's. The fused ops
are one node each: ``rms_norm``, ``apply_rotary`` (q and k rotated in the projections'
layout), ``swiglu`` and ``grouped_causal_attention`` (no key or value repeated).

    >>> model = Llama(LlamaConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4,
    ...                           n_kv_head=2, n_embd=128))
    >>> logits, loss = model(idx, targets)
    >>> out = model.generate(idx[:, :8], max_new_tokens=50, temperature=0.8)
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

from ..backend import dtypes
from ..creation import arange
from ..ops.attention_heads import cached_grouped_attention, grouped_causal_attention
from ..ops.rotary import RotaryTables, apply_rotary
from ..tensor import Tensor
from . import init
from .causal_lm import CausalLM, KVCache
from .containers import ModuleDict, ModuleList
from .layers import (CrossEntropyLoss, Dropout, Embedding, Linear, RMSNorm, SwiGLU,
                     residual_projection)
from .lm_config import GPTConfig, LlamaConfig
from .module import Module

__all__ = ["Llama", "LlamaConfig", "LlamaAttention", "LlamaMLP", "LlamaDecoderLayer",
           "Rotary", "GroupedCausalAttention"]


class Rotary(Module):
    """Rotates the queries and keys of positions start .. start + T - 1 in the
    projections' layout (B, T, heads * head_dim), Llama's rotate-half convention
    (``ops/rotary.py``). No parameters: the cos/sin tables are the model's, computed once
    per dtype and device (float32, float64 for a float64 model) and sliced per call."""

    def __init__(self, tables: RotaryTables, n_head: int, n_kv_head: int) -> None:
        super().__init__()
        self.tables, self.n_head, self.n_kv_head = tables, n_head, n_kv_head

    def forward(self, q: Tensor, k: Tensor, start: Union[int, Tensor] = 0
                ) -> Tuple[Tensor, Tensor]:
        """q and k rotated for positions start .. start + T - 1; ``start`` an int, or a
        decode step's position tensor (1,), whose table rows are gathered by an op."""
        D = self.tables.head_dim
        dtype = dtypes.float64 if q.dtype == dtypes.float64 else dtypes.float32
        if isinstance(start, Tensor):
            T = q.shape[1]
            positions = start if T == 1 else start + arange(T, device=q.device)
            cos, sin = self.tables.at(positions, dtype=dtype)
        else:
            cos, sin = self.tables(start, q.shape[1], dtype=dtype, device=q.device)
        return (apply_rotary(q, cos, sin, head_dim=D), apply_rotary(k, cos, sin, head_dim=D))

    def extra_repr(self) -> str:
        return f"head_dim={self.tables.head_dim}, theta={self.tables.theta}"


class GroupedCausalAttention(Module):
    """A Llama's attention core: causal grouped-query attention of ``n_head`` query heads
    over ``n_kv_head`` key/value heads, from the projections to (B, T, n_head * head_dim)
    (``F.grouped_causal_attention``). Dropout on the weights in training mode only."""

    def __init__(self, n_head: int, n_kv_head: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.dropout = n_head, n_kv_head, float(dropout)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return grouped_causal_attention(q, k, v, self.n_head, self.n_kv_head,
                                        self.dropout if self.training else 0.0)

    def extra_repr(self) -> str:
        return f"n_head={self.n_head}, n_kv_head={self.n_kv_head}, dropout={self.dropout}"


class LlamaAttention(Module):
    """Grouped-query self-attention with rotary positions: q_proj to n_head heads, k_proj
    and v_proj to n_kv_head heads, q and k rotated, attention, o_proj back to n_embd."""

    def __init__(self, config: GPTConfig, tables: RotaryTables, layer: int = 0) -> None:
        super().__init__()
        C, H, Hkv, D = config.n_embd, config.n_head, config.n_kv_head, config.head_dim
        self.q_proj = Linear(C, H * D, bias=config.bias)
        self.k_proj = Linear(C, Hkv * D, bias=config.bias)
        self.v_proj = Linear(C, Hkv * D, bias=config.bias)
        self.o_proj = Linear(H * D, C, bias=config.bias)
        self.rotary = Rotary(tables, H, Hkv)
        self.core = GroupedCausalAttention(H, Hkv, config.dropout)
        self.resid_dropout = Dropout(config.dropout)
        self.n_head = H
        self.layer = layer  # which KVCache slot is ours

    def forward(self, x: Tensor, start: int = 0, kv_cache: Optional[KVCache] = None,
                residual: Optional[Tensor] = None) -> Tensor:
        """The attention's output, plus ``residual`` when given (the layer's skip
        connection, added in o_proj's node while dropout is off)."""
        q, k = self.rotary(self.q_proj(x), self.k_proj(x), start)
        v = self.v_proj(x)
        if kv_cache is None:
            y = self.core(q, k, v)
        else:  # inference: append k, v to this layer's cache and attend over all of it
            y = cached_grouped_attention(q, k, v, kv_cache.keys[self.layer],
                                         kv_cache.values[self.layer], start, self.n_head)
        return residual_projection(residual, self.o_proj, self.resid_dropout, y)


class LlamaMLP(Module):
    """The gated feed-forward half: down_proj(silu(gate_proj(x)) * up_proj(x)), n_embd ->
    ffn_hidden -> n_embd; the gate and its product are one fused op (``F.swiglu``)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        C, F = config.n_embd, config.ffn_hidden
        self.gate_proj = Linear(C, F, bias=config.bias)
        self.up_proj = Linear(C, F, bias=config.bias)
        self.down_proj = Linear(F, C, bias=config.bias)
        self.act = SwiGLU()
        self.dropout = Dropout(config.dropout)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None) -> Tensor:
        """The feed-forward output, plus ``residual`` when given (in down_proj's node)."""
        return residual_projection(residual, self.down_proj, self.dropout,
                                   self.act(self.gate_proj(x), self.up_proj(x)))


class LlamaDecoderLayer(Module):
    """A pre-RMSNorm block: x + self_attn(input_layernorm(x)), then
    + mlp(post_attention_layernorm(x)), each add inside the half's last projection
    (``residual_projection``). Modules in Hugging Face's order (its state dict's)."""

    def __init__(self, config: GPTConfig, tables: RotaryTables, layer: int = 0) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, tables, layer)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.n_embd, eps=config.norm_eps)
        self.post_attention_layernorm = RMSNorm(config.n_embd, eps=config.norm_eps)

    def forward(self, x: Tensor, start: int = 0, kv_cache: Optional[KVCache] = None) -> Tensor:
        x = self.self_attn(self.input_layernorm(x), start, kv_cache, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class Llama(CausalLM):
    """A Llama: token embeddings, ``n_layer`` decoder layers, a final RMSNorm and the
    language-model head (tied to the embedding when ``tie_embeddings``). No position
    table: positions enter as the rotation of q and k. Forward, generation with a KV
    cache of n_kv_head heads, and accounting: ``CausalLM``.

    Initialisation: normal(0, 0.02) for every matrix, as Hugging Face's
    ``initializer_range``, with GPT-2's 1/sqrt(2 n_layer) on the two projections that
    write to the residual stream (o_proj, down_proj); RMSNorm gains at one."""

    arch = "llama"

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        config = self._own_config(config)
        self.rotary_tables = RotaryTables(config.head_dim, config.block_size, config.rope_theta)
        self.model = ModuleDict(dict(
            embed_tokens=Embedding(config.vocab_size, config.n_embd),
            drop=Dropout(config.dropout),
            layers=ModuleList(LlamaDecoderLayer(config, self.rotary_tables, i)
                              for i in range(config.n_layer)),
            norm=RMSNorm(config.n_embd, eps=config.norm_eps),
        ))
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        self.loss = CrossEntropyLoss(ignore_index=-1)
        if config.tie_embeddings:
            self.model.embed_tokens.weight = self.lm_head.weight
        for module in self.modules():
            if isinstance(module, (Linear, Embedding)):
                init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, Linear) and module.bias is not None:
                init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.n_layer))

    def _hidden(self, idx: Tensor, start: int, kv_cache: Optional[KVCache]) -> Tensor:
        m = self.model
        x = m.drop(m.embed_tokens(idx))  # (B, T, C)
        for layer in m.layers:
            x = layer(x, start, kv_cache)
        return m.norm(x)

    def _lookup_tables(self) -> list:
        return [] if self.config.tie_embeddings else [self.model.embed_tokens.weight]
