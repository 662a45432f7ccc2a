"""A row-major (batched) matrix product as the arguments of cuBLAS's column-major GEMM.

cuBLAS multiplies column-major matrices: ``C = op(A) op(B)`` where each operand is a base
pointer, a leading dimension ``ld`` (elements between columns) and a transpose flag, and a
strided batch adds one more stride per operand. NumPy and CuPy arrays are described by
strides instead. A 2-D array of shape (r, c) and strides (s0, s1), in elements, is

- *row-major* when s1 == 1: read column-major, the same memory is its transpose (c, r)
  with ld = s0 (a contiguous matrix, or GPT's q, k, v head views, whose rows are 3C apart);
- *column-major* when s0 == 1: read column-major it is itself (r, c) with ld = s1 (a
  transposed view such as ``weight.T`` or ``k.swapaxes(-1, -2)``).

For a row-major result C (M, N) = A (M, K) B (K, N), cuBLAS computes C^T = B^T A^T: its
first operand is our b and its second our a, each passed untransposed when row-major (the
memory already holds B^T and A^T) and transposed when column-major. For a column-major
result it computes C = A B directly. Batch dims must reduce to one stride per operand
(0 when the operand is broadcast over the batch); where they don't (GPT's (B, nh) head
views step T*3C between sequences and hs between heads), ``plan_gemm`` returns None and
the caller makes that operand contiguous first.

No CuPy here: the tests run every plan through a NumPy model of cuBLAS's GEMM
(tests/test_gemm_plan.py); ``call_cublas`` makes the call with the cuBLAS bindings and the
arrays it is given (CuPy's on a GPU, the stand-in's on the emulated one).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from .dtypes import bfloat16, float16, float32

OP_N, OP_T = 0, 1  # cublasOperation_t
_INT32_MAX = 2 ** 31 - 1
# cudaDataType_t of the dtypes cuBLAS multiplies here (library_types.h)
CUDA_DATA_TYPES = {float32: 0, float16: 2, bfloat16: 14}  # CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
_ONE, _ZERO = np.ones((), np.float32), np.zeros((), np.float32)  # alpha, beta (host memory)


@dataclass(frozen=True)
class GemmPlan:
    """The arguments of ``cublasGemmStridedBatchedEx`` (``gemmEx`` when batch is 1), with
    ``first``/``second`` saying which of our operands ("a" or "b") cuBLAS reads as its A
    and its B. Strides and leading dimensions are in elements."""

    first: str
    second: str
    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    stride_a: int
    stride_b: int
    stride_c: int
    batch: int


def _layout(rows: int, cols: int, s0: int, s1: int) -> Optional[Tuple[str, int]]:
    """("row", ld) or ("col", ld) for a (rows, cols) matrix of strides (s0, s1), or None.
    A dim of size 1 has no stride that matters, so it never stands in the way."""
    if cols == 1 or s1 == 1:  # row-major: read column-major, (cols, rows) with ld = s0
        ld = s0 if rows > 1 else max(cols, 1)
        if ld >= max(cols, 1):
            return "row", ld
    if rows == 1 or s0 == 1:  # column-major: (rows, cols) with ld = s1
        ld = s1 if cols > 1 else max(rows, 1)
        if ld >= max(rows, 1):
            return "col", ld
    return None


def _batch_stride(shape: Sequence[int], strides: Sequence[int]) -> Optional[int]:
    """The one stride that steps through every batch item of these batch dims in order, or
    None when there is none. 0 means the operand is the same matrix for every item."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if not dims:
        return 0
    if all(s == 0 for _, s in dims):
        return 0
    step = dims[-1][1]
    if step < 0:
        return None
    expected = step
    for n, s in reversed(dims):
        if s != expected:
            return None
        expected = s * n
    return step


