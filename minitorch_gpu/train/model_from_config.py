"""The model a run config describes: config section -> model config (the model itself is
``nn.build``'s ``build_model``).

The trainer and the CLI's profile command read their model's shape here, so a config means
the same model everywhere::

    config = gpt_config(cfg.model, tokenizer.vocab_size)  # a GPTConfig
    model = build_model(config, weight_dtype(cfg.system.dtype), cfg.system.device)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..nn import GPTConfig
from ..nn.memory import check_workload, workload
from .config import Config, ConfigError, ModelConfig

__all__ = ["check_training_memory", "gpt_config"]


def gpt_config(model: ModelConfig, tokenizer_vocab: Optional[int]) -> GPTConfig:
    """The model a config's model section describes: its vocabulary is model.vocab_size, or
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
    shape = {f.name: getattr(model, f.name) for f in dataclasses.fields(GPTConfig)}
    return GPTConfig(**{**shape, "vocab_size": vocab_size})


def check_training_memory(cfg: Config, vocab_size: Optional[int], backend: Any,
                          data_parallel: bool = False) -> None:
    """MemoryLimitError, one line naming the config keys, when the model ``cfg`` describes,
    its optimizer and one micro-batch (or evaluation batch) are estimated past the memory
    ``backend``'s device has (``memory.py``): Python arithmetic, before anything is
    allocated. ``vocab_size`` None: before the data is read, the vocabulary at its least
    (model.vocab_size, else model.pad_vocab_to)."""
    m, t = cfg.model, cfg.train
    vocab = vocab_size or m.vocab_size or m.pad_vocab_to
    work = workload("train", dataclasses.replace(m, vocab_size=vocab), batch=t.batch_size,
                    eval_batch=cfg.eval.batch_size, dtype=cfg.system.dtype,
                    device=str(backend.device), data_parallel=data_parallel)
    names = {"n_layer": "model.n_layer", "n_embd": "model.n_embd",
             "block_size": "model.block_size", "batch": "train.batch_size",
             "eval_batch": "eval.batch_size", "n_head": "model.n_head",
             "vocab_size": "model.vocab_size" if m.vocab_size is not None or
             cfg.data.tokenizer != "bpe" else "data.vocab_size"}
    if work.arch == "llama":  # the Llama's own widths: the keys' and values', the MLP's
        names.update({"n_kv_head": "model.n_kv_head", "ffn_hidden": "model.ffn_hidden"})
    check_workload(work, backend, cfg.system.memory_limit_gb, names)
