"""Recording a model's calls: the module hooks, the autograd graph observer, and
``profile(model)``, the context manager that installs and removes them.

Timing hangs on the module hooks and nowhere else: a forward pre-hook reads the clock as a
module starts and a forward hook as it ends, so a module's time includes its children's.
With ``backward=True`` the autograd engine reports each node's backward time
(``autograd.set_graph_observer``) and every node counts for the module that was running
when forward recorded it. On a GPU every clock reading synchronises the device first, so a
span holds the kernels launched in it; on the CPU the clock is ``time.perf_counter``.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from .. import autograd
from ..autograd import AccumulateGrad
from ..nn import Module
from .costs import tensor_specs
from .plot import plot_roofline
from .records import Call, Node, Recording
from .roofline import Roofline
from .rows import Row, build_rows
from .summary import summarize
from .table import format_table, write_csv
from .trace import write_trace

__all__ = ["Profile", "profile"]


class Profile(Recording):
    """Records every forward call of ``model`` and its submodules while it is active (a
    context manager), and with ``backward=True`` every node of each backward pass. A
    pass starts each time ``model`` itself is called."""

    def __init__(self, model: Module, backward: bool = False,
                 roofline: Optional[Roofline] = None) -> None:
        if not isinstance(model, Module):
            raise TypeError(f"profile: expected a Module, got {type(model).__name__}")
        super().__init__(model, bool(backward))
        self._roofline = roofline
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
        self.scope: Optional[str] = None  # read by autograd for each recorded node
        self._stack: List[Call] = []
        self._handles: list = []
        self._previous_observer: Any = None
        self._active = False
        self._rows: Optional[List[Row]] = None

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
        call = Call(self._names[id(module)], len(self.calls),
                    parent.index if parent is not None else None,
                    len(self._stack), self.passes - 1, module, module.training,
                    tensor_specs(args), 0.0)
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
        call.outputs = tensor_specs(output)
        if self._stack:
            parent = self._stack[-1]
            parent.children += 1
            parent.child_seconds += end - call.start
        self.scope = self._stack[-1].name if self._stack else None

    # the graph observer: autograd calls these during backward --------------------------------
    def backward_node(self, node: Any, start: float, end: float) -> None:
        if type(node) is AccumulateGrad:  # a parameter's gradient: its module's work
            variable = node.variable()
            scope = self._owners.get(id(variable)) if variable is not None else None
        else:
            scope = node.scope
        self.nodes.append(Node(scope, node.name(), len(self.backward_passes), start, end))

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
    def rows(self) -> List[Row]:
        """One ``Row`` per row of the table (forward rows, then backward rows when
        recorded), in the module tree's order; ``Row`` says what each field means."""
        if self._rows is None:
            self._rows = build_rows(self, self.roofline)
        return self._rows

    @property
    def summary(self) -> Dict[str, Any]:
        """Totals: per-pass forward time (hooked, median), the sum of the partition rows,
        the reference (unhooked) time when known, counted FLOPs and bytes per pass, and the
        model's own FLOP estimate when it has ``flops_per_token``."""
        return summarize(self, self.rows, self.roofline)

    def table(self, sort: str = "tree", depth: Optional[int] = None) -> str:
        """The rows as text. ``sort="tree"`` shows the module tree, parents before their
        children with inclusive figures; ``time``, ``flops`` and ``name`` list the rows that
        partition the pass (leaves and (self) rows), largest first (names A to Z).
        ``depth`` cuts the tree there: a module at that depth stands for its subtree."""
        return format_table(self.rows, self.summary, sort, depth)

    def export_chrome_trace(self, path: Union[str, Path]) -> Path:
        """Chrome's trace-event JSON: one complete event per module call (nested as the
        calls were) on the forward track, one per autograd node on the backward track, with
        shapes, FLOPs and bytes as args. Opens in ui.perfetto.dev and chrome://tracing."""
        return write_trace(self, Path(path))

    def export_csv(self, path: Union[str, Path]) -> Path:
        """The rows as CSV, one line per row, every field a column."""
        return write_csv(self.rows, Path(path))

    def plot_roofline(self, path: Union[str, Path]) -> Path:
        """Each forward row that partitions the pass as a point (FLOP/byte, achieved
        GFLOP/s) under the measured roofs, saved as an image. Needs matplotlib."""
        return plot_roofline(self.rows, self.roofline, type(self.model).__name__, Path(path))


def profile(model: Module, backward: bool = False,
            roofline: Optional[Roofline] = None) -> Profile:
    """``with profile(model) as prof: model(x)``: a per-layer profile of what runs inside.
    ``roofline`` defaults to this machine's, measured once and cached."""
    return Profile(model, backward=backward, roofline=roofline)
