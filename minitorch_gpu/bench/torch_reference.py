"""GPT-2 in PyTorch eager, with nanoGPT's parameter names, and the Llama with Hugging
Face's: the development-only references this project is checked and timed against
(``tests/test_against_torch.py``, ``scripts/reference_train_torch.py``, ``minitorch-gpu
bench --vs-torch``). PyTorch is never a dependency: import this module only where torch
is installed.

    reference = TorchGPT.from_ours(model)      # the same shape and weights, key by key
    logits, loss = reference(to_torch(idx), to_torch(targets))
    tokens = reference.generate(to_torch(prompt), 200, window_shift=32)   # with a KV cache
    optimizer = torch_adamw(reference, 0.1, 1e-3, (0.9, 0.99))  # our GPT's AdamW groups

Attention is one of two forms (``attention=``, ``causal_attention``): "explicit", the
default, matrix products written out (scores, causal mask, softmax, weighted sum), the
same arithmetic as this project's unfused attention; or "sdpa", torch's fused
``scaled_dot_product_attention``, what ``bench --vs-torch`` times as "torch". Both give
the same numbers to rounding. ``TorchLlama`` is written plainly from the Llama paper and
Hugging Face's ``modeling_llama``: what a reader compares our fused ops (rms_norm,
apply_rotary, swiglu, grouped_causal_attention) against. Both models have a KV cache
(``TorchKVCache``) and a ``generate`` that slides its window as ours does.

    reference = TorchLlama.from_ours(llama, attention="sdpa")   # Hugging Face's names
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch
from torch import nn as tnn
from torch.nn import functional as tF

from ..nn import CausalLM, GPTConfig
from ..tensor import Tensor

__all__ = ["ATTENTION_FORMS", "TorchBlock", "TorchCausalLM", "TorchGPT", "TorchKVCache",
           "TorchLlama", "TorchLlamaLayer", "TorchRMSNorm", "causal_attention", "to_torch",
           "torch_adamw", "torch_rotary"]

ATTENTION_FORMS = ("explicit", "sdpa")  # causal_attention's forms; the models' attention=


def to_torch(t: Tensor) -> torch.Tensor:
    """A CPU Tensor's values as a torch tensor (a copy when the array is not contiguous)."""
    return torch.from_numpy(np.ascontiguousarray(t.detach().numpy()))


