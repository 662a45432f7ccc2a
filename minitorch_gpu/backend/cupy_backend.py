"""The CUDA backend: CuPy arrays on one GPU.

CuPy is imported here and nowhere else. ``unavailable_reason()`` says why CUDA can't
be used on this machine (no CuPy, or no GPU), so the error a user sees names the fix.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .base import Backend, Device, Timer

INSTALL_HINT = ("install CuPy for your CUDA version: pip install -e '.[cuda12]' or "
                "pip install -e '.[cuda13]'")

try:
    import cupy
    import cupyx
    import cupyx.scipy.special as _cupy_special
    _IMPORT_ERROR: Optional[str] = None
except Exception as exc:  # ImportError, or a CuPy that fails to load its CUDA libraries
    cupy = None
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


def unavailable_reason() -> Optional[str]:
    """None when CUDA can be used, else a sentence saying why not."""
    if cupy is None:
        return f"CuPy is not importable ({_IMPORT_ERROR}); {INSTALL_HINT}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"CuPy is installed but no CUDA GPU is usable ({type(exc).__name__}: {exc})"
    if count == 0:
        return "CuPy is installed but no CUDA GPU was found"
    return None


def device_count() -> int:
    if unavailable_reason() is not None:
        return 0
    return cupy.cuda.runtime.getDeviceCount()


class CudaTimer(Timer):
    """Times a block with CUDA events, so queued GPU work is counted, not just its launch."""

    def __enter__(self) -> "CudaTimer":
        self._start_event = cupy.cuda.Event()
        self._end_event = cupy.cuda.Event()
        self._start_event.record()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._end_event.record()
        self._end = True

    @property
    def elapsed_ms(self) -> float:
        if self._end is None:
            raise RuntimeError("Timer.elapsed_ms: the timed block has not finished")
        self._end_event.synchronize()
        return cupy.cuda.get_elapsed_time(self._start_event, self._end_event)


class CupyBackend(Backend):
    """Arrays on ``cuda:index``. Every call that allocates runs under that device."""

    def __init__(self, index: int, seed: int) -> None:
        self.xp = cupy
        self.device = Device("cuda", index)
        self._cuda_device = cupy.cuda.Device(index)
        super().__init__(seed)

    def asarray(self, data: Any, dtype: Optional[np.dtype] = None) -> Any:
        with self._cuda_device:
            return cupy.asarray(data, dtype=dtype)

    def to_numpy(self, array: Any) -> np.ndarray:
        return cupy.asnumpy(array)

    def data_ptr(self, array: Any) -> int:
        return array.data.ptr

    def scatter_add(self, target: Any, index: Any, values: Any) -> None:
        cupyx.scatter_add(target, index, values)

    def erf(self, x: Any) -> Any:
        return _cupy_special.erf(x)

    def stable_argsort(self, array: Any, axis: int) -> Any:
        with self._cuda_device:  # CuPy's argsort is always stable and accepts no other kind
            return cupy.argsort(array, axis=axis)

    def seed(self, seed: int) -> None:
        with self._cuda_device:
            self._rng = cupy.random.default_rng(seed)

    def randn(self, shape: tuple, dtype: np.dtype) -> Any:
        draw = self._float_for_random(dtype)
        with self._cuda_device:
            return self._rng.standard_normal(shape, dtype=draw).astype(dtype, copy=False)

    def rand(self, shape: tuple, dtype: np.dtype) -> Any:
        draw = self._float_for_random(dtype)
        with self._cuda_device:
            return self._rng.random(shape, dtype=draw).astype(dtype, copy=False)

    def randint(self, low: int, high: int, shape: tuple, dtype: np.dtype) -> Any:
        with self._cuda_device:
            return self._rng.integers(low, high, size=shape, dtype=dtype)

    def synchronize(self) -> None:
        self._cuda_device.synchronize()

    def timer(self) -> CudaTimer:
        return CudaTimer()

    def memory_stats(self) -> dict:
        pool = cupy.get_default_memory_pool()
        return {"bytes_in_use": pool.used_bytes(), "bytes_reserved": pool.total_bytes()}
