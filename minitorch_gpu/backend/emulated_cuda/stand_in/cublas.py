"""``cupy_backends.cuda.libs.cublas`` of the stand-in: ``gemmEx`` and
``gemmStridedBatchedEx`` as cuBLAS defines them, on device memory addressed by pointers.

cuBLAS is column-major: an m x n matrix with leading dimension ld holds element (i, j) at
``i + j * ld``. So each operand is read here through a strided NumPy view of the raw
memory, after the checks cuBLAS makes (``CUBLAS_STATUS_INVALID_VALUE``: ld below the rows
it stores, a negative size), and the whole of every operand must lie inside one live
device buffer, which is what catches a plan that reads past an array. bf16 and fp16
operands are widened to float32, multiplied with float32 accumulation (what
``CUBLAS_COMPUTE_32F`` promises), and the result rounded once to C's dtype.
"""
from __future__ import annotations

import ctypes
from typing import Any, Tuple

import numpy as np

from .. import memory
from ...dtypes import bfloat16

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
_DATA_TYPES = {0: np.dtype(np.float32), 2: np.dtype(np.float16), 14: np.dtype(bfloat16)}

calls: list = []  # (name, m, n, k, batch) of every call, for the tests
# the (Atype, Btype, Ctype) cuBLAS's cublasGemmEx documents for CUBLAS_COMPUTE_32F that the
# stand-in models: fp32, and bf16 or fp16 operands with a C of their own type or fp32
_COMPUTE_32F_TYPES = {(0, 0, 0), (14, 14, 14), (14, 14, 0), (2, 2, 2), (2, 2, 0)}


class CUBLASError(RuntimeError):
    """``cupy_backends.cuda.libs.cublas.CUBLASError``."""


def _view(pointer: int, dtype: np.dtype, rows: int, cols: int, ld: int, batch: int = 1,
          stride: int = 0, what: str = "A") -> np.ndarray:
    """The (batch, rows, cols) column-major matrices at ``pointer`` as a NumPy view."""
    if ld < max(1, rows):
        raise CUBLASError(f"CUBLAS_STATUS_INVALID_VALUE: ld{what.lower()} = {ld} is less "
                          f"than the {rows} rows of {what}")
    if rows == 0 or cols == 0:
        return np.zeros((batch, rows, cols), dtype)
    item = dtype.itemsize
    last = (batch - 1) * stride + (rows - 1) + (cols - 1) * ld  # in elements
    buffer = memory.find_buffer(pointer)
    if buffer is None or pointer + (last + 1) * item > buffer.stop or stride < 0:
        raise CUBLASError(f"{what}: {batch} x ({rows}, {cols}) with ld {ld} and batch "
                          f"stride {stride} from 0x{pointer:x} is not inside one device "
                          f"buffer (cuBLAS would read out of bounds)")
    raw = (ctypes.c_char * ((last + 1) * item)).from_address(pointer)
    flat = np.frombuffer(raw, dtype=dtype)
    return np.lib.stride_tricks.as_strided(
        flat, (batch, rows, cols), (stride * item, item, ld * item), writeable=True)


def _operand(transpose: int, pointer: int, kind: int, rows: int, cols: int, ld: int,
             batch: int, stride: int, what: str) -> np.ndarray:
    """op(X) as a float32 (batch, rows, cols) array; X is stored (cols, rows) when
    transposed."""
    dtype = _DATA_TYPES.get(kind)
    if dtype is None:
        raise CUBLASError(f"CUBLAS_STATUS_NOT_SUPPORTED: data type {kind} for {what}")
    if transpose == CUBLAS_OP_N:
        stored = _view(pointer, dtype, rows, cols, ld, batch, stride, what)
    elif transpose == CUBLAS_OP_T:
        stored = _view(pointer, dtype, cols, rows, ld, batch, stride, what)
        stored = stored.transpose(0, 2, 1)
    else:
        raise CUBLASError(f"CUBLAS_STATUS_INVALID_VALUE: trans{what.lower()} = {transpose}")
    return stored.astype(np.float32)


def _scalar(pointer: int) -> float:
    return ctypes.c_float.from_address(pointer).value


def _gemm(name: str, transa: int, transb: int, m: int, n: int, k: int, alpha: int,
          a: Tuple[int, int, int, int], b: Tuple[int, int, int, int], beta: int,
          c: Tuple[int, int, int, int], batch: int, compute: int) -> None:
    if min(m, n, k, batch) < 0:
        raise CUBLASError(f"CUBLAS_STATUS_INVALID_VALUE: m={m} n={n} k={k} batch={batch}")
    if compute != CUBLAS_COMPUTE_32F:
        raise CUBLASError(f"the stand-in computes in CUBLAS_COMPUTE_32F only, got {compute}")
    calls.append((name, m, n, k, batch))
    c_pointer, c_kind, ldc, stride_c = c
    kinds = (a[1], b[1], c_kind)
    if kinds not in _COMPUTE_32F_TYPES:  # cuBLAS's table for gemmEx with COMPUTE_32F
        raise CUBLASError(f"CUBLAS_STATUS_NOT_SUPPORTED: A, B, C of data types {kinds} "
                          f"with CUBLAS_COMPUTE_32F")
    out_dtype = _DATA_TYPES.get(c_kind)
    if out_dtype is None:
        raise CUBLASError(f"CUBLAS_STATUS_NOT_SUPPORTED: data type {c_kind} for C")
    target = _view(c_pointer, out_dtype, m, n, ldc, batch, stride_c, "C")
    if m == 0 or n == 0 or batch == 0:
        return
    left = _operand(transa, *a[:2], m, k, a[2], batch, a[3], "A")
    right = _operand(transb, *b[:2], k, n, b[2], batch, b[3], "B")
    product = _scalar(alpha) * np.matmul(left, right)
    if _scalar(beta) != 0:
        product += _scalar(beta) * target.astype(np.float32)
    target[...] = product.astype(out_dtype)


def gemmEx(handle: int, transa: int, transb: int, m: int, n: int, k: int, alpha: int,
           A: int, Atype: int, lda: int, B: int, Btype: int, ldb: int, beta: int, C: int,
           Ctype: int, ldc: int, computeType: int, algo: int) -> None:
    _gemm("gemmEx", transa, transb, m, n, k, alpha, (A, Atype, lda, 0), (B, Btype, ldb, 0),
          beta, (C, Ctype, ldc, 0), 1, computeType)


def gemmStridedBatchedEx(handle: int, transa: int, transb: int, m: int, n: int, k: int,
                         alpha: int, A: int, Atype: int, lda: int, strideA: int, B: int,
                         Btype: int, ldb: int, strideB: int, beta: int, C: int, Ctype: int,
                         ldc: int, strideC: int, batchCount: int, computeType: int,
                         algo: int) -> None:
    _gemm("gemmStridedBatchedEx", transa, transb, m, n, k, alpha, (A, Atype, lda, strideA),
          (B, Btype, ldb, strideB), beta, (C, Ctype, ldc, strideC), batchCount, computeType)
