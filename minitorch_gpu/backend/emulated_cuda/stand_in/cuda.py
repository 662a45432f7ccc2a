"""``cupy.cuda`` of the stand-in: devices, the current device, streams, events, the memory
pool, page-locked memory, the runtime calls the backend makes, and NCCL for one rank.

Everything runs at once on the host, so streams never overlap; what they model is the
*ordering* a program must state. Each stream counts the operations queued on it; an
event is (stream, count); ``wait_event`` records that a stream has waited for another up
to that count. An array written by a copy on a side stream remembers (stream, count), and
an operation on another stream that reads it before waiting for that count raises
``StreamOrderError``: the race a GPU would run silently (the copy not yet landed).

The emulated machine has ``DEVICE_COUNT`` GPUs and no peer access between them, so work
that mixes arrays of two devices, or runs on the wrong current device, is refused as CuPy
refuses it there (``_check_peer_access``).
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .. import memory

DEVICE_COUNT = 2  # two, so that work on the wrong device shows (CuPy allocates on the
# current device and refuses another device's arrays without peer access)
TOTAL_MEMORY = 80 * 2 ** 30  # what memGetInfo reports as the device's size (an H100's)
MULTIPROCESSORS = 4  # cudaDevAttrMultiProcessorCount: sizes cupy.random's state (small)
# the compute capability the emulated GPUs report, as CuPy's Device.compute_capability
# ("90": an H100); MINITORCH_EMULATE_CUDA_ARCH=75 makes them a T4 (no bf16), 86 an A10
COMPUTE_CAPABILITY = os.environ.get("MINITORCH_EMULATE_CUDA_ARCH", "90")
if not (COMPUTE_CAPABILITY.isdigit() and len(COMPUTE_CAPABILITY) == 2):
    raise ValueError(f"MINITORCH_EMULATE_CUDA_ARCH must be a compute capability such as 75 "
                     f"or 90, got {COMPUTE_CAPABILITY!r}")


class CUDARuntimeError(RuntimeError):
    """``cupy_backends.cuda.api.runtime.CUDARuntimeError``."""


class StreamOrderError(RuntimeError):
    """An array read on one stream while a copy into it, queued on another stream, was not
    waited for (``Stream.wait_event``)."""


def _check_device_id(device: Any) -> int:
    index = int(getattr(device, "id", device))
    if not 0 <= index < DEVICE_COUNT:
        raise CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {index} "
                               f"(the emulated machine has {DEVICE_COUNT} GPUs)")
    return index


class _State(threading.local):
    """The current device and each device's current stream, per host thread (as CUDA's)."""

    def __init__(self) -> None:
        self.device = 0
        self.streams: Dict[int, "Stream"] = {}


_state = _State()


def current_device_id() -> int:
    return _state.device


memory.current_device[0] = current_device_id  # allocations are the current device's


class Device:
    """``cupy.cuda.Device``: ``with Device(i):`` makes GPU i current inside (and restores
    the one before), ``use()`` makes it current for good."""

    def __init__(self, device: Any = None) -> None:
        self.id = _state.device if device is None else _check_device_id(device)
        self._before: list = []

    def __enter__(self) -> "Device":
        self._before.append(_state.device)
        _state.device = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        _state.device = self._before.pop()

    def use(self) -> None:
        _state.device = self.id

    def synchronize(self) -> None:
        return None  # the host ran everything already

    @property
    def compute_capability(self) -> str:
        """``"90"`` for sm_90, as CuPy's (``COMPUTE_CAPABILITY``)."""
        return COMPUTE_CAPABILITY

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


def get_device_id() -> int:
    return _state.device


_stream_numbers = itertools.count(1)


class Stream:
    """``cupy.cuda.Stream``: a queue of one device. ``queued`` counts its operations;
    ``waited[other]`` is how far it has waited for ``other`` (``wait_event``)."""

    def __init__(self, null: bool = False, non_blocking: bool = False,
                 ptds: bool = False, priority: Optional[int] = None) -> None:
        self.device_id = _state.device
        self.ptr = 0 if null else next(_stream_numbers)
        self.non_blocking = non_blocking
        self.queued = 0
        self.waited: Dict["Stream", int] = {}
        self._before: list = []

    def __enter__(self) -> "Stream":
        self._before.append(_state.streams.get(self.device_id))
        _state.streams[self.device_id] = self
        return self

    def __exit__(self, *exc: Any) -> None:
        before = self._before.pop()
        if before is None:
            _state.streams.pop(self.device_id, None)
        else:
            _state.streams[self.device_id] = before

    def use(self) -> "Stream":
        _state.streams[self.device_id] = self
        return self

    def record(self, event: Optional["Event"] = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: "Event") -> None:
        if event.stream is not None and event.stream is not self:
            self.waited[event.stream] = max(self.waited.get(event.stream, 0), event.count)

    def synchronize(self) -> None:
        return None

    @property
    def done(self) -> bool:
        return True

    # CUDA Graphs: graphs.py records the calls made while the stream captures (it puts
    # its begin and end in capture_hooks when imported)
    _capture: Any = None

    def begin_capture(self, mode: Any = None) -> None:
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if self._capture is not None:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is already capturing")
        self._capture = capture_hooks["begin"](self)
        capturing_streams.add(self)

    def end_capture(self) -> Any:
        if self._capture is None:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is not capturing")
        capture, self._capture = self._capture, None
        capturing_streams.discard(self)
        return capture_hooks["end"](self, capture)

    def is_capturing(self) -> bool:
        return self._capture is not None

    def __repr__(self) -> str:
        return f"<Stream {self.ptr} (device {self.device_id})>"


