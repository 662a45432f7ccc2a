"""``minitorch_gpu.cuda``: is a GPU usable here, and the GPU-side helpers.

>>> minitorch_gpu.cuda.is_available()   # False on a machine without CuPy or a GPU
"""
from __future__ import annotations

from typing import Optional

from .backend import _cupy, get_backend


def is_available() -> bool:
    """True when CuPy imports and sees at least one CUDA GPU."""
    return _cupy.unavailable_reason() is None


def is_emulated() -> bool:
    """True under ``MINITORCH_EMULATE_CUDA=1``: ``cuda`` is the CuPy stand-in on the CPU, a
    test device (kernels and results are checked; its speeds mean nothing)."""
    return _cupy.EMULATED


EMULATED_NOTE = _cupy.EMULATED_NOTE


def unavailable_reason() -> Optional[str]:
    """Why CUDA can't be used here (None when it can)."""
    return _cupy.unavailable_reason()


def device_count() -> int:
    return _cupy.device_count()


def synchronize(device: int = 0) -> None:
    """Wait for all queued work on ``cuda:device``."""
    get_backend(f"cuda:{device}").synchronize()


def memory_stats(device: int = 0) -> dict:
    """Bytes in use and reserved by CuPy's memory pool."""
    return get_backend(f"cuda:{device}").memory_stats()
