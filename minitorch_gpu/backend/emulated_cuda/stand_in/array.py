"""``cupy.ndarray`` of the stand-in: a NumPy array in emulated device memory, on one device.

The elements live in ``memory.py``'s guarded buffers, so the CUDA kernels read them in
place. What CuPy refuses, this refuses (cited from CuPy v14.2.0's ``cupy/_core/core.pyx``):

* ``np.asarray(x)`` and every implicit conversion to NumPy raise TypeError (``__array__``);
* an operand of another device raises ValueError, as without peer access
  (``_check_peer_access`` in ``_kernel.pyx``);
* a NumPy array as an operand of an operation raises TypeError (``_preprocess_args``).

Every copy to the host (``get``, ``item``, ``tolist``, ``float()``, ``int()``, ``bool()``,
``cupy.asnumpy``) adds one to ``host_reads`` here: the test of the engine's host-read
counter compares the two, so a read the engine does not count shows.
"""
from __future__ import annotations

import ctypes
from typing import Any, Iterable, Optional

import numpy as np

from .. import memory
from . import cuda
from .indexing import wrapped_key
from .ufunc_types import resolve_reduction
from .signatures import check_call

host_reads = [0]  # device-to-host copies made through the stand-in, ever
sync_allowed = [True]  # False inside cupyx.allow_synchronize(False)


class DeviceSynchronized(RuntimeError):
    """``cupyx.DeviceSynchronized``: a host read inside ``allow_synchronize(False)``."""


def record_read(what: str) -> None:
    """One wait of the host for the device: a copy back (``get``) or a size or value CuPy
    reads itself (``nonzero``, a boolean mask, ``unique``...). Counted in ``host_reads``;
    refused inside ``cupyx.allow_synchronize(False)`` as CuPy's detector refuses it
    (``cupy/_core/syncdetect.py``, ``_declare_synchronize``). The host-read test watches
    this one function."""
    if not sync_allowed[0]:
        raise DeviceSynchronized(f"Synchronization detected while prohibited "
                                 f"(cupyx.allow_synchronize(False)): {what}")
    cuda.check_not_capturing(what)
    host_reads[0] += 1
    for watcher in read_watchers:
        watcher(what)


read_watchers: list = []  # called with each read's description (the host-read test's)


def refuse_upload_while_capturing(host: np.ndarray, what: str) -> None:
    """CuPy copies a host array of more than 0 dims with ``copy_from_host_async``, which
    refuses while the current stream captures (``cupy/cuda/memory.pyx``): a graph could
    not repeat the copy from memory the host may since have changed. A 0-d value goes in
    as a kernel argument."""
    if host.ndim and cuda.get_current_stream().is_capturing():
        raise cuda.CUDARuntimeError(
            f"cudaErrorStreamCaptureUnsupported: {what} of shape {host.shape} while the "
            f"current stream captures (copy_from_host_async refuses a host-to-device copy "
            f"during a capture)")


def written_of(array: "ndarray") -> Any:
    """The side-stream copy into ``array``'s memory not yet waited for: kept on the base,
    so a view taken before the copy sees it too."""
    root = array if array._base is None else array._base
    return root._written


def _set_written(array: "ndarray", written: Any) -> None:
    (array if array._base is None else array._base)._written = written


def _fresh(result: np.ndarray) -> np.ndarray:
    """``result`` where it already lies in device memory (a view), else a device copy."""
    if memory.is_device_array(result):
        return result
    out = memory.empty(result.shape, result.dtype)
    out[...] = result
    return out


class Memory:
    """``cupy.cuda.Memory``: one allocation, ``ptr`` its start (views of it share it)."""

    def __init__(self, ptr: int, size: int) -> None:
        self.ptr, self.size = ptr, size


class MemoryPointer:
    """``cupy.cuda.MemoryPointer``: ``ptr``, the allocation it points into (``mem``) and
    the asynchronous copies the backend makes."""

    def __init__(self, owner: "ndarray") -> None:
        self.owner = owner
        self.ptr = owner._view.__array_interface__["data"][0]
        self.device_id = owner._device
        buffer = memory.find_buffer(self.ptr)
        self.mem = Memory(self.ptr, 0) if buffer is None else \
            Memory(buffer.start, buffer.stop - buffer.start)

    def copy_from_device_async(self, src: "MemoryPointer", size: int,
                               stream: Optional[cuda.Stream] = None) -> None:
        cuda.check_ordered(written_of(src.owner), "the source of a device copy")
        ctypes.memmove(self.ptr, src.ptr, int(size))
        stream = cuda.get_current_stream() if stream is None else stream
        stream.queued += 1
        _set_written(self.owner, (stream, stream.queued))


class Flags:
    def __init__(self, view: np.ndarray) -> None:
        self.c_contiguous = bool(view.flags.c_contiguous)
        self.f_contiguous = bool(view.flags.f_contiguous)
        self.owndata = view.base is None

    def __getitem__(self, name: str) -> bool:
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous,
                "OWNDATA": self.owndata}[name]


