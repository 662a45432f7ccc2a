"""The CUDA backend's cuBLAS arguments, checked on the CPU.

``backend/gemm.py`` turns a row-major (batched) product over arrays of any strides into
the column-major arguments of ``cublasGemmStridedBatchedEx``. Here a NumPy model of that
call (what cuBLAS documents it computes, element addresses and all) runs every plan on
flat buffers, and its result must equal ``a @ b``: transposed views, GPT's packed head
views, broadcast batches, vectors, a result written through a transposed view.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from minitorch_gpu.backend import dtypes
from minitorch_gpu.backend.gemm import OP_N, GemmPlan, plan_gemm


def column_major(buffer: np.ndarray, offset: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The (rows, cols) column-major matrix at ``buffer[offset:]`` with leading dim ld."""
    item = buffer.itemsize
    return np.lib.stride_tricks.as_strided(buffer[offset:], (rows, cols), (item, ld * item))


def run_plan(plan: GemmPlan, operands: dict, c: tuple) -> None:
    """cuBLAS's strided batched GEMM, as its documentation defines it, with alpha 1 and
    beta 0: for each batch item i, C_i = op(A_i) op(B_i), all column-major. ``operands``
    maps "a"/"b" to (flat buffer, offset of element 0); ``c`` is the result's."""
    (abuf, aoff), (bbuf, boff) = operands[plan.first], operands[plan.second]
    cbuf, coff = c
    a_rows, a_cols = (plan.m, plan.k) if plan.transa == OP_N else (plan.k, plan.m)
    b_rows, b_cols = (plan.k, plan.n) if plan.transb == OP_N else (plan.n, plan.k)
    assert plan.lda >= max(1, a_rows) and plan.ldb >= max(1, b_rows)  # else cuBLAS refuses
    assert plan.ldc >= max(1, plan.m)
    for i in range(plan.batch):
        A = column_major(abuf, aoff + i * plan.stride_a, a_rows, a_cols, plan.lda)
        B = column_major(bbuf, boff + i * plan.stride_b, b_rows, b_cols, plan.ldb)
        C = column_major(cbuf, coff + i * plan.stride_c, plan.m, plan.n, plan.ldc)
        opA = A if plan.transa == OP_N else A.T
        opB = B if plan.transb == OP_N else B.T
        C[...] = opA @ opB


def strides_of(x: np.ndarray) -> tuple:
    return tuple(s // x.itemsize for s in x.strides)


def offset_in(buffer: np.ndarray, view: np.ndarray) -> int:
    return (view.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]) \
        // buffer.itemsize


