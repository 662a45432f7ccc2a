"""The real compiler, without a GPU: every build the launchers can ask for, compiled by
NVRTC with the options CuPy 14 adds, and ptxas's report of each kernel's resources.

NVRTC is the library CuPy compiles ``RawModule`` sources with. It comes here from the
``nvidia-cuda-nvrtc`` wheel (the dev extra), called through ctypes, not through CuPy: dev
never installs a CuPy, so a GPU machine's ``cupy-cuda12x`` or ``cupy-cuda13x`` (whose
``ctk`` extra brings its own NVRTC) is never beside a second one.

CuPy 14.2's options for a ``RawModule``, beside ours (``loader.COMPILE_OPTIONS``):

* ``-ftz=true``: ``cupy/cuda/compiler.py`` line 667 (``_compile_with_cache_cuda``);
* ``-arch=sm_XX`` (a cubin for the device's own architecture): compiler.py line 235
  (``_get_arch_for_options_for_nvrtc``), added at line 361;
* ``--device-as-default-execution-space``: compiler.py line 371;
* ``-I`` its own, CCCL's and the CUDA toolkit's include folders:
  ``cupy/_core/core.pyx`` lines 2589-2603 (``assemble_cupy_compiler_options``); the
  kernels include nothing, so they are left out here;
* ``--pch`` where NVRTC >= 12.8 and CuPy's precompiled headers are on (compiler.py line
  379): a compile-time cache, no change to the code.

``ptxas_options`` adds ``--ptxas-options=-v`` so that the log carries ptxas's report
(registers, spills, static shared memory per kernel), which ``resources`` reads.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .architectures import ARCHITECTURES, EVERY_BUILD_ARCHITECTURES, SM_LIMITS

__all__ = ["CUPY_OPTIONS", "ARCHITECTURES", "EVERY_BUILD_ARCHITECTURES", "KernelResources",
           "NvrtcError", "available", "compile_source", "library_path", "occupancy",
           "resources", "version"]

CUPY_OPTIONS = ("-ftz=true", "--device-as-default-execution-space")  # + -arch=sm_XX
# ARCHITECTURES (what is checked for which GPU) and each SM's limits: architectures.py
_REGISTER_UNIT = 256  # registers are allocated per warp in units of 256 (every arch here)


class NvrtcError(RuntimeError):
    """NVRTC refused a source (its log is the message), or is not installed."""


def library_path() -> Optional[str]:
    """libnvrtc from the nvidia-cuda-nvrtc wheel (CUDA 13 or 12 layout), or None."""
    for folder in sys.path:
        for pattern in ("nvidia/cu13/lib/libnvrtc.so.*", "nvidia/cuda_nvrtc/lib/libnvrtc.so.*"):
            found = sorted(p for p in glob.glob(os.path.join(folder, pattern))
                           if "builtins" not in p)
            if found:
                return found[0]
    return None


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    path = library_path()
    if path is None:
        raise NvrtcError("NVRTC is not installed: pip install nvidia-cuda-nvrtc (the dev "
                         "extra takes it)")
    lib = ctypes.CDLL(path)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def available() -> bool:
    return library_path() is not None


def _check(code: int, what: str) -> None:
    if code != 0:
        message = _library().nvrtcGetErrorString(code).decode()
        raise NvrtcError(f"NVRTC {what}: {message}")


def version() -> Tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(_library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
    return major.value, minor.value


def compile_source(source: str, name: str, options: Sequence[str]) -> Tuple[str, bytes]:
    """NVRTC's log and the cubin of ``source`` (options should name a real sm_XX);
    NvrtcError with the log when it does not compile."""
    lib = _library()
    program = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0,
                                  None, None), "create")
    try:
        encoded = [o.encode() for o in options]
        array = (ctypes.c_char_p * len(encoded))(*encoded)
        result = lib.nvrtcCompileProgram(program, len(encoded), array)
        size = ctypes.c_size_t()
        _check(lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)), "log size")
        log = ctypes.create_string_buffer(size.value)
        _check(lib.nvrtcGetProgramLog(program, log), "log")
        text = log.value.decode(errors="replace")
        if result != 0:
            raise NvrtcError(f"NVRTC could not compile {name} with {' '.join(options)}:\n"
                             f"{text}")
        _check(lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib.nvrtcGetCUBIN(program, cubin), "cubin")
        return text, cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def ptxas_options(arch: str, defines: Sequence[Tuple[str, int]] = ()) -> Tuple[str, ...]:
    """What CuPy 14 compiles a launcher's build with for sm_``arch``, and ptxas's report."""
    from .loader import COMPILE_OPTIONS
    return (COMPILE_OPTIONS + tuple(f"-D{k}={v}" for k, v in defines) + CUPY_OPTIONS
            + (f"-arch=sm_{arch}", "--ptxas-options=-v"))


@dataclass
class KernelResources:
    """ptxas's figures for one kernel of one build."""

    kernel: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared: int  # static shared memory, bytes

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


_FUNCTION = re.compile(r"Compiling entry function '(\w+)' for '(?:sm_)?(\d+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                    r"loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def resources(log: str) -> List[KernelResources]:
    """Each kernel's registers, spills and static shared memory from ptxas's -v report."""
    out: List[KernelResources] = []
    current: Dict[str, object] = {}
    for line in log.splitlines():
        if (m := _FUNCTION.search(line)):
            current = dict(kernel=m[1], arch=m[2])
        elif (m := _FRAME.search(line)) and current:
            current.update(stack_frame=int(m[1]), spill_stores=int(m[2]),
                           spill_loads=int(m[3]))
        elif (m := _USED.search(line)) and current:
            if "spill_stores" not in current:  # a report whose wording changed: say so,
                # rather than read no line as no spill
                raise ValueError(f"ptxas: no stack frame and spill line for "
                                 f"{current['kernel']} before its register count")
            out.append(KernelResources(registers=int(m[1]), shared=int(m[2] or 0),
                                       **current))  # type: ignore[arg-type]
            current = {}
    return out


def occupancy(arch: str, threads: int, registers: int, shared: int) -> float:
    """Theoretical occupancy (resident warps / the SM's most) of blocks of ``threads``
    using ``registers`` per thread and ``shared`` static bytes, on sm_``arch``; 0 for a
    block that cannot be resident at all (too many threads, registers or bytes)."""
    if arch not in SM_LIMITS:
        raise ValueError(f"occupancy: no SM limits for sm_{arch}, expected one of "
                         f"{', '.join('sm_' + a for a in SM_LIMITS)}")
    sm = SM_LIMITS[arch]
    warps = -(-threads // 32)
    per_warp = -(-max(registers, 1) * 32 // _REGISTER_UNIT) * _REGISTER_UNIT
    by_registers = sm["registers"] // (per_warp * warps)
    allocated = -(-shared // sm["shared_unit"]) * sm["shared_unit"] + sm["reserved"]
    by_shared = sm["shared"] // allocated if shared else sm["max_blocks"]
    if threads > sm["max_threads"] or shared > sm["shared_per_block"]:
        return 0.0
    blocks = min(sm["max_blocks"], sm["max_warps"] // warps, by_registers, by_shared)
    return blocks * warps / sm["max_warps"]
