"""backend/blas_split.py: stacks of attention-score-shaped products split over the cores
with one BLAS thread each give np.matmul's results, restore BLAS's threads, and leave
every other product to np.matmul.

"The same results" means within the rounding of a product, not bit for bit: a BLAS
kernel may sum a dot product in another order on one thread than on two (OpenBLAS's
Haswell kernels do, its SkylakeX kernels happen not to), and either is a correct
product."""
from __future__ import annotations

import numpy as np
import pytest

from minitorch_gpu.backend import blas_split, get_backend
from minitorch_gpu.backend.threads import set_cpu_threads


def assert_same_product(result, a, b):
    """``result`` is ``a @ b`` to within two roundings of a K-term dot product: each entry
    within 2 K eps (|a| @ |b|) of the float64 product (the textbook bound on a sum of K
    products, in whatever order BLAS adds them)."""
    k, eps = a.shape[-1], np.finfo(result.dtype).eps
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    bound = 2 * k * eps * np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    assert result.shape == exact.shape and result.dtype == a.dtype
    excess = np.abs(result - exact) - bound
    assert excess.max() <= 0, f"off by more than the rounding bound: {excess.max():.3g}"


@pytest.fixture
def two_threads():
    """Two cores for the split and two BLAS threads to lend (restored after)."""
    blas = blas_split._blas()
    if not blas:
        pytest.skip("threadpoolctl finds no single BLAS library here")
    before = blas.get_num_threads()
    blas.set_num_threads(2)
    set_cpu_threads(2)
    yield blas
    set_cpu_threads(None)
    blas.set_num_threads(before)


def _scores_operands(rng, batch=(3, 2), t=256, hs=32, dtype=np.float32):
    """q (..., T, hs) and k^T (..., hs, T) as strided views of a packed projection."""
    packed = rng.standard_normal(batch[:1] + (t, 2 * batch[1] * hs)).astype(dtype)
    heads = packed.reshape(batch[0], t, 2, batch[1], hs)
    return heads[:, :, 0].transpose(0, 2, 1, 3), heads[:, :, 1].transpose(0, 2, 3, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_out", [False, True])
def test_split_products_are_the_products(two_threads, dtype, with_out):
    q, kt = _scores_operands(np.random.default_rng(0), dtype=dtype)
    # NaN, not np.empty: a freed buffer of the same product would hide an unwritten piece
    out = np.full(q.shape[:-1] + kt.shape[-1:], np.nan, dtype) if with_out else None
    result = blas_split.split_matmul(q, kt, out)
    assert result is not None and (out is None or result is out)
    assert_same_product(result, q, kt)
    assert_same_product(np.matmul(q, kt), q, kt)  # NumPy's own, to the same bound
    assert two_threads.get_num_threads() == 2  # restored


def test_broadcast_stacks_split_along_the_first_axis(two_threads):
    """Grouped-query attention's shapes: k broadcast over the group axis."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((4, 2, 3, 256, 16)).astype(np.float32)
    kt = rng.standard_normal((4, 2, 1, 16, 256)).astype(np.float32)
    assert_same_product(blas_split.split_matmul(q, kt), q, kt)
    one = rng.standard_normal((1, 2, 16, 256)).astype(np.float32)  # batch 1 in b only
    qq = rng.standard_normal((5, 2, 256, 16)).astype(np.float32)
    assert_same_product(blas_split.split_matmul(qq, one), qq, one)


@pytest.mark.parametrize("why, a_shape, b_shape", [
    ("2-D", (256, 32), (32, 256)),
    ("one matrix", (1, 256, 32), (1, 32, 256)),
    ("long inner dim (P V)", (4, 256, 256), (4, 256, 64)),
    ("tiny matrices", (4, 64, 32), (4, 32, 64)),
])
def test_other_products_are_left_to_numpy(two_threads, why, a_shape, b_shape):
    rng = np.random.default_rng(2)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    assert blas_split.split_matmul(a, b) is None, why
    assert blas_split.split_matmul(a.astype(np.float64), b) is None  # mixed dtypes


def test_one_blas_thread_or_one_core_is_not_split(two_threads):
    q, kt = _scores_operands(np.random.default_rng(3))
    two_threads.set_num_threads(1)
    assert blas_split.split_matmul(q, kt) is None
    two_threads.set_num_threads(2)
    set_cpu_threads(1)
    assert blas_split.split_matmul(q, kt) is None


def test_the_backend_matmul_takes_the_split(two_threads, monkeypatch):
    calls = []
    real = blas_split.run_split
    monkeypatch.setattr(blas_split, "run_split", lambda fn, pieces: (calls.append(
        len(pieces)), real(fn, pieces)))
    q, kt = _scores_operands(np.random.default_rng(4))
    result = get_backend("cpu").matmul(q, kt)
    assert calls == [2]
    assert_same_product(result, q, kt)
