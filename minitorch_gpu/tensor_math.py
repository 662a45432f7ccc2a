"""Tensor's arithmetic, comparison and bitwise operators and its math methods: elementwise
math, activations, matrix products, reductions, scans, sorting. Each forwards to its op in
``ops``; ``tensor.py`` copies this family onto ``Tensor`` (see ``attach_methods``), where
it is looked up as any method written in the class is."""
from __future__ import annotations

from typing import Any, Optional

from . import ops as _ops
from .tensor import Tensor


class TensorMath:
    """Tensor's operators and math methods (attached onto ``Tensor``)."""

    # --- operators ----------------------------------------------------------------------
    def __add__(self, other: Any) -> "Tensor":
        return _ops.add(self, other)

    def __radd__(self, other: Any) -> "Tensor":
        return _ops.add(other, self)

    def __sub__(self, other: Any) -> "Tensor":
        return _ops.sub(self, other)

    def __rsub__(self, other: Any) -> "Tensor":
        return _ops.sub(other, self)

    def __mul__(self, other: Any) -> "Tensor":
        return _ops.mul(self, other)

    def __rmul__(self, other: Any) -> "Tensor":
        return _ops.mul(other, self)

    def __truediv__(self, other: Any) -> "Tensor":
        return _ops.div(self, other)

    def __rtruediv__(self, other: Any) -> "Tensor":
        return _ops.div(other, self)

    def __floordiv__(self, other: Any) -> "Tensor":
        return _ops.floor_divide(self, other)

    def __rfloordiv__(self, other: Any) -> "Tensor":
        return _ops.floor_divide(other, self)

    def __mod__(self, other: Any) -> "Tensor":
        return _ops.remainder(self, other)

    def __rmod__(self, other: Any) -> "Tensor":
        return _ops.remainder(other, self)

    def __pow__(self, other: Any) -> "Tensor":
        return _ops.pow(self, other)

    def __rpow__(self, other: Any) -> "Tensor":
        return _ops.pow(other, self)

    def __matmul__(self, other: Any) -> "Tensor":
        return _ops.matmul(self, other)

    def __rmatmul__(self, other: Any) -> "Tensor":
        return _ops.matmul(other, self)

    def __neg__(self) -> "Tensor":
        return _ops.neg(self)

    def __abs__(self) -> "Tensor":
        return _ops.abs(self)

    def __eq__(self, other: Any) -> "Tensor":  # type: ignore[override]
        return _ops.eq(self, other)

    def __ne__(self, other: Any) -> "Tensor":  # type: ignore[override]
        return _ops.ne(self, other)

    def __lt__(self, other: Any) -> "Tensor":
        return _ops.lt(self, other)

    def __le__(self, other: Any) -> "Tensor":
        return _ops.le(self, other)

    def __gt__(self, other: Any) -> "Tensor":
        return _ops.gt(self, other)

    def __ge__(self, other: Any) -> "Tensor":
        return _ops.ge(self, other)

    def __and__(self, other: Any) -> "Tensor":
        return _ops.bitwise_and(self, other)

    def __or__(self, other: Any) -> "Tensor":
        return _ops.bitwise_or(self, other)

    def __invert__(self) -> "Tensor":
        return _ops.bitwise_not(self)

    def __xor__(self, other: Any) -> "Tensor":
        return _ops.bitwise_xor(self, other)

    def __rand__(self, other: Any) -> "Tensor":
        return _ops.bitwise_and(other, self)

    def __ror__(self, other: Any) -> "Tensor":
        return _ops.bitwise_or(other, self)

    def __rxor__(self, other: Any) -> "Tensor":
        return _ops.bitwise_xor(other, self)


    # --- arithmetic, comparison and logic -----------------------------------------------
    def add(self, other: Any, *, alpha: Any = 1) -> "Tensor":
        return _ops.add(self, _scaled(other, alpha))

    def sub(self, other: Any, *, alpha: Any = 1) -> "Tensor":
        return _ops.sub(self, _scaled(other, alpha))

    def mul(self, other: Any) -> "Tensor":
        return _ops.mul(self, other)

    multiply = mul

    subtract = sub

    def neg(self) -> "Tensor":
        return _ops.neg(self)

    negative = neg

    def div(self, other: Any, *, rounding_mode: Optional[str] = None) -> "Tensor":
        return _ops.div(self, other, rounding_mode=rounding_mode)

    def divide(self, other: Any, *, rounding_mode: Optional[str] = None) -> "Tensor":
        return self.div(other, rounding_mode=rounding_mode)

    def true_divide(self, other: Any) -> "Tensor":
        return self.div(other)

    def floor_divide(self, other: Any) -> "Tensor":
        return _ops.floor_divide(self, other)

    def remainder(self, other: Any) -> "Tensor":
        return _ops.remainder(self, other)

    def fmod(self, other: Any) -> "Tensor":
        return _ops.fmod(self, other)

    def pow(self, exponent: Any) -> "Tensor":
        return _ops.pow(self, exponent)

    def abs(self) -> "Tensor":
        return _ops.abs(self)

    def absolute(self) -> "Tensor":
        return self.abs()

    def square(self) -> "Tensor":
        return _ops.mul(self, self)

    def clamp(self, min: Any = None, max: Any = None) -> "Tensor":
        return _ops.clamp(self, min, max)

    clip = clamp

    def clamp_min(self, min: Any) -> "Tensor":  # noqa: A002 - torch's name
        return _ops.clamp(self, min, None)

    def clamp_max(self, max: Any) -> "Tensor":  # noqa: A002 - torch's name
        return _ops.clamp(self, None, max)

    def maximum(self, other: Any) -> "Tensor":
        return _ops.maximum(self, other)

    def minimum(self, other: Any) -> "Tensor":
        return _ops.minimum(self, other)

    def where(self, condition: Any, other: Any) -> "Tensor":
        """``self`` where ``condition`` is true, else ``other`` (torch's argument order)."""
        return _ops.where(condition, self, other)

    def masked_fill(self, mask: Any, value: float) -> "Tensor":
        return _ops.masked_fill(self, mask, value)

    def tril(self, diagonal: int = 0) -> "Tensor":
        return _ops.tril(self, diagonal)

    def triu(self, diagonal: int = 0) -> "Tensor":
        return _ops.triu(self, diagonal)

    def eq(self, other: Any) -> "Tensor":
        return _ops.eq(self, other)

    def ne(self, other: Any) -> "Tensor":
        return _ops.ne(self, other)

    def lt(self, other: Any) -> "Tensor":
        return _ops.lt(self, other)

    def le(self, other: Any) -> "Tensor":
        return _ops.le(self, other)

    def gt(self, other: Any) -> "Tensor":
        return _ops.gt(self, other)

    def ge(self, other: Any) -> "Tensor":
        return _ops.ge(self, other)

    greater, less, not_equal = gt, lt, ne

    greater_equal, less_equal = ge, le

    def logical_and(self, other: Any) -> "Tensor":
        return _ops.logical_and(self, other)

    def logical_or(self, other: Any) -> "Tensor":
        return _ops.logical_or(self, other)

    def logical_not(self) -> "Tensor":
        return _ops.logical_not(self)

    def bitwise_and(self, other: Any) -> "Tensor":
        return _ops.bitwise_and(self, other)

    def bitwise_or(self, other: Any) -> "Tensor":
        return _ops.bitwise_or(self, other)

    def bitwise_xor(self, other: Any) -> "Tensor":
        return _ops.bitwise_xor(self, other)

    def bitwise_not(self) -> "Tensor":
        return _ops.bitwise_not(self)

    def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
                equal_nan: bool = False) -> "Tensor":
        return _ops.isclose(self, other, rtol, atol, equal_nan)

    def allclose(self, other: "Tensor", rtol: float = 1e-05, atol: float = 1e-08,
                 equal_nan: bool = False) -> bool:
        other = other.data if isinstance(other, Tensor) else other
        return bool(self._backend.xp.allclose(self.data, other, rtol=rtol, atol=atol,
                                              equal_nan=equal_nan))

    def equal(self, other: "Tensor") -> bool:
        """Same shape and the same values (torch.equal)."""
        return self.shape == other.shape and bool(self._backend.xp.array_equal(self.data,
                                                                               other.data))


    # --- elementwise math and activations -----------------------------------------------
    def exp(self) -> "Tensor":
        return _ops.exp(self)

    def log(self) -> "Tensor":
        return _ops.log(self)

    def sqrt(self) -> "Tensor":
        return _ops.sqrt(self)

    def sin(self) -> "Tensor":
        return _ops.sin(self)

    def cos(self) -> "Tensor":
        return _ops.cos(self)

    def rsqrt(self) -> "Tensor":
        return _ops.rsqrt(self)

    def erf(self) -> "Tensor":
        return _ops.erf(self)

    def exp2(self) -> "Tensor":
        return _ops.exp2(self)

    def log2(self) -> "Tensor":
        return _ops.log2(self)

    def log10(self) -> "Tensor":
        return _ops.log10(self)

    def tan(self) -> "Tensor":
        return _ops.tan(self)

    def asin(self) -> "Tensor":
        return _ops.asin(self)

    def acos(self) -> "Tensor":
        return _ops.acos(self)

    def atan(self) -> "Tensor":
        return _ops.atan(self)

    def sinh(self) -> "Tensor":
        return _ops.sinh(self)

    def cosh(self) -> "Tensor":
        return _ops.cosh(self)

    def asinh(self) -> "Tensor":
        return _ops.asinh(self)

    def acosh(self) -> "Tensor":
        return _ops.acosh(self)

    def atanh(self) -> "Tensor":
        return _ops.atanh(self)

    def atan2(self, other: Any) -> "Tensor":
        return _ops.atan2(self, other)

    def logaddexp(self, other: Any) -> "Tensor":
        return _ops.logaddexp(self, other)

    def lerp(self, end: Any, weight: Any) -> "Tensor":
        return _ops.lerp(self, end, weight)

    def floor(self) -> "Tensor":
        return _ops.floor(self)

    def ceil(self) -> "Tensor":
        return _ops.ceil(self)

    def round(self, *, decimals: int = 0) -> "Tensor":
        return _ops.round(self, decimals=decimals)

    def trunc(self) -> "Tensor":
        return _ops.trunc(self)

    def sign(self) -> "Tensor":
        return _ops.sign(self)

    def isnan(self) -> "Tensor":
        return _ops.isnan(self)

    def isinf(self) -> "Tensor":
        return _ops.isinf(self)

    def isfinite(self) -> "Tensor":
        return _ops.isfinite(self)

    def tanh(self) -> "Tensor":
        return _ops.tanh(self)

    def sigmoid(self) -> "Tensor":
        return _ops.sigmoid(self)

    def relu(self) -> "Tensor":
        return _ops.relu(self)


    # --- matrix products ----------------------------------------------------------------
    def matmul(self, other: Any) -> "Tensor":
        return _ops.matmul(self, other)

    def mm(self, other: "Tensor") -> "Tensor":
        if self.ndim != 2 or getattr(other, "ndim", 0) != 2:
            raise ValueError("mm: expected two 2-D tensors")
        return _ops.matmul(self, other)

    def bmm(self, other: "Tensor") -> "Tensor":
        if self.ndim != 3 or getattr(other, "ndim", 0) != 3:
            raise ValueError("bmm: expected two 3-D tensors")
        return _ops.matmul(self, other)

    def mv(self, vec: "Tensor") -> "Tensor":
        if self.ndim != 2 or getattr(vec, "ndim", 0) != 1:
            raise ValueError("mv: expected a 2-D tensor and a 1-D tensor")
        return _ops.matmul(self, vec)

    def dot(self, other: "Tensor") -> "Tensor":
        if self.ndim != 1 or getattr(other, "ndim", 0) != 1:
            raise ValueError("dot: expected two 1-D tensors")
        return _ops.matmul(self, other)

    def outer(self, other: "Tensor") -> "Tensor":
        return _ops.mul(self.reshape(-1, 1), other.reshape(1, -1))


    # --- reductions, scans, sorting and sampling ----------------------------------------
    def sum(self, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> "Tensor":
        return _ops.sum(self, dim, keepdim, dtype=dtype)

    def mean(self, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> "Tensor":
        return _ops.mean(self, dim, keepdim, dtype=dtype)

    def var(self, dim: Any = None, unbiased: Optional[bool] = None, keepdim: bool = False,
            *, correction: Optional[int] = None) -> "Tensor":
        return _ops.var(self, dim, unbiased=unbiased, keepdim=keepdim, correction=correction)

    def std(self, dim: Any = None, unbiased: Optional[bool] = None, keepdim: bool = False,
            *, correction: Optional[int] = None) -> "Tensor":
        return _ops.std(self, dim, unbiased=unbiased, keepdim=keepdim, correction=correction)

    def amax(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return _ops.amax(self, dim, keepdim)

    def amin(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return _ops.amin(self, dim, keepdim)

    def max(self, dim: Optional[int] = None, keepdim: bool = False) -> Any:
        return _ops.max(self, dim, keepdim)

    def min(self, dim: Optional[int] = None, keepdim: bool = False) -> Any:
        return _ops.min(self, dim, keepdim)

    def argmax(self, dim: Optional[int] = None, keepdim: bool = False) -> "Tensor":
        return _ops.argmax(self, dim, keepdim)

    def argmin(self, dim: Optional[int] = None, keepdim: bool = False) -> "Tensor":
        return _ops.argmin(self, dim, keepdim)

    def any(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return _ops.any(self, dim, keepdim)

    def all(self, dim: Any = None, keepdim: bool = False) -> "Tensor":
        return _ops.all(self, dim, keepdim)

    def logsumexp(self, dim: Any, keepdim: bool = False) -> "Tensor":
        return _ops.logsumexp(self, dim, keepdim)

    def prod(self, dim: Optional[int] = None, keepdim: bool = False, *,
             dtype: Any = None) -> "Tensor":
        return _ops.prod(self, dim, keepdim, dtype=dtype)

    def cumsum(self, dim: int, *, dtype: Any = None) -> "Tensor":
        return _ops.cumsum(self, dim, dtype=dtype)

    def cumprod(self, dim: int, *, dtype: Any = None) -> "Tensor":
        return _ops.cumprod(self, dim, dtype=dtype)

    def softmax(self, dim: int) -> "Tensor":
        return _ops.softmax(self, dim)

    def log_softmax(self, dim: int) -> "Tensor":
        return _ops.log_softmax(self, dim)

    def sort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:
        return _ops.sort(self, dim, descending, stable)

    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> "Tensor":
        return _ops.argsort(self, dim, descending, stable)

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
        return _ops.topk(self, k, dim, largest, sorted)

    def multinomial(self, num_samples: int, replacement: bool = False) -> "Tensor":
        return _ops.multinomial(self, num_samples, replacement)


def _scaled(other: Any, alpha: Any) -> Any:
    """``alpha * other`` for ``add``/``sub``'s ``alpha=`` (a number stays a number)."""
    if alpha == 1:
        return other
    return _ops.mul(other, alpha) if isinstance(other, Tensor) else other * alpha