def unwrap(value: Any, device: int, what: str = "an operand") -> Any:
    """The NumPy view of a stand-in array on ``device`` (lists and tuples unwrapped
    through); a NumPy array is refused as CuPy refuses it."""
    if isinstance(value, ndarray):
        if value._device != device:
            raise ValueError(
                f"The device where the array resides ({value._device}) is different from "
                f"the current device ({device}). Peer access is unavailable between these "
                f"devices.")
        cuda.check_ordered(written_of(value), what)
        return value._view
    if isinstance(value, np.ndarray):
        raise TypeError(f"Unsupported type {type(value)}")
    if isinstance(value, (list, tuple)):
        return type(value)(unwrap(v, device, what) for v in value)
    return value


def wrap(result: Any, like: Optional["ndarray"] = None) -> Any:
    """A NumPy result as stand-in arrays on the current device; a view of ``like``'s
    memory stays a view with ``like``'s base."""
    if isinstance(result, np.ndarray):
        if like is not None and result is like._view:
            return like
        if like is not None and memory.is_device_array(result) and \
                np.shares_memory(result, like._view):
            return ndarray._of(result, like._device,
                               like._base if like._base is not None else like)
        return ndarray._of(_fresh(result), cuda.current_device_id())
    if isinstance(result, np.generic):  # CuPy's reductions and indexing give 0-d arrays
        return ndarray._of(_fresh(np.asarray(result)), cuda.current_device_id())
    if isinstance(result, tuple):
        return tuple(wrap(r) for r in result)
    if isinstance(result, list):
        return [wrap(r) for r in result]
    return result


# the ndarray methods that return new arrays or views, forwarded to NumPy; each is a
# method of cupy.ndarray (tests/test_cupy_stand_in.py checks the names against CuPy)
FORWARDED_METHODS = (
    "all", "any", "argmax", "argmin", "astype", "copy", "cumprod", "cumsum",
    "diagonal", "max", "mean", "min", "prod", "ravel", "reshape",
    "round", "squeeze", "std", "sum", "swapaxes", "take", "trace", "transpose", "var",
    "view", "flatten", "dot", "conj", "fill",
)


