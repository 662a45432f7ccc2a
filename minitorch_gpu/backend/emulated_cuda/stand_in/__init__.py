"""A CuPy stand-in: the ``cuda`` device without a GPU, for tests.

``MINITORCH_EMULATE_CUDA=1`` (read by ``backend/_cupy.py``, and by nothing else) puts
``cupy`` here in place of CuPy: device arrays are NumPy arrays in guarded emulated memory
(``array.py``), the project's CUDA kernels run compiled for the CPU (``RawModule`` below,
through ``launch.py``), cuBLAS's two GEMMs are computed from their pointers
(``cublas.py``), and devices, streams, events, the memory pool and one-rank NCCL are
modelled (``cuda.py``). It offers only the CuPy the engine uses, refuses what CuPy
refuses, and ``tests/test_cupy_stand_in.py`` checks its names against real CuPy.

It is a test device, not part of the engine: nothing selects it but that variable.
"""
from __future__ import annotations

import contextlib
import re
import types
from typing import Any, Dict, Iterator, Tuple

import numpy as np

from .. import launch
from ..launch import EmulatedModule
from . import array as _array
from . import cublas, cuda, functions, graphs, random
from .array import MemoryPointer, ndarray
from .cuda import StreamOrderError

__version__ = "14.2.0"  # the CuPy whose behaviour it follows


class RawKernel:
    """A kernel of a ``RawModule``: its launches go to the emulated GPU with the device
    arrays' memory, after CuPy's checks of the arguments' devices."""

    def __init__(self, kernel: launch.EmulatedKernel) -> None:
        self._kernel = kernel
        self.name = kernel.name

    def __call__(self, grid: Any, block: Any, args: tuple, *, shared_mem: int = 0,
                 stream: Any = None, enable_cooperative_groups: bool = False) -> None:
        device = cuda.current_device_id()
        views = tuple(_array.unwrap(a, device, f"argument {i} of kernel {self.name}")
                      if isinstance(a, ndarray) else a for i, a in enumerate(args))
        if any(isinstance(a, np.ndarray) for a in args):
            functions.refuse_host(next(a for a in args if isinstance(a, np.ndarray)))
        cuda.queue_on_current_stream()
        self._kernel(grid, block, views, shared_mem=shared_mem)


class RawModule:
    """``cupy.RawModule(code=..., options=...)`` for the project's sources: the code is
    matched to its file (the emulator compiles files) and ``-DNAME=value`` options become
    its defines."""

    def __init__(self, code: str, *, options: Tuple[str, ...] = (), **kwargs: Any) -> None:
        from ...kernels import loader
        path = next((loader.SOURCE_DIR / name for name in loader.SOURCES
                     if loader.source_text(name) == code), None)
        if path is None:
            raise NotImplementedError("the emulated GPU compiles the project's own .cu "
                                      "sources only")
        defines = tuple(sorted((m.group(1), int(m.group(2))) for m in (
            re.fullmatch(r"-D(\w+)=(-?\d+)", o) for o in options) if m))
        self._module = _module(str(path), defines)
        self._kernels: Dict[str, RawKernel] = {}

    def get_function(self, name: str) -> RawKernel:
        if name not in self._kernels:
            self._kernels[name] = RawKernel(self._module.get_function(name))
        return self._kernels[name]


_modules: Dict[Tuple[str, tuple], EmulatedModule] = {}


def _module(path: str, defines: tuple) -> EmulatedModule:
    key = (path, defines)
    if key not in _modules:
        _modules[key] = EmulatedModule(path, defines)
    return _modules[key]


def host_reads() -> int:
    """Device-to-host copies made through the stand-in so far (every ``get``)."""
    return _array.host_reads[0]


