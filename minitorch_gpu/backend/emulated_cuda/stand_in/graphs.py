"""CUDA Graphs in the stand-in: ``Stream.begin_capture``, ``end_capture`` and
``Graph.launch``, as CuPy 14.2 offers them (``cupy/cuda/stream.pyx``, ``graph.pyx``).

On a GPU, work queued on a capturing stream is not run: it becomes the nodes of a graph,
and ``Graph.launch`` runs them all again, on the same memory, in one call. Here every
top-level call of the stand-in's API made while the current stream captures (a ufunc, a
routine, an ndarray method or operator, a kernel, a cuBLAS GEMM, a draw) is recorded with
its arguments and its result, each device array of them kept as its address, shape,
strides and dtype, not as a Python reference: a launch calls each again in order on the
memory at those addresses (``memory.mapped_view``), copying the new result into the
recorded one's memory. As on a GPU, nothing keeps that memory alive but its owners: a
buffer freed after the capture goes back to its pool, poisoned, and then to another
array, and a launch reads whatever lies there. What CUDA refuses
during a capture is refused: a copy back to the host (any host read), a capture on the
null stream, a second capture, and ``end_capture`` of a stream that is not capturing.

The arrays allocated during the capture (the graph's own buffers) are poisoned when it
ends (0xFF bytes: NaN, -1), as a GPU has not written them yet: a caller that reads a
result of the capture before launching the graph sees it. Writes a captured call made
into memory from before the capture (a KV cache's row) are not undone: the emulation runs
the calls while recording them, where a GPU would leave that memory as it was until the
first launch. Only a GPU confirms a graph's speed and its memory pool's behaviour.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, List, Optional

import numpy as np

from .. import memory
from . import cuda, random
from .array import ndarray

_depth = [0]  # > 0 inside a recorded call (its inner calls are its own) or a launch
_LAUNCH_SCRATCH = memory.Pool("the graph launches' scratch")


class Graph:
    """``cupy.cuda.Graph``: the calls a capture recorded, launched again on any stream."""

    def __init__(self, calls: List[tuple], device: int) -> None:
        self._calls, self._device = calls, device
        # what the capture allocated, an op's temporaries included (_end sets it): on a
        # GPU their blocks stay the graph's (its private pool keeps them)
        self._buffers: List[Any] = []

    def launch(self, stream: Any = None) -> None:
        if cuda.current_device_id() != self._device:
            raise cuda.CUDARuntimeError("cudaErrorInvalidResourceHandle: the graph belongs "
                                        f"to device {self._device}")
        use = contextlib.nullcontext() if stream is None else stream
        _depth[0] += 1
        try:
            # the calls' fresh results are the emulation's scratch, which a GPU never
            # allocates: from a pool of their own, so that none takes (and poisons, when
            # it dies) memory the graph's nodes read
            with use, memory.using_pool(_LAUNCH_SCRATCH):
                for call, args, kwargs, result in self._calls:
                    new = call(*_at_addresses(args), **_at_addresses(kwargs))
                    _copy_into(_at_addresses(result), new)
        finally:
            _depth[0] -= 1

    def upload(self, stream: Any = None) -> None:
        return None


class _Address:
    """A device array as a graph node holds it: where its elements lie, no reference."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "device")

    def __init__(self, array: ndarray) -> None:
        view = array._view
        self.ptr = view.__array_interface__["data"][0]
        self.shape, self.strides, self.dtype = view.shape, view.strides, view.dtype
        self.device = array._device

    def array(self) -> ndarray:
        return ndarray._of(memory.mapped_view(self.ptr, self.shape, self.strides,
                                              self.dtype), self.device)


def _replace(value: Any, kind: type, replacement: Callable[[Any], Any]) -> Any:
    """``value`` with each ``kind`` in it (in tuples, lists, dicts, slices) replaced."""
    if isinstance(value, kind):
        return replacement(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_replace(v, kind, replacement) for v in value)
    if isinstance(value, dict):
        return {k: _replace(v, kind, replacement) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(*(_replace(v, kind, replacement)
                       for v in (value.start, value.stop, value.step)))
    return value


def _by_address(value: Any) -> Any:
    """``value`` with each device array in it replaced by its ``_Address``."""
    return _replace(value, ndarray, _Address)


def _at_addresses(value: Any) -> Any:
    """``_by_address`` undone: each ``_Address`` an array of the memory there now."""
    return _replace(value, _Address, _Address.array)


def _copy_into(recorded: Any, new: Any) -> None:
    """A launch's result of one call into the memory of the capture's result."""
    if isinstance(recorded, ndarray) and isinstance(new, ndarray):
        recorded._view[...] = new._view  # a view's call gives its own memory: a no-op copy
    elif isinstance(recorded, (tuple, list)) and isinstance(new, (tuple, list)):
        for r, n in zip(recorded, new):
            _copy_into(r, n)


class Capture:
    """One stream's capture: the calls recorded so far and the buffers allocated (held
    until the capture ends, to be poisoned then)."""

    def __init__(self) -> None:
        self.calls: List[tuple] = []
        self.allocated: List[Any] = []  # held by the graph: its nodes read them
        # the random streams' states: a GPU runs no draw while capturing, the stand-in
        # does, so they are put back when the capture ends (the launches draw)
        self.rng_states = [(g, g._state._view.copy()) for g in list(random.live)]

    def allocated_array(self, array: np.ndarray) -> None:
        self.allocated.append(array)




def capturing() -> Optional[Capture]:
    """The capture of the current stream, or None."""
    return getattr(cuda.get_current_stream(), "_capture", None)


def recorded(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call``, recorded into the current stream's capture when one is under way (its
    own inner calls are part of it, not recorded again)."""
    @functools.wraps(call)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _depth[0]:
            return call(*args, **kwargs)
        capture = capturing()
        if capture is None:
            return call(*args, **kwargs)
        _depth[0] += 1
        try:
            result = call(*args, **kwargs)
        finally:
            _depth[0] -= 1
        capture.calls.append((call, _by_address(args), _by_address(kwargs),
                              _by_address(result)))
        return result
    wrapper.__wrapped_for_graphs__ = True
    return wrapper


def record_methods(cls: type, names: Any) -> None:
    """Wrap ``cls``'s methods ``names`` with ``recorded`` (once)."""
    for name in names:
        method = cls.__dict__.get(name)
        if callable(method) and not getattr(method, "__wrapped_for_graphs__", False):
            setattr(cls, name, recorded(method))


def _begin(stream: Any) -> Capture:
    capture = Capture()
    memory.allocation_watchers.append(capture.allocated_array)
    return capture


def _end(stream: Any, capture: Capture) -> Graph:
    memory.allocation_watchers.remove(capture.allocated_array)
    for array in capture.allocated:  # not written yet on a GPU: poisoned until a launch
        array.reshape(-1).view(np.uint8)[...] = 0xFF
    for generator, state in capture.rng_states:
        generator._state._view[...] = state
    graph = Graph(capture.calls, stream.device_id)
    graph._buffers = capture.allocated
    return graph


cuda.capture_hooks.update(begin=_begin, end=_end)


@contextlib.contextmanager
def using_allocator(allocator: Any = None) -> Iterator[None]:
    """``cupy.cuda.using_allocator``: inside, new arrays come from the pool whose
    ``malloc`` is ``allocator`` (a graph's private pool); None or another allocator: the
    default pool."""
    owner = getattr(allocator, "__self__", None)
    pool = owner._pool if isinstance(owner, cuda.MemoryPool) else memory.DEFAULT_POOL
    with memory.using_pool(pool):
        yield