def check(a_buf, a, b_buf, b, c_buf=None, c=None) -> GemmPlan:
    """Plan a @ b into c (a fresh contiguous array by default), run the model, compare."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a_full = np.broadcast_to(a, batch + a.shape[-2:])
    b_full = np.broadcast_to(b, batch + b.shape[-2:])
    if c is None:
        c_buf = np.full(int(np.prod(batch + (a.shape[-2], b.shape[-1]))), np.nan)
        c = c_buf.reshape(batch + (a.shape[-2], b.shape[-1]))
    plan = plan_gemm(a_full.shape, strides_of(a_full), b_full.shape, strides_of(b_full),
                     c.shape, strides_of(c))
    assert plan is not None
    run_plan(plan, {"a": (a_buf, offset_in(a_buf, a)), "b": (b_buf, offset_in(b_buf, b))},
             (c_buf, offset_in(c_buf, c)))
    np.testing.assert_allclose(c, a @ b, rtol=1e-12)
    return plan


rng = np.random.default_rng(0)


def flat(n: int) -> np.ndarray:
    return rng.standard_normal(n)


@pytest.mark.parametrize("M, K, N", [(5, 7, 3), (1, 4, 6), (6, 4, 1), (1, 1, 1), (33, 17, 9)])
@pytest.mark.parametrize("a_t, b_t", list(itertools.product([False, True], repeat=2)))
def test_2d_products_in_every_layout(M, K, N, a_t, b_t):
    abuf, bbuf = flat(M * K), flat(K * N)
    a = abuf.reshape(K, M).T if a_t else abuf.reshape(M, K)  # a transposed view or not
    b = bbuf.reshape(N, K).T if b_t else bbuf.reshape(K, N)
    plan = check(abuf, a, bbuf, b)
    assert plan.batch == 1


def test_a_linear_layer_reads_the_weight_transposed():
    x, w = flat(8 * 5), flat(3 * 5)
    plan = check(x, x.reshape(8, 5), w, w.reshape(3, 5).T)  # x @ weight.T
    # C^T = (w.T)^T x^T: cuBLAS's A is the weight read transposed, its B is x as stored
    assert (plan.first, plan.transa, plan.transb) == ("b", 1, 0)


def test_gpt_head_views_and_a_result_written_through_a_transposed_view():
    B, T, nh, hs = 2, 5, 3, 4
    C = nh * hs
    qkv_buf = flat(B * T * 3 * C)
    heads = qkv_buf.reshape(B, T, 3, nh, hs)
    q, k = heads[:, :, 0].transpose(0, 2, 1, 3), heads[:, :, 1].transpose(0, 2, 1, 3)
    # the (B, nh) batch does not reduce to one stride: the caller copies
    kt = k.swapaxes(-1, -2)
    assert plan_gemm(q.shape, strides_of(q), kt.shape, strides_of(kt),
                     (B, nh, T, T), (nh * T * T, T * T, T, 1)) is None
    # one sequence's heads do: stride hs between heads, rows 3C apart
    plan = check(qkv_buf, q[1], qkv_buf, k[1].swapaxes(-1, -2))
    assert plan.batch == nh and plan.stride_a == plan.stride_b == hs
    # scores @ v written through the transposed (T, nh, hs) view of the (T, C) output
    s_buf = flat(nh * T * T)
    out_buf = np.full(T * C, np.nan)
    out = out_buf.reshape(T, nh, hs).transpose(1, 0, 2)
    check(s_buf, s_buf.reshape(nh, T, T), qkv_buf, heads[0, :, 2].transpose(1, 0, 2),
          out_buf, out)


def test_broadcast_batches_and_vectors():
    abuf, bbuf = flat(4 * 3 * 5), flat(5 * 2)
    plan = check(abuf, abuf.reshape(4, 3, 5), bbuf, bbuf.reshape(5, 2))  # b for every item
    # cuBLAS's A is our b (the result is row-major): the same matrix for every item
    assert plan.batch == 4 and plan.first == "b" and plan.stride_a == 0
    check(abuf, abuf.reshape(4, 3, 5)[:1], bbuf, bbuf.reshape(1, 5, 2))
    ones, g = flat(6), flat(6 * 4)  # the bias gradient: a (1, M) row times (M, out)
    check(ones, ones.reshape(1, 6), g, g.reshape(6, 4))
    abuf, bbuf = flat(2 * 3 * 3 * 4), flat(4 * 2)  # two batch dims that reduce to one
    check(abuf, abuf.reshape(2, 3, 3, 4), bbuf, bbuf.reshape(4, 2))


def test_layouts_cuBLAS_cannot_take_give_none():
    x = flat(6 * 8).reshape(6, 8)
    every_other = x[:, ::2]  # neither dim contiguous
    assert plan_gemm((6, 4), strides_of(every_other), (4, 3), (3, 1), (6, 3), (3, 1)) is None
    assert plan_gemm((6, 4), (4, 1), (4, 3), (3, 1), (6, 3), (6, 2)) is None  # strided out
    assert plan_gemm((2, 6, 4), (0, 4, 1), (2, 4, 3), (12, 3, 1), (2, 6, 3), (0, 3, 1)) is None
    assert plan_gemm((6, 0), (0, 1), (0, 3), (3, 1), (6, 3), (3, 1)) is None  # k = 0
    with pytest.raises(ValueError, match="plan_gemm"):
        plan_gemm((6, 4), (4, 1), (5, 3), (3, 1), (6, 3), (3, 1))


# --- the CUDA backend's whole call, with NumPy standing in for CuPy and cuBLAS ------------
class DeviceArray(np.ndarray):
    """A NumPy array that answers ``.data.ptr`` as a CuPy array does (element 0's address)."""

    @property
    def data(self):
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


FAKE_CUPY = SimpleNamespace(
    empty=lambda shape, dtype: np.empty(shape, dtype).view(DeviceArray),
    broadcast_to=lambda x, shape: np.broadcast_to(x, shape, subok=True),
    ascontiguousarray=lambda x: np.ascontiguousarray(x).view(DeviceArray),
    cuda=SimpleNamespace(device=SimpleNamespace(get_cublas_handle=lambda: 7)),
)
CUDA_DTYPES = {0: np.dtype(np.float32), 2: np.dtype(np.float16), 14: dtypes.bfloat16}


def at_address(address: int, dtype: np.dtype, rows: int, cols: int, ld: int) -> np.ndarray:
    """The column-major (rows, cols) matrix with leading dim ld at a raw address."""
    nbytes = ((cols - 1) * ld + rows) * dtype.itemsize
    buffer = np.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=dtype)
    return np.lib.stride_tricks.as_strided(buffer, (rows, cols),
                                           (dtype.itemsize, ld * dtype.itemsize))


