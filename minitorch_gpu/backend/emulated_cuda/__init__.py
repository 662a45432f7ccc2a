"""An emulated GPU for the tests: the project's CUDA C compiled by g++ and run on the CPU.

A device that only tests use. It imitates what the kernels' launchers
(``backend/kernels``) need from CuPy, and nothing is ever switched to it by the engine:
``emulated()`` (or ``activate()``) puts it behind the loader's three seams
(``loader.require_cupy``, ``loader.load_kernel``, ``loader.contiguous``). (The whole
``cuda`` device on it is ``stand_in/``, CuPy's stand-in, which ``MINITORCH_EMULATE_CUDA=1``
has ``backend/__init__`` install in CuPy's place before ``cupy_backend`` binds the name.)

* ``cuda_emulation.h``: CUDA's built-ins for g++: every CUDA thread a fiber, real barriers,
  warp shuffles by CUDA's rules, static shared memory per block, seeded shuffled schedules,
  -ftz's flushed denormals;
* ``build.py``: each .cu compiled once per (source, defines), cached on disk;
* ``launch.py``: ``RawModule``/``RawKernel`` look-alikes that check every launch against the
  kernel's C signature and ``__launch_bounds__``, and name the buffer a fault ran past;
* ``memory.py``: device arrays are NumPy arrays flush against a guard page, poisoned when
  allocated;
* ``host_kernels.py``: the launchers for host arrays, so the CPU backend's ops can take
  their kernel branches through the CUDA kernels (each kernel tested against its op).

What it cannot show is what only a GPU has: speed, the memory pool, streams running
concurrently, cuBLAS and NCCL (docs/DESIGN.md).
"""
from __future__ import annotations

import contextlib
import functools
import platform
import sys
from types import SimpleNamespace
from typing import Any, Iterator, Optional, Tuple

import numpy as np

from . import build, memory
from .host_kernels import kernels_for_host_arrays
from .launch import EmulatedKernel, EmulatedKernelError, EmulatedModule, launched, schedules

__all__ = ["EmulatedKernel", "EmulatedKernelError", "EmulatedModule", "activate",
           "deactivate", "emulated", "kernels_for_host_arrays", "launched", "memory",
           "launcher_stand_in", "schedules", "unavailable_reason"]


def unavailable_reason() -> Optional[str]:
    """Why the emulated GPU cannot run here (it needs Linux on x86-64 and a C++ compiler),
    or None."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"it runs on Linux x86-64, this is {sys.platform} {platform.machine()}"
    try:
        build.compiler()
    except RuntimeError as exc:
        return str(exc)
    return None


class _Device:
    """``cupy.cuda.Device``: one device, 0, current inside ``with``."""

    def __init__(self, device: Any = None) -> None:
        self.id = 0 if device is None else int(getattr(device, "id", device))
        if self.id != 0:
            raise ValueError(f"the emulated GPU has one device, 0; got {self.id}")

    def __enter__(self) -> "_Device":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def use(self) -> None:
        return None


def _empty_like(a: Any, dtype: Any = None) -> np.ndarray:
    return memory.empty(a.shape, a.dtype if dtype is None else dtype)


def _zeros(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    out = memory.empty(shape, dtype)
    out[...] = 0
    return out


def _full(shape: Any, fill: Any, dtype: Any = None) -> np.ndarray:
    out = memory.empty(shape, np.asarray(fill).dtype if dtype is None else dtype)
    out[...] = fill
    return out


def _ascontiguousarray(a: Any, dtype: Any = None) -> np.ndarray:
    """``a`` itself where it already is a C-contiguous device array of ``dtype``, else a
    device copy (a view of a host array is copied in, as the launchers' inputs are)."""
    if isinstance(a, np.ndarray) and a.flags.c_contiguous and memory.is_device_array(a) and \
            (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    return memory.to_device(a, dtype)


def _asarray(a: Any, dtype: Any = None) -> np.ndarray:
    if isinstance(a, np.ndarray) and memory.is_device_array(a) and \
            (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    return memory.to_device(a, dtype)


def _stand_in() -> SimpleNamespace:
    """What the launchers call on CuPy, on emulated device arrays."""
    return SimpleNamespace(
        empty=memory.empty, empty_like=_empty_like, zeros=_zeros,
        zeros_like=lambda a, dtype=None: _zeros(a.shape, a.dtype if dtype is None else dtype),
        ones=lambda shape, dtype=np.float32: _full(shape, 1, dtype), full=_full,
        asarray=_asarray, ascontiguousarray=_ascontiguousarray,
        broadcast_to=np.broadcast_to, ndarray=np.ndarray,
        cuda=SimpleNamespace(Device=_Device))


launcher_stand_in = _stand_in()


@functools.lru_cache(maxsize=None)
def _module(filename: str, defines: Tuple[Tuple[str, int], ...]) -> EmulatedModule:
    from ..kernels import loader
    loader.source_text(filename)  # the same check of the name
    return EmulatedModule(loader.SOURCE_DIR / filename, defines)


def load_kernel(like: Any, filename: str, name: str, **defines: int) -> EmulatedKernel:
    """``loader.load_kernel`` on the emulated GPU: one module per (source, defines), one
    kernel object per name."""
    return _module(filename, tuple(sorted(defines.items()))).get_function(name)


_saved: list = []


def activate() -> None:
    """Put the emulated GPU behind the kernels' loader (until ``deactivate``)."""
    from ..kernels import loader
    _saved.append((loader.require_cupy, loader.load_kernel, loader.contiguous))
    loader.require_cupy = lambda: launcher_stand_in
    loader.load_kernel = load_kernel
    loader.contiguous = _ascontiguousarray


def deactivate() -> None:
    """Give the loader back what ``activate`` replaced."""
    from ..kernels import loader
    loader.require_cupy, loader.load_kernel, loader.contiguous = _saved.pop()


@contextlib.contextmanager
def emulated() -> Iterator[SimpleNamespace]:
    """The kernels' launchers run on the emulated GPU inside; yields the CuPy stand-in
    (``.asarray`` puts a host array on the device)."""
    activate()
    try:
        yield launcher_stand_in
    finally:
        deactivate()
