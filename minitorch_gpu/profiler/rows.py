"""A recording turned into rows: one per module in the module tree's order, a "(self)" row
after a parent's children for what it does around them, and with backward recorded the
same rows again for the backward pass, then the autograd engine's own time.

Leaf rows, (self) rows and engine rows partition a pass: their times add up to it. Modules
never called (ModuleList, ModuleDict) are rows summed from what ran below them. The
backward of a layer is counted as twice its forward, FLOPs and bytes (the usual estimate:
one product for the input's gradient, one for the weight's).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..nn import Module
from .costs import Cost, Spec, spec_bytes
from .records import Call, Recording
from .roofline import Roofline

__all__ = ["Row", "build_rows", "iqr", "median"]


@dataclass
class Row:
    """One row of the table: a module's (or its own work's, or the engine's) figures in one
    phase. Times are medians in ms; FLOPs and bytes per call (per pass without calls)."""

    name: str  # the module's dotted name ("(self)" after it for its own work); the root's type
    module: Optional[str]  # the module's name, "" for the root; None for the engine's rows
    phase: str  # "forward" or "backward"
    type: str  # the module's class name; "" for the engine's rows
    kind: str  # "module", "self" (its own work), "container" (never called) or "engine"
    depth: int  # 0 for the root
    leaf: bool  # one of the rows that partition the pass
    calls: int = 0
    time_ms: Optional[float] = None  # per call
    spread_ms: Optional[float] = None  # the interquartile range of time_ms
    pass_ms: Optional[float] = None  # per pass
    percent: Optional[float] = None  # of the pass
    flops: Optional[int] = None  # counted; None: unknown
    bytes: Optional[int] = None  # the least moved; None: unknown
    intensity: Optional[float] = None  # FLOP per byte
    gflops: Optional[float] = None  # achieved
    gbytes: Optional[float] = None  # achieved
    bound: str = "-"  # "compute", "memory", or "-" for no work
    roof_pct: Optional[float] = None  # achieved as % of the roof at this intensity
    out_bytes: Optional[int] = None  # of the last call's outputs
    params: int = 0  # in the module and its children
    inputs: str = ""  # the last call's input shapes, "(4, 32) (4, 32)"
    outputs: str = ""

    def __getitem__(self, key: str) -> Any:
        # old code and the tests read rows by key, as the dicts rows used to be
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def as_dict(self) -> Dict[str, Any]:
        """The fields by name, in the table's column order (for CSV and JSON)."""
        return asdict(self)


_FIELDS = frozenset(f.name for f in fields(Row))


def median(values: Sequence[float]) -> float:
    return float(np.median(values)) if len(values) else 0.0


def iqr(values: Sequence[float]) -> float:
    """The interquartile range: how far the middle half of ``values`` spreads."""
    if len(values) < 2:
        return 0.0
    q1, q3 = np.percentile(values, [25, 75])
    return float(q3 - q1)


def _per_pass(values: Iterable[Tuple[int, float]], passes: int) -> List[float]:
    """Each pass's sum of the ``(pass index, seconds)`` pairs; passes past ``passes``
    are left out."""
    totals = [0.0] * passes
    for pass_index, value in values:
        if 0 <= pass_index < passes:
            totals[pass_index] += value
    return totals


def _timing(call_times: Optional[List[float]], pass_times: List[float],
            total: float) -> Dict[str, Any]:
    """Row fields: per call (None: no calls of its own) and per pass, against a pass of
    ``total`` seconds."""
    per_pass = median(pass_times)
    return dict(time_ms=None if call_times is None else median(call_times) * 1e3,
                spread_ms=None if call_times is None else iqr(call_times) * 1e3,
                pass_ms=per_pass * 1e3, percent=100.0 * per_pass / total if total else None)


def _figures(flops: Optional[float], nbytes: Optional[float], seconds: float,
             roof: Roofline) -> Dict[str, Any]:
    """Row fields of ``flops`` and ``nbytes`` done in ``seconds``, and the verdict."""
    return dict(flops=None if flops is None else int(round(flops)),
                bytes=None if nbytes is None else int(round(nbytes)),
                **roof.judge(flops, nbytes, seconds)._asdict())


def _sum_known(values: Iterable[Optional[float]]) -> Optional[float]:
    """The sum, or None (unknown) when any of ``values`` is."""
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def _scaled(value: Optional[float], factor: float) -> Optional[float]:
    return None if value is None else value * factor


def _within(name: str, scope: Optional[str]) -> bool:
    """Whether module ``scope`` is module ``name`` or inside it ("" is the root)."""
    return scope is not None and (not name or scope == name or scope.startswith(name + "."))


def _shape_text(spec: Spec) -> str:
    return "(" + ", ".join(str(n) for n in spec[0]) + ")"


def build_rows(recording: Recording, roof: Roofline) -> List[Row]:
    """The rows of ``recording``, judged against ``roof``: forward rows in the module
    tree's order, then the backward rows when backward passes were recorded."""
    return _RowBuilder(recording, roof).build()


