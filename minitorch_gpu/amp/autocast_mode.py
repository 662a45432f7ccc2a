"""Mixed precision's forward: which ops run in bf16 or fp16 and which stay in float32.

    with minitorch_gpu.autocast("bf16"):     # or "fp16" (float16), with a GradScaler
        logits, loss = model(idx, targets)   # the weights stay float32 (the master copy)
    loss.backward()                          # their gradients arrive in float32

Inside ``autocast`` the matrix products (``matmul``, ``linear``, and the attention core)
cast their floating inputs to the autocast dtype: a bf16 x bf16 (or fp16 x fp16) product
accumulates in float32 (tensor cores on a GPU; float32 BLAS on rounded values on the CPU,
which is the same arithmetic) and its result is stored in the narrow dtype, as are the
activations those ops save for backward, half the bytes of float32. Layer norm, softmax,
log-softmax and cross-entropy cast narrow inputs up and compute in float32: their sums and
exponentials are where an 8-bit (bf16) or 11-bit (fp16) mantissa would hurt. Everything
else follows the usual type promotion, so the residual stream (float32 + bf16 -> float32)
stays float32.

bf16 has float32's exponent range; fp16 has 5 exponent bits (largest 65504, smallest
normal 6.1e-5), so small gradients flush to zero in its products' backward unless the loss
is scaled up first: fp16 training takes a ``GradScaler`` (``grad_scaler.py``), bf16 none.

The casts are ordinary differentiable ops: backward casts each gradient back to the dtype
of the tensor it belongs to, so a float32 weight's gradient is accumulated in float32
whatever precision its product ran in. Each op's rule is one call in its checked wrapper,
nowhere else: ``autocast_lower`` (matmul, linear, scaled_dot_product_attention, packed and
cached causal attention) or ``autocast_float32`` (layer_norm, rms_norm, softmax,
log_softmax, cross_entropy), both in ``ops/promotion.py``; a grep for them lists the rules.
"""
from __future__ import annotations

import contextlib
from typing import Any, Optional

import numpy as np

from ..backend import dtypes

__all__ = ["autocast", "autocast_dtype"]

_SUPPORTED = (dtypes.bfloat16, dtypes.float16)


class _State:
    dtype: Optional[np.dtype] = None


def autocast_dtype() -> Optional[np.dtype]:
    """The dtype matrix products run in now, or None outside ``autocast``."""
    return _State.dtype


class autocast(contextlib.ContextDecorator):
    """Run the matrix products inside in ``dtype`` ("bf16"/"bfloat16" or "fp16"/"float16");
    ``enabled=False`` turns an enclosing autocast off. A context manager and a decorator;
    nests."""

    def __init__(self, dtype: Any = "bf16", enabled: bool = True) -> None:
        target = dtypes.as_dtype(dtype)
        if target not in _SUPPORTED:
            raise ValueError(f"autocast: dtype must be bf16 (bfloat16) or fp16 (float16), "
                             f"got {target.name}")
        self.dtype = target if enabled else None
        self._previous: list = []

    def __enter__(self) -> "autocast":
        self._previous.append(_State.dtype)
        _State.dtype = self.dtype
        return self

    def __exit__(self, *exc: Any) -> None:
        _State.dtype = self._previous.pop()
