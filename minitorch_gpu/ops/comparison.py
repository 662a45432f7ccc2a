"""Comparisons and logic: eq, ne, lt, le, gt, ge, logical_and/or/not. Bool results,
no gradient; the operands are lifted and promoted as for arithmetic (an int64 tensor
against 0.5 compares as float32)."""
from __future__ import annotations

from typing import Any

from ..tensor import Tensor
from ._util import require_tensor, untracked_binary
from .promotion import binary_operands


def eq(a: Any, b: Any) -> Tensor:
    """``a == b`` elementwise, as a bool tensor."""
    return untracked_binary("equal", *binary_operands(a, b, "eq"))


def ne(a: Any, b: Any) -> Tensor:
    """``a != b`` elementwise, as a bool tensor."""
    return untracked_binary("not_equal", *binary_operands(a, b, "ne"))


def lt(a: Any, b: Any) -> Tensor:
    """``a < b`` elementwise, as a bool tensor."""
    return untracked_binary("less", *binary_operands(a, b, "lt"))


def le(a: Any, b: Any) -> Tensor:
    """``a <= b`` elementwise, as a bool tensor."""
    return untracked_binary("less_equal", *binary_operands(a, b, "le"))


def gt(a: Any, b: Any) -> Tensor:
    """``a > b`` elementwise, as a bool tensor."""
    return untracked_binary("greater", *binary_operands(a, b, "gt"))


def ge(a: Any, b: Any) -> Tensor:
    """``a >= b`` elementwise, as a bool tensor."""
    return untracked_binary("greater_equal", *binary_operands(a, b, "ge"))


def logical_and(a: Any, b: Any) -> Tensor:
    """Elementwise logical and of the operands' truth values, as a bool tensor."""
    return untracked_binary("logical_and", *binary_operands(a, b, "logical_and"))


def logical_or(a: Any, b: Any) -> Tensor:
    """Elementwise logical or of the operands' truth values, as a bool tensor."""
    return untracked_binary("logical_or", *binary_operands(a, b, "logical_or"))


def logical_not(a: Tensor) -> Tensor:
    """Elementwise logical not of ``a``'s truth values, as a bool tensor."""
    require_tensor(a, "logical_not")
    return Tensor._make(a._backend.xp.logical_not(a.data), a._backend, False)
