"""Autograd: the Function base class, grad mode, and backward over the graph.

A node enters the graph only through ``Function.apply``. The node *is* the ``ctx`` its
forward saw: it keeps what ``save_for_backward`` stored and points at the nodes that made
its inputs (``next_nodes``). ``backward`` sorts those nodes once, iteratively (no
recursion, so a chain of any length works), and walks them in reverse topological order,
handing each its output gradient and freeing its saved arrays once used.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Optional

import numpy as np

from .tensor import Tensor

__all__ = ["Function", "backward", "no_grad", "enable_grad", "set_grad_enabled",
           "is_grad_enabled", "set_graph_observer"]


# --- grad mode ----------------------------------------------------------------------------
class _GradMode:
    enabled = True


def is_grad_enabled() -> bool:
    """Whether ops record the graph now (False inside ``no_grad()``)."""
    return _GradMode.enabled


class set_grad_enabled(contextlib.ContextDecorator):
    """Turn graph recording on or off: a call, a context manager and a decorator."""

    def __init__(self, mode: bool) -> None:
        self.prev = _GradMode.enabled
        self.mode = bool(mode)
        _GradMode.enabled = self.mode

    def __enter__(self) -> None:
        _GradMode.enabled = self.mode

    def __exit__(self, *exc: Any) -> None:
        _GradMode.enabled = self.prev


class _GradModeContext(contextlib.ContextDecorator):
    mode: bool

    def __enter__(self) -> None:
        self.prev = _GradMode.enabled
        _GradMode.enabled = self.mode

    def __exit__(self, *exc: Any) -> None:
        _GradMode.enabled = self.prev


class no_grad(_GradModeContext):
    """Context manager and decorator: ops inside record no graph (inference, optimizer steps)."""

    mode = False


class enable_grad(_GradModeContext):
    """Context manager and decorator: record the graph even inside ``no_grad``."""

    mode = True


_NO_GRAD_NEEDED = [(False,) * n for n in range(8)]


def unbroadcast(grad: Any, shape: tuple) -> Any:
    """Sum ``grad`` back to ``shape``: the backward of broadcasting (an implicit expand)."""
    if grad.shape == shape:
        return grad
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=axes).reshape(shape)


# --- observing the graph ------------------------------------------------------------------
_observer: Any = None  # the profiler's, while one runs; None costs one test per node


def set_graph_observer(observer: Any) -> Any:
    """Install ``observer`` (None to remove it) and return the one it replaces.

    This is how a profiler sees the graph without timing code in the ops: every node
    recorded while it is installed carries ``node.scope = observer.scope`` (the profiler
    keeps that label at the module running now), and ``backward`` reads
    ``observer.clock()`` before and after each node and calls
    ``observer.backward_node(node, start, end)``, then
    ``observer.backward_pass(start, end)`` for the whole walk.
    """
    global _observer
    previous, _observer = _observer, observer
    return previous


# --- capturing ----------------------------------------------------------------------------
_recorder: Any = None  # capturing.py's, while a function is being captured: it runs forwards


# --- Function -----------------------------------------------------------------------------
_FREED = object()


class Function:
    """A differentiable op: ``forward`` and ``backward`` side by side, on raw arrays.

    Subclasses define two static methods::

        class Mul(Function):
            @staticmethod
            def forward(ctx, a, b):          # arrays of ctx.xp (or Python scalars)
                ctx.save_for_backward(a, b)
                return a * b
            @staticmethod
            def backward(ctx, grad):         # one gradient per forward input, or None
                a, b = ctx.saved_tensors
                return grad * b, grad * a

    ``ctx.needs_input_grad[i]`` says whether input i wants a gradient. ``backward`` must not
    write into ``grad`` (it may be shared with other nodes); returned gradients may have
    the broadcast shape only if the op reduces them itself: the engine checks every shape.
    Ops whose output is a view of input 0 set ``returns_view = True`` so in-place updates
    of either are seen by the other's version counter. Ops whose inputs broadcast against
    each other (add, mul, where, ...) set ``broadcasts = True`` and may return gradients of
    the broadcast shape: the engine sums them back to each input's shape (``unbroadcast``),
    the backward of an implicit expand.
    """

    returns_view = False
    broadcasts = False

    _saved: tuple = ()  # what save_for_backward kept; _FREED after backward used it
    versions: Any = ()  # (version box, version) of each saved input, checked in backward
    retained: Any = None  # weak reference to the output when retain_grad() was called
    scope: Any = None  # the graph observer's label when the node was recorded

    # set by apply on the node; documented here for readers
    needs_input_grad: tuple
    next_nodes: tuple
    backend: Any
    xp: Any

    @staticmethod
    def forward(ctx: "Function", *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: "Function", grad: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Tensor:
        """Run forward on the arrays of ``args`` and, when grad is on, record a node."""
        backend = None
        record = False
        for arg in args:
            if isinstance(arg, Tensor):
                if backend is None:
                    backend = arg._backend
                elif arg._backend is not backend:
                    raise RuntimeError(
                        f"{cls.__name__.lower()}: expected all tensors on one device, got "
                        f"{backend.device} and {arg._backend.device}")
                if arg.requires_grad:
                    record = True
        if backend is None:
            raise TypeError(f"{cls.__name__.lower()}: expected at least one Tensor argument")
        record = record and _GradMode.enabled
        ctx = cls()
        ctx.backend = backend
        ctx.xp = backend.xp
        if record:
            needs, nodes = [], []
            for arg in args:
                need = isinstance(arg, Tensor) and arg.requires_grad
                needs.append(need)
                nodes.append(_node_of(arg) if need else None)
            ctx.needs_input_grad = tuple(needs)
            ctx.next_nodes = tuple(nodes)
            if _observer is not None:
                ctx.scope = _observer.scope
        else:
            ctx.needs_input_grad = _NO_GRAD_NEEDED[len(args)] if len(args) < 8 \
                else (False,) * len(args)
        arrays = [arg.data if isinstance(arg, Tensor) else arg for arg in args]
        device = backend._cuda_device  # see Backend.on_device; None on the CPU
        forward = cls.forward if _recorder is None else \
            lambda ctx, *arrays, **kwargs: _recorder.forward(cls, ctx, args, arrays, kwargs)
        if device is None:  # no current device to make: no `with` (100 ns, 7% of a 4x4 add)
            out = forward(ctx, *arrays, **kwargs)
        else:  # CuPy allocates and launches on the current GPU: make it the tensors'
            with device:
                out = forward(ctx, *arrays, **kwargs)
        if isinstance(out, np.generic):  # NumPy turns 0-d results into scalars; keep arrays
            out = np.asarray(out)
        result = Tensor._make(out, backend, record)
        if cls.returns_view:
            result._version = args[0]._version
        if not record:
            return result
        ctx.shape = out.shape
        ctx.dtype = out.dtype
        if ctx._saved:  # remember versions of saved inputs/outputs to catch in-place edits
            saved_ids = {id(array) for array in ctx._saved}
            ctx.versions = [(t._version, t._version[0]) for t in (*args, result)
                            if isinstance(t, Tensor) and id(t.data) in saved_ids]
        result.grad_fn = ctx
        return result

    def save_for_backward(self, *arrays: Any) -> None:
        """Keep arrays for backward; they are released after the node's backward runs."""
        self._saved = arrays

    @property
    def saved_tensors(self) -> tuple:
        """What forward saved (arrays, or None for what it chose not to keep)."""
        if self._saved is _FREED:
            raise RuntimeError(
                f"backward: trying to backward through the graph a second time ({self.name()} "
                "already freed its saved arrays); call backward(retain_graph=True) the "
                "first time if you need to")
        return self._saved

    def release(self) -> None:
        self._saved = _FREED

    def name(self) -> str:
        return f"{type(self).__name__}Backward"

    def __repr__(self) -> str:
        return f"<{self.name()}>"


