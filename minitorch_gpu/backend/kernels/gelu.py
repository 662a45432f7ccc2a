"""GELU's launchers (``gelu.cu``): forward and backward, tanh or erf form, elementwise."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import loader
from .loader import (ELEMENTWISE_THREADS, check_float32, check_shape, elementwise_grid,
                     is_float32_or_narrower, on_device_of_first_array)


def supports_gelu(x: Any, approximate: str = "tanh") -> bool:
    """A float32 (or bf16/fp16, widened by the op) input with at least one element
    (either form, tanh or erf: ``approximate`` changes nothing here)."""
    return x.size > 0 and is_float32_or_narrower(x)


def _approximate_flag(op: str, approximate: str) -> np.int32:
    if approximate not in ("tanh", "none"):
        raise ValueError(f"{op}: approximate must be 'tanh' or 'none', got {approximate!r}")
    return np.int32(approximate == "tanh")


@on_device_of_first_array
def gelu_forward(x: Any, approximate: str = "tanh") -> Any:
    """GELU of float32 ``x``: ``approximate="tanh"`` (GPT-2's) or ``"none"`` (erf)."""
    op = "gelu_forward"
    check_float32(op, x=x)
    flag = _approximate_flag(op, approximate)
    x = loader.contiguous(x)
    y = loader.require_cupy().empty_like(x)
    if x.size:
        kernel = loader.load_kernel(x, "gelu.cu", "gelu_forward")
        kernel((elementwise_grid(x.size),), (ELEMENTWISE_THREADS,),
               (x, y, np.int64(x.size), flag))
    return y


@on_device_of_first_array
def gelu_backward(x: Any, dy: Any, approximate: str = "tanh") -> Any:
    """``dy * gelu'(x)``, both float32 of one shape."""
    op = "gelu_backward"
    check_float32(op, x=x, dy=dy)
    check_shape(op, "dy", dy, x.shape)
    flag = _approximate_flag(op, approximate)
    x, dy = loader.contiguous(x), loader.contiguous(dy)
    dx = loader.require_cupy().empty_like(x)
    if x.size:
        kernel = loader.load_kernel(x, "gelu.cu", "gelu_backward")
        kernel((elementwise_grid(x.size),), (ELEMENTWISE_THREADS,),
               (x, dy, dx, np.int64(x.size), flag))
    return dx
