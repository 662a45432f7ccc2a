"""The project's .cu sources compiled by the machine's g++ for the emulated GPU.

One shared library per (source, defines): ``cuda_emulation.h`` first, then the .cu file as
it is, then one ``EMU_KERNEL`` line per kernel, which exports the kernel's launch, its C
signature as the compiler sees it, and its ``__launch_bounds__``. The libraries are cached
under ``$MINITORCH_GPU_CACHE/emulated_cuda`` (default ``~/.cache/minitorch_gpu``), named
by a hash of the header, the source, the defines and the compiler's version, so a changed
kernel is compiled again and an unchanged one is only loaded.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

__all__ = ["Kernel", "compile_source", "kernels_of", "parameter_names"]

HEADER = Path(__file__).resolve().parent / "cuda_emulation.h"
# -O1: seconds per build, and fast enough to run; no _FORTIFY_SOURCE, whose longjmp check
# refuses the jump from a faulting fiber's stack back to the launch
# -fsanitize=bounds with its trap: an index past a local or __shared__ array of known size
# traps (SIGILL), which the launch reports; no sanitizer runtime is needed
FLAGS = ("-std=c++17", "-O1", "-shared", "-fPIC", "-fvisibility=hidden", "-U_FORTIFY_SOURCE",
         "-D_FORTIFY_SOURCE=0", "-fno-strict-aliasing", "-Werror=return-type",
         "-fsanitize=bounds", "-fsanitize-undefined-trap-on-error")
NO_BOUNDS = 1024  # a kernel without __launch_bounds__ takes CUDA's largest block

_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+'
                     r'(?:__launch_bounds__\s*\((?P<bounds>(?:[^()]|\([^()]*\))*)\)\s*)?'
                     r'(?P<name>\w+)\s*\((?P<params>[^)]*)\)')


@dataclass(frozen=True)
class Kernel:
    """A kernel's C declaration as written: name, parameter names, __launch_bounds__'s
    arguments (the header's first_of takes the most threads per block from them)."""

    name: str
    parameters: Tuple[str, ...]
    bounds: Optional[str]


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def parameter_names(params: str) -> Tuple[str, ...]:
    """The names in a C parameter list: the last identifier of each declaration."""
    names = []
    for declaration in params.split(","):
        words = re.findall(r"[A-Za-z_]\w*", declaration)
        if words:
            names.append(words[-1])
    return tuple(names)


def kernels_of(source: str) -> List[Kernel]:
    """Every ``extern "C" __global__`` kernel declared in ``source``."""
    return [Kernel(m["name"], parameter_names(m["params"]), m["bounds"])
            for m in _KERNEL.finditer(_strip_comments(source))]


def _cache_dir() -> Path:
    root = os.environ.get("MINITORCH_GPU_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "minitorch_gpu"
    return base / "emulated_cuda"


@functools.lru_cache(maxsize=None)
def compiler() -> Tuple[str, str]:
    """The C++ compiler ($CXX, else g++ or c++ on PATH) and its --version text."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise RuntimeError("emulated CUDA: no C++ compiler (g++) on PATH; install one "
                           "(Debian: apt install g++)")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             check=False).stdout
    return cxx, version


def compile_source(path: Path, defines: Tuple[Tuple[str, int], ...]) -> Tuple[ctypes.CDLL,
                                                                              List[Kernel]]:
    """The shared library of the .cu file at ``path`` with ``-DNAME=value`` for each of
    ``defines``, compiled (or found in the cache) and loaded, and its kernels."""
    path = Path(path).resolve()  # the wrapper #includes it from another folder
    source = path.read_text(encoding="utf-8")
    kernels = kernels_of(source)
    if not kernels:
        raise ValueError(f"emulated CUDA: no extern \"C\" __global__ kernel in {path.name}")
    cxx, version = compiler()
    wrapper = "".join([f'#include "{HEADER}"\n', f'#include "{path}"\n'] + [
        f"EMU_KERNEL({k.name}, {k.bounds if k.bounds else NO_BOUNDS})\n" for k in kernels])
    options = [f"-D{name}={value}" for name, value in defines]
    key = hashlib.sha256("\0".join([HEADER.read_text(encoding="utf-8"), source, wrapper,
                                    *options, *FLAGS, version]).encode()).hexdigest()[:24]
    folder = _cache_dir()
    library = folder / f"{path.stem}-{key}.so"
    if not library.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as work:
            cpp = Path(work) / f"{path.stem}.cpp"
            cpp.write_text(wrapper, encoding="utf-8")
            built = Path(work) / library.name
            done = subprocess.run([cxx, *FLAGS, *options, "-o", str(built), str(cpp)],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"emulated CUDA: g++ could not compile {path.name} with "
                                   f"{' '.join(options) or 'no defines'}:\n{done.stderr}")
            os.replace(built, library)  # whole or not at all, if two processes race
    return ctypes.CDLL(str(library)), kernels


def signatures(library: ctypes.CDLL, kernels: List[Kernel]) -> Dict[str, Tuple[str, ...]]:
    """Each kernel's parameter types as the compiler sees them ("pcf4": pointer to const
    4-byte float; "i8": 8-byte signed integer; "s2": a 2-byte struct)."""
    out = {}
    for kernel in kernels:
        describe = getattr(library, f"emu_signature_{kernel.name}")
        describe.restype = ctypes.c_char_p
        text = describe().decode()
        out[kernel.name] = tuple(text.split(",")) if text else ()
    return out
