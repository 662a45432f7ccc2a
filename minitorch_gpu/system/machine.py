"""This machine's measured ceilings, which MFU and the roofline are judged against.

``matmul_peak_flops(device, dtype)`` times square matrix products and keeps the best rate;
``copy_bandwidth(device, dtype)`` times copies of an array far larger than the caches (bytes
read plus bytes written per second: the memory roof). Each figure is cached per machine,
device, dtype and thread count in
``$MINITORCH_GPU_CACHE/machine.json`` (default ``~/.cache/minitorch_gpu``), so it is
measured once, not at every run. A peak quoted from a data sheet would flatter or shame a
run on hardware that differs from it; a measured one tells what this machine can do.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import numpy as np

from .atomic import atomic_write
from ..backend import dtypes, get_backend
from ..backend._cupy import EMULATED  # the emulated GPU: small sizes (its rates mean
# nothing, and a GPU's 8192 product takes minutes there)

__all__ = ["cache_dir", "copy_bandwidth", "describe_libraries", "libraries",
           "matmul_peak_flops", "set_num_threads"]

# what pins OpenBLAS's kernels and caches on some machines, and how long its idle threads
# spin (backend/__init__.py sets that one): a figure measured under them is not the
# processor's own speed, so every bench record names them when they are set
BLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_VERBOSE",
                  "OPENBLAS_THREAD_TIMEOUT", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE")


def cache_dir() -> Path:
    """Where the framework caches what it measures or downloads."""
    root = os.environ.get("MINITORCH_GPU_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "minitorch_gpu"


def set_num_threads(threads: Optional[int]) -> None:
    """Limit the BLAS (and OpenMP) threads of this process, and the threads that split
    long array work (``backend/threads.py``); None leaves the default.

    NumPy's BLAS reads its thread count once, at import, from environment variables;
    threadpoolctl changes it in the running process for OpenBLAS, MKL and BLIS alike.
    """
    if threads is None:
        return
    from threadpoolctl import threadpool_limits

    from ..backend.threads import set_cpu_threads
    threadpool_limits(limits=int(threads))
    set_cpu_threads(int(threads))


def _blas_threads() -> int:
    from threadpoolctl import threadpool_info
    counts = [info.get("num_threads", 1) for info in threadpool_info()
              if info.get("user_api") == "blas"]
    return max(counts) if counts else 1


def _machine_key(kind: str, device: str, dtype: Any) -> str:
    cpu = platform.processor() or platform.machine()
    threads = _blas_threads() if device == "cpu" else 0
    return (f"{kind}|{platform.node()}|{cpu}|{os.cpu_count()}|{device}|"
            f"{np.dtype(dtype).name}|{threads}")


def _measure_matmul(device: str, dtype: Any, n: int, repeats: int) -> float:
    backend = get_backend(device)
    xp = backend.xp
    work = dtypes.float32 if dtype == dtypes.bfloat16 and device == "cpu" else dtype
    rng = np.random.default_rng(0)  # its own stream: measuring never moves the seeded one
    a = backend.asarray(rng.standard_normal((n, n), dtype=np.float32), dtype=work)
    b = backend.asarray(rng.standard_normal((n, n), dtype=np.float32), dtype=work)
    out = xp.empty((n, n), dtype=work)
    best = float("inf")
    for i in range(repeats + 2):  # two warm-up products
        backend.synchronize()
        start = time.perf_counter()
        xp.matmul(a, b, out=out)
        backend.synchronize()
        if i >= 2:
            best = min(best, time.perf_counter() - start)
    return 2.0 * n ** 3 / best


def _measure_copy(device: str, dtype: Any, nbytes: int, repeats: int) -> float:
    backend = get_backend(device)
    xp = backend.xp
    n = nbytes // np.dtype(dtype).itemsize
    src = xp.ones(n, dtype=dtype)
    dst = xp.empty(n, dtype=dtype)
    best = float("inf")
    for i in range(repeats + 1):  # one warm-up copy: it also faults dst's pages in
        backend.synchronize()
        start = time.perf_counter()
        xp.copyto(dst, src)
        backend.synchronize()
        if i >= 1:
            best = min(best, time.perf_counter() - start)
    return 2.0 * n * np.dtype(dtype).itemsize / best  # read once, written once


def _read_cache(path: Path) -> Dict[str, float]:
    """The measured peaks in ``path``: only positive, finite numbers under str keys; a
    missing, unreadable or damaged file (any JSON but an object) is an empty cache."""
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(cached, dict):
        return {}
    return {key: float(value) for key, value in cached.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0}


def _write_cache(path: Path, key: str, peak: float) -> None:
    """Add ``key`` to the cache file, keeping what other processes wrote meanwhile (it is
    read again just before the write, not before the seconds of measuring). Best effort: a
    read-only cache only means measuring again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        cached = _read_cache(path)
        cached[key] = peak
        with atomic_write(path, "w") as file:  # a failed write leaves no temporary file
            json.dump(cached, file, indent=1)
    except OSError:
        pass


def _cached(kind: str, device: str, dtype: Any, refresh: bool,
            measure: Callable[[str], float]) -> float:
    device = str(get_backend(device).device)
    key = _machine_key(kind, device, dtype)
    path = cache_dir() / "machine.json"
    cached = _read_cache(path)
    if not refresh and key in cached:
        return cached[key]
    value = measure(device)
    _write_cache(path, key, value)
    return value


