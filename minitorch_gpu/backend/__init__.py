"""Backends: one per device, chosen by device string ("cpu", "cuda", "cuda:N").

``get_backend(device)`` returns the (cached) Backend for a device; ``manual_seed`` reseeds
every backend, including those created later; ``get_rng_state``/``set_rng_state`` snapshot
and restore every backend's random stream (a resumed run continues its dropout and sampling).

Foundation layer: imports nothing of the package outside ``backend/`` (neither
tensor nor autograd); every other layer may import it.
"""
from __future__ import annotations

import os

# OpenBLAS's worker threads spin for 2^28 cycles (about 0.1 s here) after each product
# before they sleep, holding a core that the fused CPU kernels' threads then share: CPU
# attention ran 1.7x slower right after a product (PERF.md). Where OpenBLAS runs its AVX2
# kernels (the CPU flash kernel's regime: it takes attention from 128 keys there, from 512
# on AVX-512 kernels), 2^20 cycles (about 0.3 ms) keeps them awake between a step's
# back-to-back products: small's step 728-743 -> 655-687 ms. On AVX-512 kernels the same
# setting cost the baby's and the Llama's steps 6-20% (more wake-ups between short
# products), so it is left alone there. OpenBLAS reads the variable once, as NumPy loads
# it: set before anything here imports NumPy, only where the environment does not set it
# (and where NumPy was imported first it changes nothing).
def _blas_runs_avx2_kernels() -> bool:
    """Whether NumPy's OpenBLAS will pick AVX2 kernels or older, read before it loads: a
    core pinned by ``OPENBLAS_CORETYPE`` without AVX-512, or a processor without it
    (Linux's /proc/cpuinfo; elsewhere unknown: False)."""
    pinned = os.environ.get("OPENBLAS_CORETYPE", "").strip().lower()
    if pinned:
        return pinned not in ("skylakex", "cooperlake", "sapphirerapids")
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return "avx512f" not in line.split()
    except OSError:
        pass
    return False


if _blas_runs_avx2_kernels():
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

import copyreg  # noqa: E402
from typing import Any, Dict  # noqa: E402

from . import _cupy  # noqa: E402

if _cupy.EMULATED:  # MINITORCH_EMULATE_CUDA=1: the CuPy stand-in, before anything binds cupy
    from . import emulated_cuda
    _reason = emulated_cuda.unavailable_reason()
    if _reason is None:
        from .emulated_cuda import stand_in
        _cupy.use_stand_in(stand_in, None)
    else:
        _cupy.use_stand_in(None, _reason)

from . import cupy_backend, dtypes  # noqa: E402  (after the stand-in, which it binds)
from .base import DEFAULT_SEED, Backend, Device, Timer, parse_device
from .numpy_backend import NumpyBackend

__all__ = ["Backend", "Device", "Timer", "cpu", "dtypes", "get_backend", "get_rng_state",
           "manual_seed", "parse_device", "set_rng_state"]

RNG_STATE_FORMAT = "minitorch-gpu-rng-state"
RNG_STATE_VERSION = 1

_seed = DEFAULT_SEED
cpu = NumpyBackend(_seed)
_backends = Backend.made  # device -> its one Backend, shared with the backends themselves
_backends[cpu.device] = cpu
# states from set_rng_state for devices with no backend yet: applied when one is made
_pending_rng_states: Dict[Device, dict] = {}


def get_backend(device: Any) -> Backend:
    """The Backend of ``device``; raises RuntimeError naming the fix when CUDA is unusable."""
    device = parse_device(device)
    backend = _backends.get(device)
    if backend is not None:
        return backend
    reason = _cupy.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"device '{device}' is not available: {reason}")
    count = _cupy.device_count()
    if device.index >= count:
        raise RuntimeError(
            f"device '{device}' is not available: this machine has {count} CUDA device(s)")
    backend = cupy_backend.CupyBackend(device.index, _seed)
    pending = _pending_rng_states.pop(device, None)
    if pending is not None:
        backend.set_rng_state(pending)  # checked by set_rng_state already
    _backends[device] = backend
    return backend


def _reduce_backend(backend: Backend) -> tuple:
    """Pickle a Backend as its device: unpickled, it is this process's one Backend there."""
    return (get_backend, (str(backend.device),))


copyreg.pickle(NumpyBackend, _reduce_backend)
copyreg.pickle(cupy_backend.CupyBackend, _reduce_backend)