def _namespace(name: str, **members: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(members)
    return module


# the ndarray methods a graph capture does not record: what makes or describes an array
# object (no device work), and the host reads, which a capture refuses anyway
_NOT_RECORDED = {"__init__", "_of", "__repr__", "__len__", "__iter__", "__array__",
                 "__deepcopy__", "__reduce__", "_method", "get", "item", "tolist",
                 "__float__", "__int__", "__index__", "__complex__", "__bool__"}
_NOT_RECORDED_FUNCTIONS = {"empty", "empty_like", "asnumpy", "get_array_module"}


def _record_for_graphs(members: Dict[str, Any]) -> None:
    """Wrap every call that queues device work with ``graphs.recorded``, so that a stream
    capture records it (routines in ``members``, ufuncs, ndarray's methods and operators,
    kernels, cuBLAS's GEMMs, draws)."""
    for name, value in list(members.items()):
        if isinstance(value, types.FunctionType) and name not in _NOT_RECORDED_FUNCTIONS:
            members[name] = graphs.recorded(value)
    graphs.record_methods(functions.ufunc, ["__call__"])
    graphs.record_methods(ndarray, [n for n, v in vars(ndarray).items()
                                    if isinstance(v, types.FunctionType)
                                    and n not in _NOT_RECORDED])
    graphs.record_methods(RawKernel, ["__call__"])
    graphs.record_methods(random.Generator, ["standard_normal", "random", "integers"])
    for name in ("gemmEx", "gemmStridedBatchedEx"):
        if not getattr(getattr(cublas, name), "__wrapped_for_graphs__", False):
            setattr(cublas, name, graphs.recorded(getattr(cublas, name)))


def _build() -> Tuple[types.ModuleType, types.ModuleType, types.ModuleType, Any]:
    """The ``cupy``, ``cupyx``, ``cupyx.scipy.special`` modules and cuBLAS."""
    cuda_module = _namespace(
        "cupy.cuda", Device=cuda.Device, Stream=cuda.Stream, Event=cuda.Event,
        runtime=cuda.runtime, device=cuda.device, nccl=cuda.nccl,
        get_current_stream=cuda.get_current_stream, get_elapsed_time=cuda.get_elapsed_time,
        alloc_pinned_memory=cuda.alloc_pinned_memory, MemoryPointer=MemoryPointer,
        get_device_id=cuda.get_device_id, Graph=graphs.Graph, MemoryPool=cuda.MemoryPool,
        using_allocator=graphs.using_allocator)
    members: Dict[str, Any] = {
        name: getattr(functions, name)
        for name in functions.UFUNCS + functions.FUNCTIONS + (
            "take", "take_along_axis", "clip", "argsort", "sort", "argpartition", "asnumpy",
            "empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like",
            "full_like", "arange", "eye", "tri", "array", "asarray", "ascontiguousarray",
            "broadcast", "matmul", "copyto", "ufunc", "get_array_module", "lib")}
    for dtype in ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                  "uint64", "float16", "float32", "float64", "complex64", "complex128",
                  "dtype", "inf", "nan", "pi", "e", "newaxis", "integer", "floating",
                  "signedinteger", "unsignedinteger", "number", "generic", "bool"):
        if hasattr(np, dtype):
            members[dtype] = getattr(np, dtype)
    members.update(ndarray=ndarray, cuda=cuda_module, random=_namespace(
        "cupy.random", default_rng=random.default_rng, Generator=random.Generator,
        XORWOW=random.XORWOW), RawModule=RawModule, RawKernel=RawKernel,
        get_default_memory_pool=cuda.get_default_memory_pool, __version__=__version__,
        stand_in=True)
    _record_for_graphs(members)
    cupy = _namespace("cupy", **members)
    special = _namespace("cupyx.scipy.special", erf=functions.ufunc("erf")
                         if hasattr(np, "erf") else _erf)
    cupyx = _namespace("cupyx", scatter_add=graphs.recorded(_scatter_add),
                       scipy=_namespace("cupyx.scipy", special=special),
                       allow_synchronize=_allow_synchronize,
                       DeviceSynchronized=_array.DeviceSynchronized)
    return cupy, cupyx, special, cublas


@contextlib.contextmanager
def _allow_synchronize(allow: bool) -> Iterator[None]:
    """``cupyx.allow_synchronize``: inside ``allow_synchronize(False)`` a host read raises
    ``DeviceSynchronized`` (``cupy/_core/syncdetect.py``)."""
    before = _array.sync_allowed[0]
    _array.sync_allowed[0] = bool(allow)
    try:
        yield
    finally:
        _array.sync_allowed[0] = before


def _erf(x: ndarray) -> ndarray:
    """``cupyx.scipy.special.erf`` (float loops only: 'f->f', 'd->d')."""
    from math import erf as scalar_erf
    view = _array.unwrap(x, cuda.current_device_id())
    if view.dtype.kind != "f" or view.dtype.itemsize < 4:
        raise TypeError(f"Wrong type ({view.dtype}) of arguments for cupyx.scipy.special.erf")
    return _array.wrap(np.vectorize(scalar_erf, otypes=[view.dtype])(view))


def _scatter_add(a: ndarray, slices: Any, value: Any) -> None:
    """``cupyx.scatter_add``: unbuffered add at wrapped indices (``_scatter_op``); no loop
    for bfloat16 or float16 (its atomicAdd takes float32, float64 and integers)."""
    from .indexing import wrapped_key
    device = cuda.current_device_id()
    view = _array.unwrap(a, device)
    if view.dtype.kind not in "fiu" or view.dtype.itemsize < 4:
        raise TypeError(f"scatter_add does not support dtype {view.dtype}")
    key = wrapped_key(_array.unwrap(slices, device), view.shape)
    np.add.at(view, key, _array.unwrap(value, device))


cupy, cupyx, cupyx_special, cublas_module = _build()

__all__ = ["MemoryPointer", "RawKernel", "RawModule", "StreamOrderError", "cublas",
           "cublas_module", "cupy", "cupyx", "cupyx_special", "host_reads", "ndarray"]
