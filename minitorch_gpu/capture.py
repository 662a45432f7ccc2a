"""Capture and replay: a function over tensors run once while its ops are recorded, then
replayed as a flat list of ``Function.forward`` calls on raw arrays.

An eager op costs the Python around its arithmetic: argument checks, dispatch, a Tensor, a
graph node. For a model's decode step (one token through every layer) that is most of the
time on small models, and the same work repeats for every token with the same shapes. A
captured function pays it once::

    step = mt.capture(lambda token, pos: model.decode_step(token, pos, cache))
    logits = step(token, pos)        # first call: runs eagerly and records its ops
    logits = step(token2, pos2)      # later calls: the recorded forwards, nothing else

What is recorded is the sequence of ``Function.apply`` calls (every op's way into the
engine): which forward, its ``ctx``, and where each argument comes from: an input of the
call, the output of an earlier op, or a constant (a parameter's array, a KV cache buffer,
a number, an array made by a factory such as ``arange``). A replay runs those forwards in
order on the new inputs' arrays: no Tensor, no node, no check is built. Arrays that live
outside the call (parameters, caches) are read and written where they are, so a replay
sees their current values and an op that writes into a cache writes into it again.

What a replay cannot do faithfully is refused when capturing, with an error that names it
(``CaptureError``):

* a host read outside an op (``item()``, ``tolist()``, ``bool(t)``, ``.numpy()``, an op
  that reads a size back): its value would be frozen into the replay, and a Python branch
  on it would never be taken again;
* a random draw outside an op (``randn``...): its numbers would be the same every time.
  Random ops (dropout, ``multinomial``) draw inside their forward, so each replay draws
  fresh numbers from the seeded stream, the same ones eager calls would draw;
* an array computed outside an op (a shortcut that wraps a new array in a Tensor without a
  node), or an in-place update outside one (``add_``, ``t[i] = v``): the replay would not
  redo it.

Python values the function computes (ints, floats, a slice bound) are constants of the
capture: anything that changes from call to call must be a tensor input. A call whose
inputs differ in shape, dtype or device from every capture so far is captured again (up
to ``max_captures``, the oldest dropped); a parameter whose array was replaced (``load_
state_dict`` into new arrays, ``.to()``) makes the capture stale and it is captured again.
A replay never waits for the device or reads a value back unless an op's forward does.

On the CPU a replay's ops allocate their results as eagerly run ones do; the arrays of one
replay are at most those of the captured call (``nbytes``), freed when the next replay
starts except the outputs handed back. On a GPU a capture is a CUDA Graph
(``_GraphCapture``): the capturing call runs on a capturing stream, and a replay is one
``Graph.launch`` between copies of the inputs in and the results out (docs/DESIGN.md,
"Capture and replay").
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from operator import itemgetter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import amp, autograd
from . import tensor as tensor_module
from .backend import Backend
from .tensor import Tensor

__all__ = ["capture", "CapturedFunction", "CaptureError", "is_capturing"]


class CaptureError(RuntimeError):
    """A captured function did something a replay could not repeat."""


def is_capturing() -> bool:
    """Whether a function is being captured now (its ops recorded)."""
    return autograd._recorder is not None


# --- the recorder -------------------------------------------------------------------------
_INPUT, _OP, _CONSTANT = "input", "op", "constant"


class _Recorder:
    """What one capturing call installs: autograd's ``_recorder`` (every ``Function.apply``
    outside a forward), the tensor module's hooks (arrays wrapped and in-place updates
    outside an op) and the backends' (host reads and random draws outside an op)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.depth = 0  # > 0 while an op's forward runs: what it does is its own
        self.program: List[tuple] = []  # (forward, ctx, arg sources, kwargs)
        self.origin: Dict[int, tuple] = {}  # id(array) -> (kind, index or name)
        self.keep: List[Any] = []  # every array an id above refers to, kept alive
        self.bound: List[Tuple[Tensor, Any]] = []  # external tensors and their arrays
        self.bound_ids: set = set()
        self.constants: List[Any] = []
        self.nbytes = 0

    # called by Function.apply in place of cls.forward
    def forward(self, cls: type, ctx: Any, args: tuple, arrays: list, kwargs: dict) -> Any:
        if self.depth:  # an op inside an op: the outer op's forward redoes it
            return cls.forward(ctx, *arrays, **kwargs)
        sources = [self._source(cls, arg, array) for arg, array in zip(args, arrays)]
        self.depth += 1
        try:
            out = cls.forward(ctx, *arrays, **kwargs)
        finally:
            self.depth -= 1
        if isinstance(out, np.generic):
            out = np.asarray(out)
        index = len(self.program)
        self.program.append((cls.forward, ctx, tuple(sources), kwargs, cls.__name__,
                             cls.returns_view))
        self._note(out, (_OP, index))
        self.nbytes += int(getattr(out, "nbytes", 0))
        return out

    def _source(self, cls: type, arg: Any, array: Any) -> tuple:
        """Where argument ``arg`` of an op comes from: an input, an earlier op, or a
        constant of the capture."""
        if isinstance(arg, Tensor):
            origin = self.origin.get(id(array))
            if origin is None:  # made before the capture: a parameter, a buffer, a cache
                if id(arg) not in self.bound_ids:
                    self.bound_ids.add(id(arg))
                    self.bound.append((arg, array))
                return (_CONSTANT, self._constant(array))
        elif _is_array(arg):  # a raw array handed to an op (an index's .data)
            origin = self.origin.get(id(arg))
            if origin is None:  # computed outside any op from who knows what
                raise CaptureError(
                    f"{self.where}: {cls.__name__} is given an array that no op, input or "
                    f"factory of the capture made ({_caller_outside()}); a replay could not "
                    f"tell whether it changes. Hand the op a Tensor")
        else:  # a number, a dtype, a function: fixed by the caller
            return (_CONSTANT, self._constant(arg))
        kind, what = origin
        if kind == "unrecorded":
            raise CaptureError(
                f"{self.where}: {cls.__name__} reads an array that {what} computed outside "
                f"an op (no Function recorded it), so a replay would hand it the captured "
                f"values again; compute it with ops, or pass it in as an input")
        if kind == _CONSTANT:
            return (_CONSTANT, self._constant(array))
        return origin

    def _constant(self, value: Any) -> int:
        self.constants.append(value)
        return len(self.constants) - 1

    def _note(self, array: Any, origin: tuple) -> None:
        self.origin[id(array)] = origin
        self.keep.append(array)

    # tensor.py's hooks
    def made(self, t: Tensor) -> None:
        """A Tensor was wrapped around an array: by an op (apply notes it itself), by a
        factory (a constant), or by something else (refused once an op reads it)."""
        if self.depth or id(t.data) in self.origin:
            return
        caller = sys._getframe(2).f_code
        if caller in _FACTORY_CODES:
            self._note(t.data, (_CONSTANT, None))
        else:
            self._note(t.data, ("unrecorded", f"{caller.co_qualname} ({_short(caller)})"))

    def updated(self, t: Tensor) -> None:
        """An in-place update outside an op (``add_``, ``t[i] = v``, ``copy_``...)."""
        if self.depth:
            return
        caller = sys._getframe(2).f_code
        raise CaptureError(f"{self.where}: {caller.co_qualname} updates a tensor in place "
                           f"outside an op, which a replay would not redo; write it as an op "
                           f"(out-of-place) or do it outside the captured function")

    # the backends' hooks
    def host_read(self, backend: Backend) -> None:
        if self.depth:
            return
        raise CaptureError(f"{self.where}: {_caller_outside()} reads a value back to the host "
                           f"({backend.device}); a replay would keep the captured value and "
                           f"any Python decision made on it. Keep the value on the device "
                           f"(ops instead of item(), bool() or tolist()), or read it outside "
                           f"the captured function")

    def random_draw(self, backend: Backend, what: str) -> None:
        if self.depth:
            return
        raise CaptureError(f"{self.where}: {_caller_outside()} draws random numbers "
                           f"({what}) outside an op; a replay would reuse them. Random ops "
                           f"(dropout, multinomial) draw inside their forward and are "
                           f"replayed with fresh numbers")

    def source_of_output(self, value: Any, path: str) -> tuple:
        if not isinstance(value, Tensor):
            raise CaptureError(f"{self.where}: the function returned {type(value).__name__} "
                               f"at {path}; a captured function returns Tensors (or a "
                               f"tuple or list of them)")
        origin = self.origin.get(id(value.data))
        if origin is None or origin[0] == _CONSTANT:
            return (_CONSTANT, self._constant(value.data))
        if origin[0] == "unrecorded":
            raise CaptureError(f"{self.where}: the output at {path} was computed by "
                               f"{origin[1]} outside an op; a replay would return the captured "
                               f"values")
        return origin


