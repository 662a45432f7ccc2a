"""Device buffers of the emulated GPU: NumPy arrays whose last byte sits flush against a
page the process may not touch, so a kernel that reads or writes one element past the end
faults at once (and ``launch.py`` names the buffer) instead of corrupting a neighbour.

``empty`` fills a new buffer with 0xFF bytes (NaN in every float dtype, -1 in every integer
one), as CUDA promises nothing about fresh memory: an output element a kernel forgot to
write shows up in the results. Only the end is guarded: an index before the start reads
the poisoned rest of the first page rather than faulting.

Memory comes from pools, as CuPy's does (``cupy/cuda/memory.pyx``): when the last view of
a buffer dies, its pages are poisoned again and go back to the pool it came from, which
hands them to the next allocation of the same size (on the same device). So something
that still reads a dead buffer by its address, as a CUDA Graph's kernels do, reads poison
or another array's values, as on a GPU. A pool of one's own (``Pool()``, made current by
``using_pool``: a graph's private pool) keeps its pages from every other pool's
allocations. Pages go back to the process only by ``Pool.free_all_blocks``; an address in
no mapped page is what ``mapped_view`` refuses as CUDA's illegal address.
"""
from __future__ import annotations

import bisect
import contextlib
import ctypes
import mmap
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

__all__ = ["Buffer", "DEFAULT_POOL", "Pool", "bytes_in_use", "empty", "find_buffer",
           "is_device_array", "mapped_view", "to_device", "using_pool"]

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
PROT_NONE = 0

_buffers: Dict[int, "Buffer"] = {}  # the live buffers, by first data address
allocation_watchers: list = []  # called with each new array (a graph capture's)
_starts: list = []  # the keys of _buffers, sorted: find_buffer bisects them
_regions: Dict[int, "_Region"] = {}  # every mapped region, live or free, by its base
_bases: list = []  # the keys of _regions, sorted
_lock = threading.RLock()  # a finalizer may run while the lock is held (a dropped view)
# the device an allocation is made on: stand_in/cuda.py puts its current device here
current_device: List[Callable[[], int]] = [lambda: 0]


class Buffer:
    """One allocation: ``start`` .. ``stop`` the data, ``stop`` .. ``guard_stop`` the
    guard page (``stop`` is page-aligned, so the guard starts right at the data's end)."""

    def __init__(self, start: int, stop: int, dtype: np.dtype, shape: Tuple[int, ...],
                 pool: "Pool", device: int):
        self.start, self.stop, self.guard_stop = start, stop, stop + PAGE
        self.dtype, self.shape, self.pool, self.device = dtype, shape, pool, device

    def describe(self) -> str:
        return (f"a buffer of {int(np.prod(self.shape, dtype=np.int64))} {self.dtype.name} "
                f"({self.stop - self.start} bytes)")


