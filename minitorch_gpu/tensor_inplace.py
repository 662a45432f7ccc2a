"""Tensor's in-place updates: ``+=`` and friends, ``add_`` ... ``uniform_``, ``t[key] = v``.
Each writes into the tensor's array and bumps its version counter (shared with its views),
so a backward that saved the old values refuses to run. They are refused on a tensor that
requires grad while grad mode is on: autograd does not record them. ``tensor.py`` copies
this family onto ``Tensor`` (see ``attach_methods``)."""
from __future__ import annotations

from typing import Any

from . import autograd
from . import ops as _ops
from .tensor import Tensor


class TensorInplace:
    """Tensor's in-place updates (attached onto ``Tensor``)."""

    def __iadd__(self, other: Any) -> "Tensor":
        return self.add_(other)

    def __isub__(self, other: Any) -> "Tensor":
        return self.sub_(other)

    def __imul__(self, other: Any) -> "Tensor":
        return self.mul_(other)

    def __itruediv__(self, other: Any) -> "Tensor":
        return self.div_(other)

    def add_(self, other: Any, alpha: Any = 1) -> "Tensor":
        value = _inplace_operand(self, other, "add_")
        if alpha != 1:
            value = value * alpha
        value = _wrapped_int(value, self)
        self.data += value
        return self._bump()

    def sub_(self, other: Any, alpha: Any = 1) -> "Tensor":
        value = _inplace_operand(self, other, "sub_")
        if alpha != 1:
            value = value * alpha
        value = _wrapped_int(value, self)
        self.data -= value
        return self._bump()

    def mul_(self, other: Any) -> "Tensor":
        self.data *= _wrapped_int(_inplace_operand(self, other, "mul_"), self)
        return self._bump()

    def div_(self, other: Any) -> "Tensor":
        self.data /= _inplace_operand(self, other, "div_")
        return self._bump()

    def copy_(self, src: Any) -> "Tensor":
        value = _inplace_operand(self, src, "copy_")
        self.data[...] = value
        return self._bump()

    def fill_(self, value: Any) -> "Tensor":
        _inplace_operand(self, value, "fill_")
        self.data.fill(value)
        return self._bump()

    def zero_(self) -> "Tensor":
        return self.fill_(0)

    def clamp_(self, min: Any = None, max: Any = None) -> "Tensor":
        """Clip to [min, max] in place; one bound may be None (the clamp op's ``clip_array``:
        no None ever reaches CuPy's clip, which refuses it for bf16)."""
        _inplace_operand(self, 0, "clamp_")
        if min is None and max is None:
            raise ValueError("clamp_: at least one of min and max must be given")
        _ops.arithmetic.clip_array(self._backend.xp, self.data, min, max, out=self.data)
        return self._bump()

    def normal_(self, mean: float = 0.0, std: float = 1.0) -> "Tensor":
        """Fill with samples of N(mean, std^2) from the backend's seeded generator."""
        _inplace_operand(self, 0, "normal_")
        self.data[...] = self._backend.randn(self.shape, self.dtype) * std + mean
        return self._bump()

    def uniform_(self, low: float = 0.0, high: float = 1.0) -> "Tensor":
        """Fill with samples of U(low, high) from the backend's seeded generator."""
        _inplace_operand(self, 0, "uniform_")
        self.data[...] = self._backend.rand(self.shape, self.dtype) * (high - low) + low
        return self._bump()

    def __setitem__(self, key: Any, value: Any) -> None:
        value = _inplace_operand(self, value, "setitem")
        target, key = _ops.indexing.setitem_target(self.data, _ops.index_key(key, self))
        target[key] = value
        self._bump()


def _wrapped_int(value: Any, target: Tensor) -> Any:
    """A Python int wrapped into an integer ``target``'s dtype, as PyTorch's in-place
    arithmetic does (``int32_tensor += 2**32`` adds 0), where NumPy raises."""
    if type(value) is int and target.data.dtype.kind in "iu":
        return _ops.promotion.wrap_int(value, target.data.dtype)
    return value


def _inplace_operand(target: Tensor, value: Any, op: str) -> Any:
    """Check an in-place update is allowed, and return ``value`` as something xp accepts."""
    if autograd.is_grad_enabled():
        if target.requires_grad:
            what = "a leaf tensor" if target.is_leaf else "a tensor"
            raise RuntimeError(
                f"{op}: in-place update of {what} that requires grad; do it under "
                "no_grad() (e.g. an optimizer step) or use the out-of-place op")
        if isinstance(value, Tensor) and value.requires_grad:
            raise RuntimeError(f"{op}: the value requires grad but in-place updates are not "
                               "recorded by autograd; use the out-of-place op")
    if isinstance(value, Tensor):
        if value._backend is not target._backend:
            raise RuntimeError(f"{op}: the value is on {value.device}, the tensor on "
                               f"{target.device}")
        return value.data
    return value
