"""Bitwise ops of integer and bool tensors: and, or, xor, not (``&``, ``|``, ``^``, ``~``):
logical for bool, bitwise for integers, as in PyTorch. No gradient; float operands are
refused."""
from __future__ import annotations

from typing import Any

from ..tensor import Tensor
from ._util import require_tensor, untracked_binary
from .promotion import binary_operands


def _require_integral(op: str, *operands: Any) -> None:
    for x in operands:  # a Tensor, or a Python number the promotion left as it is
        if isinstance(x, float) or (isinstance(x, Tensor) and x.dtype.kind not in "iub"):
            dtype = x.dtype if isinstance(x, Tensor) else type(x)
            raise TypeError(f"{op}: expected integer or bool operands, got {dtype}; compare "
                            "first to get a bool mask (e.g. (x > 0) & (x < 1))")


def _integral_operands(a: Any, b: Any, op: str) -> tuple:
    """The lifted, promoted operands of a bitwise op, checked to be integer or bool."""
    a, b = binary_operands(a, b, op)
    _require_integral(op, a, b)
    return a, b


def bitwise_and(a: Any, b: Any) -> Tensor:
    """``a & b`` of integer or bool tensors."""
    return untracked_binary("bitwise_and", *_integral_operands(a, b, "bitwise_and"))


def bitwise_or(a: Any, b: Any) -> Tensor:
    """``a | b`` of integer or bool tensors."""
    return untracked_binary("bitwise_or", *_integral_operands(a, b, "bitwise_or"))


def bitwise_xor(a: Any, b: Any) -> Tensor:
    """``a ^ b`` of integer or bool tensors."""
    return untracked_binary("bitwise_xor", *_integral_operands(a, b, "bitwise_xor"))


def bitwise_not(a: Tensor) -> Tensor:
    """``~a``: logical not of a bool tensor, bitwise not of an integer one."""
    require_tensor(a, "bitwise_not")
    _require_integral("bitwise_not", a)
    return Tensor._make(a._backend.xp.invert(a.data), a._backend, False)
