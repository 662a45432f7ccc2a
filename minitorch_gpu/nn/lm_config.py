"""The shape of a decoder-only language model: GPT-2's fields, and Llama's on top.

One dataclass for both families, so a run config's model section, a checkpoint's metadata
and the memory estimate read one set of names; ``arch`` says which network the fields
describe (``nn/gpt.py`` builds gpt2, ``nn/llama.py`` llama).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional

__all__ = ["ARCHS", "GPTConfig", "LlamaConfig", "REQUIRED_KEYS", "check_arch_fields",
           "llama_ffn_hidden"]

# the keys every checkpoint's model_config has had, since before the Llama fields
REQUIRED_KEYS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias")


ARCHS = ("gpt2", "llama")  # model.arch: which network the shape below describes


def llama_ffn_hidden(n_embd: int, multiple_of: int = 64) -> int:
    """Llama's SwiGLU width: 8/3 of ``n_embd`` (two thirds of the 4x MLP, as the gate adds a
    third matrix: the same parameters), rounded up to a multiple of ``multiple_of``."""
    return -(-(8 * n_embd // 3) // multiple_of) * multiple_of


def check_arch_fields(c: Any, fail: Callable[[str, str], None],
                      vocab_optional: bool = False) -> None:
    """The rules of a model's shape, on GPTConfig's fields of ``c`` before the arch's
    defaults are filled in (a GPTConfig, or a run config's model section, whose None means
    the default): ``fail(key, message)`` is called at the first broken rule and must
    raise. GPTConfig raises ValueError, the run config a ConfigError naming model.KEY
    (``vocab_optional``: its vocab_size may be null, the tokenizer's)."""
    def positive_int(key: str, value: Any, optional: bool = False) -> None:
        if value is None and optional:
            return
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            fail(key, f"must be a positive int{' or null' if optional else ''}, got {value!r}")

    if c.arch not in ARCHS:
        fail("arch", f"must be one of {', '.join(ARCHS)}, got {c.arch!r}")
    llama = c.arch == "llama"
    for key in ("block_size", "n_layer", "n_head", "n_embd", "ffn_multiple_of"):
        positive_int(key, getattr(c, key))
    positive_int("vocab_size", c.vocab_size, optional=vocab_optional)
    for key in ("n_kv_head", "ffn_hidden"):
        positive_int(key, getattr(c, key), optional=True)
    if c.n_embd % c.n_head:
        fail("n_embd", f"({c.n_embd}) must be divisible by n_head ({c.n_head})")
    for key in ("rope_theta", "norm_eps"):
        value = getattr(c, key)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                not 0 < value < float("inf"):
            fail(key, f"must be a positive number, got {value!r}")
    if not llama:  # Llama's fields, left unset, so a misspelt arch cannot silently drop them
        if c.n_kv_head not in (None, c.n_head):
            fail("n_kv_head", f"({c.n_kv_head}) must be null (or n_head, {c.n_head}) under "
                              f"arch gpt2: grouped-query attention is a llama field")
        defaults = {"ffn_hidden": None, "rope_theta": 10000.0, "ffn_multiple_of": 64}
        for key, default in defaults.items():
            if getattr(c, key) != default:
                fail(key, f"must be {'null' if default is None else default} under arch "
                          f"gpt2 (a llama field), got {getattr(c, key)!r}")
        return
    if c.n_kv_head is not None and c.n_head % c.n_kv_head:
        fail("n_kv_head", f"({c.n_kv_head}) must divide n_head ({c.n_head}): each key/value "
                          f"head serves an equal group of query heads")
    if (c.n_embd // c.n_head) % 2:
        fail("n_embd", f"// n_head, the head size {c.n_embd // c.n_head}, must be even for "
                       f"rotary positions")


@dataclass
class GPTConfig:
    """The shape of a decoder-only language model. The defaults are GPT-2 small (124M
    parameters); ``arch="llama"`` (or ``LlamaConfig``) is the Llama family on the same
    fields: RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases.

    The arch's defaults (a Llama's n_kv_head and ffn_hidden, bias, tie_embeddings) are
    filled in when a config is made and stored: ``dataclasses.replace`` keeps them, so a
    replace that changes n_head or n_embd should give them anew (or None)."""

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
        def fail(key: str, message: str) -> None:
            raise ValueError(f"GPTConfig: {key} {message}")

        check_arch_fields(self, fail)
        llama = self.arch == "llama"
        if self.bias is None:
            self.bias = not llama
        if self.tie_embeddings is None:
            self.tie_embeddings = not llama
        if llama and self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if not llama and self.n_kv_head == self.n_head:
            self.n_kv_head = None  # gpt2 stores no head count of its own: replace() keeps working
        if llama and self.ffn_hidden is None:
            self.ffn_hidden = llama_ffn_hidden(self.n_embd, self.ffn_multiple_of)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "Optional[int]") and value is not None:
                setattr(self, f.name, int(value))  # NumPy integers become Python ints
        if not isinstance(self.dropout, (int, float)) or isinstance(self.dropout, bool) or \
                not 0.0 <= self.dropout < 1.0:
            fail("dropout", f"must be in [0, 1), got {self.dropout!r}")
        for name in ("bias", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                fail(name, f"must be true or false, got {getattr(self, name)!r}")
        self.rope_theta, self.norm_eps = float(self.rope_theta), float(self.norm_eps)

    @property
    def kv_heads(self) -> int:
        """Key/value heads per layer: n_kv_head for a Llama, n_head for a GPT-2."""
        return self.n_kv_head or self.n_head

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
        return GPTConfig(**shape)  # not cls: a file without "arch" is a GPT-2 whatever asks


@dataclass
class LlamaConfig(GPTConfig):
    """A Llama's shape: GPTConfig with ``arch="llama"`` (Hugging Face's LlamaConfig names:
    n_kv_head is num_key_value_heads, ffn_hidden intermediate_size, norm_eps
    rms_norm_eps, tie_embeddings tie_word_embeddings)."""

    arch: str = "llama"