class _Region:
    """``pages`` data pages and a guard page, mapped once and reused by its pool."""

    def __init__(self, pages: int) -> None:
        self.pages = pages
        self.map = mmap.mmap(-1, (pages + 1) * PAGE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.stop = self.base + pages * PAGE
        if _libc.mprotect(self.stop, PAGE, PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "emulated device: mprotect of a guard page "
                                              "failed")

    def poison(self) -> None:
        np.frombuffer(self.map, dtype=np.uint8, count=self.pages * PAGE)[:] = 0xFF


class Pool:
    """A memory pool: its free regions by (device, data pages), reused exactly."""

    def __init__(self, name: str = "a pool") -> None:
        self.name = name
        self._free: Dict[Tuple[int, int], List[_Region]] = {}

    def _take(self, device: int, pages: int) -> _Region:
        free = self._free.get((device, pages))
        if free:
            return free.pop()
        region = _Region(pages)
        with _lock:
            _regions[region.base] = region
            bisect.insort(_bases, region.base)
        return region

    def _give_back(self, device: int, region: _Region) -> None:
        region.poison()
        self._free.setdefault((device, region.pages), []).append(region)

    def used_bytes(self, device: Optional[int] = None) -> int:
        """The data bytes of this pool's live buffers on ``device`` (every device: None)."""
        with _lock:
            return sum(b.stop - b.start for b in _buffers.values()
                       if b.pool is self and (device is None or b.device == device))

    def free_bytes(self, device: Optional[int] = None) -> int:
        """The bytes of the regions this pool holds free for reuse."""
        return sum(len(regions) * pages * PAGE for (d, pages), regions in self._free.items()
                   if device is None or d == device)

    def total_bytes(self, device: Optional[int] = None) -> int:
        return self.used_bytes(device) + self.free_bytes(device)

    def free_all_blocks(self) -> None:
        """Unmap the free regions: an address in one is no device memory any more."""
        with _lock:
            for key, regions in list(self._free.items()):
                kept = []
                for region in regions:
                    try:
                        region.map.close()
                    except BufferError:  # a mapped_view of it is alive: stays mapped
                        kept.append(region)
                        continue
                    del _regions[region.base]
                    del _bases[bisect.bisect_left(_bases, region.base)]
                self._free[key] = kept


DEFAULT_POOL = Pool("the default pool")
_current = threading.local()  # .pools: the stack using_pool pushes


def current_pool() -> Pool:
    pools = getattr(_current, "pools", None)
    return pools[-1] if pools else DEFAULT_POOL


@contextlib.contextmanager
def using_pool(pool: Pool) -> Iterator[None]:
    """Allocate from ``pool`` inside (this host thread only, as CuPy's allocators)."""
    pools = getattr(_current, "pools", None)
    if pools is None:
        pools = _current.pools = []
    pools.append(pool)
    try:
        yield
    finally:
        pools.pop()


def empty(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    """A new device array of ``shape`` and ``dtype`` from the current pool, poisoned (0xFF
    bytes), its end flush against a guard page."""
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"emulated device: negative dimensions in shape {shape}")
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    pages = max(1, -(-nbytes // PAGE))
    pool, device = current_pool(), current_device[0]()
    region = pool._take(device, pages)
    # the slack before the data too: a read at index -1 finds NaN, not a plausible 0.0
    region.poison()
    offset = pages * PAGE - nbytes
    owner = np.frombuffer(region.map, dtype=dtype, count=count, offset=offset)
    array = owner.reshape(shape)  # every view's base is owner: it dies with the last one
    buffer = Buffer(region.stop - nbytes, region.stop, dtype, shape, pool, device)
    with _lock:
        _buffers[buffer.start] = buffer
        bisect.insort(_starts, buffer.start)
    weakref.finalize(owner, _release, buffer, region)
    for watcher in allocation_watchers:
        watcher(array)
    return array


def _release(buffer: Buffer, region: _Region) -> None:
    """The last view of ``buffer`` died: its region poisoned and back to its pool."""
    with _lock:
        if _buffers.get(buffer.start) is buffer:
            del _buffers[buffer.start]
            del _starts[bisect.bisect_left(_starts, buffer.start)]
        if region.base in _regions:  # not unmapped meanwhile
            buffer.pool._give_back(buffer.device, region)


def mapped_view(address: int, shape: Tuple[int, ...], strides: Tuple[int, ...],
                dtype: np.dtype) -> np.ndarray:
    """The memory at ``address`` as an array, whether a live buffer holds it or not (a
    freed one reads poison or its next owner's values): what a kernel reading that
    address reads. An address in no mapped region raises, as CUDA's illegal address."""
    dtype = np.dtype(dtype)
    if 0 in shape:
        return np.empty(shape, dtype)
    low = address + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    high = address + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + dtype.itemsize
    with _lock:
        at = bisect.bisect_right(_bases, low) - 1
        region = _regions[_bases[at]] if at >= 0 else None
    if region is None or high > region.stop:
        raise RuntimeError(f"cudaErrorIllegalAddress: {high - low} bytes at 0x{low:x} lie in "
                           f"no device memory (freed back to the driver)")
    return np.ndarray(shape, dtype, buffer=region.map, offset=address - region.base,
                      strides=strides)


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
    """The data bytes of every live buffer, in every pool and on every device."""
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