class FakeCublas:
    """cuBLAS's two GEMM entry points as CuPy 14 binds them (same positional arguments),
    computing in float64 from raw addresses; records each call."""
    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT = 68, -1

    def __init__(self):
        self.calls = []

    def gemmEx(self, handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb,
               beta, C, Ctype, ldc, compute, algo):
        self.gemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0,
                                  B, Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1, compute, algo,
                                  name="gemmEx")

    def gemmStridedBatchedEx(self, handle, transa, transb, m, n, k, alpha, A, Atype, lda,
                             stride_a, B, Btype, ldb, stride_b, beta, C, Ctype, ldc,
                             stride_c, batch, compute, algo, name="gemmStridedBatchedEx"):
        assert handle == 7 and compute == 68 and algo == -1
        scalar = lambda address: at_address(address, np.dtype(np.float32), 1, 1, 1)[0, 0]
        assert (scalar(alpha), scalar(beta)) == (1.0, 0.0)
        assert Atype == Btype and lda >= 1 and ldb >= 1 and ldc >= max(1, m)
        # CUBLAS_COMPUTE_32F writes C in float32 or in A's and B's type, nothing else
        assert Ctype in (0, Atype), (Atype, Ctype)
        self.calls.append((name, batch))
        ta, tb, tc = CUDA_DTYPES[Atype], CUDA_DTYPES[Btype], CUDA_DTYPES[Ctype]
        a_rows, a_cols = (m, k) if transa == OP_N else (k, m)
        b_rows, b_cols = (k, n) if transb == OP_N else (n, k)
        # cuBLAS's CUBLAS_STATUS_INVALID_VALUE: a leading dim below the stored rows
        assert lda >= max(1, a_rows) and ldb >= max(1, b_rows), (lda, a_rows, ldb, b_rows)
        for i in range(batch):
            opA = at_address(A + i * stride_a * ta.itemsize, ta, a_rows, a_cols, lda)
            opB = at_address(B + i * stride_b * tb.itemsize, tb, b_rows, b_cols, ldb)
            opA = opA if transa == OP_N else opA.T
            opB = opB if transb == OP_N else opB.T
            out = at_address(C + i * stride_c * tc.itemsize, tc, m, n, ldc)
            out[...] = (opA.astype(np.float64) @ opB.astype(np.float64)).astype(tc)


@pytest.fixture
def fake_gpu(monkeypatch):
    from minitorch_gpu.backend import cupy_backend
    cublas = FakeCublas()
    monkeypatch.setattr(cupy_backend, "cupy", FAKE_CUPY)
    monkeypatch.setattr(cupy_backend, "_cublas", cublas)
    backend = SimpleNamespace(_cuda_device=contextlib.nullcontext())
    return lambda a, b, out=None: cupy_backend.CupyBackend._gemm(backend, a, b, out), cublas


def bf16(*shape) -> DeviceArray:
    return rng.standard_normal(shape).astype(dtypes.bfloat16).view(DeviceArray)


def exact(a, b):
    return np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def test_the_cuda_backend_multiplies_bf16_through_cublas(fake_gpu):
    gemm, cublas = fake_gpu
    x, w = bf16(8, 5), bf16(3, 5)
    y = gemm(x, w.T)  # a linear layer: float32 out, one call, nothing copied
    assert y.dtype == np.float32 and y.shape == (8, 3)
    np.testing.assert_allclose(y, exact(x, w.T), rtol=1e-6)
    assert cublas.calls == [("gemmEx", 1)]
    g = bf16(8, 3)  # the bias gradient: ones (M,) @ g (M, out)
    ones = np.ones(8, dtypes.bfloat16).view(DeviceArray)
    np.testing.assert_allclose(gemm(ones, g), exact(ones, g), rtol=1e-6)
    v = bf16(5)
    np.testing.assert_allclose(gemm(x, v), exact(x, v), rtol=1e-6)  # (M, K) @ (K,)


def test_the_cuda_backend_on_gpt_head_views_and_into_a_strided_out(fake_gpu):
    gemm, cublas = fake_gpu
    B, T, nh, hs = 2, 5, 3, 4
    heads = bf16(B, T, 3, nh, hs)  # the packed (B, T, 3C) projection
    q, k, v = (heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    scores = gemm(q, k.swapaxes(-1, -2))  # (B, nh) does not reduce: copied, one call
    np.testing.assert_allclose(scores, exact(q, k.swapaxes(-1, -2)), rtol=1e-6)
    assert cublas.calls[-1] == ("gemmStridedBatchedEx", B * nh)
    probs = scores.astype(dtypes.bfloat16).view(DeviceArray)
    out = np.zeros((B, T, nh * hs), dtypes.bfloat16).view(DeviceArray)
    head_out = out.reshape(B, T, nh, hs).transpose(0, 2, 1, 3)
    assert gemm(probs, v, out=head_out) is head_out  # rounded once, into the view
    expected = exact(probs, v).astype(np.float32).astype(dtypes.bfloat16)
    assert (head_out.view(np.uint16) == expected.view(np.uint16)).all()
    contiguous = np.zeros((B, nh, T, hs), np.float32).view(DeviceArray)
    calls = len(cublas.calls)
    gemm(probs, v, out=contiguous)  # written by cuBLAS itself
    np.testing.assert_allclose(contiguous, exact(probs, v), rtol=1e-6)
    assert len(cublas.calls) == calls + 1
    shared = bf16(1, nh, hs, T)  # broadcast over the batch in one dim only: copied
    np.testing.assert_allclose(gemm(q, shared), exact(q, shared), rtol=1e-6)
    assert gemm(bf16(2, 0), bf16(0, 3)).tolist() == [[0.0] * 3] * 2  # k = 0: zeros
    # an fp16 out for bf16 operands, which cuBLAS can't write: float32, then rounded
    half = np.zeros((B, nh, T, hs), np.float16).view(DeviceArray)
    gemm(probs, v, out=half)
    np.testing.assert_allclose(half, exact(probs, v), rtol=1e-3)
