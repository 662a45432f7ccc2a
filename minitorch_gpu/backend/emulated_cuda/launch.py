"""Kernels of the emulated GPU, launched as ``cupy.RawKernel`` launches them.

``kernel(grid, block, args, shared_mem=0, stream=None)`` checks what a GPU would not:

* each argument's type against the kernel's C signature (as its compiler reports it): a
  device array (an ``emulated_cuda.memory`` buffer, or a view into one) for a pointer, of
  the pointee's kind and width (a struct pointee, bf16_bits say, by width only); for a
  scalar, the C type it must arrive as. Scalars are converted as CuPy 14.2 converts them
  (``cupy/_core/_scalar.pyx``, ``numpy_dtype_from_pyscalar``): a Python bool becomes bool,
  an int int64 (uint64 from 2**63), a float float64, a complex complex128, a NumPy scalar
  keeps its dtype. So a launcher that passes ``n`` where the kernel takes ``int`` fails
  here; on a GPU it reads 4 of 8 bytes and every argument after it is shifted. Two
  arguments of the same type swapped are not caught: the order is the launcher's;
* the block against ``__launch_bounds__`` and CUDA's limits, the grid against its limits;

then runs every block (``cuda_emulation.h``), with the fibers' order shuffled by
``schedule_seed``. An error in the kernel (a deadlock, a shuffle over lanes that cannot
come) or a fault (an access past a device buffer: the report names the parameter whose
buffer it was) raises ``EmulatedKernelError`` naming the kernel.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import signal
import threading
from pathlib import Path
from typing import Any, Deque, Dict, Iterator, Sequence, Tuple

import numpy as np

from . import build, memory

__all__ = ["EmulatedKernel", "EmulatedKernelError", "EmulatedModule", "launched",
           "schedules"]

MAX_THREADS = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2 ** 31 - 1, 65535, 65535)
_CTYPES = {"f4": ctypes.c_float, "f8": ctypes.c_double, "i1": ctypes.c_int8,
           "i2": ctypes.c_int16, "i4": ctypes.c_int32, "i8": ctypes.c_int64,
           "u1": ctypes.c_uint8, "u2": ctypes.c_uint16, "u4": ctypes.c_uint32,
           "u8": ctypes.c_uint64, "b1": ctypes.c_bool}
_C_NAMES = {"f4": "float", "f8": "double", "i1": "signed char", "i2": "short", "i4": "int",
            "i8": "long long", "u1": "unsigned char", "u2": "unsigned short",
            "u4": "unsigned int", "u8": "unsigned long long", "b1": "bool"}

_launch_lock = threading.Lock()  # one launch at a time: the runtime's state is global
_seed = [0]
# the kernels launched, by name, in order: the last 4096 (a test may clear it)
launched: Deque[str] = collections.deque(maxlen=4096)


class EmulatedKernelError(RuntimeError):
    """A kernel of the emulated GPU did what a GPU would not survive, or was launched
    with what its signature does not take."""


class _Launch(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("seed", ctypes.c_ulonglong), ("status", ctypes.c_int),
                ("fault_signal", ctypes.c_int), ("fault_write", ctypes.c_int), ("fault_address", ctypes.c_ulonglong),
                ("fault_block", ctypes.c_uint * 3), ("fault_thread", ctypes.c_uint * 3),
                ("message", ctypes.c_char * 2048)]


@contextlib.contextmanager
def schedules(seed: int) -> Iterator[None]:
    """Launches inside run their fibers in the order seeded by ``seed``."""
    before = _seed[0]
    _seed[0] = int(seed)
    try:
        yield
    finally:
        _seed[0] = before


def _describe_code(code: str) -> str:
    pointer = code.startswith("p")
    const = code.startswith("pc")
    base = code[2:] if const else code[1:] if pointer else code
    name = _C_NAMES.get(base, f"a {base[1:]}-byte struct")
    return f"{'const ' if const else ''}{name}{'*' if pointer else ''}"


def cupy_scalar_dtype(value: Any) -> np.dtype:
    """The dtype CuPy 14.2 passes a scalar argument as (``_scalar.pyx``: by exact type, so
    a subclass of int, an IntEnum say, is refused as CuPy refuses it)."""
    if isinstance(value, np.generic):
        return value.dtype
    kind = type(value)
    if kind is bool:
        return np.dtype(np.bool_)
    if kind is float:
        return np.dtype(np.float64)
    if kind is complex:
        return np.dtype(np.complex128)
    if kind is int:
        if not -2 ** 63 <= value < 2 ** 64:
            raise TypeError(f"{value} does not fit 64 bits")
        return np.dtype(np.uint64 if value >= 2 ** 63 else np.int64)
    raise TypeError(f"unsupported type {kind.__name__}")


def _dtype_code(dtype: np.dtype) -> str:
    kind = {"f": "f", "i": "i", "u": "u", "b": "b"}.get(dtype.kind, "s")
    return f"{kind}{dtype.itemsize}"


class EmulatedKernel:
    """One kernel of a compiled module: call it as a ``cupy.RawKernel``."""

    def __init__(self, module: "EmulatedModule", name: str, parameters: Tuple[str, ...],
                 codes: Tuple[str, ...], bounds: int) -> None:
        self.module, self.name = module, name
        self.parameters, self.codes, self.bounds = parameters, codes, bounds
        self._entry = getattr(module.library, f"emu_launch_{name}")
        self._entry.argtypes = (ctypes.POINTER(_Launch), ctypes.POINTER(ctypes.c_void_p))
        self._entry.restype = None

    def _error(self, text: str) -> EmulatedKernelError:
        return EmulatedKernelError(f"{self.name} ({self.module.label}): {text}")

    def _dims(self, what: str, dims: Any, limits: Sequence[int]) -> Tuple[int, int, int]:
        if isinstance(dims, (int, np.integer)):
            dims = (dims,)
        if not isinstance(dims, tuple) or not 1 <= len(dims) <= 3 or not all(
                isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in dims):
            raise self._error(f"{what} must be a tuple of 1 to 3 ints, got {dims!r}")
        full = tuple(int(n) for n in dims) + (1,) * (3 - len(dims))
        for axis, (n, limit) in enumerate(zip(full, limits)):
            if not 1 <= n <= limit:
                raise self._error(f"{what}.{'xyz'[axis]} is {n}, expected 1 to {limit}")
        return full  # type: ignore[return-value]

    def _argument(self, index: int, value: Any) -> ctypes._SimpleCData:
        name, code = self.parameters[index], self.codes[index]
        where = f"parameter {index} '{name}' ({_describe_code(code)})"
        if code.startswith("p"):
            if not isinstance(value, np.ndarray) and hasattr(value, "_view") and \
                    hasattr(value, "__cuda_array_interface__"):
                value = value._view  # a device array of the CuPy stand-in: its memory
            if not isinstance(value, np.ndarray):
                raise self._error(f"{where} expects a device array, got "
                                  f"{type(value).__name__}")
            if not memory.is_device_array(value):
                raise self._error(f"{where} was given a host array (shape "
                                  f"{value.shape}), not one on the emulated device")
            pointee = code[2:] if code.startswith("pc") else code[1:]
            got = _dtype_code(value.dtype)
            fits = got == pointee or (pointee.startswith("s") or got.startswith("s")) \
                and pointee[1:] == got[1:]
            if not fits:
                raise self._error(f"{where} expects {_describe_code(pointee)} elements, got "
                                  f"an array of {value.dtype}")
            return ctypes.c_void_p(value.__array_interface__["data"][0])
        if code not in _CTYPES:  # a struct passed by value: no launcher does that
            raise self._error(f"{where}: a struct by value is not emulated")
        try:
            dtype = cupy_scalar_dtype(value)
        except TypeError as exc:
            raise self._error(f"{where}: {exc}") from None
        if _dtype_code(dtype) != code:
            raise self._error(f"{where} expects {_describe_code(code)}, got {value!r}, which "
                              f"CuPy passes as {dtype.name} ({dtype.itemsize} bytes)")
        return _CTYPES[code](value.item() if isinstance(value, np.generic) else value)

    def __call__(self, grid: Any, block: Any, args: Sequence[Any], *, shared_mem: int = 0,
                 stream: Any = None, enable_cooperative_groups: bool = False) -> None:
        grid3 = self._dims("grid", grid, MAX_GRID)
        block3 = self._dims("block", block, MAX_BLOCK)
        threads = block3[0] * block3[1] * block3[2]
        if threads > MAX_THREADS:
            raise self._error(f"a block of {threads} threads, past CUDA's {MAX_THREADS}")
        if threads > self.bounds:
            raise self._error(f"a block of {threads} threads, past __launch_bounds__ "
                              f"({self.bounds})")
        if shared_mem:
            raise self._error("dynamic shared memory is not emulated (the kernels use "
                              "static __shared__ arrays)")
        if not isinstance(args, tuple):
            raise self._error(f"args must be a tuple, got {type(args).__name__}")
        if len(args) != len(self.codes):
            raise self._error(f"takes {len(self.codes)} arguments "
                              f"({', '.join(self.parameters)}), got {len(args)}")
        values = [self._argument(i, a) for i, a in enumerate(args)]
        pointers = (ctypes.c_void_p * max(1, len(values)))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        state = _Launch()
        state.grid[:] = grid3
        state.block[:] = block3
        state.seed = _seed[0]
        with _launch_lock:
            launched.append(self.name)
            self._entry(ctypes.byref(state), pointers)
        if state.status == 1:
            raise self._error(state.message.decode(errors="replace"))
        if state.status == 2:
            raise self._error(self._fault(state, args))

    def _fault(self, state: _Launch, args: Sequence[Any]) -> str:
        address = int(state.fault_address)
        where = (f"block {tuple(state.fault_block)}, thread {tuple(state.fault_thread)}")
        if state.fault_signal == signal.SIGFPE:  # a GPU gives garbage here, not a trap
            return f"{where} divided an integer by zero"
        if state.fault_signal == signal.SIGILL:
            return (f"{where} indexed a local or __shared__ array past its bounds "
                    f"(-fsanitize=bounds)")
        access = {1: "wrote", 0: "read"}.get(state.fault_write, "touched")
        for index, (name, code) in enumerate(zip(self.parameters, self.codes)):
            if not code.startswith("p"):
                continue
            buffer = memory.find_buffer(args[index].__array_interface__["data"][0])
            if buffer is not None and buffer.stop <= address < buffer.guard_stop:
                return (f"{where} {access} byte {address - buffer.start} of parameter "
                        f"{index} '{name}', {buffer.describe()}: past its end")
        buffer = memory.find_buffer(address)
        if buffer is not None:
            return (f"{where} {access} address 0x{address:x}, past the end of {buffer.describe()}"
                    f" that was not passed to this kernel")
        return f"{where} {access} address 0x{address:x}, outside every device buffer " \
               f"(a fiber's stack overflow, or a wild pointer)"


class EmulatedModule:
    """A .cu source compiled for the emulated GPU with some defines; ``get_function``
    gives its kernels, as ``cupy.RawModule`` does."""

    def __init__(self, path: Path, defines: Tuple[Tuple[str, int], ...] = ()) -> None:
        self.path, self.defines = Path(path), tuple(defines)
        self.label = self.path.name + "".join(f" -D{k}={v}" for k, v in self.defines)
        self.library, declared = build.compile_source(self.path, self.defines)
        codes = build.signatures(self.library, declared)
        self._declared: Dict[str, Any] = {k.name: k for k in declared}
        self._codes = codes

    @functools.lru_cache(maxsize=None)
    def get_function(self, name: str) -> EmulatedKernel:
        if name not in self._declared:
            raise EmulatedKernelError(f"{self.label} has no kernel {name!r}; it has "
                                      f"{sorted(self._declared)}")
        declared = self._declared[name]
        if len(declared.parameters) != len(self._codes[name]):
            raise EmulatedKernelError(
                f"{name}: read {len(declared.parameters)} parameter names from the source "
                f"({', '.join(declared.parameters)}), but the compiler reports "
                f"{len(self._codes[name])} parameters")
        bounds_of = getattr(self.library, f"emu_bounds_{name}")
        bounds_of.restype = ctypes.c_long
        return EmulatedKernel(self, name, declared.parameters, self._codes[name],
                              int(bounds_of()))
