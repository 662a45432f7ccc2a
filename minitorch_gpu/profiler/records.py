"""What a profile records: each module call's span and shapes, each backward node's span,
and each backward pass. Rows and reports read a ``Recording``; ``Profile`` fills one."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..nn import Module
from .costs import Cost, Spec, layer_cost

__all__ = ["Call", "Node", "Recording"]


@dataclass
class Call:
    """One forward call of a module."""

    name: str
    index: int  # order of starting
    parent: Optional[int]  # index of the call it ran inside, if any
    depth: int
    pass_index: int
    module: Module
    training: bool
    inputs: List[Spec]
    start: float
    end: float = 0.0  # 0.0 until it returns
    outputs: List[Spec] = field(default_factory=list)
    children: int = 0  # calls made directly inside it
    child_seconds: float = 0.0

    def cost(self) -> Cost:
        """The module's own work in this call, counted from its shapes."""
        return layer_cost(self.module, self.training, self.inputs, self.outputs,
                          leaf=self.children == 0)


@dataclass
class Node:
    """One autograd node's backward, counted for the module ``scope`` (None: none)."""

    scope: Optional[str]
    name: str
    pass_index: int
    start: float
    end: float


@dataclass(eq=False, repr=False)  # a recording is one object, not a value; it holds 1000s
class Recording:
    """Every call, node and backward pass of ``model`` recorded so far; ``passes`` counts
    the calls of ``model`` itself. ``reference_ms`` may be set by whoever also timed passes
    without hooks (``profile_model`` does), to compare."""

    model: Module
    backward: bool = False
    calls: List[Call] = field(default_factory=list)
    nodes: List[Node] = field(default_factory=list)
    backward_passes: List[Tuple[float, float]] = field(default_factory=list)  # (start, end)
    passes: int = 0
    reference_ms: Optional[Dict[str, float]] = None

    def backward_seconds(self) -> List[float]:
        """How long each backward pass took."""
        return [end - start for start, end in self.backward_passes]
