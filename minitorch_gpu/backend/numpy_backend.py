"""The CPU backend: NumPy arrays. It is the reference the CUDA backend is checked against."""
from __future__ import annotations

import math
import os
import resource
import sys
from typing import Any, Optional, Tuple

import numpy as np

from . import cpu_kernels
from .base import Backend, Device
from .blas_split import split_matmul
from .dtypes import NARROW_FLOATS
from .host_memory import cache_freed_memory

_SQRT_PI = math.sqrt(math.pi)


class NumpyBackend(Backend):
    xp = np
    device = Device("cpu")
    rng_kind = "numpy"
    reads_are_free = True  # the arrays are host memory: checks run at once (base.py)
    # False makes every op run its NumPy code instead of the fused CPU kernels (numba's,
    # backend/cpu_kernels): to compare the two, or where numba misbehaves. The kernels
    # run only where numba is importable (cpu_kernels.unavailable_reason() says why not)
    use_fused_kernels = True
    _RNG_KEYS = frozenset({"kind", "bit_generator", "state", "inc", "has_uint32", "uinteger"})

    def prepare_backward(self) -> None:
        """Training frees and allocates the same activation-sized arrays at every step:
        from the first backward pass on, malloc keeps freed blocks mapped for reuse rather
        than page-faulting fresh ones in (host_memory.py)."""
        cache_freed_memory()

    def fused_kernels(self) -> Any:
        if self.use_fused_kernels and cpu_kernels.available():
            return cpu_kernels
        return None

    def asarray(self, data: Any, dtype: Optional[np.dtype] = None) -> np.ndarray:
        if hasattr(data, "__cuda_array_interface__"):  # a CuPy array: a read from its GPU
            owner = Backend.made.get(Device("cuda", data.device.id))
            # counted by the GPU's backend; an array made outside this package has none
            data = owner.to_numpy(data) if owner is not None else data.get()
        return np.asarray(data, dtype=dtype)

    def _to_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def data_ptr(self, array: np.ndarray) -> int:
        return array.__array_interface__["data"][0]

    def scatter_add(self, target: np.ndarray, index: Any, values: np.ndarray) -> None:
        if (isinstance(index, np.ndarray) and index.ndim == 1 and index.dtype.kind in "iu"
                and index.size and values.ndim == target.ndim and values.ndim > 1):
            _scatter_add_rows(target, index, values)
        else:
            np.add.at(target, index, values)

    def erf(self, x: np.ndarray) -> np.ndarray:
        return _erf(x)

    def matmul(self, a: np.ndarray, b: np.ndarray,
               out: Optional[np.ndarray] = None) -> np.ndarray:
        """bf16/fp16 operands are widened to float32 (exactly) and multiplied by float32
        BLAS: the same arithmetic as a tensor core's (products exact, float32 sums), many
        times faster than ml_dtypes' own bf16 matmul loop. ``out`` of the operands' dtype
        is written by BLAS directly, whatever its strides (NumPy passes the row stride)."""
        if a.dtype not in NARROW_FLOATS and (split := split_matmul(a, b, out)) is not None:
            return split  # a stack of small products, side by side on the cores
        if out is not None and a.dtype == b.dtype == out.dtype and a.dtype not in NARROW_FLOATS:
            return np.matmul(a, b, out=out)
        if a.dtype in NARROW_FLOATS:
            a = a.astype(np.float32)
        if b.dtype in NARROW_FLOATS:
            b = b.astype(np.float32)  # a float64 operand stays float64, as NumPy promotes
        if out is None:
            return np.matmul(a, b)
        out[...] = np.matmul(a, b)  # rounded to out's dtype
        return out

    def stable_argsort(self, array: np.ndarray, axis: int) -> np.ndarray:
        return np.argsort(array, axis=axis, kind="stable")  # the default is not stable

    def smallest_positions(self, keys: np.ndarray, k: int, axis: int) -> np.ndarray:
        """A partition (introselect, linear time) and its first ``k``."""
        index = (slice(None),) * (axis % keys.ndim) + (slice(0, k),)
        return np.argpartition(keys, k - 1, axis=axis)[index]

    def seed(self, seed: int) -> None:
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def get_rng_state(self) -> dict:
        """PCG64's whole state (``bit_generator.state``, two 128-bit ints and the cached
        32-bit half-draw): restoring it continues the stream exactly.

        >>> state = backend.get_rng_state(); a = backend.randn((3,), float32)
        >>> backend.set_rng_state(state); assert (backend.randn((3,), float32) == a).all()
        """
        numpy_state = self._rng.bit_generator.state
        return {"kind": self.rng_kind, "bit_generator": numpy_state["bit_generator"],
                "state": int(numpy_state["state"]["state"]),
                "inc": int(numpy_state["state"]["inc"]),
                "has_uint32": int(numpy_state["has_uint32"]),
                "uinteger": int(numpy_state["uinteger"])}

    @classmethod
    def parse_rng_state(cls, state: Any) -> dict:
        cls._check_rng_state_keys(state, cls._RNG_KEYS)
        if state["bit_generator"] != "PCG64":
            raise ValueError(f"{cls.__name__}.set_rng_state: expected bit_generator 'PCG64', "
                             f"got {state['bit_generator']!r}")
        inner = {"state": cls._check_rng_int(state, "state", 0, 1 << 128),
                 "inc": cls._check_rng_int(state, "inc", 0, 1 << 128)}
        if inner["inc"] % 2 == 0:  # PCG64 makes its increment odd; an even one was edited
            raise ValueError(f"{cls.__name__}.set_rng_state: expected an odd 'inc' (PCG64's "
                             f"increment), got {inner['inc']}")
        return {"bit_generator": "PCG64", "state": inner,
                "has_uint32": cls._check_rng_int(state, "has_uint32", 0, 2),
                "uinteger": cls._check_rng_int(state, "uinteger", 0, 1 << 32)}

    def _install_rng_state(self, parsed: dict) -> None:
        bit_generator = np.random.PCG64()
        bit_generator.state = parsed
        self._rng = np.random.Generator(bit_generator)

    def randn(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        self._drawing("randn")
        draw = self._float_for_random(dtype)
        return self._rng.standard_normal(shape, dtype=draw).astype(dtype, copy=False)

    def rand(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        self._drawing("rand")
        draw = self._float_for_random(dtype)
        return self._rng.random(shape, dtype=draw).astype(dtype, copy=False)

    def randint(self, low: int, high: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
        self._drawing("randint")
        return self._rng.integers(low, high, size=shape, dtype=dtype)

    def memory_stats(self) -> dict:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # ru_maxrss is in kilobytes on Linux and in bytes on macOS.
        return {"peak_rss_bytes": peak if sys.platform == "darwin" else peak * 1024}

    def free_memory(self) -> Tuple[int, str]:
        """The host's available memory (MemAvailable: free plus reclaimable caches), or
        less where this process is held to less: a cgroup's memory limit (a container) or
        an address-space limit (``ulimit -v``), each less what is already used under it."""
        found = [_mem_available(), _cgroup_room(), _address_space_room()]
        return min((room for room in found if room is not None), key=lambda room: room[0])


def _mem_available() -> Tuple[int, str]:
    """MemAvailable from /proc/meminfo; elsewhere free pages times the page size."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available (MemAvailable)"
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        pages = -1
    if pages < 0:  # nothing to go by: no limit of ours
        return sys.maxsize, "available"
    return pages, "available (free pages)"


def _read_int(path: str) -> Optional[int]:
    """The integer in a one-line file (cgroup's), or None (absent, "max", unreadable)."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _cgroup_room() -> Optional[Tuple[int, str]]:
    """What this cgroup's memory limit leaves (v2, else v1), or None without a limit. The
    usage counts the page cache, which the kernel reclaims before it refuses memory: its
    inactive part (what ``docker stats`` and the kubelet leave out too) is not counted,
    or a container that has just read a corpus would look full."""
    for directory, limit_name, usage_name, inactive_name in (
            ("/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
             "total_inactive_file")):
        limit = _read_int(f"{directory}/{limit_name}")
        usage = _read_int(f"{directory}/{usage_name}")
        if limit is not None and usage is not None and limit < 1 << 60:  # v1's "none": ~2^63
            usage -= min(_memory_stat(f"{directory}/memory.stat", inactive_name), usage)
            return max(limit - usage, 0), "left under the cgroup's memory limit"
    return None


def _memory_stat(path: str, key: str) -> int:
    """``key``'s bytes in a cgroup's memory.stat ("KEY VALUE" lines), 0 when absent."""
    try:
        with open(path) as stat:
            for line in stat:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _address_space_room() -> Optional[Tuple[int, str]]:
    """What an address-space limit (RLIMIT_AS, ``ulimit -v``) leaves this process, or None
    without one."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        used = 0
    return max(soft - used, 0), "left under the address-space limit (ulimit -v)"


def _scatter_add_rows(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """``target[index[i]] += values[i]`` for whole rows (the embedding backward), where rows
    repeat: sort the indices, sum each run of equal ones with one ``reduceat``, then add
    each distinct row once. About 3x faster than ``np.add.at``, which adds row by row."""
    if index.min() < 0:
        index = np.where(index < 0, index + target.shape[0], index)
    order = np.argsort(index, kind="stable")
    rows = index[order]
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    target[rows[starts]] += np.add.reduceat(values[order], starts, axis=0)


def _erf(x: np.ndarray) -> np.ndarray:
    """Vectorised error function, accurate to about 1e-15 in float64 (NumPy has none).

    Two expansions, each where it converges fast and without cancellation:
    |x| < 2.5: erf(x) = 2/sqrt(pi) * exp(-x^2) * sum_n (2x^2)^n x / (1*3*...*(2n+1));
    |x| >= 2.5: erfc(|x|) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))).
    """
    x = np.asarray(x)
    work = x.astype(np.float64, copy=False)
    ax = np.abs(work)
    out = np.empty_like(work)

    small = ax < 2.5
    xs = work[small]
    x2 = xs * xs
    term = xs.copy()
    total = xs.copy()
    for n in range(1, 60):  # terms shrink like (2x^2)^n / (2n+1)!!; 60 covers |x| < 2.5
        term *= 2.0 * x2 / (2 * n + 1)
        total += term
    out[small] = 2.0 / _SQRT_PI * np.exp(-x2) * total

    big = ~small
    xb = ax[big]
    frac = xb.copy()
    for k in range(60, 0, -1):  # the continued fraction, evaluated from its tail
        frac = xb + (k / 2.0) / frac
    erfc = np.exp(-xb * xb) / _SQRT_PI / frac
    out[big] = np.copysign(1.0 - erfc, work[big])
    return out.astype(x.dtype, copy=False) if x.dtype.kind == "f" else out
