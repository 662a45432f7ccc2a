"""What every kernel's launcher shares: the sources, their compiled modules, launch
shapes, and the checks of the arrays handed to a kernel.

The CUDA C sources sit in this folder, each beside the module that launches its kernels
(``layernorm.cu`` and ``layernorm.py``, ...). They are compiled at first use with
``cupy.RawModule`` (NVRTC), once per (device, source, compile-time constants) in this
process; CuPy also keeps the compiled binaries in its on-disk cache, so a later process
only loads them.

CuPy comes from ``backend/_cupy.py`` and is needed only to launch: ``source_text``, the
constants and the checks work on any machine. The launchers reach CuPy, their kernels and
their copies through this module's ``require_cupy``, ``load_kernel`` and ``contiguous``
(as ``loader.NAME``), so a test can stand NumPy and stubs in for all of them at once.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Tuple

import numpy as np

from .. import _cupy
from ..dtypes import NARROW_FLOATS, bfloat16
# the architectures every kernel is compiled for by NVRTC without a GPU
# (scripts/kernel_resources.py --check)
from .architectures import ARCHITECTURES as CHECKED_ARCHITECTURES
from .architectures import BF16_MIN_ARCH

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("layernorm.cu", "gelu.cu", "cross_entropy.cu", "adamw.cu", "attention.cu",
           "attention_softmax.cu", "rmsnorm.cu", "rotary.cu", "swiglu.cu")
COMPILE_OPTIONS = ("-std=c++17",)  # NVRTC picks the architecture of the current device
ELEMENTWISE_THREADS = 256  # gelu.cu, adamw.cu, rotary.cu, swiglu.cu: threads per block of a
# grid-stride loop

FLOAT32 = np.dtype(np.float32)
INT64 = np.dtype(np.int64)
BFLOAT16 = np.dtype(bfloat16)
# INPUT_DTYPE of rmsnorm.cu, rotary.cu and swiglu.cu: the storage dtypes they read (and
# write their outputs in), widened to float32 on load; attention.cu's codes, less fp16
INPUT_DTYPES = {"float32": 0, "bfloat16": 1}


class KernelBuildError(RuntimeError):
    """A kernel's module did not compile or load on this GPU."""


def reads_bf16(defines: Tuple[Tuple[str, int], ...]) -> bool:
    """The build stores bf16 (INPUT_DTYPE 1 in every source that has one, or the dense
    softmax's PROB_BF16)."""
    d = dict(defines)
    return d.get("INPUT_DTYPE") == INPUT_DTYPES["bfloat16"] or d.get("PROB_BF16") == 1


def build_failure(filename: str, defines: Tuple[Tuple[str, int], ...], name: str,
                  arch: str, cause: BaseException) -> str:
    """What a KernelBuildError says: the kernel and its build, the architecture it was
    built for against the ones checked, the compiler's first line, and the way around
    it (another system.dtype for a bf16 build)."""
    label = " ".join(f"{k}={v}" for k, v in defines)
    build = f"{filename} ({label})" if label else filename
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    first_line = next((line for line in lines if "error" in line.lower()),
                      lines[0] if lines else type(cause).__name__)
    checked = ", ".join("sm_" + a for a in CHECKED_ARCHITECTURES)
    message = (f"fused kernels: kernel {name} of {build} could not be built for sm_{arch} "
               f"(compute capability {arch[:-1]}.{arch[-1]}): {first_line}. The kernels are "
               f"compiled without a GPU for {checked}"
               + ("" if arch in CHECKED_ARCHITECTURES else f", not sm_{arch}"))
    if reads_bf16(defines):
        message += (f"; this build reads bf16, whose arithmetic needs sm_{BF16_MIN_ARCH} "
                    f"or newer: use system.dtype: fp16 (or float32) on this GPU"
                    if int(arch) < int(BF16_MIN_ARCH) else
                    "; system.dtype: float32 runs without this bf16 build")
    return message


# --- sources and modules ------------------------------------------------------------------
def source_text(filename: str) -> str:
    """The CUDA C text of one of ``SOURCES``."""
    if filename not in SOURCES:
        raise ValueError(f"fused kernels: unknown source {filename!r}, expected one of "
                         f"{list(SOURCES)}")
    return (SOURCE_DIR / filename).read_text(encoding="utf-8")


def require_cupy() -> Any:
    """The cupy module; RuntimeError with the install hint where it can't be imported."""
    if _cupy.cupy is None:
        raise RuntimeError(f"fused kernels need CuPy; {_cupy.INSTALL_HINT}")
    return _cupy.cupy


@functools.lru_cache(maxsize=None)
def _module(device_id: int, filename: str, defines: Tuple[Tuple[str, int], ...]) -> Any:
    """The RawModule of ``filename`` with ``-DNAME=value`` for each of ``defines``, built
    for device ``device_id`` (compiled on its first ``get_function``)."""
    cupy = require_cupy()
    options = COMPILE_OPTIONS + tuple(f"-D{name}={value}" for name, value in defines)
    with cupy.cuda.Device(device_id):
        return cupy.RawModule(code=source_text(filename), options=options)