def manual_seed(seed: int) -> None:
    """Seed the random numbers of every backend (randn, rand, randint, dropout)."""
    global _seed
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"manual_seed: expected an int seed, got {type(seed).__name__}")
    _seed = seed
    _pending_rng_states.clear()
    for backend in _backends.values():
        backend.seed(seed)


def _backend_class(device: Device) -> type:
    return NumpyBackend if device.type == "cpu" else cupy_backend.CupyBackend


def get_rng_state() -> dict:
    """Every backend's random stream and the global seed, as JSON data and NumPy arrays.

    ``{"format": "minitorch-gpu-rng-state", "version": 1, "seed": int, "backends":
    {"cpu": {...}, "cuda:0": {...}}}``: one entry per backend made so far (see each
    backend's ``get_rng_state`` for what its entry guarantees). The CPU's entry is plain
    JSON; a GPU's holds its generator's bytes as a uint8 array (13 MB on an H100). Store
    it in a checkpoint's metadata (``save_checkpoint`` stores each array as a tensor)
    and hand it to ``set_rng_state`` when resuming.

    >>> state = get_rng_state(); a = mt.randn(3)
    >>> set_rng_state(state); assert mt.randn(3).tolist() == a.tolist()
    """
    states = {str(device): backend.get_rng_state() for device, backend in _backends.items()}
    for device, pending in _pending_rng_states.items():  # not made yet: as it will start
        states[str(device)] = dict(pending)
    return {"format": RNG_STATE_FORMAT, "version": RNG_STATE_VERSION, "seed": _seed,
            "backends": states}


def set_rng_state(state: dict) -> None:
    """Restore ``get_rng_state()``: the global seed and each listed backend's stream.

    A listed device with no backend yet gets its state when its backend is made (so a
    GPU run's state can be restored before the first CUDA tensor, or carried through a
    CPU-only process); a backend the state doesn't list is reseeded with its seed, as
    if made afresh. Everything is checked first: a malformed state raises ValueError
    naming what was expected, and changes nothing.
    """
    global _seed
    where = "set_rng_state"
    keys = {"format", "version", "seed", "backends"}
    if not isinstance(state, dict) or set(state) != keys:
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{where}: expected a dict from get_rng_state() with the keys "
                         f"{sorted(keys)}, got {got}")
    if state["format"] != RNG_STATE_FORMAT:
        raise ValueError(f"{where}: expected format {RNG_STATE_FORMAT!r}, got "
                         f"{state['format']!r}")
    if state["version"] != RNG_STATE_VERSION or isinstance(state["version"], bool):
        raise ValueError(f"{where}: expected version {RNG_STATE_VERSION} (the one this "
                         f"minitorch-gpu writes), got {state['version']!r}")
    seed, saved = state["seed"], state["backends"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{where}: expected an int 'seed', got {type(seed).__name__}")
    if not isinstance(saved, dict):
        raise ValueError(f"{where}: expected 'backends' to be a dict of device -> state, "
                         f"got {type(saved).__name__}")
    parsed: Dict[Device, Any] = {}
    for name, backend_state in saved.items():
        try:
            device = parse_device(name)
        except ValueError as exc:
            raise ValueError(f"{where}: 'backends' key {name!r}: {exc}") from None
        if str(device) != name:
            raise ValueError(f"{where}: expected 'backends' keys as get_rng_state() writes "
                             f"them ({str(device)!r}), got {name!r}")
        try:
            parsed[device] = _backend_class(device).parse_rng_state(backend_state)
        except ValueError as exc:
            raise ValueError(f"{where}: the state of {name!r}: {exc}") from None

    # CUDA backends first: restoring one can still fail (a CuPy with another state
    # layout), and then the CPU stream and the seed are left as they were
    for device in sorted(_backends, key=lambda d: d.type == "cpu"):
        if device in parsed:
            _backends[device]._install_rng_state(parsed.pop(device))
        else:
            _backends[device].seed(seed)
    _seed = seed
    _pending_rng_states.clear()
    _pending_rng_states.update((device, saved[str(device)]) for device in parsed)


def backend_of_array(array: Any) -> Backend:
    """The backend that owns a raw array (a NumPy array is on the CPU)."""
    if hasattr(array, "__cuda_array_interface__"):
        return get_backend(Device("cuda", array.device.id))
    return cpu
