"""SwiGLU's launchers (``swiglu.cu``): silu(gate) * up forward, and its two gradients,
elementwise; gate and up float32 or bf16, read as stored.
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from . import loader
from .loader import (ELEMENTWISE_THREADS, FLOAT32, check_input_dtype, check_shape,
                     elementwise_grid, input_code, is_float32_or_bf16,
                     on_device_of_first_array)


def supports_swiglu(gate: Any, up: Any) -> bool:
    """gate and up of one shape and one dtype, float32 or bf16 (read as stored), at least
    one element, any strides (a strided one is copied once)."""
    return (gate.size > 0 and tuple(gate.shape) == tuple(up.shape) and gate.dtype == up.dtype
            and is_float32_or_bf16(gate, up))


def _check(op: str, gate: Any, up: Any) -> None:
    check_input_dtype(op, gate=gate, up=up)
    check_shape(op, "up", up, gate.shape)


@on_device_of_first_array
def swiglu_forward(gate: Any, up: Any) -> Any:
    """silu(gate) * up = gate * sigmoid(gate) * up, in gate's dtype (computed in float32,
    rounded once); gate and up of one shape and dtype, float32 or bf16."""
    op = "swiglu_forward"
    _check(op, gate, up)
    gate, up = loader.contiguous(gate), loader.contiguous(up)
    out = loader.require_cupy().empty_like(gate)
    if gate.size:
        kernel = loader.load_kernel(gate, "swiglu.cu", "swiglu_forward",
                                    INPUT_DTYPE=input_code(gate.dtype))
        kernel((elementwise_grid(gate.size),), (ELEMENTWISE_THREADS,),
               (gate, up, out, np.int64(gate.size)))
    return out


@on_device_of_first_array
def swiglu_backward(grad: Any, gate: Any, up: Any) -> Tuple[Any, Any]:
    """``(grad_gate, grad_up)``, float32 of gate's shape, given ``grad`` = dL/dout: with
    s = sigmoid(gate), grad_gate = grad * up * s * (1 + gate * (1 - s)) and grad_up =
    grad * gate * s. grad is read in gate's dtype (another float dtype is cast once)."""
    op = "swiglu_backward"
    _check(op, gate, up)
    check_shape(op, "grad", grad, gate.shape)
    if grad.dtype != gate.dtype:  # one module reads grad, gate, up: grad in gate's dtype
        if grad.dtype.kind != "f" and grad.dtype.name != "bfloat16":
            raise TypeError(f"{op}: grad must be a float array, got {grad.dtype}")
        grad = grad.astype(gate.dtype)
    cupy = loader.require_cupy()
    grad, gate, up = (loader.contiguous(a) for a in (grad, gate, up))
    grad_gate = cupy.empty(gate.shape, dtype=FLOAT32)
    grad_up = cupy.empty(gate.shape, dtype=FLOAT32)
    if gate.size:
        kernel = loader.load_kernel(gate, "swiglu.cu", "swiglu_backward",
                                    INPUT_DTYPE=input_code(gate.dtype))
        kernel((elementwise_grid(gate.size),), (ELEMENTWISE_THREADS,),
               (grad, gate, up, grad_gate, grad_up, np.int64(gate.size)))
    return grad_gate, grad_up
