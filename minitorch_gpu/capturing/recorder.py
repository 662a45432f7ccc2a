"""The recorder a capturing call installs: every op's forward run and noted with where its
arguments come from, and the refusals of what a replay could not repeat."""
from __future__ import annotations

import sys
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..backend import Backend
from ..tensor import Tensor


class CaptureError(RuntimeError):
    """A captured function did something a replay could not repeat."""


# --- the recorder -------------------------------------------------------------------------
_INPUT, _OP, _CONSTANT, _STRUCT = "input", "op", "constant", "struct"


class _Recorder:
    """What one capturing call installs: autograd's ``_recorder`` (every ``Function.apply``
    outside a forward), the tensor module's hooks (arrays wrapped and in-place updates
    outside an op) and the backends' (host reads and random draws outside an op)."""

    def __init__(self, where: str, keep_arrays: bool = False) -> None:
        self.where = where
        self._kept: List[Any] = []
        self.depth = 0  # > 0 while an op's forward runs: what it does is its own
        self.program: List[tuple] = []  # (forward, ctx, arg sources, kwargs)
        self.origin: Dict[int, tuple] = {}  # id(array) -> (kind, index or name)
        # a CUDA Graph's kernels were given every array noted: kept alive with the graph.
        # Elsewhere an entry goes when its array dies (its id may then be another's), so
        # capturing holds no more memory than an eager call
        self.keep: Optional[List[Any]] = [] if keep_arrays else None
        self.bound: List[Tuple[Tensor, Any]] = []  # external tensors and their arrays
        self.bound_ids: set = set()
        self.constants: List[Any] = []
        self.modules: List[Tuple[Any, bool]] = []  # (module, its training mode) that ran
        self.module_ids: set = set()
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
                             cls.returns_view, bool(ctx._saved)))
        ctx._saved = ()  # saved for a backward that never comes: dropped, as eagerly
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
        elif isinstance(arg, (tuple, list)) and _holds_arrays(arg):
            # an index key holding index arrays: each bound where it came from, the
            # container rebuilt at every replay
            return (_STRUCT, type(arg), tuple(self._source(cls, a, a.data if isinstance(
                a, Tensor) else a) for a in arg))
        else:  # a number, a dtype, a function, a slice: fixed by the caller
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
        key = id(array)
        self.origin[key] = origin
        if self.keep is not None:
            self.keep.append(array)
        else:
            try:
                weakref.finalize(array, self.origin.pop, key, None)
            except TypeError:  # not weakly referenceable: kept instead
                self._kept.append(array)

    # tensor.py's hooks
    def made(self, t: Tensor) -> None:
        """A Tensor was wrapped around an array: by an op (apply notes it itself), by a
        factory (a constant), or by something else (refused once an op reads it)."""
        if self.depth or id(t.data) in self.origin:
            return
        caller = sys._getframe(2).f_code
        if caller in factory_codes():
            self._note(t.data, (_CONSTANT, None))
        else:
            self._note(t.data, ("unrecorded", f"{caller.co_qualname} ({_short(caller)})"))

    def copied(self, data: Any) -> None:
        """A factory copies ``data`` (``tensor(x)``, ``Tensor(x)``): refused when it is a
        value of the capture (an input or an op's result), which the copy would freeze."""
        if self.depth:
            return
        array = data.data if isinstance(data, Tensor) else data
        origin = self.origin.get(id(array))
        if origin is not None and origin[0] in (_INPUT, _OP):
            raise CaptureError(f"{self.where}: {_caller_outside()} copies a value of the "
                               f"capture with a factory (tensor(), Tensor()), outside an op: "
                               f"a replay would keep the captured copy. Use .clone() or an op")

    def module_called(self, module: Any) -> None:
        """A module ran: its ``training`` mode is Python state the capture fixes."""
        if id(module) not in self.module_ids:
            self.module_ids.add(id(module))
            self.modules.append((weakref.ref(module), module.training))

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

    def host_upload(self, backend: Backend, shape: tuple) -> None:
        """Host data of ``shape`` copied to a GPU while a stream captures, which CUDA
        refuses (inside an op too): the graph could not repeat the copy."""
        raise CaptureError(f"{self.where}: {_caller_outside()} copies host data of shape "
                           f"{shape} to {backend.device} while a CUDA Graph captures, which "
                           f"CUDA refuses (a factory such as tensor() of a list or a NumPy "
                           f"array). Make the tensor before the captured function and use "
                           f"it there, or build it with device ops (arange, zeros, full)")

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


def _holds_arrays(value: Any) -> bool:
    return any(isinstance(v, Tensor) or _is_array(v) or
               (isinstance(v, (tuple, list)) and _holds_arrays(v)) for v in value)


def _is_array(value: Any) -> bool:
    return hasattr(value, "__array_interface__") or hasattr(value, "__cuda_array_interface__")


def _short(code: Any) -> str:
    parts = code.co_filename.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) + f":{code.co_firstlineno}"


def _caller_outside() -> str:
    """The first function outside the engine's plumbing (tensor, backend, capture)."""
    frame = sys._getframe(2)
    skip = ("/backend/", "/capturing/", "/tensor.py", "/tensor_math.py", "/autograd.py",
            "/ops/", "/creation.py")
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if not any(s in name for s in skip):
            return f"{frame.f_code.co_qualname} ({_short(frame.f_code)})"
        frame = frame.f_back
    return "a caller"


def _factory_codes() -> frozenset:
    from .. import creation
    return frozenset({creation._finish.__code__, Tensor.__new__.__code__})


_FACTORY_CODES: frozenset = frozenset()


def factory_codes() -> frozenset:
    """The code objects of the factories (made once, on the first capture)."""
    global _FACTORY_CODES
    if not _FACTORY_CODES:
        _FACTORY_CODES = _factory_codes()
    return _FACTORY_CODES
