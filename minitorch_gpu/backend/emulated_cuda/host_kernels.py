"""The CUDA kernels' launchers for host (NumPy) arrays, run on the emulated GPU: what lets
the CPU backend's ops take their kernel branches through ``backend/kernels`` (the
launchers a GPU runs) instead of ``backend/cpu_kernels``, so each CUDA kernel is tested
against its op, forward and backward, on the CPU.

Each array argument goes to the device as it lies: the array that owns its memory is
copied into one device buffer (once per launch, however many arguments view it) and the
argument becomes the same view of the copy, strides and offset included, so strided heads
are still read in place and a read past the owner's end faults. After the launch every
owner gets its buffer's bytes back (the in-place updates of AdamW), and the results come
back as the NumPy arrays they are.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, Callable, Container, Dict, List

import numpy as np

from . import memory

__all__ = ["kernels_for_host_arrays"]


def _owner(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class _Transfer:
    """One launch's host arrays on the device, and back."""

    def __init__(self) -> None:
        self.copies: Dict[int, tuple] = {}  # id(owner) -> (owner, its device copy)
        self.dense: List[tuple] = []  # (view, its dense device copy) where not mirrored

    def to_device(self, value: Any) -> Any:
        if not isinstance(value, np.ndarray) or memory.is_device_array(value):
            return value
        owner = _owner(value)
        if not owner.flags.c_contiguous or any(s < 0 for s in value.strides):
            copy = memory.to_device(value)  # a layout this can't mirror: a dense copy
            self.dense.append((value, copy))
            return copy
        if id(owner) not in self.copies:
            copy = memory.empty(owner.shape, owner.dtype)
            copy[...] = owner
            self.copies[id(owner)] = (owner, copy)
        raw = self.copies[id(owner)][1]
        offset = value.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
        return np.ndarray(value.shape, value.dtype, buffer=raw, offset=offset,
                          strides=value.strides)

    def back(self) -> None:
        for owner, copy in self.copies.values():
            if owner.flags.writeable:
                owner[...] = copy
        for view, copy in self.dense:
            if view.flags.writeable:
                view[...] = copy


def _on_device(launcher: Callable) -> Callable:
    @functools.wraps(launcher)
    def run(*args: Any, **kwargs: Any) -> Any:
        transfer = _Transfer()
        args = tuple(_map(transfer.to_device, a) for a in args)
        kwargs = {k: _map(transfer.to_device, v) for k, v in kwargs.items()}
        result = launcher(*args, **kwargs)
        transfer.back()
        return result
    return run


def _map(fn: Callable, value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(fn(v) for v in value)
    return fn(value)


def kernels_for_host_arrays(declined: Container[str] = ()) -> SimpleNamespace:
    """``backend/kernels`` (every name it exports) with its launchers taking host arrays
    and running on the emulated GPU (which must be active: ``emulated_cuda.emulated()``);
    each ``supports_NAME`` in ``declined`` says no, so an op takes its next path (the
    flash kernels where the dense softmax kernel would do, say)."""
    from .. import kernels
    names = {}
    for name in kernels.__all__:
        value = getattr(kernels, name)
        if name in declined:
            value = lambda *args, **kwargs: False  # noqa: E731
        elif callable(value) and name.endswith(("_forward", "_backward", "_update", "_step")):
            value = _on_device(value)
        names[name] = value
    return SimpleNamespace(**names)