class AccumulateGrad:
    """The graph node of a leaf that requires grad: it adds incoming gradients to ``.grad``.

    It holds its tensor weakly: a leaf that is gone needs no gradient.
    """

    next_nodes = ()

    def __init__(self, tensor: Tensor) -> None:
        self.variable = weakref.ref(tensor)
        self.shape = tensor.shape
        self.dtype = tensor.dtype

    def name(self) -> str:
        return "AccumulateGrad"

    def __repr__(self) -> str:
        return "<AccumulateGrad>"


def _node_of(tensor: Tensor) -> Any:
    """The node a gradient for ``tensor`` flows into: its grad_fn, or its leaf accumulator."""
    if tensor.grad_fn is not None:
        return tensor.grad_fn
    acc = tensor._accumulator
    if acc is None:
        acc = tensor._accumulator = AccumulateGrad(tensor)
    return acc


# --- backward -----------------------------------------------------------------------------
def _topological_order(root: Any) -> list:
    """Nodes reachable from ``root``, each after all nodes that feed gradient into it."""
    order = []
    visited = {root}
    stack = [(root, iter(root.next_nodes))]
    while stack:  # iterative depth-first search; a node is appended after its inputs
        node, children = stack[-1]
        for child in children:
            if child is not None and child not in visited:
                visited.add(child)
                stack.append((child, iter(child.next_nodes)))
                break
        else:
            stack.pop()
            order.append(node)
    order.reverse()  # root first: every node comes before the nodes it sends gradient to
    return order


