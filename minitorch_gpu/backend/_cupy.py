"""The one place CuPy is imported: ``cupy`` (None where it can't be), the install hint,
and why CUDA can't be used on this machine (no CuPy, or no GPU), so the error a user sees
names the fix. The CUDA backend, the kernels, NCCL and ``minitorch_gpu.cuda`` take CuPy
from here.
"""
from __future__ import annotations

from typing import Optional

INSTALL_HINT = ("install CuPy for your CUDA version: pip install -e '.[cuda12]' or "
                "pip install -e '.[cuda13]'")

try:
    import cupy
    import cupyx
    import cupyx.scipy.special as cupy_special
    _IMPORT_ERROR: Optional[str] = None
except Exception as exc:  # ImportError, or a CuPy that fails to load its CUDA libraries
    cupy = cupyx = cupy_special = None
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
    """The CUDA GPUs CuPy sees (0 where CUDA can't be used)."""
    if unavailable_reason() is not None:
        return 0
    return cupy.cuda.runtime.getDeviceCount()
