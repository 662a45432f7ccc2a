"""A run's precision (``system.dtype``): the autocast its forward passes run under, fp16's
loss scaler, the refusal of bf16 on a GPU without it, and what the log says of the scaler.

float32 and float64 train as they are. bf16 and fp16 keep float32 master weights and
optimizer state and run the forward under ``autocast``; fp16 also scales the loss
(``amp.GradScaler``), because its 5-bit exponent flushes small gradients to zero, and
skips the steps whose gradients overflowed. bf16 has float32's range and needs no scaler,
but its arithmetic needs a GPU of compute capability 8.0 (Ampere) or newer: on a T4 or a
V100 fp16 is the mixed precision there is.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

from ..amp import GradScaler, autocast
from ..backend import dtypes
from .run_state import TrainingError

__all__ = ["AUTOCAST_DTYPES", "BF16_MIN_CAPABILITY", "MixedPrecision"]

# the dtype the forward's products run in, per mixed-precision system.dtype
AUTOCAST_DTYPES = {"bf16": dtypes.bfloat16, "fp16": dtypes.float16}
# bf16 tensor cores (cuBLAS's CUDA_R_16BF) came with Ampere, compute capability 8.0
BF16_MIN_CAPABILITY = (8, 0)


class MixedPrecision:
    """The precision of a run whose config says ``system.dtype: name``.

    ``autocast`` is the context the forward passes run in (off for float32/float64);
    ``scaler`` the GradScaler the step goes through (disabled, so a pass-through, but for
    fp16); ``dtype`` the products' dtype, None without mixed precision."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = AUTOCAST_DTYPES.get(name)
        self.autocast = autocast(self.dtype or "bf16", enabled=self.dtype is not None)
        self.scaler = GradScaler(enabled=name == "fp16")
        self._skipped_at_last_log = 0

    def check_device(self, backend: Any) -> None:
        """TrainingError, one line, for bf16 on a GPU of compute capability below 8.0,
        naming fp16 as the way to train there."""
        capability = backend.compute_capability()
        if self.name != "bf16" or capability is None or capability >= BF16_MIN_CAPABILITY:
            return
        have, need = ".".join(map(str, capability)), ".".join(map(str, BF16_MIN_CAPABILITY))
        raise TrainingError(
            f"system.dtype: bf16 needs a GPU of compute capability {need} or newer (Ampere), "
            f"and {backend.device} has {have}, which has no bf16; use system.dtype: fp16 "
            f"(float16 with dynamic loss scaling) instead")

    def log_fields(self) -> Tuple[Dict[str, Any], str]:
        """For a log point under fp16: the metrics fields ``scale`` (the loss scale now:
        one host read, after the losses' read has waited for the steps) and
        ``skipped_steps`` (the steps skipped since the last log point), and the log line's
        words for them; nothing otherwise."""
        if not self.scaler.is_enabled():
            return {}, ""
        skipped = self.scaler.skipped_steps - self._skipped_at_last_log
        self._skipped_at_last_log = self.scaler.skipped_steps
        scale = self.scaler.get_scale()
        steps = "step" if skipped == 1 else "steps"
        return ({"scale": scale, "skipped_steps": skipped},
                f", loss scale {scale:g}, {skipped} {steps} skipped")