def backward(tensor: Tensor, gradient: Optional[Any] = None, retain_graph: bool = False) -> None:
    """Accumulate d(tensor)/d(leaf) into every leaf's ``.grad`` that requires grad.

    ``gradient`` (same shape as ``tensor``) is needed unless ``tensor`` has one element.
    """
    if _recorder is not None:
        raise RuntimeError("backward: called inside a function being captured; a capture "
                           "records forward ops only (run backward outside it)")
    if not tensor.requires_grad:
        raise RuntimeError("backward: the tensor does not require grad and has no grad_fn "
                           "(did you build it under no_grad, or from tensors without "
                           "requires_grad=True?)")
    with tensor._backend.on_device():  # every node's backward allocates and launches there
        _backward(tensor, gradient, retain_graph)


def _backward(tensor: Tensor, gradient: Optional[Any], retain_graph: bool) -> None:
    xp = tensor._backend.xp
    tensor._backend.prepare_backward()
    handed_out: set = set()  # ids of arrays already stored as someone's .grad
    if gradient is None:
        if tensor.data.size != 1:
            raise RuntimeError(
                f"backward: grad can be implicitly created only for a tensor with one "
                f"element; got shape {tuple(tensor.shape)}: pass gradient= of that shape")
        grad = xp.ones_like(tensor.data)
    else:
        grad = gradient.data if isinstance(gradient, Tensor) else tensor._backend.asarray(gradient)
        if grad.shape != tensor.data.shape:
            raise RuntimeError(f"backward: gradient has shape {tuple(grad.shape)}, expected "
                               f"the tensor's shape {tuple(tensor.shape)}")
        if grad.dtype != tensor.dtype:
            grad = grad.astype(tensor.dtype)
        handed_out.add(id(grad))

    observer = _observer
    if observer is not None:
        pass_start = observer.clock()
    root = _node_of(tensor)
    grads = {root: grad}
    for node in _topological_order(root):
        grad = grads.pop(node, None)
        if grad is None:
            continue
        if observer is not None:
            start = observer.clock()
        if type(node) is AccumulateGrad:
            _accumulate_into_leaf(node.variable(), grad, handed_out)
            if observer is not None:
                observer.backward_node(node, start, observer.clock())
            continue
        node.saved_tensors  # raises if a previous backward freed this part of the graph
        for box, version in node.versions:
            if box[0] != version:
                raise RuntimeError(
                    f"backward: an array saved by {node.name()} was modified by an in-place "
                    f"operation (version {version} when saved, {box[0]} now)")
        if node.retained is not None:
            kept = node.retained()
            if kept is not None:
                _accumulate_into_leaf(kept, grad, handed_out)
        input_grads = node.backward(node, grad)
        del grad
        if observer is not None:
            observer.backward_node(node, start, observer.clock())
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        if len(input_grads) != len(node.next_nodes):
            raise RuntimeError(f"{node.name()} returned {len(input_grads)} gradients, expected "
                               f"{len(node.next_nodes)} (one per forward input)")
        for child, g in zip(node.next_nodes, input_grads):
            if child is None or g is None:
                continue
            if isinstance(g, np.generic):
                g = np.asarray(g)
            if g.shape != child.shape and node.broadcasts and g.ndim >= len(child.shape):
                g = unbroadcast(g, child.shape)
            if g.shape != child.shape:
                raise RuntimeError(
                    f"{node.name()} returned a gradient of shape {tuple(g.shape)} for an "
                    f"input of shape {tuple(child.shape)}")
            if g.dtype != child.dtype:
                g = g.astype(child.dtype)
            previous = grads.get(child)
            grads[child] = g if previous is None else previous + g
        if not retain_graph:
            node.release()
    if observer is not None:
        observer.backward_pass(pass_start, observer.clock())


def _accumulate_into_leaf(tensor: Optional[Tensor], grad: Any, handed_out: set) -> None:
    if tensor is None:
        return
    if tensor.grad is None:
        # A gradient array may be shared (x + x hands one array to both inputs) or be a
        # view; copy it then, so that in-place updates of one .grad never touch another.
        if grad.base is not None or id(grad) in handed_out:
            grad = grad.copy()
        handed_out.add(id(grad))
        tensor.grad = Tensor._make(grad, tensor._backend, False)
    else:
        tensor.grad.data += grad
