"""The CUDA backend: CuPy arrays on one GPU.

CuPy is imported here and nowhere else. ``unavailable_reason()`` says why CUDA can't
be used on this machine (no CuPy, or no GPU), so the error a user sees names the fix.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any, Optional

import numpy as np

from .base import Backend, Device, Timer
from .dtypes import NARROW_FLOATS
from . import kernels as fused_kernel_module

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


_MAX_RESEED = (1 << 63) - 1  # "reseed" mode draws its seed in [0, 2**63 - 1)
_RNG_KEYS = {  # the keys of get_rng_state() in each mode
    "exact": frozenset({"kind", "bit_generator", "mode", "size", "nbytes", "encoding", "data"}),
    "reseed": frozenset({"kind", "bit_generator", "mode", "seed"}),
}


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

    rng_kind = "cupy"
    # False makes every op run its vectorised CuPy code instead of the fused CUDA kernels
    # (to compare the two, or to rule the kernels out)
    use_fused_kernels = True

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
        if target.dtype in NARROW_FLOATS:  # cupyx.scatter_add has no bf16/fp16 loop
            wide = target.astype(cupy.float32)
            cupyx.scatter_add(wide, index, values.astype(cupy.float32))
            target[...] = wide.astype(target.dtype)
            return
        cupyx.scatter_add(target, index, values)

    def matmul(self, a: Any, b: Any, out: Any = None) -> Any:
        """cuBLAS (gemmEx, float32 accumulation) for bf16 too; but CuPy 14 sends a batched
        (> 2-D) bf16 product to a kernel that refuses bf16 (cupy/cupy#10317, unreleased
        fix), so those are widened to float32 first: the same arithmetic. ``out`` receives
        the product, rounded to its dtype."""
        if (a.dtype in NARROW_FLOATS or b.dtype in NARROW_FLOATS) and max(a.ndim, b.ndim) > 2:
            product = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
        elif out is not None and a.dtype == b.dtype == out.dtype:
            return cupy.matmul(a, b, out=out)
        else:
            product = cupy.matmul(a, b)
        if out is None:
            return product
        out[...] = product
        return out

    def erf(self, x: Any) -> Any:
        return _cupy_special.erf(x)

    def stable_argsort(self, array: Any, axis: int) -> Any:
        with self._cuda_device:  # CuPy's argsort is always stable and accepts no other kind
            return cupy.argsort(array, axis=axis)

    def fused_kernels(self) -> Any:
        return fused_kernel_module if self.use_fused_kernels else None

    def seed(self, seed: int) -> None:
        with self._cuda_device:
            self._rng = cupy.random.default_rng(seed)

    # --- random-number state ------------------------------------------------------------
    # ``cupy.random.default_rng(seed)`` is ``Generator(XORWOW(seed))``. In CuPy's source
    # (cupy/random/_bit_generator.pyx, class ``_cuRANDGenerator``, as of v14) the bit
    # generator's whole state is one device buffer ``_state``: int8, holding ``_size``
    # cuRAND ``curandState`` records (one per GPU thread, Box-Muller cache included).
    # ``_size`` defaults to ``8 * 256 * cupy.cuda.runtime.cudaDevAttrMultiProcessorCount``,
    # which is that attribute's enum value (16), not the SM count: 32768 threads on any
    # GPU. Every draw
    # (cupy/random/_generator_api.pyx, ``_launch_dist``) reads and advances those records
    # and nothing else. The Generator itself keeps only a binomial cache, which randn,
    # rand and randint never use. So copying ``_state``'s bytes out and into a new
    # XORWOW of the same ``_size`` restores the stream exactly. CuPy has no public API
    # for this: where ``_state``/``_size`` are missing (a CuPy that reorganised them),
    # get_rng_state falls back to "reseed" (see below).
    def get_rng_state(self) -> dict:
        """The XORWOW stream as JSON data, in one of two modes:

        - ``"exact"`` (CuPy 14 and the versions that keep ``XORWOW._state``): the bytes
          of every per-thread cuRAND state, base64-encoded: with CuPy's default of 32768
          threads of 48 bytes, 1.5 MB of state and 2 MB of text, a few ms to take (a
          copy to the host, which waits for queued work, then the encoding; zlib would
          save a quarter of the size for ten times the time). Restoring it continues the
          stream exactly, and taking it changes nothing.
        - ``"reseed"`` (a CuPy without ``_state``): a 63-bit seed drawn from the stream,
          which is then reseeded with it here too. Guarantee: the draws after restoring
          are those this process makes after the snapshot; but taking the snapshot
          changed this process's stream (it is not the one an unsnapshotted run sees).

        Restore on any GPU (the thread count is saved) with the same CuPy and CUDA
        versions: cuRAND does not promise one state layout across versions.
        """
        bit_generator = self._rng.bit_generator
        device_state = getattr(bit_generator, "_state", None)
        size = getattr(bit_generator, "_size", None)
        name = type(bit_generator).__name__
        if isinstance(device_state, cupy.ndarray) and isinstance(size, (int, np.integer)) \
                and size > 0:
            with self._cuda_device:
                raw = device_state.get().tobytes()  # waits for the queued draws
            return {"kind": self.rng_kind, "bit_generator": name, "mode": "exact",
                    "size": int(size), "nbytes": len(raw), "encoding": "base64",
                    "data": base64.b64encode(raw).decode("ascii")}
        with self._cuda_device:
            seed = int(self._rng.integers(0, _MAX_RESEED, size=(), dtype=np.int64))
        self.seed(seed)
        return {"kind": self.rng_kind, "bit_generator": name, "mode": "reseed", "seed": seed}

    @classmethod
    def parse_rng_state(cls, state: Any) -> tuple:
        """``("exact", size, raw bytes)`` or ``("reseed", seed)``; ValueError if malformed.
        Runs without CuPy, so a GPU's state can be checked on a CPU-only machine."""
        where = f"{cls.__name__}.set_rng_state"
        mode = state.get("mode") if isinstance(state, dict) else None
        if not isinstance(mode, str) or mode not in _RNG_KEYS:
            cls._check_rng_state_keys(state, _RNG_KEYS["exact"])  # names the kind or keys
            raise ValueError(f"{where}: expected mode 'exact' or 'reseed', got {mode!r}")
        cls._check_rng_state_keys(state, _RNG_KEYS[mode])
        if state["bit_generator"] != "XORWOW":
            raise ValueError(f"{where}: expected bit_generator 'XORWOW' (cupy.random."
                             f"default_rng's), got {state['bit_generator']!r}")
        if mode == "reseed":
            return ("reseed", cls._check_rng_int(state, "seed", 0, _MAX_RESEED))
        size = cls._check_rng_int(state, "size", 1, 1 << 32)
        nbytes = cls._check_rng_int(state, "nbytes", 1, 1 << 40)
        if nbytes % size:
            raise ValueError(f"{where}: expected 'nbytes' to be a multiple of 'size' ({size} "
                             f"equal per-thread states), got {nbytes}")
        if state["encoding"] != "base64" or not isinstance(state["data"], str):
            raise ValueError(f"{where}: expected 'data' to be a str in encoding 'base64', "
                             f"got a {type(state['data']).__name__} in {state['encoding']!r}")
        try:
            raw = base64.b64decode(state["data"], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"{where}: 'data' is not base64 ({exc})") from None
        if len(raw) != nbytes:
            raise ValueError(f"{where}: expected 'data' to decode to {nbytes} bytes "
                             f"('nbytes'), got {len(raw)}")
        return ("exact", size, raw)

    def _install_rng_state(self, parsed: tuple) -> None:
        if parsed[0] == "reseed":
            self.seed(parsed[1])
            return
        _, size, raw = parsed
        bit_generator_type = type(self._rng.bit_generator)
        with self._cuda_device:
            bit_generator = bit_generator_type(0, size=size)  # same thread count as saved
            device_state = getattr(bit_generator, "_state", None)
            if not isinstance(device_state, cupy.ndarray):
                raise RuntimeError(
                    f"{type(self).__name__}.set_rng_state: this CuPy ({cupy.__version__}) "
                    "keeps no XORWOW._state buffer, so an 'exact' state can't be restored; "
                    "restore it with the CuPy version that saved it")
            if device_state.nbytes != len(raw):
                raise ValueError(
                    f"{type(self).__name__}.set_rng_state: expected {device_state.nbytes} "
                    f"bytes of XORWOW state for {size} threads (this CuPy's "
                    f"{device_state.nbytes // size} per thread), got {len(raw)} "
                    f"({len(raw) // size} per thread); save and restore with one CuPy")
            device_state.set(np.frombuffer(raw, dtype=np.int8))
            self._rng = type(self._rng)(bit_generator)

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
