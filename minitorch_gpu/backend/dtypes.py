"""The dtypes a Tensor can hold, as NumPy dtype objects shared by both backends.

NumPy has no bfloat16; ``ml_dtypes`` adds one that NumPy and CuPy both understand,
so ``bfloat16`` here is a real storage type on each backend (round-to-nearest-even).
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)

default_float = float32
FLOATING = frozenset({float16, bfloat16, float32, float64})
NARROW_FLOATS = (bfloat16, float16)  # computed in float32 ("opmath"), stored narrow

_BY_NAME = {
    "float32": float32, "fp32": float32, "float": float32,
    "float64": float64, "fp64": float64, "double": float64,
    "float16": float16, "fp16": float16, "half": float16,
    "bfloat16": bfloat16, "bf16": bfloat16,
    "int32": int32, "int": int32, "int64": int64, "long": int64,
    "uint8": uint8, "bool": bool_,
}


def as_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype for ``dtype``: a dtype, a Python/NumPy type, or a name such as "bf16".

    Python's ``float`` means float32 and ``int`` means int64, as in PyTorch.
    """
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, str):
        try:
            return _BY_NAME[dtype]
        except KeyError:
            raise ValueError(
                f"unknown dtype {dtype!r}: expected one of {sorted(_BY_NAME)}") from None
    if dtype is float:
        return float32
    if dtype is int:
        return int64
    if dtype is bool:
        return bool_
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"cannot interpret {dtype!r} as a dtype") from None


def is_floating(dtype: np.dtype) -> bool:
    return dtype in FLOATING


def is_integer(dtype: np.dtype) -> bool:
    return dtype.kind in "iu"


def float32_to_bfloat16(x: Any, xp: Any = np) -> Any:
    """``x`` (float32, an array of ``xp``) rounded to bfloat16: to nearest, ties to even, as
    ml_dtypes and CUDA's ``__float2bfloat16_rn`` round. Written on the bits so that both
    backends round the same way: bf16 is the top half of a float32, so add just under half
    of the dropped half (0x7FFF), plus one when the lowest kept bit is odd (a tie then goes
    up to the even neighbour), and keep the top 16 bits. An overflow carries into the
    exponent and gives inf, as it should; NaN becomes the quiet NaN 0x7FC0 with its sign.
    """
    bits = xp.asarray(x, dtype=xp.float32).view(xp.uint32)  # same itemsize: any strides
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    out = xp.where(nan, ((bits >> 16) & 0x8000) | 0x7FC0, rounded)
    return out.astype(xp.uint16).view(bfloat16)
