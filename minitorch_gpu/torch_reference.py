"""GPT-2 in PyTorch eager, with nanoGPT's parameter names: the development-only reference
this project is checked and timed against (``tests/test_against_torch.py``,
``scripts/reference_train_torch.py``). PyTorch is never a dependency: import this module
only where torch is installed.

    reference = TorchGPT.from_ours(model)      # the same shape and weights, key by key
    logits, loss = reference(to_torch(idx), to_torch(targets))

Attention is written as explicit matrix products (scores, causal mask, softmax, weighted
sum), the same arithmetic as this project's unfused attention.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn as tnn
from torch.nn import functional as tF

from .nn import GPT, GPTConfig
from .tensor import Tensor

__all__ = ["TorchBlock", "TorchGPT", "to_torch"]


def to_torch(t: Tensor) -> torch.Tensor:
    """A CPU Tensor's values as a torch tensor (a copy when the array is not contiguous)."""
    return torch.from_numpy(np.ascontiguousarray(t.detach().numpy()))


class TorchBlock(tnn.Module):
    def __init__(self, d: int, n_head: int, bias: bool = True):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = tnn.LayerNorm(d, bias=bias), tnn.LayerNorm(d, bias=bias)
        self.attn = tnn.Module()
        self.attn.c_attn = tnn.Linear(d, 3 * d, bias=bias)
        self.attn.c_proj = tnn.Linear(d, d, bias=bias)
        self.mlp = tnn.Module()
        self.mlp.c_fc = tnn.Linear(d, 4 * d, bias=bias)
        self.mlp.c_proj = tnn.Linear(4 * d, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])  # (B, nh, T, T)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v  # (B, nh, T, hs)
        x = x + self.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp.c_proj(tF.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class TorchGPT(tnn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.transformer = tnn.ModuleDict(dict(
            wte=tnn.Embedding(c.vocab_size, c.n_embd), wpe=tnn.Embedding(c.block_size, c.n_embd),
            h=tnn.ModuleList(TorchBlock(c.n_embd, c.n_head, c.bias) for _ in range(c.n_layer)),
            ln_f=tnn.LayerNorm(c.n_embd, bias=c.bias)))
        self.lm_head = tnn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    @classmethod
    def from_ours(cls, model: GPT) -> "TorchGPT":
        """The same GPT in torch: ``model``'s config, dtype and weights (key by key)."""
        state = {k: to_torch(v) for k, v in model.state_dict().items()}
        reference = cls(model.config).to(state["lm_head.weight"].dtype)
        reference.load_state_dict(state, strict=True)  # every key matches, shapes included
        return reference

    def forward(self, idx: torch.Tensor, targets: torch.Tensor):
        """``(logits, loss)``, as our GPT's ``model(idx, targets)``."""
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
        for block in tr.h:
            x = block(x)
        logits = self.lm_head(tr.ln_f(x))
        return logits, tF.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