def plan_gemm(a_shape: Sequence[int], a_strides: Sequence[int], b_shape: Sequence[int],
              b_strides: Sequence[int], c_shape: Sequence[int],
              c_strides: Sequence[int]) -> Optional[GemmPlan]:
    """The cuBLAS arguments of c = a @ b for a (*batch, M, K), b (*batch, K, N) and
    c (*batch, M, N), all of one batch shape (broadcast batch dims have stride 0), strides in
    elements; None when a layout can't be expressed (then copy that operand contiguous)."""
    *batch, M, K = a_shape
    N = b_shape[-1]
    if tuple(b_shape) != (*batch, K, N) or tuple(c_shape) != (*batch, M, N):
        raise ValueError(f"plan_gemm: expected a (*batch, M, K), b (*batch, K, N), c "
                         f"(*batch, M, N), got {tuple(a_shape)}, {tuple(b_shape)}, "
                         f"{tuple(c_shape)}")
    if min(M, N, K) < 1:
        return None  # nothing for cuBLAS to do: the caller fills zeros or returns empty
    count = 1
    for n in batch:
        count *= n
    la = _layout(M, K, *a_strides[-2:])
    lb = _layout(K, N, *b_strides[-2:])
    lc = _layout(M, N, *c_strides[-2:])
    sa = _batch_stride(batch, a_strides[:-2])
    sb = _batch_stride(batch, b_strides[:-2])
    sc = _batch_stride(batch, c_strides[:-2])
    if None in (la, lb, lc, sa, sb, sc) or (sc == 0 and count > 1):
        return None
    if lc[0] == "row":  # C^T (N, M) = B^T A^T: cuBLAS's A is our b, its B our a
        plan = GemmPlan(first="b", second="a",
                        transa=OP_N if lb[0] == "row" else OP_T,
                        transb=OP_N if la[0] == "row" else OP_T,
                        m=N, n=M, k=K, lda=lb[1], ldb=la[1], ldc=lc[1],
                        stride_a=sb, stride_b=sa, stride_c=sc, batch=count)
    else:  # C (M, N) = A B, column-major
        plan = GemmPlan(first="a", second="b",
                        transa=OP_N if la[0] == "col" else OP_T,
                        transb=OP_N if lb[0] == "col" else OP_T,
                        m=M, n=N, k=K, lda=la[1], ldb=lb[1], ldc=lc[1],
                        stride_a=sa, stride_b=sb, stride_c=sc, batch=count)
    if max(plan.m, plan.n, plan.k, plan.lda, plan.ldb, plan.ldc, plan.batch) > _INT32_MAX:
        return None  # cuBLAS takes these as int
    return plan


def expressible(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether one operand of ``shape`` (*batch, rows, cols) and these element strides can be
    handed to cuBLAS as it is (``plan_gemm`` then needs no copy of it)."""
    return _layout(shape[-2], shape[-1], *strides[-2:]) is not None and \
        _batch_stride(shape[:-2], strides[:-2]) is not None


def call_cublas(cublas: Any, handle: int, plan: GemmPlan, first: Any, second: Any,
                c: Any) -> None:
    """C = op(A) op(B) as one call of ``cublas`` (``cupy_backends.cuda.libs.cublas``):
    ``gemmEx``, or ``gemmStridedBatchedEx`` for a batch, with A = ``first`` and B =
    ``second`` (as the plan names them), alpha 1, beta 0 and float32 compute
    (``CUBLAS_COMPUTE_32F``: tensor cores for bf16 and fp16 operands, whose products are
    exact and summed in float32). Each array's dtype gives its ``cudaDataType``."""
    kinds = [CUDA_DATA_TYPES[x.dtype] for x in (first, second, c)]
    if plan.batch == 1:
        cublas.gemmEx(handle, plan.transa, plan.transb, plan.m, plan.n, plan.k,
                      _ONE.ctypes.data, first.data.ptr, kinds[0], plan.lda,
                      second.data.ptr, kinds[1], plan.ldb, _ZERO.ctypes.data,
                      c.data.ptr, kinds[2], plan.ldc, cublas.CUBLAS_COMPUTE_32F,
                      cublas.CUBLAS_GEMM_DEFAULT)
        return
    cublas.gemmStridedBatchedEx(
        handle, plan.transa, plan.transb, plan.m, plan.n, plan.k, _ONE.ctypes.data,
        first.data.ptr, kinds[0], plan.lda, plan.stride_a,
        second.data.ptr, kinds[1], plan.ldb, plan.stride_b, _ZERO.ctypes.data,
        c.data.ptr, kinds[2], plan.ldc, plan.stride_c, plan.batch,
        cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)
