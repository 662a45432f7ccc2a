"""Device buffers of the emulated GPU: NumPy arrays whose last byte sits flush against a
page the process may not touch, so a kernel that reads or writes one element past the end
faults at once (and ``launch.py`` names the buffer) instead of corrupting a neighbour.

``empty`` fills a new buffer with 0xFF bytes (NaN in every float dtype, -1 in every integer
one), as CUDA promises nothing about fresh memory: an output element a kernel forgot to
write shows up in the results. Only the end is guarded: an index before the start reads
the poisoned rest of the first page rather than faulting.
"""
from __future__ import annotations

import bisect
import ctypes
import mmap
import threading
import weakref
from typing import Any, Dict, Optional, Tuple

import numpy as np

__all__ = ["Buffer", "bytes_in_use", "empty", "find_buffer", "is_device_array", "to_device"]

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
PROT_NONE = 0

_buffers: Dict[int, "Buffer"] = {}  # by first data address
allocation_watchers: list = []  # called with each new array (a graph capture's)
_starts: list = []  # the keys of _buffers, sorted: find_buffer bisects them
_lock = threading.Lock()


class Buffer:
    """One allocation: ``start`` .. ``stop`` the data, ``stop`` .. ``guard_stop`` the
    guard page (``stop`` is page-aligned, so the guard starts right at the data's end)."""

    def __init__(self, start: int, stop: int, dtype: np.dtype, shape: Tuple[int, ...]):
        self.start, self.stop, self.guard_stop = start, stop, stop + PAGE
        self.dtype, self.shape = dtype, shape

    def describe(self) -> str:
        return (f"a buffer of {int(np.prod(self.shape, dtype=np.int64))} {self.dtype.name} "
                f"({self.stop - self.start} bytes)")


def empty(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    """A new device array of ``shape`` and ``dtype``, poisoned (0xFF bytes), its end flush
    against a guard page."""
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"emulated device: negative dimensions in shape {shape}")
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    data_pages = max(1, -(-nbytes // PAGE))
    region = mmap.mmap(-1, (data_pages + 1) * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    stop = base + data_pages * PAGE
    if _libc.mprotect(stop, PAGE, PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "emulated device: mprotect of a guard page failed")
    offset = data_pages * PAGE - nbytes
    # the slack before the data too: a read at index -1 finds NaN, not a plausible 0.0
    np.frombuffer(region, dtype=np.uint8, count=data_pages * PAGE)[:] = 0xFF
    array = np.frombuffer(region, dtype=dtype, count=count, offset=offset).reshape(shape)
    buffer = Buffer(stop - nbytes, stop, dtype, shape)
    with _lock:
        _buffers[buffer.start] = buffer
        bisect.insort(_starts, buffer.start)
    weakref.finalize(region, _forget, buffer.start)
    for watcher in allocation_watchers:
        watcher(array)
    return array


def _forget(start: int) -> None:
    with _lock:
        if _buffers.pop(start, None) is not None:
            del _starts[bisect.bisect_left(_starts, start)]


def find_buffer(address: int) -> Optional[Buffer]:
    """The live buffer whose data or guard page holds ``address``, or None."""
    with _lock:
        at = bisect.bisect_right(_starts, address) - 1
        if at < 0:
            return None
        buffer = _buffers[_starts[at]]
    return buffer if address < buffer.guard_stop else None


def is_device_array(array: Any) -> bool:
    """Whether ``array`` is a NumPy array (or a view) whose elements lie in one emulated
    device buffer."""
    if not isinstance(array, np.ndarray):
        return False
    if array.size == 0:
        return find_buffer(array.__array_interface__["data"][0]) is not None
    low, high = _byte_bounds(array)
    buffer = find_buffer(low)
    return buffer is not None and high <= buffer.stop


def _byte_bounds(array: np.ndarray) -> Tuple[int, int]:
    try:
        from numpy.lib.array_utils import byte_bounds  # NumPy 2
    except ImportError:  # NumPy 1.26
        byte_bounds = np.byte_bounds
    return byte_bounds(array)


def bytes_in_use() -> int:
    """The data bytes of every live buffer (the emulated memory pool's ``used_bytes``)."""
    with _lock:
        return sum(b.stop - b.start for b in _buffers.values())


def copy_bytes(destination: int, source: int, nbytes: int) -> None:
    """``nbytes`` from address ``source`` to ``destination``, both inside live buffers."""
    for address in (source, destination):
        buffer = find_buffer(address)
        if buffer is None or address + nbytes > buffer.stop:
            raise ValueError(f"emulated device: a copy of {nbytes} bytes at 0x{address:x} "
                             f"runs outside every device buffer")
    ctypes.memmove(destination, source, nbytes)


def to_device(array: Any, dtype: Any = None) -> np.ndarray:
    """A device copy of ``array`` (C order), in ``dtype`` if given."""
    host = np.asarray(array, dtype=dtype)
    out = empty(host.shape, host.dtype)
    out[...] = host
    return out