def matmul_peak_flops(device: str = "cpu", dtype: Any = dtypes.float32, *,
                      refresh: bool = False) -> float:
    """The best FLOP/s of an (n, n) @ (n, n) product on ``device`` in ``dtype``, measured
    once per machine and cached. (n is 1024 on the CPU, 8192 on a GPU, 256 on the
    emulated one.)"""
    def measure(device: str) -> float:
        n, repeats = (1024, 5) if device == "cpu" else (256, 2) if EMULATED else (8192, 10)
        return _measure_matmul(device, dtype, n, repeats)
    return _cached("matmul", device, dtype, refresh, measure)


def copy_bandwidth(device: str = "cpu", dtype: Any = dtypes.float32, *,
                   refresh: bool = False) -> float:
    """The best bytes/s (read + written) of copying one array into another on ``device``,
    measured once per machine and cached: 256 MiB on the CPU (far past its caches), 2 GiB on
    a GPU. On the CPU this is one core's rate, as NumPy's elementwise ops run on one."""
    def measure(device: str) -> float:
        nbytes, repeats = (256 << 20, 5) if device == "cpu" else \
            (8 << 20, 2) if EMULATED else (2 << 30, 10)
        return _measure_copy(device, dtype, nbytes, repeats)
    return _cached("copy", device, dtype, refresh, measure)


def libraries() -> Dict[str, Any]:
    """What runs this process's arithmetic, as a bench record carries it: NumPy's version,
    every thread pool threadpoolctl finds loaded (a BLAS's library, version, the kernel
    architecture it picked, its threads), the split threads of ``backend/threads.py``,
    numba's and PyTorch's threading where they are imported, and the environment
    variables that pin a BLAS's kernels (BLAS_VARIABLES) where set."""
    import sys

    from threadpoolctl import threadpool_info

    from ..backend.threads import cpu_threads
    found: Dict[str, Any] = {
        "numpy": np.__version__,
        "pools": [{key: info.get(key) for key in ("user_api", "internal_api", "version",
                                                   "architecture", "num_threads",
                                                   "threading_layer")}
                  | {"file": os.path.basename(info.get("filepath") or "")}
                  for info in threadpool_info()],
        "split_threads": cpu_threads(),
        "environment": {name: os.environ[name] for name in BLAS_VARIABLES
                        if name in os.environ},
    }
    numba = sys.modules.get("numba")
    if numba is not None:  # its kernels run on backend/threads.py's workers (split_threads),
        # not numba's own parallel pool, which the project never starts
        found["numba"] = {"version": numba.__version__, "kernel_threads": cpu_threads()}
    torch = sys.modules.get("torch")
    if torch is not None:
        shown = torch.__config__.show()
        blas = [part.split("=", 1)[1] for part in shown.replace(",", " ").split()
                if part.startswith("BLAS_INFO=")]
        capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
        found["torch"] = {"version": torch.__version__, "num_threads": torch.get_num_threads(),
                          "blas": blas[0] if blas else "unknown",
                          "cpu_capability": capability() if capability else "unknown"}
    cupy = sys.modules.get("cupy")
    if cupy is not None:  # a GPU run: its products are cuBLAS's, not the BLAS above
        gpu: Dict[str, Any] = {"version": cupy.__version__}
        try:
            runtime = cupy.cuda.runtime
            gpu["cuda_runtime"] = runtime.runtimeGetVersion()
            gpu["device"] = runtime.getDeviceProperties(0)["name"].decode()
        except Exception as exc:  # noqa: BLE001  no GPU: say so, the record is still useful
            gpu["device"] = f"none ({type(exc).__name__})"
        found["cupy"] = gpu
    return found


def describe_libraries(found: Dict[str, Any]) -> str:
    """``libraries()``'s record in one line: "NumPy 2.3.5, BLAS OpenBLAS 0.3.31 (Haswell
    kernels, 2 threads; OPENBLAS_CORETYPE=Haswell), numba 0.62.1, torch ..."."""
    parts = [f"NumPy {found.get('numpy', '?')}"]
    for pool in found.get("pools", []):
        if pool.get("user_api") != "blas":
            continue
        kernels = f"{pool['architecture']} kernels, " if pool.get("architecture") else ""
        threads = pool.get("num_threads")
        parts.append(f"BLAS {pool.get('internal_api')} {pool.get('version') or ''} "
                     f"({kernels}{threads} thread{'' if threads == 1 else 's'})"
                     .replace("  ", " "))
    pinned = found.get("environment") or {}
    if pinned:
        parts.append("pinned by " + " ".join(f"{k}={v}" for k, v in pinned.items()))
    if "numba" in found:
        numba = found["numba"]
        threads = numba.get("kernel_threads")
        parts.append(f"numba {numba['version']}" + (
            f" (kernels split over {threads} thread{'' if threads == 1 else 's'})"
            if threads else ""))
    if "torch" in found:
        torch = found["torch"]
        parts.append(f"torch {torch['version']} ({torch['blas']} BLAS, "
                     f"{torch['cpu_capability']}, {torch['num_threads']} threads)")
    if "cupy" in found:
        cupy = found["cupy"]
        parts.append(f"CuPy {cupy['version']} on {cupy.get('device', '?')} (products by "
                     f"cuBLAS)")
    return ", ".join(parts)