@functools.lru_cache(maxsize=None)
def _kernel(device_id: int, filename: str, defines: Tuple[Tuple[str, int], ...],
            name: str) -> Any:
    """Kernel ``name`` of a module, looked up once: CuPy 14's ``get_function`` builds a
    new RawKernel and calls cuModuleGetFunction on every call (raw.pyx), host time on
    every launch of every step otherwise. CuPy compiles the module here, at its first
    kernel; a build that fails is a KernelBuildError naming the kernel, the build and the
    GPU's architecture, not NVRTC's log in the middle of a training step."""
    try:
        return _module(device_id, filename, defines).get_function(name)
    except Exception as exc:  # CuPy's CompileException, or the driver's refusal
        arch = require_cupy().cuda.Device(device_id).compute_capability
        raise KernelBuildError(build_failure(filename, defines, name, arch, exc)) from exc


def load_kernel(like: Any, filename: str, name: str, **defines: int) -> Any:
    """Kernel ``name`` of ``filename``, for the device ``like`` lives on (one lookup per
    device, module and name)."""
    return _kernel(like.device.id, filename, tuple(sorted(defines.items())), name)


def on_device_of_first_array(launcher: Callable) -> Callable:
    """Run ``launcher`` with the device of its first argument current, so its outputs are
    allocated and its kernels launched where the inputs live (as CuPy's own ops need).
    A host array (the argument checks' tests) is passed through unchanged."""
    @functools.wraps(launcher)
    def on_device(first: Any, *args: Any, **kwargs: Any) -> Any:
        if not hasattr(first, "__cuda_array_interface__"):
            return launcher(first, *args, **kwargs)
        with require_cupy().cuda.Device(first.device.id):
            return launcher(first, *args, **kwargs)
    return on_device


# --- launch shapes ------------------------------------------------------------------------
def blocks(count: int, per_block: int) -> int:
    """Blocks of ``per_block`` that cover ``count`` items."""
    return (count + per_block - 1) // per_block


def elementwise_grid(n: int) -> int:
    """Blocks for a grid-stride loop over n elements: enough to fill any GPU, no more."""
    return max(1, min(blocks(n, ELEMENTWISE_THREADS), 65536))


# --- argument checks ----------------------------------------------------------------------
def is_float32(*arrays: Any) -> bool:
    """Every one of ``arrays`` is given (not None) and float32."""
    return all(a is not None and a.dtype == FLOAT32 for a in arrays)


def is_float32_or_narrower(*arrays: Any) -> bool:
    """float32, or bf16/fp16 that the op widens to float32 for the kernel (the kernels
    compute in float32 either way, as autocast wants)."""
    return all(a is not None and (a.dtype == FLOAT32 or a.dtype in NARROW_FLOATS)
               for a in arrays)


def input_code(dtype: Any) -> Any:
    """INPUT_DTYPE (``INPUT_DTYPES``) for arrays of ``dtype``; None for one the kernels
    that store float32 or bf16 cannot read."""
    return INPUT_DTYPES.get(np.dtype(dtype).name)


def is_float32_or_bf16(*arrays: Any) -> bool:
    """Every one of ``arrays`` is given and float32 or bf16 (read as stored)."""
    return all(a is not None and input_code(a.dtype) is not None for a in arrays)


def check_input_dtype(op: str, **arrays: Any) -> None:
    """TypeError naming the first of ``arrays`` that is not float32 or bf16, or whose dtype
    differs from the first's (one module reads them all in one storage type)."""
    first = None
    for name, a in arrays.items():
        if input_code(a.dtype) is None:
            raise TypeError(f"{op}: {name} must be float32 or bfloat16, got {a.dtype}")
        if first is None:
            first = (name, a.dtype)
        elif a.dtype != first[1]:
            raise TypeError(f"{op}: {name} must have {first[0]}'s dtype {first[1]}, got "
                            f"{a.dtype}")


def check_float32(op: str, **arrays: Any) -> None:
    """TypeError naming the first of ``arrays`` (by keyword) that is not float32."""
    for name, a in arrays.items():
        if a.dtype != FLOAT32:
            raise TypeError(f"{op}: {name} must be float32, got {a.dtype}")


def check_shape(op: str, name: str, array: Any, expected: tuple) -> None:
    """ValueError naming ``name`` when ``array`` is not of shape ``expected``."""
    if tuple(array.shape) != tuple(expected):
        raise ValueError(f"{op}: {name} has shape {tuple(array.shape)}, expected "
                         f"{tuple(expected)}")


def contiguous(array: Any) -> Any:
    """``array`` as a C-contiguous device array (itself when it already is one)."""
    return require_cupy().ascontiguousarray(array)
