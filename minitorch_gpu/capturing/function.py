"""``CapturedFunction``: a function captured on its first call per input signature and
replayed on the next ones (the package's docstring says what that means)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, List, Optional, Sequence

from .. import amp, autograd
from .. import tensor as tensor_module
from ..backend import Backend
from ..tensor import Tensor
from .recorder import _INPUT, CaptureError, _Recorder
from .replay import _Capture, _flatten, _GraphCapture, _rebuild


def is_capturing() -> bool:
    """Whether a function is being captured now (its ops recorded)."""
    return autograd._recorder is not None


class CapturedFunction:
    """``capture(fn)``: call it as ``fn``; see the module's docstring. ``captures`` counts
    the calls that ran eagerly to record, ``replays`` the calls that replayed."""

    def __init__(self, fn: Callable[..., Any], max_captures: int = 4,
                 name: Optional[str] = None, cuda_graphs: bool = True) -> None:
        if not callable(fn):
            raise TypeError(f"capture: expected a function, got {type(fn).__name__}")
        if isinstance(max_captures, bool) or not isinstance(max_captures, int) or \
                max_captures < 1:
            raise ValueError(f"capture: max_captures must be an int >= 1, got "
                             f"{max_captures!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", type(fn).__name__)
        self.max_captures = max_captures
        self.cuda_graphs = bool(cuda_graphs)  # on a GPU, a CUDA Graph per capture
        self._captures: "OrderedDict[tuple, _Capture]" = OrderedDict()
        self.captures = 0
        self.replays = 0

    def __repr__(self) -> str:
        return (f"CapturedFunction({self.name}, {len(self._captures)} held, "
                f"{self.captures} captured, {self.replays} replayed)")

    @property
    def nbytes(self) -> int:
        """Bytes of the op results of every capture held: what one replay of each
        allocates, at most."""
        return sum(c.nbytes for c in self._captures.values())

    @property
    def ops(self) -> int:
        """Ops in the newest capture's program (0 before the first call)."""
        return len(next(reversed(self._captures.values())).program) if self._captures else 0

    def op_names(self) -> List[str]:
        """The Functions the newest capture replays, in order."""
        return next(reversed(self._captures.values())).op_names if self._captures else []

    def reset(self) -> None:
        """Drop every capture: the next call captures again."""
        self._captures.clear()

    def __call__(self, *inputs: Tensor) -> Any:
        key = self._key(inputs)
        held = self._captures.get(key)
        if held is not None and not held.is_stale():
            self._captures.move_to_end(key)
            self.replays += 1
            arrays = [t.data for t in inputs]
            device = held.backend._cuda_device
            if device is None:
                out = held.replay(arrays)
            else:
                with device:
                    out = held.replay(arrays)
            backend = held.backend
            return _rebuild(held.structure, iter([Tensor._make(a, backend, False) for a in out]))
        return self._capture(key, inputs)

    def _key(self, inputs: Sequence[Tensor]) -> tuple:
        key = []
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor):
                raise TypeError(f"{self.name}: a captured function takes Tensors; argument "
                                f"{i} is {type(t).__name__} (pass numbers that change as "
                                f"tensors; fixed ones belong inside the function)")
            key.append((t.shape, t.dtype, t._backend.device))
        # the modes an op reads as Python state, fixed in a capture as its constants are
        return (autograd.is_grad_enabled(), amp.autocast_dtype(), tuple(key))

    def _capture(self, key: tuple, inputs: Sequence[Tensor]) -> Any:
        if autograd._recorder is not None:
            raise CaptureError(f"{self.name}: called while another function is being "
                               f"captured; capture the outer function only")
        if autograd.is_grad_enabled() and any(t.requires_grad for t in inputs):
            raise CaptureError(f"{self.name}: inputs require grad with grad mode on: a "
                               f"replay builds no graph, so run it under no_grad()")
        if not inputs:
            raise CaptureError(f"{self.name}: a captured function needs at least one tensor "
                               f"input (its device and the replay's arguments)")
        graph = inputs[0]._backend._cuda_device is not None and self.cuda_graphs
        recorder = _Recorder(self.name, keep_arrays=graph)
        for i, t in enumerate(inputs):
            if id(t.data) in recorder.origin:
                raise CaptureError(f"{self.name}: argument {i} is the same array as an "
                                   f"earlier argument; pass distinct tensors")
            recorder._note(t.data, (_INPUT, i))
        backends = {t._backend for t in inputs}
        if len(backends) != 1:
            raise CaptureError(f"{self.name}: inputs on several devices "
                               f"({sorted(str(b.device) for b in backends)}); a capture "
                               f"runs on one")
        (backend,) = backends
        if backend._cuda_device is not None and self.cuda_graphs:
            with backend._cuda_device:
                result, capture, outputs = self._capture_graph(recorder, inputs, backend)
        else:
            _install(recorder)
            try:
                result = self.fn(*inputs)
                outputs: list = []
                structure = _flatten(result, outputs, "the result")
                capture = _Capture(recorder, inputs, outputs, structure, backend)
            finally:
                _install(None)
        if autograd.is_grad_enabled() and any(t.requires_grad for t, _ in outputs):
            raise CaptureError(f"{self.name}: the result requires grad (grad mode is on and "
                               f"it depends on parameters); a replay builds no graph, so "
                               f"call the captured function under no_grad()")
        self.captures += 1
        self._captures.pop(key, None)
        self._captures[key] = capture
        while len(self._captures) > self.max_captures:
            self._captures.popitem(last=False)
        return result


    def _capture_graph(self, recorder: _Recorder, inputs: Sequence[Tensor],
                       backend: Backend) -> tuple:
        """The call run once on a capturing stream (recorded by the ops as on the CPU,
        and by CUDA as a graph), then launched for its results."""
        cuda = backend.xp.cuda
        buffers = [t.data.copy() for t in inputs]  # the graph's own input buffers
        for i, buffer in enumerate(buffers):
            recorder._note(buffer, (_INPUT, i))
        own = [Tensor._make(b, backend, False) for b in buffers]
        stream = cuda.Stream(non_blocking=True)
        stream.wait_event(cuda.get_current_stream().record())  # the copies in, first
        pool = cuda.MemoryPool()
        outputs: list = []
        # the checks pending now are read first: a check of the same op captured later
        # would fold its new values into their arrays, which the graph does not own
        backend.raise_deferred_errors()
        backend.prepare_to_capture()  # what CUDA may not create while a stream captures
        checks = backend._deferred_checks
        pending = dict(checks._pending)  # a failed capture's checks would read its buffers
        with cuda.using_allocator(pool.malloc), stream:
            stream.begin_capture()
            _install(recorder)
            try:
                result = self.fn(*own)
                structure = _flatten(result, outputs, "the result")
                program = _Capture(recorder, own, outputs, structure, backend)
            except BaseException:
                _install(None)
                checks._pending = pending
                try:
                    stream.end_capture()
                except Exception:  # noqa: BLE001 - the capture is void either way; the
                    pass  # error raised is the one that named the op, not end_capture's
                raise
            _install(None)
            graph = stream.end_capture()
        arrays = [t.data for t, _ in outputs]
        # the checks the call made belong to the graph: read after each of its launches
        capture = _GraphCapture(recorder, program, graph, stream, pool, buffers, arrays,
                                checks.take())
        capture.launch()  # the first call's results: the capture ran nothing
        fresh = iter([Tensor._make(a.copy(), backend, False) for a in arrays])
        return _rebuild(structure, fresh), capture, outputs


def _install(recorder: Optional[_Recorder]) -> None:
    autograd._recorder = recorder
    tensor_module._capture_hook = recorder
    Backend.capture_hook = recorder


def capture(fn: Optional[Callable[..., Any]] = None, *, max_captures: int = 4) -> Any:
    """``fn`` captured on its first call and replayed on the next ones with inputs of the
    same shapes, dtypes and device (see the module's docstring). A decorator too::

        @mt.capture
        def step(x):
            return model(x)[0]
    """
    if fn is None:
        return lambda f: CapturedFunction(f, max_captures)
    return CapturedFunction(fn, max_captures)