_null_streams: Dict[int, Stream] = {}
capture_hooks: Dict[str, Any] = {}  # graphs.py's begin and end of a capture
capturing_streams: set = set()  # the streams capturing now


def check_not_capturing(what: str) -> None:
    """A host read while a stream captures: CUDA refuses the synchronous copy."""
    if capturing_streams:
        raise CUDARuntimeError(f"cudaErrorStreamCaptureUnsupported: operation not "
                               f"permitted when stream is capturing ({what})")


def get_current_stream(device_id: Optional[int] = None) -> Stream:
    """The current stream of the current device (its null stream unless one is in use)."""
    device_id = _state.device if device_id is None else device_id
    stream = _state.streams.get(device_id)
    if stream is None:
        stream = _null_streams.get(device_id)
        if stream is None:
            with Device(device_id):
                stream = _null_streams[device_id] = Stream(null=True)
    return stream


def queue_on_current_stream() -> Tuple[Stream, int]:
    """Count one operation on the current stream; (stream, its count after it)."""
    stream = get_current_stream()
    stream.queued += 1
    return stream, stream.queued


def check_ordered(written: Optional[Tuple[Stream, int]], what: str) -> None:
    """StreamOrderError unless the current stream may read what ``written`` (a copy's
    (stream, count)) wrote: the same stream, or one that waited for it."""
    if written is None:
        return
    stream, count = written
    reader = get_current_stream()
    if stream is reader or reader.waited.get(stream, 0) >= count:
        return
    raise StreamOrderError(
        f"{what} is read on {reader!r} while its copy on {stream!r} may still be running: "
        f"the reading stream never waited for it (record an event on the copy's stream "
        f"and call wait_event on the reader)")


class Event:
    """``cupy.cuda.Event``: a point in one stream's queue, and the host time it was
    recorded (``get_elapsed_time``)."""

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False) -> None:
        self.disable_timing = disable_timing
        self.stream: Optional[Stream] = None
        self.count = 0
        self._time: Optional[float] = None

    def record(self, stream: Optional[Stream] = None) -> None:
        self.stream = get_current_stream() if stream is None else stream
        self.count = self.stream.queued
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        return None

    @property
    def done(self) -> bool:
        return True


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    """Milliseconds between two recorded events (CUDA refuses events without timing)."""
    start, end = start_event, end_event
    for event in (start, end):
        if event.disable_timing:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: an event made with "
                                   "disable_timing=True cannot be timed")
        if event._time is None:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: the event was never "
                                   "recorded")
    return (end._time - start._time) * 1000.0


class _Allocation:
    """What ``MemoryPool.malloc`` gives: memory at ``ptr`` (an allocator's result)."""

    def __init__(self, array: np.ndarray) -> None:
        self.mem, self.ptr = array, array.__array_interface__["data"][0]


class MemoryPool:
    """``cupy.cuda.MemoryPool``: ``memory.Pool``'s buffers, reused when freed, as CuPy's
    pool reuses them (``cupy.get_default_memory_pool()`` is the one every allocation
    uses unless ``using_allocator`` names another's ``malloc``, as a graph's private pool).
    Its byte counts are the current device's, as CuPy's per-device pools report."""

    def __init__(self, allocator: Any = None) -> None:
        self.allocator = allocator
        self._pool = memory.Pool("a private pool")

    def malloc(self, size: int) -> Any:
        with memory.using_pool(self._pool):
            return _Allocation(memory.empty((int(size),), np.uint8))

    def used_bytes(self) -> int:
        return self._pool.used_bytes(_state.device)

    def total_bytes(self) -> int:
        return self._pool.total_bytes(_state.device)

    def free_bytes(self) -> int:
        return self._pool.free_bytes(_state.device)

    def free_all_blocks(self, stream: Any = None) -> None:
        self._pool.free_all_blocks()


_pool = MemoryPool()
_pool._pool = memory.DEFAULT_POOL


def get_default_memory_pool() -> MemoryPool:
    return _pool


class PinnedMemory(bytearray):
    """``cupy.cuda.alloc_pinned_memory``'s buffer: host memory NumPy can view."""


def alloc_pinned_memory(size: int) -> PinnedMemory:
    return PinnedMemory(int(size))


