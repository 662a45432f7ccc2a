"""Backends: one per device, chosen by device string ("cpu", "cuda", "cuda:N").

``get_backend(device)`` returns the (cached) Backend for a device; ``manual_seed`` reseeds
every backend, including those created later.
"""
from __future__ import annotations

from typing import Any

from . import cupy_backend, dtypes
from .base import DEFAULT_SEED, Backend, Device, Timer, parse_device
from .numpy_backend import NumpyBackend

__all__ = ["Backend", "Device", "Timer", "cpu", "dtypes", "get_backend", "manual_seed",
           "parse_device"]

_seed = DEFAULT_SEED
cpu = NumpyBackend(_seed)
_backends: dict = {cpu.device: cpu}


def get_backend(device: Any) -> Backend:
    """The Backend of ``device``; raises RuntimeError naming the fix when CUDA is unusable."""
    device = parse_device(device)
    backend = _backends.get(device)
    if backend is not None:
        return backend
    reason = cupy_backend.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"device '{device}' is not available: {reason}")
    count = cupy_backend.device_count()
    if device.index >= count:
        raise RuntimeError(
            f"device '{device}' is not available: this machine has {count} CUDA device(s)")
    backend = _backends[device] = cupy_backend.CupyBackend(device.index, _seed)
    return backend


def manual_seed(seed: int) -> None:
    """Seed the random numbers of every backend (randn, rand, randint, dropout)."""
    global _seed
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"manual_seed: expected an int seed, got {type(seed).__name__}")
    _seed = seed
    for backend in _backends.values():
        backend.seed(seed)


def backend_of_array(array: Any) -> Backend:
    """The backend that owns a raw array (a NumPy array is on the CPU)."""
    if hasattr(array, "__cuda_array_interface__"):
        return get_backend(Device("cuda", array.device.id))
    return cpu
