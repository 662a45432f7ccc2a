"""The model a run config describes: config section -> model config -> model.

The trainer, the CLI's profile command and inference build their GPT here, so a config
means the same model everywhere::

    config = gpt_config(cfg.model, tokenizer.vocab_size)  # a GPTConfig
    model = build_model(config, weight_dtype(cfg.system.dtype), cfg.system.device)
"""
from __future__ import annotations

from typing import Any, Optional

from .backend import dtypes
from .config import ConfigError, ModelConfig
from .nn import GPT, GPTConfig

__all__ = ["DTYPES", "build_model", "gpt_config", "weight_dtype"]

# the weights' dtype per system.dtype: bf16 mixed precision keeps float32 master weights
# (and optimizer state) and runs the matrix products in bf16 under autocast
DTYPES = {"float32": dtypes.float32, "float64": dtypes.float64, "bf16": dtypes.float32}


def weight_dtype(name: str) -> Any:
    """The weights' dtype for a ``system.dtype`` (float32 for bf16 mixed precision)."""
    if name not in DTYPES:
        raise ValueError(f"system.dtype: expected one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def gpt_config(model: ModelConfig, tokenizer_vocab: Optional[int]) -> GPTConfig:
    """The GPT a config's model section describes: its vocabulary is model.vocab_size, or
    the tokenizer's ``tokenizer_vocab`` rounded up to a multiple of model.pad_vocab_to.
    ``tokenizer_vocab`` may be None only when model.vocab_size is set; ConfigError else,
    and when model.vocab_size is smaller than the tokenizer's vocabulary."""
    vocab_size = model.vocab_size
    if vocab_size is None:
        if tokenizer_vocab is None:
            raise ConfigError("model.vocab_size is null: the vocabulary size comes from the "
                              "data's tokenizer")
        vocab_size = -(-tokenizer_vocab // model.pad_vocab_to) * model.pad_vocab_to
    elif tokenizer_vocab is not None and vocab_size < tokenizer_vocab:
        raise ConfigError(f"model.vocab_size ({vocab_size}) is smaller than the tokenizer's "
                          f"vocabulary ({tokenizer_vocab}); set it to null")
    return GPTConfig(block_size=model.block_size, vocab_size=vocab_size, n_layer=model.n_layer,
                     n_head=model.n_head, n_embd=model.n_embd, dropout=model.dropout,
                     bias=model.bias)


def build_model(config: GPTConfig, dtype: Any = dtypes.float32, device: Any = "cpu") -> GPT:
    """A GPT of ``config``, initialised from the current seed, its weights in ``dtype`` (cast
    where they are made) and then moved to ``device``."""
    return GPT(config).to(dtype).to(device)
