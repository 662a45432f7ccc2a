"""The one place CuPy is imported: ``cupy`` (None where it can't be), the install hint,
and why CUDA can't be used on this machine (no CuPy, or no GPU), so the error a user sees
names the fix. The CUDA backend, the kernels, NCCL and ``minitorch_gpu.cuda`` take CuPy
from here, and cuBLAS and NCCL through ``cublas()`` and ``nccl()``.

``MINITORCH_EMULATE_CUDA=1`` (``EMULATED``) leaves CuPy unimported: ``backend/__init__``
then puts the CuPy stand-in (``emulated_cuda/stand_in``) here with ``use_stand_in``, the
``cuda`` device on a machine without a GPU, for tests. Nothing else selects it.
"""
from __future__ import annotations

import os
from typing import Any, Optional

INSTALL_HINT = ("install CuPy for your CUDA version: pip install -e '.[cuda12]' or "
                "pip install -e '.[cuda13]'")
EMULATE_ENV = "MINITORCH_EMULATE_CUDA"
EMULATED = os.environ.get(EMULATE_ENV, "").strip() not in ("", "0")
EMULATED_NOTE = (f"the GPU is emulated on the CPU ({EMULATE_ENV}=1): kernels and results "
                 f"are checked, speeds mean nothing")

cupy = cupyx = cupy_special = None
_IMPORT_ERROR: Optional[str] = None
_stand_in: Any = None  # the stand-in package, once use_stand_in put it here
if not EMULATED:
    try:
        import cupy
        import cupyx
        import cupyx.scipy.special as cupy_special
    except Exception as exc:  # ImportError, or a CuPy that fails to load its CUDA libraries
        cupy = cupyx = cupy_special = None
        _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = f"{EMULATE_ENV}=1 is set but the emulated GPU was not installed"


def use_stand_in(stand_in: Any, unavailable: Optional[str]) -> None:
    """Put the CuPy stand-in here (``backend/__init__.py`` calls it when ``EMULATED``,
    before the CUDA backend binds these names), or say why it can't run."""
    global cupy, cupyx, cupy_special, _stand_in, _IMPORT_ERROR
    if unavailable is not None:
        _IMPORT_ERROR = f"{EMULATE_ENV}=1 is set but the emulated GPU can't run: {unavailable}"
        return
    cupy, cupyx, cupy_special = stand_in.cupy, stand_in.cupyx, stand_in.cupyx_special
    _stand_in, _IMPORT_ERROR = stand_in, None


def unavailable_reason() -> Optional[str]:
    """None when CUDA can be used, else a sentence saying why not."""
    if cupy is None:
        if EMULATED:
            return _IMPORT_ERROR
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


def cublas() -> Any:
    """CuPy's cuBLAS bindings (``cupy_backends.cuda.libs.cublas``), or the stand-in's."""
    if _stand_in is not None:
        return _stand_in.cublas
    from cupy_backends.cuda.libs import cublas as cupy_cublas
    return cupy_cublas


def nccl() -> Any:
    """``cupy.cuda.nccl``, or the stand-in's one-rank NCCL."""
    if _stand_in is not None:
        return cupy.cuda.nccl
    from cupy.cuda import nccl as cupy_nccl
    return cupy_nccl
