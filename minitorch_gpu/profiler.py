"""Where a model's time goes, layer by layer, and whether each layer is compute- or
memory-bound on this machine.

    with profile(model) as prof:                 # backward=True also times loss.backward()
        for _ in range(10):
            model(idx, targets)
    print(prof.table())                          # one row per module, and totals
    prof.rows                                    # the same, as plain dicts
    prof.export_chrome_trace("trace.json")       # for ui.perfetto.dev or chrome://tracing

Timing hangs on the module hooks and nowhere else: a forward pre-hook reads the clock as a
module starts and a forward hook as it ends, so a module's time includes its children's;
what a module does around its children (a residual add, a reshape that copies) is its
"(self)" row. Leaf modules and (self) rows partition the pass: their times add up to it.
With ``backward=True`` the autograd engine reports each node's backward time
(``autograd.set_graph_observer``) and every node counts for the module that was running
when forward recorded it. On a GPU every clock reading synchronises the device first, so a
span holds the kernels launched in it; on the CPU the clock is ``time.perf_counter``.

FLOPs are counted from shapes, not measured: 2 M N K per matrix product (the attention
core's Q K^T and A V over the whole T x T square, as ``GPT.flops_per_token`` counts them)
and a few per element for elementwise work (the constants are in the cost functions
below). Bytes are the least a layer must move: its inputs and outputs once each and its
weights read once. A layer whose FLOP per byte (its arithmetic intensity) is below the
machine's ridge point (peak FLOP/s over copy bandwidth, both measured, see ``machine``) can
at best run at bandwidth times intensity: it is memory-bound; above, compute-bound. The
backward of a layer is counted as twice its forward, FLOPs and bytes (the usual estimate:
one product for the input's gradient, one for the weight's).
"""
from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np

from . import autograd
from .autograd import AccumulateGrad
from .nn import (GELU, GPT, MLP, Block, CausalSelfAttention, CrossEntropyLoss, Dropout,
                 Embedding, Identity, LayerNorm, Linear, Module, ModuleDict, ModuleList,
                 PackedCausalAttention, ReLU, ScaledDotProductAttention, Sequential, Tanh)
from .tensor import Tensor

__all__ = ["profile", "Profile", "Roofline", "register_cost", "SORT_KEYS"]

SORT_KEYS = ("tree", "time", "flops", "name")

Spec = Tuple[Tuple[int, ...], int]  # (shape, bytes per element) of one tensor


# --- what each layer costs --------------------------------------------------------------
@dataclass(frozen=True)
class Cost:
    """A module's own work in one call: FLOPs and the bytes it must move (None: unknown)."""

    flops: Optional[int]
    bytes: Optional[int]


CostFn = Callable[[Module, bool, List[Spec], List[Spec]], Cost]
_COSTS: Dict[type, CostFn] = {}


def register_cost(*module_types: type) -> Callable[[CostFn], CostFn]:
    """Teach the profiler what a module type costs: ``fn(module, training, inputs,
    outputs) -> Cost`` where inputs and outputs are ``(shape, itemsize)`` of the tensors
    passed positionally and returned. For a module with children, only its own work
    (what it does around them)."""
    def decorate(fn: CostFn) -> CostFn:
        for module_type in module_types:
            _COSTS[module_type] = fn
        return fn
    return decorate


def _numel(spec: Spec) -> int:
    return math.prod(spec[0])


def _nbytes(*specs: Spec) -> int:
    return sum(_numel(s) * s[1] for s in specs)


def _param_bytes(module: Module) -> int:
    return sum(p.nbytes for p in module.parameters(recurse=False))


@register_cost(Linear)
def _linear_cost(m: Linear, training: bool, inputs: List[Spec], outputs: List[Spec]) -> Cost:
    x, y = inputs[0], outputs[0]
    rows = _numel(x) // m.in_features  # (B, T, in) -> B*T rows
    flops = 2 * rows * m.in_features * m.out_features
    if m.bias is not None:
        flops += rows * m.out_features
    return Cost(flops, _nbytes(x, y) + _param_bytes(m))


@register_cost(Embedding)
def _embedding_cost(m: Embedding, training: bool, inputs: List[Spec],
                    outputs: List[Spec]) -> Cost:
    # no arithmetic: the rows of the ids are read from the table and written out
    return Cost(0, _nbytes(inputs[0]) + 2 * _nbytes(outputs[0]))


@register_cost(LayerNorm)
def _layer_norm_cost(m: LayerNorm, training: bool, inputs: List[Spec],
                     outputs: List[Spec]) -> Cost:
    # per element: sum for the mean, subtract it, square, sum for the variance, scale by
    # 1/std (5), then the gain and the bias when there are ones
    per_element = 5 + (m.weight is not None) + (m.bias is not None)
    return Cost(per_element * _numel(inputs[0]),
                _nbytes(inputs[0], outputs[0]) + _param_bytes(m))


@register_cost(GELU)
def _gelu_cost(m: GELU, training: bool, inputs: List[Spec], outputs: List[Spec]) -> Cost:
    # tanh form: 0.5 x (1 + tanh(c (x + 0.044715 x^3))): 9 operations, tanh counted as one;
    # exact form: 0.5 x (1 + erf(x / sqrt 2)): 5
    per_element = 9 if m.approximate == "tanh" else 5
    return Cost(per_element * _numel(inputs[0]), _nbytes(inputs[0], outputs[0]))


