"""Copies and conversions: ``contiguous``/``clone`` (a fresh row-major copy), casts between
dtypes, and moves between devices; each gradient goes back the way its value came."""
from __future__ import annotations

from typing import Any

from ..autograd import Function
from ..backend import dtypes, get_backend
from ..tensor import Tensor
from ._util import require_tensor


class Copy(Function):
    """A fresh row-major copy (``contiguous`` of a non-contiguous tensor, ``clone``)."""

    @staticmethod
    def forward(ctx, a):
        return ctx.xp.array(a, copy=True, order="C")

    @staticmethod
    def backward(ctx, grad):
        return grad


def contiguous(a: Tensor) -> Tensor:
    return Copy.apply(a)


def clone(a: Tensor) -> Tensor:
    return Copy.apply(require_tensor(a, "clone"))


class Cast(Function):
    @staticmethod
    def forward(ctx, a, dtype):
        ctx.in_dtype = a.dtype
        # float32 -> bf16 rounds to nearest, ties to even, in one pass on both backends:
        # ml_dtypes on the CPU (5x faster than the bit-level dtypes.float32_to_bfloat16 it
        # matches bit for bit), CUDA's __float2bfloat16_rn in CuPy's astype on the GPU
        # (checked against it in test_amp; only a NaN's payload differs)
        return a.astype(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.astype(ctx.in_dtype), None


def to_dtype(a: Tensor, dtype: Any) -> Tensor:
    dtype = dtypes.as_dtype(dtype)
    if a.requires_grad and not dtypes.is_floating(dtype):
        # an integer copy can't carry a gradient: cut it from the graph
        return Tensor._make(a.data.astype(dtype), a._backend, False)
    return Cast.apply(a, dtype)


class ToDevice(Function):
    """Move to another device; the gradient moves back. ``to_device`` rebinds the output.
    The target backend's ``asarray`` always copies: from the host, to it, and from another
    GPU (``cuda:0`` to ``cuda:1``), so the two tensors never share memory."""

    @staticmethod
    def forward(ctx, a, target):
        return target.asarray(a)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backend.asarray(grad), None


def to_device(a: Tensor, device: Any) -> Tensor:
    target = get_backend(device)
    out = ToDevice.apply(a, target)
    out._backend = target  # the data now lives on ``target``; its gradient moves back
    return out
