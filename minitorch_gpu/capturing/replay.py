"""What a replay runs: ``_Capture``, the recorded forwards as a flat list over slots
(the CPU, or any backend without graphs), and ``_GraphCapture``, a CUDA Graph (a GPU)."""
from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable, Dict, List, Sequence

import numpy as np

from ..backend import Backend
from ..tensor import Tensor
from .recorder import _CONSTANT, _INPUT, _STRUCT, _Recorder

class _Capture:
    """One recorded call: the program and where its inputs and outputs sit.

    Every value the program touches has a slot: the constants first, then the inputs,
    then one per op's result. A view whose result nothing reads is left out of the
    program (an argument check's slice, say): a view has no effect but its result."""

    def __init__(self, recorder: _Recorder, inputs: Sequence[Tensor], outputs: list,
                 structure: Any, backend: Backend) -> None:
        n_const, n_in = len(recorder.constants), len(inputs)

        def slot(source: tuple) -> Any:
            """A source's slot; a container of sources as (type, slots), rebuilt per call."""
            if source[0] == _STRUCT:
                return (source[1], tuple(slot(s) for s in source[2]))
            kind, what = source
            if kind == _CONSTANT:
                return what
            if kind == _INPUT:
                return n_const + what
            return n_const + n_in + what

        def slots_read(sources: tuple) -> list:
            flat = []
            for s in sources:
                flat.extend(slots_read(s[1]) if isinstance(s, tuple) else [s])
            return flat

        output_sources = [recorder.source_of_output(t, p) for t, p in outputs]
        read = {slot(s) for s in output_sources}
        kept = []
        saving = set()
        for i in reversed(range(len(recorder.program))):  # last first: who reads what
            forward, ctx, sources, kwargs, name, is_view, saves = recorder.program[i]
            target = n_const + n_in + i
            if is_view and target not in read:
                continue
            read.update(slots_read(tuple(slot(s) for s in sources)))
            if saves:
                saving.add(id(ctx))
            kept.append((forward, ctx, tuple(slot(s) for s in sources), kwargs, target, name))
        kept.reverse()
        self.template = list(recorder.constants) + [None] * (n_in + len(recorder.program))
        # each op result's slot is emptied after its last reader, as an eager call drops
        # the Tensor: a replay holds no more at once than the eager call would
        last_read: Dict[int, int] = {}
        for i, (_, _, sources, _, _, _) in enumerate(kept):
            for source in slots_read(sources):
                if source >= n_const + n_in:  # an op's result (inputs, constants stay)
                    last_read[source] = i
        outputs_kept = {slot(s) for s in output_sources}
        dead: List[list] = [[] for _ in kept]
        for source, i in last_read.items():
            if source not in outputs_kept:
                dead[i].append(source)
        for i, (*_, target, _) in enumerate(kept):  # read by nothing: dropped at once
            if target not in last_read and target not in outputs_kept:
                dead[i].append(target)
        self.program = [(forward, ctx, _getter(sources), kwargs or None, target,
                         tuple(dead[i]))
                        for i, (forward, ctx, sources, kwargs, target, _) in enumerate(kept)]
        # the ops whose forward saves arrays for a backward that never comes: released
        # after each call, as an eager call's node is (else a replay would hold them)
        self.saving = frozenset(saving)
        self.op_names = [name for *_, name in kept]
        self.input_slots = tuple(n_const + i for i in range(n_in))
        self.output_slots = tuple(slot(s) for s in output_sources)
        self.structure = structure
        self.bound = recorder.bound
        self.modules = recorder.modules
        self.backend = backend
        self.nbytes = recorder.nbytes

    def is_stale(self) -> bool:
        """A tensor the program reads from outside holds another array now, or a module
        that ran is in the other mode (``train()``/``eval()``: dropout on or off)."""
        for t, array in self.bound:
            if t.data is not array:
                return True
        for ref, training in self.modules:
            module = ref()
            if module is not None and module.training is not training:
                return True
        return False

    def replay(self, arrays: Sequence[Any]) -> list:
        slots = self.template.copy()
        for i, array in zip(self.input_slots, arrays):
            slots[i] = array
        generic, saving = np.generic, self.saving
        for forward, ctx, arguments, kwargs, target, dead in self.program:
            if kwargs is None:  # most ops: no ** to build
                out = forward(ctx, *arguments(slots))
            else:
                out = forward(ctx, *arguments(slots), **kwargs)
            if type(out) is not np.ndarray and isinstance(out, generic):
                out = np.asarray(out)  # NumPy's 0-d results are scalars; keep arrays
            slots[target] = out
            if id(ctx) in saving:
                ctx._saved = ()
            for slot in dead:
                slots[slot] = None
        return [slots[s] for s in self.output_slots]


def _getter(sources: tuple) -> Callable[[list], tuple]:
    """A function of the slots giving an op's arguments as a tuple (itemgetter: C; a
    container argument, an index key holding arrays, is rebuilt in Python)."""
    if any(isinstance(s, tuple) for s in sources):
        def build(source: Any, slots: list) -> Any:
            if isinstance(source, tuple):
                kind, parts = source
                return kind(build(p, slots) for p in parts)
            return slots[source]
        return lambda slots: tuple(build(s, slots) for s in sources)
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
                 pool: Any, buffers: list, outputs: list, checks: dict) -> None:
        self.program = program.program
        self.op_names = program.op_names
        self.structure, self.bound, self.backend = program.structure, recorder.bound, \
            program.backend
        self.modules = program.modules
        self.nbytes = recorder.nbytes
        self.graph, self.stream, self.pool = graph, stream, pool
        self.buffers, self.outputs = buffers, outputs
        self.keep = recorder.keep  # every array the graph's kernels were given
        self.rng = program.backend.random_stream()  # the draws' state the graph reads
        self.checks = checks  # the deferred checks its ops made: arrays its launches write
        self.backend.graph_captures.add(self)  # its pool counted in memory_stats

    def is_stale(self) -> bool:
        """A bound tensor holds another array, or the random stream was replaced
        (``manual_seed``): the graph would read the old one."""
        return self.backend.random_stream() is not self.rng or _Capture.is_stale(self)

    def replay(self, arrays: Sequence[Any]) -> list:
        for buffer, array in zip(self.buffers, arrays):
            buffer[...] = array
        self.launch()
        return [out.copy() for out in self.outputs]

    def launch(self) -> None:
        """One launch on the current stream (after the copies in), its checks then
        pending as an eager call's are."""
        self.graph.launch()
        if self.checks:
            self.backend._deferred_checks.add_launched(self.backend.xp, self.checks)


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