@register_cost(ReLU, Tanh)
def _pointwise_cost(m: Module, training: bool, inputs: List[Spec],
                    outputs: List[Spec]) -> Cost:
    return Cost(_numel(inputs[0]), _nbytes(inputs[0], outputs[0]))


@register_cost(Dropout)
def _dropout_cost(m: Dropout, training: bool, inputs: List[Spec],
                  outputs: List[Spec]) -> Cost:
    if not training or m.p == 0.0:
        return Cost(0, 0)  # the identity: it returns its input, moving nothing
    x = inputs[0]  # draw, compare, scale: 3 per element; a byte of mask besides x and y
    return Cost(3 * _numel(x), _nbytes(x, outputs[0]) + _numel(x))


@register_cost(Identity)
def _identity_cost(m: Module, training: bool, inputs: List[Spec],
                   outputs: List[Spec]) -> Cost:
    return Cost(0, 0)


def _scores_cost(heads: int, L: int, S: int, E: int, Ev: int, dropout: bool) -> int:
    """FLOPs of attention over ``heads`` (batch x heads) (L, S) score matrices: Q K^T and
    A V over the full square (the causal half is not subtracted, as in flops_per_token);
    softmax: scale, max, subtract, exp, sum, divide ~ 5 per score; dropout 3 more."""
    scores = heads * L * S
    return 2 * scores * E + 2 * scores * Ev + (8 if dropout else 5) * scores