def torch_adamw(model: tnn.Module, weight_decay: float, lr: float,
                betas: Tuple[float, float], eps: float = 1e-8) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with the groups of our ``GPT.configure_optimizers``: decay on
    the 2-D weights (matmuls and embeddings), none on biases and norms."""
    params = [p for p in model.parameters() if p.requires_grad]  # a tied weight once
    return torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=lr, betas=betas, eps=eps)


def check_attention(attention: str) -> str:
    """``attention`` if it is one of ATTENTION_FORMS, else a ValueError naming them."""
    if attention not in ATTENTION_FORMS:
        raise ValueError(f"torch_reference: unknown attention {attention!r}, expected one of "
                         f"{', '.join(ATTENTION_FORMS)}")
    return attention


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int = 0,
                     attention: str = "explicit") -> torch.Tensor:
    """Causal attention of queries q (B, H, T, D) at positions start .. start + T - 1 over
    keys and values k, v (B, Hkv, start + T, D) of positions 0 .. start + T - 1: (B, H, T,
    D). Query head h reads key/value head h // (H // Hkv) (grouped-query when Hkv < H).

    "explicit": k and v repeated over their group, scores, the mask (query i sees keys up
    to start + i: ``tril(start)``), softmax, weighted sum. "sdpa": torch's
    ``scaled_dot_product_attention`` with ``enable_gqa`` (no repeat); ``is_causal`` only
    from position 0, as its causal mask is aligned to the top left (query i sees keys up
    to i), which would be wrong after a cache; a single new position sees every key and
    needs no mask, and a longer continuation is given the explicit boolean mask."""
    T, S, D = q.shape[2], k.shape[2], q.shape[3]
    group = q.shape[1] // k.shape[1]
    if attention == "sdpa":
        if start == 0:  # T == S
            return tF.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                   enable_gqa=group > 1)
        mask = None if T == 1 else torch.ones(T, S, dtype=torch.bool).tril(start)
        return tF.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=group > 1)
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, S)
    mask = torch.ones(T, S, dtype=torch.bool).tril(start)
    return att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v  # (B, H, T, D)


class TorchBlock(tnn.Module):
    def __init__(self, d: int, n_head: int, bias: bool = True, attention: str = "explicit"):
        super().__init__()
        self.n_head, self.attention = n_head, check_attention(attention)
        self.ln_1, self.ln_2 = tnn.LayerNorm(d, bias=bias), tnn.LayerNorm(d, bias=bias)
        self.attn = tnn.Module()
        self.attn.c_attn = tnn.Linear(d, 3 * d, bias=bias)
        self.attn.c_proj = tnn.Linear(d, d, bias=bias)
        self.mlp = tnn.Module()
        self.mlp.c_fc = tnn.Linear(d, 4 * d, bias=bias)
        self.mlp.c_proj = tnn.Linear(4 * d, d, bias=bias)

    def forward(self, x: torch.Tensor, cache: Optional["TorchKVCache"] = None,
                layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        start = 0
        if cache is not None:  # keys and values of the positions before these T
            start = cache.length
            k, v = cache.append(layer, k, v)  # (B, nh, start + T, hs)
        y = causal_attention(q, k, v, start, self.attention)  # (B, nh, T, hs)
        x = x + self.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp.c_proj(tF.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class TorchCausalLM(tnn.Module):
    """What TorchGPT and TorchLlama share: ``config``, ``from_ours`` and ``generate``."""

    config: GPTConfig

    @classmethod
    def from_ours(cls, model: CausalLM, attention: str = "explicit") -> "TorchCausalLM":
        """The same model in torch: ``model``'s config, dtype and weights (key by key)."""
        state = {k: to_torch(v) for k, v in model.state_dict().items()}
        reference = cls(model.config, attention).to(state["lm_head.weight"].dtype)
        reference.load_state_dict(state, strict=True)  # every key matches, shapes included
        return reference

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 window_shift: int = 1) -> torch.Tensor:
        """Sample ``max_new_tokens`` after ``idx`` (B, T) with a KV cache (temperature 0:
        greedy), sliding the window as our ``generate`` does: when the text outgrows
        ``block_size`` the oldest ``window_shift`` tokens are dropped and the rest runs
        again as a new prompt, from position 0."""
        block_size = self.config.block_size
        cache, start = None, max(0, idx.shape[1] - block_size)
        for _ in range(max_new_tokens):
            if idx.shape[1] - start > block_size:
                start, cache = idx.shape[1] - (block_size + 1 - window_shift), None
            if cache is None:
                cache = TorchKVCache(self, idx.shape[0])
                logits, _ = self(idx[:, start:], cache=cache)
            else:
                logits, _ = self(idx[:, -1:], cache=cache)
            if temperature == 0:
                next_token = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            else:
                probs = (logits[:, -1, :] / temperature).softmax(dim=-1)
                next_token = torch.multinomial(probs, 1)
            idx = torch.cat([idx, next_token], dim=1)
        return idx


class TorchGPT(TorchCausalLM):
    def __init__(self, c: GPTConfig, attention: str = "explicit"):
        super().__init__()
        self.config = c
        self.transformer = tnn.ModuleDict(dict(
            wte=tnn.Embedding(c.vocab_size, c.n_embd), wpe=tnn.Embedding(c.block_size, c.n_embd),
            h=tnn.ModuleList(TorchBlock(c.n_embd, c.n_head, c.bias, attention)
                             for _ in range(c.n_layer)),
            ln_f=tnn.LayerNorm(c.n_embd, bias=c.bias)))
        self.lm_head = tnn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None,
                cache: Optional["TorchKVCache"] = None):
        """``(logits, loss)``, as our GPT's ``model(idx, targets)``; without targets the
        last position's logits and no loss. With ``cache``, ``idx`` continues its positions."""
        tr = self.transformer
        start = cache.length if cache is not None else 0
        x = tr.wte(idx) + tr.wpe(torch.arange(start, start + idx.shape[1]))
        for layer, block in enumerate(tr.h):
            x = block(x, cache, layer)
        x = tr.ln_f(x)
        if cache is not None:
            cache.length += idx.shape[1]
        if targets is None:
            return self.lm_head(x[:, -1:]), None
        logits = self.lm_head(x)
        return logits, tF.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class TorchKVCache:
    """Every layer's keys and values, in (B, kv_heads, block_size, head_dim) buffers made
    once (a Llama's keys rotated, as ours); ``length`` the positions held."""

    def __init__(self, model: TorchCausalLM, batch_size: int):
        c = model.config
        shape = (batch_size, c.kv_heads, c.block_size, c.head_dim)
        dtype = model.lm_head.weight.dtype
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(c.n_layer)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(c.n_layer)]
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        end = self.length + k.shape[2]
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


