"""CUDA Graphs in the stand-in: ``Stream.begin_capture``, ``end_capture`` and
``Graph.launch``, as CuPy 14.2 offers them (``cupy/cuda/stream.pyx``, ``graph.pyx``).

On a GPU, work queued on a capturing stream is not run: it becomes the nodes of a graph,
and ``Graph.launch`` runs them all again, on the same memory, in one call. Here every
top-level call of the stand-in's API made while the current stream captures (a ufunc, a
routine, an ndarray method or operator, a kernel, a cuBLAS GEMM, a draw) is recorded with
its arguments and its result, and a launch calls each again in order, copying a new
result into the recorded one's memory: the graph's nodes, by address. What CUDA refuses
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


class Graph:
    """``cupy.cuda.Graph``: the calls a capture recorded, launched again on any stream."""

    def __init__(self, calls: List[tuple], device: int) -> None:
        self._calls, self._device = calls, device

    def launch(self, stream: Any = None) -> None:
        if cuda.current_device_id() != self._device:
            raise cuda.CUDARuntimeError("cudaErrorInvalidResourceHandle: the graph belongs "
                                        f"to device {self._device}")
        use = contextlib.nullcontext() if stream is None else stream
        _depth[0] += 1
        try:
            with use:
                for call, args, kwargs, result in self._calls:
                    _copy_into(result, call(*args, **kwargs))
        finally:
            _depth[0] -= 1

    def upload(self, stream: Any = None) -> None:
        return None


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
        self.allocated: List[np.ndarray] = []
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
        capture.calls.append((call, args, kwargs, result))
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
    return Graph(capture.calls, stream.device_id)


cuda.capture_hooks.update(begin=_begin, end=_end)


@contextlib.contextmanager
def using_allocator(allocator: Any = None) -> Iterator[None]:
    """``cupy.cuda.using_allocator``: the stand-in allocates its own guarded buffers
    whatever the allocator (it never reuses memory, so a graph's buffers are never handed
    to other work); the context is accepted as CuPy's."""
    yield
