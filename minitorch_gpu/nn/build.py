"""A model from its shape: ``build_model(GPTConfig)`` (a GPT or a Llama, by ``arch``), and the
weights' dtype for a precision's name, as run configs and checkpoints spell it.

What the trainer, the profiler's command, inference and ``from_pretrained`` build their
model with, so a shape means the same model everywhere::

    model = build_model(config, weight_dtype("bf16"), "cuda")  # float32 master weights
"""
from __future__ import annotations

from typing import Any

from ..backend import dtypes
from . import CausalLM, GPTConfig, model_for

__all__ = ["DTYPES", "build_model", "weight_dtype"]

# the weights' dtype per system.dtype: bf16 and fp16 mixed precision keep float32 master
# weights (and optimizer state) and run the matrix products in bf16/fp16 under autocast
DTYPES = {"float32": dtypes.float32, "float64": dtypes.float64, "bf16": dtypes.float32,
          "fp16": dtypes.float32}


def weight_dtype(name: str) -> Any:
    """The weights' dtype for a ``system.dtype`` (float32 for bf16/fp16 mixed precision)."""
    if name not in DTYPES:
        raise ValueError(f"system.dtype: expected one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def build_model(config: GPTConfig, dtype: Any = dtypes.float32,
                device: Any = "cpu") -> CausalLM:
    """The model of ``config`` (a GPT or a Llama, by ``config.arch``), initialised from the
    current seed, its weights in ``dtype`` (cast where they are made) and then moved to
    ``device``."""
    return model_for(config).to(dtype).to(device)