class _Runtime:
    """``cupy.cuda.runtime``: the calls the backend makes."""

    CUDARuntimeError = CUDARuntimeError
    cudaDevAttrMultiProcessorCount = 16

    @staticmethod
    def getDeviceCount() -> int:
        return DEVICE_COUNT

    @staticmethod
    def getDevice() -> int:
        return _state.device

    @staticmethod
    def setDevice(device: int) -> None:
        _state.device = _check_device_id(device)

    @staticmethod
    def memGetInfo() -> Tuple[int, int]:
        return TOTAL_MEMORY - memory.bytes_in_use(), TOTAL_MEMORY

    @staticmethod
    def deviceGetAttribute(attrib: int, device: int) -> int:
        _check_device_id(device)
        if attrib == _Runtime.cudaDevAttrMultiProcessorCount:
            return MULTIPROCESSORS
        raise CUDARuntimeError(f"the emulated GPU does not report attribute {attrib}")

    @staticmethod
    def getDeviceProperties(device: int) -> dict:
        _check_device_id(device)
        return {"name": b"Emulated GPU (CPU)", "totalGlobalMem": TOTAL_MEMORY,
                "multiProcessorCount": MULTIPROCESSORS,
                "major": int(COMPUTE_CAPABILITY[0]), "minor": int(COMPUTE_CAPABILITY[1])}

    @staticmethod
    def runtimeGetVersion() -> int:
        return 13000

    @staticmethod
    def driverGetVersion() -> int:
        return 13000


runtime = _Runtime()


_cublas_handles: Dict[int, int] = {}  # by device: made at the first get_cublas_handle


class _DeviceModule:
    """``cupy.cuda.device``: the cuBLAS handle of the current device, made at its first
    request (``cupy/cuda/device.pyx``: cublas.create), which a capturing stream refuses:
    cublasCreate allocates its workspace on the device."""

    @staticmethod
    def get_cublas_handle() -> int:
        handle = _cublas_handles.get(_state.device)
        if handle is None:
            if capturing_streams:
                raise CUDARuntimeError(
                    "cudaErrorStreamCaptureUnsupported: operation not permitted when stream "
                    f"is capturing (cublasCreate: device {_state.device}'s cuBLAS handle is "
                    f"made at its first GEMM; make it before the capture)")
            handle = _cublas_handles[_state.device] = 1 + _state.device
        return handle

    Device = Device
    get_device_id = staticmethod(get_device_id)


device = _DeviceModule()


class _NcclCommunicator:
    """``cupy.cuda.nccl.NcclCommunicator`` of a one-rank world: every collective leaves the
    buffer as it is (the sum over one rank, the root's own values)."""

    def __init__(self, ndev: int, commId: Any, rank: int) -> None:
        if ndev != 1 or rank != 0:
            raise RuntimeError(f"the emulated NCCL has one rank; asked for rank {rank} of "
                               f"{ndev}")
        self.device_id = _state.device

    def _check(self, count: int, datatype: int, stream: int) -> None:
        if _state.device != self.device_id:
            raise RuntimeError(f"NCCL: a collective on device {_state.device} through the "
                               f"communicator of device {self.device_id}")
        if count < 0 or datatype not in _Nccl._SIZES:
            raise RuntimeError(f"NCCL: invalid count {count} or datatype {datatype}")

    @staticmethod
    def _check_buffer(pointer: int, count: int, datatype: int, what: str) -> None:
        """``count`` elements from ``pointer`` inside one live device buffer (an offset or
        a count in bytes for elements runs past it)."""
        nbytes = count * _Nccl._SIZES[datatype]
        buffer = memory.find_buffer(pointer)
        if buffer is None or pointer < buffer.start or pointer + nbytes > buffer.stop:
            raise RuntimeError(f"NCCL: {what} of {count} elements ({nbytes} bytes) at "
                               f"0x{pointer:x} is not inside one device buffer")

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                  stream: int) -> None:
        self._check(count, datatype, stream)
        if op not in _Nccl._OPS:
            raise RuntimeError(f"NCCL: unknown reduction op {op}")
        self._check_buffer(sendbuf, count, datatype, "the send buffer")
        self._check_buffer(recvbuf, count, datatype, "the receive buffer")
        if sendbuf != recvbuf:
            memory.copy_bytes(recvbuf, sendbuf, count * _Nccl._SIZES[datatype])

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self._check(count, datatype, stream)
        self._check_buffer(buff, count, datatype, "the buffer")
        if root != 0:
            raise RuntimeError(f"NCCL: root {root} of a one-rank world")

    def check_async_error(self) -> None:
        return None

    def abort(self) -> None:
        return None


class _Nccl:
    """``cupy.cuda.nccl`` for one rank."""

    available = True
    NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16 = 6, 7, 8, 9
    NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
    _OPS = (0, 1, 2, 3, 4)
    _SIZES = {6: 2, 7: 4, 8: 8, 9: 2}
    NcclCommunicator = _NcclCommunicator

    @staticmethod
    def get_unique_id() -> tuple:
        return tuple(np.random.default_rng().integers(0, 256, 128).tolist())

    @staticmethod
    def groupStart() -> None:
        return None

    @staticmethod
    def groupEnd() -> None:
        return None


nccl = _Nccl()