class _RowBuilder:
    """Per module: calls and their times, costs, and the verdicts."""

    def __init__(self, recording: Recording, roof: Roofline) -> None:
        self.recording = recording
        self.roof = roof
        self.passes = max(recording.passes, 1)
        self.calls: Dict[str, List[Call]] = {}
        for call in recording.calls:
            if call.end:  # finished calls only
                self.calls.setdefault(call.name, []).append(call)
        self.costs: Dict[int, Cost] = {}  # by call index

    def cost(self, call: Call) -> Cost:
        cost = self.costs.get(call.index)
        if cost is None:
            cost = self.costs[call.index] = call.cost()
        return cost

    def build(self) -> List[Row]:
        total = median(_per_pass([(c.pass_index, c.end - c.start)
                                  for c in self.calls.get("", [])], self.passes))
        rows: List[Row] = []
        for name, module in self.recording.model.named_modules():
            depth = 0 if name == "" else name.count(".") + 1
            calls = self.calls.get(name, [])
            if calls:
                rows.append(self.module_row(name, module, depth, calls, total))
                if any(c.children for c in calls):
                    rows.append(self.self_row(name, module, depth + 1, calls, total))
            else:
                row = self.container_row(name, module, depth, total)
                if row is not None:
                    rows.append(row)
        if self.recording.backward and self.recording.backward_passes:
            rows.extend(self.backward_rows(rows))
        return rows

    def subtree_flops_bytes(self, name: str) -> Tuple[Optional[int], Optional[int]]:
        """Counted FLOPs and bytes of everything ``name`` ran, over the whole profile."""
        costs = [self.cost(call) for other, calls in self.calls.items() if _within(name, other)
                 for call in calls]
        return _sum_known(c.flops for c in costs), _sum_known(c.bytes for c in costs)

    def timed(self, calls: List[Call], times: List[float], total: float,
              flops: Optional[float], nbytes: Optional[float]) -> Dict[str, Any]:
        """Row fields of ``calls`` that took ``times`` seconds each and did ``flops`` and
        moved ``nbytes`` in all: per-call figures, and the share of a pass."""
        n = len(calls)
        pass_times = _per_pass([(c.pass_index, t) for c, t in zip(calls, times)], self.passes)
        return dict(calls=n, **_timing(times, pass_times, total),
                    **_figures(_scaled(flops, 1 / n), _scaled(nbytes, 1 / n), median(times),
                               self.roof))

    def module_row(self, name: str, module: Module, depth: int, calls: List[Call],
                   total: float) -> Row:
        last = calls[-1]
        return Row(name or type(module).__name__, name, "forward", type(module).__name__,
                   "module", depth, leaf=all(c.children == 0 for c in calls),
                   **self.timed(calls, [c.end - c.start for c in calls], total,
                                *self.subtree_flops_bytes(name)),
                   out_bytes=spec_bytes(*last.outputs),
                   params=sum(p.numel() for p in module.parameters()),
                   inputs=" ".join(_shape_text(s) for s in last.inputs),
                   outputs=" ".join(_shape_text(s) for s in last.outputs))

    def self_row(self, name: str, module: Module, depth: int, calls: List[Call],
                 total: float) -> Row:
        costs = [self.cost(c) for c in calls]  # its own work only
        times = [max(c.end - c.start - c.child_seconds, 0.0) for c in calls]
        return Row(f"{name or type(module).__name__} (self)", name, "forward",
                   type(module).__name__, "self", depth, leaf=True,
                   **self.timed(calls, times, total, _sum_known(c.flops for c in costs),
                                _sum_known(c.bytes for c in costs)))

    def container_row(self, name: str, module: Module, depth: int,
                      total: float) -> Optional[Row]:
        """A module never called itself (ModuleList, ModuleDict): the sum of the called
        modules below it, per pass; None when none of them ran."""
        below = [c for other, calls in self.calls.items() if _within(name, other)
                 for c in calls]
        if not below:
            return None
        # only the outermost calls below it: a call's parent is outside the container
        inside = {c.index for c in below}
        outer = [c for c in below if c.parent not in inside]
        pass_times = _per_pass([(c.pass_index, c.end - c.start) for c in outer], self.passes)
        flops, nbytes = self.subtree_flops_bytes(name)
        return Row(name or type(module).__name__, name, "forward", type(module).__name__,
                   "container", depth, leaf=False, **_timing(None, pass_times, total),
                   **_figures(_scaled(flops, 1 / self.passes), _scaled(nbytes, 1 / self.passes),
                              median(pass_times), self.roof),
                   params=sum(p.numel() for p in module.parameters()))

    def backward_rows(self, forward: List[Row]) -> List[Row]:
        """Each forward row again for the backward passes, then the engine's own time."""
        recording = self.recording
        n_passes = len(recording.backward_passes)
        pass_seconds = recording.backward_seconds()
        total = median(pass_seconds)

        def node_times(scope_matches: Callable[[Optional[str]], bool]) -> List[float]:
            return _per_pass([(node.pass_index, node.end - node.start)
                              for node in recording.nodes if scope_matches(node.scope)],
                             n_passes)

        rows = []
        for frow in forward:
            own = frow.kind == "self"  # (self): its own nodes; else its subtree's
            times = node_times(lambda scope, name=frow.module, own=own:
                               scope == name if own else _within(name, scope))
            # twice the forward's work per forward call (a pass runs calls/passes of them),
            # except for a (self) row: its glue (adds, views) mostly passes gradients
            # through, with no work to speak of
            scale = 2 * (frow.calls / self.passes if frow.calls else 1)
            rows.append(replace(frow, phase="backward", calls=n_passes,
                                **_timing(times, times, total), out_bytes=None,
                                **_figures(None if own else _scaled(frow.flops, scale),
                                           None if own else _scaled(frow.bytes, scale),
                                           median(times), self.roof)))
        # what the engine does between nodes (sorting the graph, summing gradients that
        # meet, checks), and nodes recorded outside any module of the model
        node_sum = node_times(lambda scope: True)
        outside = node_times(lambda scope: scope is None)
        engine = [max(p - s, 0.0) for p, s in zip(pass_seconds, node_sum)]
        for label, times in (("(autograd engine)", engine), ("(outside the model)", outside)):
            if label == "(outside the model)" and not any(times):
                continue
            rows.append(Row(label, None, "backward", "", "engine", 1, leaf=True,
                            calls=n_passes, **_timing(times, times, total)))
        return rows
