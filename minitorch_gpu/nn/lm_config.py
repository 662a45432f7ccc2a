"""The shape of a decoder-only language model: GPT-2's fields, and Llama's on top.

One dataclass for both families, so a run config's model section, a checkpoint's metadata
and the memory estimate read one set of names; ``arch`` says which network the fields
describe (``nn/gpt.py`` builds gpt2, ``nn/llama.py`` llama).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, fields
from typing import Any, Optional

__all__ = ["ARCHS", "GPTConfig", "LlamaConfig", "REQUIRED_KEYS", "llama_ffn_hidden"]

# the keys every checkpoint's model_config has had, since before the Llama fields
REQUIRED_KEYS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias")


ARCHS = ("gpt2", "llama")  # model.arch: which network the shape below describes


def llama_ffn_hidden(n_embd: int, multiple_of: int = 64) -> int:
    """Llama's SwiGLU width: 8/3 of ``n_embd`` (two thirds of the 4x MLP, as the gate adds a
    third matrix: the same parameters), rounded up to a multiple of ``multiple_of``."""
    return -(-(8 * n_embd // 3) // multiple_of) * multiple_of


@dataclass
class GPTConfig:
    """The shape of a decoder-only language model. The defaults are GPT-2 small (124M
    parameters); ``arch="llama"`` (or ``LlamaConfig``) is the Llama family on the same
    fields: RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases."""

    block_size: int = 1024  # the longest sequence the model sees: rows of the position table
    vocab_size: int = 50304  # GPT-2's 50257 tokens padded up to a multiple of 64 (faster GEMMs)
    n_layer: int = 12  # transformer blocks stacked on the residual stream
    n_head: int = 12  # attention heads per block; each works on n_embd // n_head dims
    n_embd: int = 768  # width of the residual stream (the embedding size)
    dropout: float = 0.0  # on embeddings, attention weights and residual branches; 0 to pretrain
    bias: Optional[bool] = None  # biases in Linear and LayerNorm; None: the arch's (gpt2 yes, llama no)
    arch: str = "gpt2"  # gpt2 | llama
    n_kv_head: Optional[int] = None  # llama: key/value heads (grouped-query); None: n_head; 1: multi-query
    rope_theta: float = 10000.0  # llama: the rotary positions' base wavelength
    ffn_hidden: Optional[int] = None  # llama: SwiGLU width; None: 8/3 n_embd up to a multiple of ffn_multiple_of
    ffn_multiple_of: int = 64  # llama: what the default ffn_hidden is rounded up to
    norm_eps: float = 1e-5  # the layer norms' (gpt2) or RMS norms' (llama) epsilon
    tie_embeddings: Optional[bool] = None  # lm_head shares the token embedding; None: the arch's (gpt2 yes, llama no)

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"GPTConfig: arch must be one of {', '.join(ARCHS)}, got "
                             f"{self.arch!r}")
        llama = self.arch == "llama"
        if self.bias is None:
            self.bias = not llama
        if self.tie_embeddings is None:
            self.tie_embeddings = not llama
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head if isinstance(self.n_head, int) else None
        if llama and self.ffn_hidden is None and isinstance(self.n_embd, int) and \
                isinstance(self.ffn_multiple_of, int) and self.ffn_multiple_of >= 1:
            self.ffn_hidden = llama_ffn_hidden(self.n_embd, self.ffn_multiple_of)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int, "Optional[int]") and value is not None:
                if not isinstance(value, numbers.Integral) or isinstance(value, bool) \
                        or value < 1:
                    raise ValueError(f"GPTConfig: {f.name} must be a positive int, got {value!r}")
                setattr(self, f.name, int(value))  # NumPy integers become Python ints
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd ({self.n_embd}) must be divisible by n_head "
                             f"({self.n_head})")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"GPTConfig: n_head ({self.n_head}) must be a multiple of "
                             f"n_kv_head ({self.n_kv_head})")
        if not llama and self.n_kv_head != self.n_head:
            raise ValueError(f"GPTConfig: n_kv_head ({self.n_kv_head}) differs from n_head "
                             f"({self.n_head}), which only arch llama supports")
        if llama and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"GPTConfig: the head size n_embd // n_head = "
                             f"{self.n_embd // self.n_head} must be even for rotary positions")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout!r}")
        for name in ("bias", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GPTConfig: {name} must be true or false, got "
                                 f"{getattr(self, name)!r}")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0 < value < float("inf"):
                raise ValueError(f"GPTConfig: {name} must be a positive number, got {value!r}")
            setattr(self, name, float(value))

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_dict(cls, shape: Any) -> "GPTConfig":
        """The config a checkpoint's ``model_config`` describes: every key must be a
        field, and GPT-2's seven must be there (checkpoints written before the Llama
        fields existed lack those, and are GPT-2s); ValueError naming the keys else."""
        expected = {f.name for f in fields(cls)}
        if not isinstance(shape, dict) or not set(shape) <= expected or \
                not set(REQUIRED_KEYS) <= set(shape):
            got = sorted(shape) if isinstance(shape, dict) else repr(shape)
            raise ValueError(f"model_config has keys {got}, expected {sorted(REQUIRED_KEYS)} "
                             f"and any of {sorted(expected - set(REQUIRED_KEYS))}")
        return GPTConfig(**shape)


@dataclass
class LlamaConfig(GPTConfig):
    """A Llama's shape: GPTConfig with ``arch="llama"`` (Hugging Face's LlamaConfig names:
    n_kv_head is num_key_value_heads, ffn_hidden intermediate_size, norm_eps
    rms_norm_eps, tie_embeddings tie_word_embeddings)."""

    arch: str = "llama"