# --- the Llama ---------------------------------------------------------------------------
class TorchRMSNorm(tnn.Module):
    """x / rms(x) * weight, the statistics in float32 at least (bf16 inputs are widened for
    them, as Hugging Face's LlamaRMSNorm does; float64 stays float64, where Hugging Face
    would narrow it)."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight, self.eps = tnn.Parameter(torch.ones(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def torch_rotary(head_dim: int, start: int, length: int, theta: float,
                 dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (length, head_dim), for positions start .. start + length - 1, the
    half-size angles repeated over both halves as Hugging Face lays them out. Computed in
    float64 and then cast, as our ``rotary_tables`` (Hugging Face uses float32)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(start, start + length, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class TorchLlamaLayer(tnn.Module):
    """One decoder layer: x + o_proj(attention(rotary(q), rotary(k), v)) on
    input_layernorm(x), then + down_proj(silu(gate_proj(h)) * up_proj(h)) on
    post_attention_layernorm(x). Query head h reads key/value head h // group
    (``causal_attention``)."""

    def __init__(self, c: GPTConfig, attention: str = "explicit"):
        super().__init__()
        C, H, Hkv, D, F = c.n_embd, c.n_head, c.n_kv_head, c.head_dim, c.ffn_hidden
        self.n_head, self.n_kv_head, self.head_dim = H, Hkv, D
        self.attention = check_attention(attention)
        self.self_attn = tnn.Module()
        self.self_attn.q_proj = tnn.Linear(C, H * D, bias=c.bias)
        self.self_attn.k_proj = tnn.Linear(C, Hkv * D, bias=c.bias)
        self.self_attn.v_proj = tnn.Linear(C, Hkv * D, bias=c.bias)
        self.self_attn.o_proj = tnn.Linear(H * D, C, bias=c.bias)
        self.mlp = tnn.Module()
        self.mlp.gate_proj = tnn.Linear(C, F, bias=c.bias)
        self.mlp.up_proj = tnn.Linear(C, F, bias=c.bias)
        self.mlp.down_proj = tnn.Linear(F, C, bias=c.bias)
        self.input_layernorm = TorchRMSNorm(C, c.norm_eps)
        self.post_attention_layernorm = TorchRMSNorm(C, c.norm_eps)

    def attend(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               cache: Optional[TorchKVCache], layer: int) -> torch.Tensor:
        B, T, _ = x.shape
        a = self.self_attn
        q = a.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        start = 0
        if cache is not None:  # rotated keys and values of the positions before these T
            start = cache.length
            k, v = cache.append(layer, k, v)  # (B, Hkv, start + T, D)
        y = causal_attention(q, k, v, start, self.attention)  # (B, H, T, D)
        return a.o_proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[TorchKVCache] = None, layer: int = 0) -> torch.Tensor:
        x = x + self.attend(self.input_layernorm(x), cos, sin, cache, layer)
        h = self.post_attention_layernorm(x)
        m = self.mlp
        return x + m.down_proj(tF.silu(m.gate_proj(h)) * m.up_proj(h))


class TorchLlama(TorchCausalLM):
    """A Llama in torch eager with Hugging Face's ``LlamaForCausalLM`` names: model.
    embed_tokens, model.layers.N (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
    input_layernorm, post_attention_layernorm), model.norm, lm_head (the embedding when
    ``tie_embeddings``). No dropout."""

    def __init__(self, c: GPTConfig, attention: str = "explicit"):
        super().__init__()
        self.config = c
        self.model = tnn.Module()
        self.model.embed_tokens = tnn.Embedding(c.vocab_size, c.n_embd)
        self.model.layers = tnn.ModuleList(TorchLlamaLayer(c, attention)
                                           for _ in range(c.n_layer))
        self.model.norm = TorchRMSNorm(c.n_embd, c.norm_eps)
        self.lm_head = tnn.Linear(c.n_embd, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.model.embed_tokens.weight = self.lm_head.weight

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None,
                cache: Optional[TorchKVCache] = None):
        """``(logits, loss)``, as our ``model(idx, targets)``: the loss ignores targets of
        -1; without targets the last position's logits and no loss. With ``cache``,
        ``idx`` continues its positions (the rotary angles of start .. start + T - 1)."""
        x = self.model.embed_tokens(idx)
        c = self.config
        start = cache.length if cache is not None else 0
        cos, sin = torch_rotary(c.head_dim, start, idx.shape[1], c.rope_theta, x.dtype)
        for number, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, cache, number)
        x = self.model.norm(x)
        if cache is not None:
            cache.length += idx.shape[1]
        if targets is None:
            return self.lm_head(x[:, -1:]), None
        logits = self.lm_head(x)
        return logits, tF.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1),
                                        ignore_index=-1)