def _is_array(value: Any) -> bool:
    return hasattr(value, "__array_interface__") or hasattr(value, "__cuda_array_interface__")


def _short(code: Any) -> str:
    parts = code.co_filename.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) + f":{code.co_firstlineno}"


def _caller_outside() -> str:
    """The first function outside the engine's plumbing (tensor, backend, capture)."""
    frame = sys._getframe(2)
    skip = ("/backend/", "/capture.py", "/tensor.py", "/tensor_math.py")
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if not any(s in name for s in skip):
            return f"{frame.f_code.co_qualname} ({_short(frame.f_code)})"
        frame = frame.f_back
    return "a caller"


def _factory_codes() -> frozenset:
    from . import creation
    return frozenset({creation._finish.__code__, Tensor.__new__.__code__})


_FACTORY_CODES: frozenset = frozenset()


# --- the captured function ----------------------------------------------------------------
class _Capture:
    """One recorded call: the program and where its inputs and outputs sit.

    Every value the program touches has a slot: the constants first, then the inputs,
    then one per op's result. A view whose result nothing reads is left out of the
    program (an argument check's slice, say): a view has no effect but its result."""

    def __init__(self, recorder: _Recorder, inputs: Sequence[Tensor], outputs: list,
                 structure: Any, backend: Backend) -> None:
        n_const, n_in = len(recorder.constants), len(inputs)

        def slot(source: tuple) -> int:
            kind, what = source
            if kind == _CONSTANT:
                return what
            if kind == _INPUT:
                return n_const + what
            return n_const + n_in + what

        output_sources = [recorder.source_of_output(t, p) for t, p in outputs]
        read = {slot(s) for s in output_sources}
        kept = []
        for i in reversed(range(len(recorder.program))):  # last first: who reads what
            forward, ctx, sources, kwargs, name, is_view = recorder.program[i]
            target = n_const + n_in + i
            if is_view and target not in read:
                continue
            read.update(slot(s) for s in sources)
            kept.append((forward, ctx, tuple(slot(s) for s in sources), kwargs, target, name))
        kept.reverse()
        self.template = list(recorder.constants) + [None] * (n_in + len(recorder.program))
        self.program = [(forward, ctx, _getter(sources), kwargs or None, target)
                        for forward, ctx, sources, kwargs, target, _ in kept]
        self.op_names = [name for *_, name in kept]
        self.input_slots = tuple(n_const + i for i in range(n_in))
        self.output_slots = tuple(slot(s) for s in output_sources)
        self.structure = structure
        self.bound = recorder.bound
        self.backend = backend
        self.nbytes = recorder.nbytes

    def is_stale(self) -> bool:
        """A tensor the program reads from outside holds another array now."""
        for t, array in self.bound:
            if t.data is not array:
                return True
        return False

    def replay(self, arrays: Sequence[Any]) -> list:
        slots = self.template.copy()
        for i, array in zip(self.input_slots, arrays):
            slots[i] = array
        generic = np.generic
        for forward, ctx, arguments, kwargs, target in self.program:
            if kwargs is None:  # most ops: no ** to build
                out = forward(ctx, *arguments(slots))
            else:
                out = forward(ctx, *arguments(slots), **kwargs)
            if type(out) is not np.ndarray and isinstance(out, generic):
                out = np.asarray(out)  # NumPy's 0-d results are scalars; keep arrays
            slots[target] = out
        return [slots[s] for s in self.output_slots]