class ndarray:
    """A device array (see the module's docstring)."""

    __slots__ = ("_view", "_device", "_base", "_written", "__weakref__")
    # NumPy hands its ufuncs and functions on such arrays to the stand-in (as CuPy does):
    # functions.py gives the class __array_ufunc__, __array_function__ and its operators
    __array_priority__ = 100

    def __init__(self, shape: Any, dtype: Any = float, memptr: Any = None,
                 strides: Any = None, order: str = "C") -> None:
        if memptr is not None or strides is not None or order != "C":
            raise NotImplementedError("the stand-in makes ndarray(shape, dtype) only")
        self._view = memory.empty(shape, dtype)
        self._device, self._base, self._written = cuda.current_device_id(), None, None

    @classmethod
    def _of(cls, view: np.ndarray, device: int, base: Optional["ndarray"] = None,
            written: Any = None) -> "ndarray":
        self = object.__new__(cls)
        self._view, self._device, self._base, self._written = view, device, base, written
        return self

    # --- what an array is -------------------------------------------------------------
    shape = property(lambda self: self._view.shape)
    dtype = property(lambda self: self._view.dtype)
    ndim = property(lambda self: self._view.ndim)
    size = property(lambda self: self._view.size)
    strides = property(lambda self: self._view.strides)
    itemsize = property(lambda self: self._view.itemsize)
    nbytes = property(lambda self: self._view.nbytes)
    base = property(lambda self: self._base)
    flags = property(lambda self: Flags(self._view))
    data = property(lambda self: MemoryPointer(self))
    device = property(lambda self: cuda.Device(self._device))
    T = property(lambda self: self.transpose())
    real = property(lambda self: self._method("real"))

    @property
    def __cuda_array_interface__(self) -> dict:
        interface = dict(self._view.__array_interface__)
        interface["version"] = 3
        interface["stream"] = 1
        return interface

    def __len__(self) -> int:
        return len(self._view)

    def __repr__(self) -> str:
        return f"stand-in cupy.ndarray(shape={self.shape}, dtype={self.dtype}, " \
               f"device={self._device})"

    def __iter__(self) -> Iterable["ndarray"]:
        return (self[i] for i in range(len(self)))

    # --- reading values back: every one a counted host read -----------------------------
    def get(self, stream: Any = None, order: str = "C", out: Any = None,
            blocking: bool = True) -> np.ndarray:
        cuda.check_ordered(written_of(self), "an array read back to the host")
        record_read("ndarray.get")
        copy = np.array(self._view, order="C" if order in ("C", "A", "K") else "F")
        if out is not None:
            out[...] = copy
            return out
        return copy

    def set(self, arr: np.ndarray, stream: Optional[cuda.Stream] = None) -> None:
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, got "
                            f"{type(arr)}")
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError(f"Shape or dtype mismatch: {arr.shape} {arr.dtype} into "
                             f"{self.shape} {self.dtype}")
        refuse_upload_while_capturing(arr, "ndarray.set")
        self._view[...] = arr
        if stream is not None and stream is not cuda.get_current_stream():
            stream.queued += 1
            _set_written(self, (stream, stream.queued))

    def item(self) -> Any:
        return self.get().item()

    def tolist(self) -> Any:
        return self.get().tolist()

    def __float__(self) -> float:  # core.pyx: float(self.get())
        return float(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __index__(self) -> int:
        if self.ndim or self.dtype.kind not in "iu":
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return int(self.get())

    def __complex__(self) -> complex:
        return complex(self.get())

    def __bool__(self) -> bool:
        return bool(self.get())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    # --- methods ------------------------------------------------------------------------
    def _method(self, name: str, *args: Any, **kwargs: Any) -> Any:
        device = self._device
        copies = name in ("reshape", "ravel") and not self._view.flags.c_contiguous
        if device != cuda.current_device_id() and (name not in _ANY_DEVICE or copies):
            unwrap(self, cuda.current_device_id())  # raises, as CuPy's kernels refuse it
        view = unwrap(self, device)
        args = unwrap(list(args), device)
        kwargs = {k: unwrap(v, device) for k, v in kwargs.items()}
        if name in _REDUCTIONS:  # CuPy's reduction loops: a dtype it has none for raises
            view = reduction_input(name, view, kwargs.get("dtype"))
        attribute = getattr(view, name)
        result = attribute(*args, **kwargs) if callable(attribute) else attribute
        with cuda.Device(device):
            return wrap(result, like=self)

    def __getitem__(self, key: Any) -> Any:
        device = self._device
        key = unwrap(key, device)
        if has_arrays(key):  # advanced indexing runs a kernel on the current device
            device = cuda.current_device_id()
            unwrap(self, device)
            if has_masks(key):  # the result's size: CuPy reads it (nonzero of the mask)
                record_read("indexing by a boolean mask")
        key = wrapped_key(key, self.shape)
        with cuda.Device(device):
            return wrap(self._view[key], like=self)

    def __setitem__(self, key: Any, value: Any) -> None:
        device = cuda.current_device_id()  # every write is a kernel on the current device
        if isinstance(value, np.ndarray):
            raise TypeError(f"Unsupported type {type(value)}")
        unwrap(self, device, "an array written in place")
        key = unwrap(key, device)
        if has_masks(key) and isinstance(value, ndarray) and value.size > 1:
            record_read("a boolean-mask assignment of an array")  # CuPy sizes it
        key = wrapped_key(key, self.shape)
        self._view[key] = unwrap(value, device)

    def __deepcopy__(self, memo: dict) -> "ndarray":
        return self.copy()

    def __reduce__(self) -> tuple:
        raise TypeError("the stand-in's device arrays are not pickled; copy to the host "
                        "(.get()) first")


_REDUCTIONS = frozenset({"sum", "prod", "max", "min", "any", "all"})


def _parts(key: Any) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def has_arrays(key: Any) -> bool:
    """Whether an index has an array or list part (advanced indexing: a kernel)."""
    return any(isinstance(p, (np.ndarray, list)) for p in _parts(key))


def has_masks(key: Any) -> bool:
    return any(isinstance(p, np.ndarray) and p.dtype == np.bool_ and p.ndim
               for p in _parts(key))


def reduction_input(name: str, view: np.ndarray, dtype: Any) -> np.ndarray:
    """``view`` as CuPy's reduction ``name`` reads it: cast to its loop's input dtype (a
    bool sum runs in int64), or CuPy's TypeError where it has no loop (a bf16 any)."""
    loop = resolve_reduction(name, view.dtype, dtype)
    if loop is None or dtype is not None or loop.in_dtypes[0] == view.dtype:
        return view
    return view.astype(loop.in_dtypes[0])


# views and metadata that CuPy makes on any device (no kernel runs)
_ANY_DEVICE = frozenset({"reshape", "transpose", "swapaxes", "view", "squeeze", "ravel",
                         "diagonal", "real"})


def _forward(name: str) -> Any:
    """NumPy's method ``name``, after binding the call against CuPy's signature of
    ``cupy.ndarray.<name>`` (NumPy's take keywords CuPy's lack)."""
    path = "cupy.ndarray." + name

    def method(self: ndarray, *args: Any, **kwargs: Any) -> Any:
        check_call(path, (self,) + args, kwargs)
        return self._method(name, *args, **kwargs)
    method.__name__ = name
    return method


for _name in FORWARDED_METHODS:
    setattr(ndarray, _name, _forward(_name))


ndarray.__hash__ = None  # type: ignore[assignment]  # as CuPy's: arrays compare elementwise
del _name