@register_cost(ScaledDotProductAttention)
def _attention_cost(m: ScaledDotProductAttention, training: bool, inputs: List[Spec],
                    outputs: List[Spec]) -> Cost:
    q, k, v = inputs[:3]
    L, E = q[0][-2:]
    S, Ev = v[0][-2:]
    flops = _scores_cost(_numel(q) // (L * E), L, S, E, Ev, training and m.dropout > 0.0)
    # the least traffic: q, k, v read and the output written once. An implementation that
    # writes the T x T scores to memory moves far more; a flash-style one moves this.
    return Cost(flops, _nbytes(q, k, v, outputs[0]))


@register_cost(PackedCausalAttention)
def _packed_attention_cost(m: PackedCausalAttention, training: bool, inputs: List[Spec],
                           outputs: List[Spec]) -> Cost:
    (qkv,) = inputs[:1]
    B, T, C3 = qkv[0]
    head_dim = C3 // (3 * m.n_head)
    flops = _scores_cost(B * m.n_head, T, T, head_dim, head_dim,
                         training and m.dropout > 0.0)
    return Cost(flops, _nbytes(qkv, outputs[0]))  # qkv read, the output written


@register_cost(CrossEntropyLoss)
def _cross_entropy_cost(m: CrossEntropyLoss, training: bool, inputs: List[Spec],
                        outputs: List[Spec]) -> Cost:
    logits, targets = inputs[:2]
    # per logit: max, subtract, exp, sum; per row a log and a pick, lost in the rounding
    return Cost(4 * _numel(logits), _nbytes(logits, targets, *outputs))


@register_cost(Block)
def _block_cost(m: Block, training: bool, inputs: List[Spec], outputs: List[Spec]) -> Cost:
    x = inputs[0]  # two residual adds, each reading two (B, T, C) and writing one
    return Cost(2 * _numel(x), 2 * 3 * _nbytes(x))


@register_cost(CausalSelfAttention)
def _self_attention_cost(m: CausalSelfAttention, training: bool, inputs: List[Spec],
                         outputs: List[Spec]) -> Cost:
    # nothing of its own: the core reads the heads in place and writes them side by side
    # (the KV-cache path, which generation takes, is not profiled)
    return Cost(0, 0)


@register_cost(GPT)
def _gpt_cost(m: GPT, training: bool, inputs: List[Spec], outputs: List[Spec]) -> Cost:
    B, T = inputs[0][0]
    # the residual stream's dtype: the weights' (the logits are bf16 under autocast)
    C, itemsize = m.config.n_embd, m.transformer.wte.weight.element_size()
    # token rows + position rows: read (B, T, C) and (T, C), write (B, T, C)
    return Cost(B * T * C, (2 * B * T * C + T * C) * itemsize)


@register_cost(MLP, Sequential, ModuleList, ModuleDict)
def _nothing_of_its_own(m: Module, training: bool, inputs: List[Spec],
                        outputs: List[Spec]) -> Cost:
    return Cost(0, 0)


def _cost(module: Module, training: bool, inputs: List[Spec], outputs: List[Spec],
          leaf: bool) -> Cost:
    for cls in type(module).__mro__:
        fn = _COSTS.get(cls)
        if fn is not None:
            return fn(module, training, inputs, outputs)
    if leaf:  # an unknown layer: its traffic is known, its arithmetic is not
        return Cost(None, _nbytes(*inputs, *outputs) + _param_bytes(module))
    return Cost(None, None)


def _specs(values: Any) -> List[Spec]:
    """(shape, itemsize) of every Tensor in ``values`` (nested tuples and lists too)."""
    out: List[Spec] = []
    stack = [values]
    while stack:
        value = stack.pop()
        if isinstance(value, Tensor):
            out.append((tuple(value.shape), value.element_size()))
        elif isinstance(value, (tuple, list)):
            stack.extend(reversed(value))
    return out


# --- the machine's roofline ---------------------------------------------------------------
@dataclass(frozen=True)
class Roofline:
    """The two ceilings of a device for one dtype: peak FLOP/s of a matrix product and
    bytes/s of a large copy. ``ridge`` (FLOP/byte) is where they meet."""

    peak_flops: float
    bandwidth: float
    device: str = "cpu"
    dtype: str = "float32"

    @classmethod
    def measure(cls, device: str, dtype: Any) -> "Roofline":
        from .machine import copy_bandwidth, matmul_peak_flops
        return cls(matmul_peak_flops(device, dtype), copy_bandwidth(device, dtype),
                   device, np.dtype(dtype).name)

    @property
    def ridge(self) -> float:
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The best FLOP/s at ``intensity`` FLOP/byte: min(peak, bandwidth x intensity)."""
        return min(self.peak_flops, self.bandwidth * intensity)


# --- recording ----------------------------------------------------------------------------
@dataclass
class _Call:
    name: str
    index: int  # order of starting
    parent: Optional[int]  # index of the call it ran inside, if any
    depth: int
    pass_index: int
    module: Module
    training: bool
    inputs: List[Spec]
    start: float
    end: float = 0.0
    outputs: List[Spec] = field(default_factory=list)
    children: int = 0  # calls made directly inside it
    child_seconds: float = 0.0


@dataclass
class _Node:
    scope: Optional[str]
    name: str
    pass_index: int
    start: float
    end: float


class Profile:
    """Records every forward call of ``model`` and its submodules while it is active (a
    context manager), and with ``backward=True`` every node of each backward pass.

    A pass starts each time ``model`` itself is called. ``reference_ms`` may be set by
    whoever also timed passes without hooks (``profile_model`` does), to compare.
    """

    def __init__(self, model: Module, backward: bool = False,
                 roofline: Optional[Roofline] = None) -> None:
        if not isinstance(model, Module):
            raise TypeError(f"profile: expected a Module, got {type(model).__name__}")
        self.model = model
        self.backward = bool(backward)
        self._roofline = roofline
        self.reference_ms: Optional[Dict[str, float]] = None
        self._names: Dict[int, str] = {id(m): name for name, m in model.named_modules()}
        self._owners: Dict[int, str] = {}  # parameter -> the module that holds it
        for name, m in model.named_modules():
            for p in m.parameters(recurse=False):
                self._owners.setdefault(id(p), name)
        param = next(iter(model.parameters()), None)
        self._backend = param.backend if param is not None else None
        self._sync = (self._backend.synchronize
                      if self._backend is not None and self._backend.device.type == "cuda"
                      else None)
        self.calls: List[_Call] = []
        self.nodes: List[_Node] = []
        self.backward_passes: List[Tuple[float, float]] = []
        self.passes = 0
        self.scope: Optional[str] = None  # read by autograd for each recorded node
        self._stack: List[_Call] = []
        self._handles: list = []
        self._previous_observer: Any = None
        self._active = False
        self._rows: Optional[List[Dict[str, Any]]] = None

    # the clock and the hooks --------------------------------------------------------------
    def clock(self) -> float:
        if self._sync is not None:
            self._sync()  # a GPU runs asynchronously: wait for what was launched
        return time.perf_counter()

    def _pre_hook(self, module: Module, args: tuple) -> None:
        if module is self.model:
            self._stack.clear()  # a pass that raised left its calls open
            self.passes += 1
        parent = self._stack[-1] if self._stack else None
        call = _Call(self._names[id(module)], len(self.calls),
                     parent.index if parent is not None else None,
                     len(self._stack), self.passes - 1, module, module.training,
                     _specs(args), 0.0)
        self.calls.append(call)
        self._stack.append(call)
        self.scope = call.name
        call.start = self.clock()  # last: the hook's own work stays out of the span

    def _post_hook(self, module: Module, args: tuple, output: Any) -> None:
        end = self.clock()  # first, for the same reason
        while self._stack:
            call = self._stack.pop()
            if call.module is module:
                break
        else:
            return  # a call that started before the profile did
        call.end = end
        call.outputs = _specs(output)
        if self._stack:
            parent = self._stack[-1]
            parent.children += 1
            parent.child_seconds += end - call.start
        self.scope = self._stack[-1].name if self._stack else None

    def backward_node(self, node: Any, start: float, end: float) -> None:
        if type(node) is AccumulateGrad:  # a parameter's gradient: its module's work
            variable = node.variable()
            scope = self._owners.get(id(variable)) if variable is not None else None
        else:
            scope = node.scope
        self.nodes.append(_Node(scope, node.name(), len(self.backward_passes), start, end))

    def backward_pass(self, start: float, end: float) -> None:
        self.backward_passes.append((start, end))

    def __enter__(self) -> "Profile":
        if self._active:
            raise RuntimeError("profile: this profile is already recording")
        for m in self.model.modules():
            self._handles.append(m.register_forward_pre_hook(self._pre_hook))
            self._handles.append(m.register_forward_hook(self._post_hook))
        if self.backward:  # else a backward run inside would pay for clock reads for nothing
            self._previous_observer = autograd.set_graph_observer(self)
        self._active = True
        self._rows = None
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.backward:
            autograd.set_graph_observer(self._previous_observer)
        self._active = False
        self.scope = None
        self._stack.clear()

    # the figures --------------------------------------------------------------------------
    @property
    def roofline(self) -> Roofline:
        if self._roofline is None:
            if self._backend is None:
                raise RuntimeError("profile: the model has no parameters to tell its device "
                                   "and dtype; pass roofline=")
            param = next(iter(self.model.parameters()))
            self._roofline = Roofline.measure(str(self._backend.device), param.dtype)
        return self._roofline

    @property
    def rows(self) -> List[Dict[str, Any]]:
        """One dict per row of the table (forward rows, then backward rows when recorded),
        in the module tree's order; see ``table`` for what the fields mean."""
        if self._rows is None:
            self._rows = _Rows(self).build()
        return self._rows

    @property
    def summary(self) -> Dict[str, Any]:
        """Totals: per-pass forward time (hooked, median), the sum of the partition rows,
        the reference (unhooked) time when known, counted FLOPs and bytes per pass, and the
        model's own FLOP estimate when it has ``flops_per_token``."""
        return _summary(self)

    def table(self, sort: str = "tree", depth: Optional[int] = None) -> str:
        """The rows as text. ``sort="tree"`` shows the module tree, parents before their
        children with inclusive figures; ``time``, ``flops`` and ``name`` list the rows that
        partition the pass (leaves and (self) rows), largest first (names A to Z).
        ``depth`` cuts the tree there: a module at that depth stands for its subtree."""
        return _format_table(self, sort, depth)

    def export_chrome_trace(self, path: Union[str, Path]) -> Path:
        """Chrome's trace-event JSON: one complete event per module call (nested as the
        calls were) on the forward track, one per autograd node on the backward track, with
        shapes, FLOPs and bytes as args. Opens in ui.perfetto.dev and chrome://tracing."""
        return _write_trace(self, Path(path))

    def export_csv(self, path: Union[str, Path]) -> Path:
        """The rows as CSV, one line per row, every field a column."""
        rows = self.rows
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fields = list(rows[0]) if rows else []
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        return path

    def plot_roofline(self, path: Union[str, Path]) -> Path:
        """Each forward row that partitions the pass as a point (FLOP/byte, achieved
        GFLOP/s) under the measured roofs, saved as an image. Needs matplotlib."""
        return _plot_roofline(self, Path(path))


def profile(model: Module, backward: bool = False,
            roofline: Optional[Roofline] = None) -> Profile:
    """``with profile(model) as prof: model(x)``: a per-layer profile of what runs inside.
    ``roofline`` defaults to this machine's, measured once and cached."""
    return Profile(model, backward=backward, roofline=roofline)


# --- turning calls into rows --------------------------------------------------------------
def _median(values: List[float]) -> float:
    return float(np.median(values)) if values else 0.0


def _sum_known(values: Iterable[Optional[float]]) -> Optional[float]:
    """The sum, or None (unknown) when any of ``values`` is."""
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def _scaled(value: Optional[float], factor: float) -> Optional[float]:
    return None if value is None else value * factor


def _iqr(values: List[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, q3 = np.percentile(values, [25, 75])
    return float(q3 - q1)


class _Rows:
    """Builds the rows: per module, calls and their times, costs, and the verdicts."""

    def __init__(self, prof: Profile) -> None:
        self.prof = prof
        self.passes = max(prof.passes, 1)
        self.calls: Dict[str, List[_Call]] = {}
        for call in prof.calls:
            if call.end:  # finished calls only
                self.calls.setdefault(call.name, []).append(call)
        self.tree = [(name, m) for name, m in prof.model.named_modules()]
        self.cost_cache: Dict[int, Cost] = {}

    def cost(self, call: _Call) -> Cost:
        cost = self.cost_cache.get(call.index)
        if cost is None:
            cost = _cost(call.module, call.training, call.inputs, call.outputs,
                         leaf=call.children == 0)
            self.cost_cache[call.index] = cost
        return cost

    def per_pass(self, values: List[Tuple[int, float]]) -> List[float]:
        totals = [0.0] * self.passes
        for pass_index, value in values:
            if 0 <= pass_index < self.passes:
                totals[pass_index] += value
        return totals

    def build(self) -> List[Dict[str, Any]]:
        roof = self.prof.roofline
        total = _median(self.per_pass(
            [(c.pass_index, c.end - c.start) for c in self.calls.get("", [])]))
        rows: List[Dict[str, Any]] = []
        for name, module in self.tree:
            depth = 0 if name == "" else name.count(".") + 1
            calls = self.calls.get(name, [])
            if calls:
                rows.append(self.module_row(name, module, depth, calls, total, roof))
                if any(c.children for c in calls):
                    rows.append(self.self_row(name, module, depth + 1, calls, total, roof))
            else:
                row = self.container_row(name, module, depth, total, roof)
                if row is not None:
                    rows.append(row)
        if self.prof.backward and self.prof.backward_passes:
            rows.extend(self.backward_rows(rows, roof))
        return rows

    def subtree_flops_bytes(self, name: str) -> Tuple[Optional[int], Optional[int]]:
        """Counted FLOPs and bytes of everything ``name`` ran, over the whole profile."""
        prefix = name + "."
        costs = [self.cost(call) for other, calls in self.calls.items()
                 if not name or other == name or other.startswith(prefix) for call in calls]
        return _sum_known(c.flops for c in costs), _sum_known(c.bytes for c in costs)

    def timed(self, row: Dict[str, Any], calls: List[_Call], times: List[float], total: float,
              flops: Optional[float], nbytes: Optional[float],
              roof: Roofline) -> Dict[str, Any]:
        """Fill ``row`` for ``calls`` that took ``times`` seconds each and did ``flops``
        and moved ``nbytes`` in all: per-call figures, and the share of a pass."""
        n = len(calls)
        per_call = _median(times)
        per_pass = _median(self.per_pass([(c.pass_index, t) for c, t in zip(calls, times)]))
        row.update(calls=n, time_ms=per_call * 1e3, spread_ms=_iqr(times) * 1e3,
                   pass_ms=per_pass * 1e3, percent=100.0 * per_pass / total if total else None)
        return self.figures(row, _scaled(flops, 1 / n), _scaled(nbytes, 1 / n), per_call, roof)

    def figures(self, row: Dict[str, Any], flops: Optional[float], nbytes: Optional[float],
                seconds: float, roof: Roofline) -> Dict[str, Any]:
        """Intensity, achieved rates and the verdict for work done in ``seconds``."""
        row["flops"] = None if flops is None else int(round(flops))
        row["bytes"] = None if nbytes is None else int(round(nbytes))
        intensity = flops / nbytes if flops is not None and nbytes else None
        row["intensity"] = intensity
        row["gflops"] = flops / seconds / 1e9 if flops is not None and seconds > 0 else None
        row["gbytes"] = nbytes / seconds / 1e9 if nbytes is not None and seconds > 0 else None
        if intensity is None or flops == 0:
            row["bound"] = "memory" if nbytes else "-"
            roof_rate = roof.bandwidth if nbytes else None
            achieved = row["gbytes"]
        else:
            row["bound"] = "memory" if intensity < roof.ridge else "compute"
            roof_rate = roof.attainable(intensity)
            achieved = row["gflops"]
        # how close to its roof: FLOP/s against min(peak, bw x I), or bytes/s against bw
        row["roof_pct"] = (100.0 * achieved * 1e9 / roof_rate
                           if achieved is not None and roof_rate else None)
        return row

    def base(self, name: str, module: Module, depth: int, kind: str,
             phase: str = "forward") -> Dict[str, Any]:
        return {"name": name or type(module).__name__, "module": name, "phase": phase,
                "type": type(module).__name__, "kind": kind, "depth": depth, "leaf": False}

    def module_row(self, name: str, module: Module, depth: int, calls: List[_Call],
                   total: float, roof: Roofline) -> Dict[str, Any]:
        row = self.timed(self.base(name, module, depth, "module"), calls,
                         [c.end - c.start for c in calls], total,
                         *self.subtree_flops_bytes(name), roof)
        row["out_bytes"] = _nbytes(*calls[-1].outputs)
        row["params"] = sum(p.numel() for p in module.parameters())
        row["inputs"] = " ".join(_shape_text(s) for s in calls[-1].inputs)
        row["outputs"] = " ".join(_shape_text(s) for s in calls[-1].outputs)
        row["leaf"] = all(c.children == 0 for c in calls)
        return row

    def self_row(self, name: str, module: Module, depth: int, calls: List[_Call],
                 total: float, roof: Roofline) -> Dict[str, Any]:
        costs = [self.cost(c) for c in calls]  # its own work only
        row = self.base(name, module, depth, "self")
        row["name"] = f"{row['name']} (self)"
        self.timed(row, calls, [max(c.end - c.start - c.child_seconds, 0.0) for c in calls],
                   total, _sum_known(c.flops for c in costs), _sum_known(c.bytes for c in costs),
                   roof)
        row.update(out_bytes=None, params=0, inputs="", outputs="", leaf=True)
        return row

    def container_row(self, name: str, module: Module, depth: int, total: float,
                      roof: Roofline) -> Optional[Dict[str, Any]]:
        """A module never called itself (ModuleList, ModuleDict): the sum of the called
        modules below it, per pass; None when none of them ran."""
        prefix = name + "."
        below = [c for other, calls in self.calls.items() if other.startswith(prefix)
                 for c in calls]
        if not below:
            return None
        # only the outermost calls below it: a call's parent is outside the container
        inside = {c.index for c in below}
        outer = [c for c in below if c.parent not in inside]
        per_pass = _median(self.per_pass([(c.pass_index, c.end - c.start) for c in outer]))
        flops, nbytes = self.subtree_flops_bytes(name)
        row = self.base(name, module, depth, "container")
        row.update(calls=0, time_ms=None, spread_ms=None, pass_ms=per_pass * 1e3,
                   percent=100.0 * per_pass / total if total else None)
        self.figures(row, _scaled(flops, 1 / self.passes), _scaled(nbytes, 1 / self.passes),
                     per_pass, roof)
        row.update(out_bytes=None, params=sum(p.numel() for p in module.parameters()),
                   inputs="", outputs="")
        return row

    def backward_rows(self, forward: List[Dict[str, Any]],
                      roof: Roofline) -> List[Dict[str, Any]]:
        prof = self.prof
        n_passes = len(prof.backward_passes)
        pass_seconds = [end - start for start, end in prof.backward_passes]
        total = _median(pass_seconds)

        def node_times(match: Callable[[Optional[str]], bool]) -> List[float]:
            totals = [0.0] * n_passes
            for node in prof.nodes:
                if match(node.scope) and node.pass_index < n_passes:
                    totals[node.pass_index] += node.end - node.start
            return totals

        rows = []
        for frow in forward:
            name = frow["module"]
            if frow["kind"] == "self":
                times = node_times(lambda scope, name=name: scope == name)
            elif name == "":
                times = node_times(lambda scope: scope is not None)
            else:
                prefix = name + "."
                times = node_times(lambda scope, name=name, prefix=prefix: scope is not None
                                   and (scope == name or scope.startswith(prefix)))
            per_pass = _median(times)
            row = dict(frow, phase="backward")
            row.update(calls=n_passes, time_ms=per_pass * 1e3, spread_ms=_iqr(times) * 1e3,
                       pass_ms=per_pass * 1e3,
                       percent=100.0 * per_pass / total if total else None,
                       out_bytes=None)
            # twice the forward's work, except for a (self) row: its glue (adds, views)
            # mostly passes gradients through, with no work to speak of
            own = frow["kind"] == "self"
            # per forward call: a pass runs calls/passes of them
            scale = 2 * (frow["calls"] / self.passes if frow["calls"] else 1)
            self.figures(row, None if own else _scaled(frow["flops"], scale),
                         None if own else _scaled(frow["bytes"], scale), per_pass, roof)
            rows.append(row)
        # what the engine does between nodes (sorting the graph, summing gradients that
        # meet, checks), and nodes recorded outside any module of the model
        node_sum = node_times(lambda scope: True)
        outside = node_times(lambda scope: scope is None)
        engine = [max(p - s, 0.0) for p, s in zip(pass_seconds, node_sum)]
        for label, times in (("(autograd engine)", engine), ("(outside the model)", outside)):
            if label == "(outside the model)" and not any(times):
                continue
            per_pass = _median(times)
            rows.append({"name": label, "module": None, "phase": "backward", "type": "",
                         "kind": "engine", "depth": 1, "leaf": True, "calls": n_passes,
                         "time_ms": per_pass * 1e3, "spread_ms": _iqr(times) * 1e3,
                         "pass_ms": per_pass * 1e3,
                         "percent": 100.0 * per_pass / total if total else None,
                         "flops": None, "bytes": None, "intensity": None, "gflops": None,
                         "gbytes": None, "bound": "-", "roof_pct": None, "out_bytes": None,
                         "params": 0, "inputs": "", "outputs": ""})
        return rows


def _shape_text(spec: Spec) -> str:
    return "(" + ", ".join(str(n) for n in spec[0]) + ")"


def _summary(prof: Profile) -> Dict[str, Any]:
    rows = prof.rows
    fwd = [r for r in rows if r["phase"] == "forward"]
    root = fwd[0] if fwd else None
    out: Dict[str, Any] = {
        "passes": prof.passes,
        "forward_ms": root["pass_ms"] if root else None,
        "leaf_sum_ms": sum(r["pass_ms"] for r in fwd if r["leaf"]),
        "flops_per_pass": root["flops"] if root else None,
        "bytes_per_pass": root["bytes"] if root else None,
        "reference_ms": dict(prof.reference_ms) if prof.reference_ms else None,
    }
    model = prof.model
    calls = [c for c in prof.calls if c.name == "" and c.inputs]
    if hasattr(model, "flops_per_token") and calls:
        shape = calls[-1].inputs[0][0]  # idx (B, T)
        if len(shape) == 2:
            B, T = shape
            # flops_per_token counts forward and backward: the forward is a third
            out["model_forward_flops"] = model.flops_per_token(T) * B * T // 3
    bwd = [r for r in rows if r["phase"] == "backward"]
    if bwd:
        out["backward_ms"] = _median([(e - s) * 1e3 for s, e in prof.backward_passes])
        out["backward_leaf_sum_ms"] = sum(r["pass_ms"] for r in bwd if r["leaf"])
    roof = prof.roofline
    out["roofline"] = {"peak_gflops": roof.peak_flops / 1e9,
                       "bandwidth_gbytes": roof.bandwidth / 1e9,
                       "ridge_flop_per_byte": roof.ridge, "device": roof.device,
                       "dtype": roof.dtype}
    return out


# --- the table ----------------------------------------------------------------------------
def _si(value: Optional[float], digits: int = 3) -> str:
    """12.3G, 456M, 7.89k, 12: a figure in 4 or 5 characters."""
    if value is None:
        return "?"
    if value == 0:
        return "0"
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def _fixed(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


COLUMNS = (  # header, width, how to show a row's value
    ("calls", 5, lambda r: str(r["calls"]) if r["calls"] else "-"),
    ("ms/call", 8, lambda r: _fixed(r["time_ms"], ".3f")),
    ("IQR", 6, lambda r: _fixed(r["spread_ms"], ".3f")),
    ("%", 5, lambda r: _fixed(r["percent"], ".1f")),
    ("FLOPs", 6, lambda r: _si(r["flops"])),
    ("bytes", 6, lambda r: _si(r["bytes"])),
    ("FLOP/B", 6, lambda r: _fixed(r["intensity"], ".3g")),
    ("GFLOP/s", 7, lambda r: _fixed(r["gflops"], ".3g")),
    ("GB/s", 6, lambda r: _fixed(r["gbytes"], ".3g")),
    ("bound", 7, lambda r: r["bound"]),
    ("roof%", 5, lambda r: _fixed(r["roof_pct"], ".0f")),
    ("out", 6, lambda r: "-" if r["out_bytes"] is None else _si(r["out_bytes"])),
    ("params", 6, lambda r: _si(r["params"]) if r["params"] else "-"),
)


def _select(rows: List[Dict[str, Any]], sort: str, depth: Optional[int]) -> List[Dict[str, Any]]:
    if sort == "tree":
        return [r for r in rows if depth is None or r["depth"] <= depth]
    # a flat list of the rows that partition the pass: leaves, (self) and engine rows, or,
    # cut at ``depth``, the rows at that depth standing for their subtrees
    chosen = [r for r in rows
              if (depth is None and r["leaf"])
              or (depth is not None and (r["depth"] == depth
                                         or (r["leaf"] and r["depth"] < depth)))]
    if sort == "time":
        return sorted(chosen, key=lambda r: -(r["pass_ms"] or 0.0))
    if sort == "flops":
        return sorted(chosen, key=lambda r: -(r["flops"] or 0))
    return sorted(chosen, key=lambda r: r["name"])


def _format_table(prof: Profile, sort: str, depth: Optional[int]) -> str:
    if sort not in SORT_KEYS:
        raise ValueError(f"profile.table: sort must be one of {', '.join(SORT_KEYS)}, got "
                         f"{sort!r}")
    if depth is not None and (not isinstance(depth, int) or depth < 0):
        raise ValueError(f"profile.table: depth must be an int >= 0, got {depth!r}")
    rows = prof.rows
    if not rows:
        return "(nothing recorded: call the model inside `with profile(model):`)"
    summary = prof.summary
    roof = prof.roofline
    lines = [f"roofline of {roof.device} in {roof.dtype}: peak {roof.peak_flops / 1e9:.1f} "
             f"GFLOP/s (matmul), {roof.bandwidth / 1e9:.1f} GB/s (copy), ridge "
             f"{roof.ridge:.1f} FLOP/byte; {summary['passes']} passes; times are medians, "
             f"% of the pass"]
    for phase in ("forward", "backward"):
        chosen = _select([r for r in rows if r["phase"] == phase], sort, depth)
        if not chosen:
            continue
        indent = sort == "tree"
        width = max(len(("  " * r["depth"] if indent else "") + r["name"]) for r in chosen)
        width = max(width, len(phase) + 2)
        header = f"{phase:<{width}}" + "".join(f" {h:>{w}}" for h, w, _ in COLUMNS)
        lines += ["", header, "-" * len(header)]
        for r in chosen:
            label = ("  " * r["depth"] if indent else "") + r["name"]
            lines.append(f"{label:<{width}}" + "".join(f" {fmt(r):>{w}}"
                                                       for _, w, fmt in COLUMNS))
    lines.append("")
    lines += _totals_lines(summary)
    return "\n".join(lines)


def _totals_lines(s: Dict[str, Any]) -> List[str]:
    lines = []
    fwd = s["forward_ms"]
    ref = s["reference_ms"] or {}
    text = (f"forward: {fwd:.3f} ms per pass with hooks; leaf and (self) rows sum to "
            f"{s['leaf_sum_ms']:.3f} ms")
    if ref.get("forward"):
        text += (f"; {ref['forward']:.3f} ms without hooks (sum/unhooked "
                 f"{s['leaf_sum_ms'] / ref['forward']:.3f})")
    lines.append(text)
    if s.get("flops_per_pass") is not None:
        text = f"FLOPs counted: {_si(s['flops_per_pass'], 4)} per forward pass"
        if s.get("model_forward_flops"):
            text += (f"; flops_per_token()/3 x tokens: {_si(s['model_forward_flops'], 4)} "
                     f"(ratio {s['flops_per_pass'] / s['model_forward_flops']:.3f})")
        lines.append(text)
    if "backward_ms" in s:
        text = (f"backward: {s['backward_ms']:.3f} ms per pass; its rows sum to "
                f"{s['backward_leaf_sum_ms']:.3f} ms")
        if ref.get("backward"):
            text += f"; {ref['backward']:.3f} ms without the profiler"
        lines.append(text)
    return lines


# --- the trace ----------------------------------------------------------------------------
def _write_trace(prof: Profile, path: Path) -> Path:
    rows = _Rows(prof)
    starts = [c.start for c in prof.calls if c.end] + [n.start for n in prof.nodes]
    origin = min(starts) if starts else 0.0

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    events: List[Dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "minitorch_gpu"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "forward"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "backward"}},
    ]
    for call in prof.calls:
        if not call.end:
            continue
        cost = rows.cost(call)
        events.append({
            "name": call.name or type(call.module).__name__, "cat": "forward", "ph": "X",
            "pid": 1, "tid": 1, "ts": us(call.start), "dur": us(call.end) - us(call.start),
            "args": {"type": type(call.module).__name__, "pass": call.pass_index,
                     "inputs": [list(s[0]) for s in call.inputs],
                     "outputs": [list(s[0]) for s in call.outputs],
                     "own_flops": cost.flops, "own_bytes": cost.bytes}})
    for i, (start, end) in enumerate(prof.backward_passes):
        events.append({"name": "backward", "cat": "backward", "ph": "X", "pid": 1, "tid": 2,
                       "ts": us(start), "dur": us(end) - us(start), "args": {"pass": i}})
    for node in prof.nodes:
        events.append({"name": node.name, "cat": "backward", "ph": "X", "pid": 1, "tid": 2,
                       "ts": us(node.start), "dur": us(node.end) - us(node.start),
                       "args": {"module": node.scope, "pass": node.pass_index}})
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return path


# --- the roofline picture -----------------------------------------------------------------
PLOT_HINT = ('--plot needs matplotlib: pip install "minitorch-gpu[plot]" (or pip install '
             'matplotlib)')


def _plot_roofline(prof: Profile, path: Path) -> Path:
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no screen needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(PLOT_HINT) from None
    roof = prof.roofline
    points = [r for r in prof.rows if r["phase"] == "forward" and r["leaf"]
              and r["flops"] and r["intensity"] and r["gflops"]]
    intensities = [r["intensity"] for r in points] or [roof.ridge]
    low = min(min(intensities), roof.ridge) / 4
    high = max(max(intensities), roof.ridge) * 4
    xs = np.geomspace(low, high, 200)
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.plot(xs, [roof.attainable(x) / 1e9 for x in xs], color="black",
            label=f"roof: {roof.bandwidth / 1e9:.1f} GB/s x intensity, capped at "
                  f"{roof.peak_flops / 1e9:.0f} GFLOP/s")
    ax.axvline(roof.ridge, color="grey", linestyle=":", label=f"ridge {roof.ridge:.1f} "
                                                              f"FLOP/byte")
    kinds: Dict[str, List[Dict[str, Any]]] = {}
    for r in points:
        kinds.setdefault(r["type"] if r["kind"] == "module" else "(self)", []).append(r)
    for kind, group in sorted(kinds.items()):
        ax.scatter([r["intensity"] for r in group], [r["gflops"] for r in group], label=kind,
                   s=30)
    named = set()
    for r in sorted(points, key=lambda r: -(r["percent"] or 0.0)):
        # name each kind of layer once (every block has an attn.c_attn), where it matters
        label = (".".join(r["name"].split(".")[-2:]) if r["kind"] == "module"
                 else f"{r['type']} (self)")
        label = label.split(".", 1)[1] if label.split(".")[0].isdigit() else label
        if label not in named and (r["percent"] or 0.0) >= 1.0:
            named.add(label)
            ax.annotate(label, (r["intensity"], r["gflops"]), fontsize=7,
                        textcoords="offset points", xytext=(4, -3))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"{type(prof.model).__name__} forward on {roof.device} ({roof.dtype})")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


# --- profiling a model end to end ---------------------------------------------------------
def profile_model(model: Module, idx: Tensor, targets: Optional[Tensor] = None, *,
                  warmup: int = 2, iters: int = 10, backward: bool = False,
                  autocast: Optional[str] = None,
                  roofline: Optional[Roofline] = None) -> Profile:
    """Warm up, time ``iters`` passes without hooks (the reference), then profile ``iters``
    passes. Forward only runs in eval mode under no_grad; with ``backward`` in training
    mode, each pass also runs ``loss.backward()`` (the loss is ``model(idx, targets)``'s
    second output). ``autocast="bf16"`` runs the passes in mixed precision, judged
    against the bf16 roofline."""
    if warmup < 0 or iters < 1:
        raise ValueError(f"profile: warmup must be >= 0 and iters >= 1, got {warmup} and "
                         f"{iters}")
    if backward and targets is None:
        raise ValueError("profile: backward=True needs targets (a loss to differentiate)")
    from .amp import autocast as autocast_context
    from .autograd import enable_grad, no_grad
    precision = autocast_context(autocast or "bf16", enabled=autocast is not None)
    if roofline is None and autocast is not None:
        param = next(iter(model.parameters()))
        roofline = Roofline.measure(str(param.device), precision.dtype)
    prof = Profile(model, backward=backward, roofline=roofline)
    clock = prof.clock
    was_training = model.training

    def run(record: Optional[List[Tuple[float, float]]]) -> None:
        start = clock()
        with precision:
            out = model(idx, targets) if targets is not None else model(idx)
        middle = clock()
        if backward:
            model.zero_grad()
            loss = out[1] if isinstance(out, tuple) else out
            loss.backward()
        end = clock()
        if record is not None:
            record.append((middle - start, end - middle))

    unhooked: List[Tuple[float, float]] = []
    try:
        model.train(backward)
        with enable_grad() if backward else no_grad():
            for _ in range(warmup):
                run(None)
            for _ in range(iters):
                run(unhooked)
            with prof:
                for _ in range(iters):
                    run(None)
    finally:  # the mode it found, also when a pass raised
        model.train(was_training)
    prof.reference_ms = {"forward": _median([f for f, _ in unhooked]) * 1e3}
    if backward:
        prof.reference_ms["backward"] = _median([b for _, b in unhooked]) * 1e3
    return prof