def _getter(sources: tuple) -> Callable[[list], tuple]:
    """A function of the slots giving an op's arguments as a tuple (itemgetter: C)."""
    if len(sources) == 1:
        (only,) = sources
        return lambda slots: (slots[only],)
    if not sources:
        return lambda slots: ()
    return itemgetter(*sources)


class _GraphCapture:
    """On a GPU: the call captured as a CUDA Graph (CuPy's ``Stream.begin_capture`` /
    ``end_capture``), so that a replay is one ``Graph.launch``. The graph reads its
    inputs from buffers of its own (the caller's arrays are copied in, never written) and
    allocates from a memory pool of its own, held with it: its buffers are never handed
    to other work between launches. Its results are copied out of its buffers, which the
    next launch overwrites. ``program`` is the op list recorded beside it (what the
    graph's kernels do, for ``op_names``)."""

    def __init__(self, recorder: _Recorder, program: _Capture, graph: Any, stream: Any,
                 pool: Any, buffers: list, outputs: list) -> None:
        self.program = program.program
        self.op_names = program.op_names
        self.structure, self.bound, self.backend = program.structure, recorder.bound, \
            program.backend
        self.nbytes = recorder.nbytes
        self.graph, self.stream, self.pool = graph, stream, pool
        self.buffers, self.outputs = buffers, outputs
        self.keep = recorder.keep  # every array the graph's kernels were given
        self.rng = program.backend.random_stream()  # the draws' state the graph reads

    def is_stale(self) -> bool:
        """A bound tensor holds another array, or the random stream was replaced
        (``manual_seed``): the graph would read the old one."""
        return self.backend.random_stream() is not self.rng or _Capture.is_stale(self)

    def replay(self, arrays: Sequence[Any]) -> list:
        for buffer, array in zip(self.buffers, arrays):
            buffer[...] = array
        self.graph.launch()  # on the current stream, after the copies in
        return [out.copy() for out in self.outputs]


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
        global _FACTORY_CODES
        if not _FACTORY_CODES:
            _FACTORY_CODES = _factory_codes()
        recorder = _Recorder(self.name)
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
        with cuda.using_allocator(pool.malloc), stream:
            stream.begin_capture()
            _install(recorder)
            try:
                result = self.fn(*own)
                structure = _flatten(result, outputs, "the result")
                program = _Capture(recorder, own, outputs, structure, backend)
            finally:
                _install(None)
                graph = stream.end_capture()
        arrays = [t.data for t, _ in outputs]
        capture = _GraphCapture(recorder, program, graph, stream, pool, buffers, arrays)
        graph.launch()  # the first call's results: the capture ran nothing
        fresh = iter([Tensor._make(a.copy(), backend, False) for a in arrays])
        return _rebuild(structure, fresh), capture, outputs


def _install(recorder: Optional[_Recorder]) -> None:
    autograd._recorder = recorder
    tensor_module._capture_hook = recorder
    Backend.capture_hook = recorder


def _flatten(value: Any, outputs: list, path: str) -> Any:
    """The structure of a result (a Tensor, or tuples and lists of them), its tensors
    appended to ``outputs`` with their paths."""
    if isinstance(value, (tuple, list)):
        return type(value), [_flatten(v, outputs, f"{path}[{i}]") for i, v in enumerate(value)]
    outputs.append((value, path))
    return None


def _rebuild(structure: Any, tensors: Any) -> Any:
    if structure is None:
        return next(tensors)
    kind, parts = structure
    return kind(_rebuild(p, tensors) for p in parts)


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
