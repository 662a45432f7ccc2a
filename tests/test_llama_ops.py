"""The Llama ops: rms_norm, swiglu and rotary position embeddings (apply_rotary,
rotary_tables, RotaryTables).

The op table (tests/op_table.py) runs their rows on every backend and layout; here each
op is checked table-driven against a plain NumPy formula on more shapes, dtypes and
strides, gradchecked in float64, and held to its properties: the rotation is Hugging
Face's rotate-half form, preserves each pair's norm and is undone by its inverse; tables
from a start position are slices of longer ones; bf16 stays bf16. The fused-kernel hooks
are checked with stand-in kernels on the CPU, and rms_norm and swiglu against PyTorch
where it is installed.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.functional as F
import minitorch_gpu.nn as nn
from minitorch_gpu.backend.numpy_backend import NumpyBackend
from minitorch_gpu.testing import gradcheck

DTYPES = (mt.float32, mt.float64)
RTOL = {mt.float32: 1e-5, mt.float64: 1e-12}


def host(t: mt.Tensor) -> np.ndarray:
    return t.detach().numpy()


def stored(values: np.ndarray, layout: str, dtype) -> mt.Tensor:
    """``values`` as a Tensor of ``dtype`` stored as ``layout`` says: "contiguous"; a
    "transposed" (B, H, T, D) array seen as (B, T, H, D); "projection", the heads as a
    strided view of a (B, T, 3 H D) projection (how q and k come out of one Linear);
    "sliced", every other element of an array twice as large."""
    if layout == "contiguous":
        return mt.tensor(values, dtype=dtype)
    if layout == "transposed":
        return mt.tensor(np.ascontiguousarray(np.swapaxes(values, -2, -3)),
                         dtype=dtype).transpose(-2, -3)
    if layout == "projection":
        b, t, h, d = values.shape
        qkv = np.random.default_rng(1).standard_normal((b, t, 3 * h * d))
        qkv[..., h * d:2 * h * d] = values.reshape(b, t, h * d)
        return mt.tensor(qkv, dtype=dtype)[..., h * d:2 * h * d].view(b, t, h, d)
    if layout == "sliced":
        every_other = (slice(None, None, 2),) * values.ndim
        padded = np.full(tuple(2 * n for n in values.shape), np.nan)
        padded[every_other] = values
        return mt.tensor(padded, dtype=dtype)[every_other]
    raise ValueError(layout)


# --- NumPy formulas ---------------------------------------------------------------------
def tables_np(positions: np.ndarray, d: int, theta: float = 10000.0) -> tuple:
    inv_freq = np.array([theta ** (-2.0 * i / d) for i in range(d // 2)])
    angles = positions[:, None].astype(np.float64) * inv_freq
    return np.cos(angles), np.sin(angles)


def rotary_np(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def rotate_half_hf(q: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Hugging Face's apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, the tables
    repeated over both halves."""
    h = q.shape[-1] // 2
    cos2 = np.concatenate([cos, cos], -1)[:, None, :]
    sin2 = np.concatenate([sin, sin], -1)[:, None, :]
    rotated = np.concatenate([-q[..., h:], q[..., :h]], axis=-1)
    return q * cos2 + rotated * sin2


def swiglu_np(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return g / (1.0 + np.exp(-g)) * u


def rms_norm_np(x: np.ndarray, ndims: int, w=None, eps: float = 1e-6) -> np.ndarray:
    axes = tuple(range(x.ndim - ndims, x.ndim))
    y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    return y * w if w is not None else y


# --- rotary --------------------------------------------------------------------------------
ROTARY_SHAPES = [(2, 5, 3, 8), (1, 7, 1, 2), (3, 4, 2, 16), (2, 1, 4, 6), (1, 9, 5, 10)]
LAYOUTS = ("contiguous", "transposed", "projection", "sliced")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", ROTARY_SHAPES, ids=str)
def test_rotary_matches_the_numpy_formula(shape, layout, dtype):
    b, t, h, d = shape
    values = np.random.default_rng(0).standard_normal(shape)
    x = stored(values, layout, dtype)
    cos, sin = F.rotary_tables(t, d, dtype=dtype)
    out = F.apply_rotary(x, cos, sin)
    assert out.dtype == dtype and tuple(out.shape) == shape and out.is_contiguous()
    expected = rotary_np(values.astype(dtype), *tables_np(np.arange(t), d))
    np.testing.assert_allclose(host(out), expected, rtol=RTOL[dtype], atol=RTOL[dtype])
    np.testing.assert_allclose(host(out), rotate_half_hf(values, *tables_np(np.arange(t), d)),
                               rtol=RTOL[dtype], atol=RTOL[dtype])


@pytest.mark.parametrize("shape", [(5, 3, 8), (2, 2, 4, 3, 6)], ids=str)
def test_rotary_takes_any_leading_dims(shape):
    values = np.random.default_rng(2).standard_normal(shape)
    cos, sin = F.rotary_tables(shape[-3], shape[-1], dtype=mt.float64)
    out = F.apply_rotary(mt.tensor(values, dtype=mt.float64), cos, sin)
    np.testing.assert_allclose(host(out), rotary_np(values, host(cos), host(sin)), rtol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("inverse", [False, True])
def test_rotary_gradcheck(layout, inverse):
    values = np.random.default_rng(3).standard_normal((2, 3, 2, 6))
    x = stored(values, layout, mt.float64).detach().requires_grad_(True)
    if layout in ("projection", "transposed", "sliced"):
        assert not x.is_contiguous()
    cos, sin = F.rotary_tables(3, 6, theta=7.0, start=5, dtype=mt.float64)
    assert gradcheck(lambda x: F.apply_rotary(x, cos, sin, inverse=inverse), [x])


def test_rotary_backward_is_the_inverse_rotation():
    x = mt.randn(2, 4, 3, 8, dtype=mt.float64, requires_grad=True)
    cos, sin = F.rotary_tables(4, 8, dtype=mt.float64)
    g = mt.randn(2, 4, 3, 8, dtype=mt.float64)
    F.apply_rotary(x, cos, sin).backward(g)
    np.testing.assert_allclose(host(x.grad), host(F.apply_rotary(g, cos, sin, inverse=True)),
                               rtol=1e-14)


def test_rotary_inverse_undoes_and_pairs_keep_their_norm():
    x = mt.randn(3, 6, 4, 16, dtype=mt.float64)
    cos, sin = F.rotary_tables(6, 16, start=1000, dtype=mt.float64)
    y = F.apply_rotary(x, cos, sin)
    np.testing.assert_allclose(host(F.apply_rotary(y, cos, sin, inverse=True)), host(x),
                               rtol=1e-12, atol=1e-14)

    def pair_norms(a):
        return np.hypot(a[..., :8], a[..., 8:])
    np.testing.assert_allclose(pair_norms(host(y)), pair_norms(host(x)), rtol=1e-12)


@pytest.mark.parametrize("start", [0, 1, 37, 4095])
def test_tables_from_a_start_are_slices_of_a_longer_table(start):
    cos, sin = F.rotary_tables(5, 12, start=start, dtype=mt.float64)
    long_cos, long_sin = F.rotary_tables(start + 5, 12, dtype=mt.float64)
    np.testing.assert_array_equal(host(cos), host(long_cos)[start:])
    np.testing.assert_array_equal(host(sin), host(long_sin)[start:])
    x = mt.randn(2, start + 5, 3, 12, dtype=mt.float64)
    full = F.apply_rotary(x, long_cos, long_sin)
    tail = F.apply_rotary(x[:, start:], cos, sin)
    np.testing.assert_array_equal(host(tail), host(full)[:, start:])


def test_tables_are_exact_at_large_positions():
    positions = [0, 1, 8191, 131071]
    cos, sin = F.rotary_tables(positions, 64, theta=500000.0, dtype=mt.float64)
    assert not cos.requires_grad and tuple(cos.shape) == (4, 32)
    for row, p in enumerate(positions):
        for i in (0, 1, 17, 31):
            angle = p * 500000.0 ** (-2 * i / 64)
            assert host(cos)[row, i] == pytest.approx(math.cos(angle), rel=1e-12, abs=1e-13)
            assert host(sin)[row, i] == pytest.approx(math.sin(angle), rel=1e-12, abs=1e-13)
    cos32, _ = F.rotary_tables(positions, 64, theta=500000.0)
    assert cos32.dtype == mt.float32
    np.testing.assert_array_equal(host(cos32), host(cos).astype(np.float32))  # one rounding


def test_rotary_tables_cache_hands_out_views():
    tables = F.RotaryTables(8, 64)
    cos, sin = tables(10, 5)
    ref_cos, ref_sin = F.rotary_tables(5, 8, start=10)
    np.testing.assert_array_equal(host(cos), host(ref_cos))
    np.testing.assert_array_equal(host(sin), host(ref_sin))
    again, _ = tables(0, 64)
    assert np.shares_memory(host(cos), host(again))  # one table, sliced
    assert tables(3, 2, dtype=mt.bfloat16)[0].dtype == mt.bfloat16
    assert len(tables._tables) == 2  # float32 and bf16, each made once
    with pytest.raises(ValueError, match="exceed the capacity of 64"):
        tables(60, 5)


def test_rotary_bf16_stays_bf16_and_is_computed_in_float32():
    values = np.random.default_rng(4).standard_normal((2, 5, 3, 8))
    x = mt.tensor(values, dtype=mt.bfloat16, requires_grad=True)
    cos, sin = F.rotary_tables(5, 8, start=100)  # float32 tables, bf16 x
    out = F.apply_rotary(x, cos, sin)
    assert out.dtype == mt.bfloat16
    expected = rotary_np(host(x).astype(np.float64), host(cos), host(sin))
    np.testing.assert_allclose(host(out).astype(np.float64), expected, rtol=1e-2, atol=1e-2)
    out.float().sum().backward()
    assert x.grad.dtype == mt.bfloat16
    with mt.autocast("bf16"):  # no autocast rule: the input's dtype
        assert F.apply_rotary(x.detach().float(), cos, sin).dtype == mt.float32
    bf_cos, bf_sin = F.rotary_tables(5, 8, dtype=mt.bfloat16)
    assert F.apply_rotary(x.detach(), bf_cos, bf_sin).dtype == mt.bfloat16


@pytest.mark.parametrize("call, message", [
    (lambda: F.rotary_tables(4, 7), "head_dim must be an even int > 0"),
    (lambda: F.rotary_tables(4, 0), "head_dim must be an even int > 0"),
    (lambda: F.rotary_tables(4, 8, theta=0.0), "theta must be a finite number > 0"),
    (lambda: F.rotary_tables(4, 8, start=-1), "start must be an int >= 0"),
    (lambda: F.rotary_tables([[1, 2]], 8), "1-D sequence of integer positions"),
    (lambda: F.RotaryTables(8, 0), "capacity must be an int >= 1"),
    (lambda: F.apply_rotary(mt.randn(2, 4, 3, 7), *F.rotary_tables(4, 6)),
     "even head dim D"),
    (lambda: F.apply_rotary(mt.randn(2, 4, 3, 8), *F.rotary_tables(5, 8)),
     r"expected cos of shape \(T, D/2\) = \(4, 4\)"),
    (lambda: F.apply_rotary(mt.randn(4, 8), *F.rotary_tables(4, 8)), "at least 3 dims"),
    (lambda: F.apply_rotary(mt.randn(2, 4, 3, 8), mt.randn(4, 4, requires_grad=True),
                            mt.randn(4, 4)), "cos must not require grad"),
    (lambda: F.apply_rotary(mt.randn(2, 4, 3, 8), mt.randn(4, 4), mt.randn(4, 4)[:, :3]),
     "expected sin of shape"),
    (lambda: F.apply_rotary(mt.ones(2, 4, 3, 8, dtype=mt.int64), *F.rotary_tables(4, 8)),
     "floating-point x"),
    (lambda: F.apply_rotary(mt.randn(2, 4, 20), *F.rotary_tables(4, 8), head_dim=8),
     "head_dim must be an int >= 2 dividing the last dim"),
    (lambda: F.apply_rotary(mt.randn(2, 4, 21), *F.rotary_tables(4, 8), head_dim=7),
     "even head dim D"),
    (lambda: F.apply_rotary(mt.randn(2, 4, 16), *F.rotary_tables(4, 8), head_dim=True),
     "head_dim must be an int >= 2"),
])
def test_rotary_errors(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
def test_rotary_on_a_projection_with_head_dim_equals_the_head_view(layout):
    """apply_rotary(x, cos, sin, head_dim=D) on x (B, T, H * D) is the rotation of
    x.view(B, T, H, D), forward and backward, with x's own shape; also on a column slice
    of a wider projection (a strided view, as q of a fused q|k|v would be)."""
    rng = np.random.default_rng(11)
    B, T, H, D = 2, 5, 3, 6
    wide = rng.standard_normal((B, T, 2 * H * D))
    data = wide[..., H * D:] if layout == "sliced" else wide[..., :H * D].copy()
    cos, sin = F.rotary_tables(T, D, start=3, dtype=mt.float64)
    x = mt.tensor(data, requires_grad=True)
    flat = F.apply_rotary(x, cos, sin, head_dim=D)
    assert tuple(flat.shape) == (B, T, H * D)
    heads = F.apply_rotary(mt.tensor(data).view(B, T, H, D), cos, sin)
    np.testing.assert_array_equal(flat.detach().numpy(), heads.numpy().reshape(B, T, H * D))
    assert gradcheck(lambda t: F.apply_rotary(t, cos, sin, head_dim=D), (x,))


# --- swiglu ------------------------------------------------------------------------------
SWIGLU_SHAPES = [(3, 5), (2, 3, 7), (12, 64, 33), (1,), ()]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("shape", SWIGLU_SHAPES, ids=str)
def test_swiglu_matches_the_formula(shape, layout, dtype):
    rng = np.random.default_rng(5)
    g, u = rng.standard_normal(shape) * 4, rng.standard_normal(shape)
    if layout == "transposed" and len(shape) < 2:
        pytest.skip("nothing to transpose")

    def make(values):
        if layout == "transposed":
            return mt.tensor(np.ascontiguousarray(values.T), dtype=dtype).T
        return stored(values, layout, dtype)
    out = F.swiglu(make(g), make(u))
    assert out.dtype == dtype and tuple(out.shape) == shape
    np.testing.assert_allclose(host(out), swiglu_np(g.astype(dtype), u.astype(dtype)),
                               rtol=RTOL[dtype], atol=RTOL[dtype])


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4), ()], ids=str)
def test_swiglu_gradcheck(shape):
    g = (mt.randn(*shape, dtype=mt.float64) * 3).requires_grad_(True)
    u = mt.randn(*shape, dtype=mt.float64, requires_grad=True)
    assert gradcheck(F.swiglu, [g, u])
    assert gradcheck(lambda g: F.swiglu(g, u.detach()), [g])  # one input wanting grad
    assert gradcheck(lambda u: F.swiglu(g.detach(), u), [u])


@pytest.fixture
def numpy_code():
    """The CPU's NumPy code for the test, the fused CPU kernels (numba's) switched off."""
    cpu = mt.get_backend("cpu")
    cpu.use_fused_kernels = False
    yield
    cpu.use_fused_kernels = True


def test_swiglu_is_one_node_saving_its_inputs_and_the_sigmoid(numpy_code):
    g = mt.randn(4, 6, requires_grad=True)
    u = mt.randn(4, 6, requires_grad=True)
    y = F.swiglu(g, u)
    assert type(y.grad_fn).__name__ == "SwiGLU"
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 3 and saved[0] is g.data and saved[1] is u.data
    np.testing.assert_allclose(saved[2], 1 / (1 + np.exp(-g.detach().numpy())), rtol=1e-6)


def test_swiglu_far_tails_are_finite_and_exact(numpy_code):
    g = mt.tensor([-100.0, -20.0, 0.0, 20.0, 100.0], requires_grad=True)
    u = mt.ones(5, requires_grad=True)
    y = F.swiglu(g, u)
    y.sum().backward()
    gd = np.array([-100.0, -20.0, 0.0, 20.0, 100.0])
    np.testing.assert_allclose(host(y), swiglu_np(gd, 1.0), rtol=1e-6, atol=1e-40)
    assert np.isfinite(host(g.grad)).all() and np.isfinite(host(u.grad)).all()


def test_swiglu_far_tails_are_finite_on_the_cpu_kernels():
    """The kernels' exp is clamped to [-87, 88]: the far tails are finite and within 1e-36
    of the exact values (the NumPy code, above, is exact there)."""
    g = mt.tensor([-100.0, -20.0, 0.0, 20.0, 100.0], requires_grad=True)
    u = mt.ones(5, requires_grad=True)
    y = F.swiglu(g, u)
    y.sum().backward()
    gd = np.array([-100.0, -20.0, 0.0, 20.0, 100.0])
    np.testing.assert_allclose(host(y), swiglu_np(gd, 1.0), rtol=1e-6, atol=1e-36)
    assert np.isfinite(host(g.grad)).all() and np.isfinite(host(u.grad)).all()


def test_swiglu_bf16_and_promotion():
    g = mt.randn(3, 8).bfloat16().requires_grad_(True)
    u = mt.randn(3, 8).bfloat16().requires_grad_(True)
    y = F.swiglu(g, u)
    assert y.dtype == mt.bfloat16
    expected = swiglu_np(host(g).astype(np.float64), host(u).astype(np.float64))
    np.testing.assert_allclose(host(y).astype(np.float64), expected, rtol=1e-2, atol=1e-2)
    y.float().sum().backward()
    assert g.grad.dtype == mt.bfloat16 and u.grad.dtype == mt.bfloat16
    with mt.autocast("bf16"):
        assert F.swiglu(g.detach(), u.detach()).dtype == mt.bfloat16
    assert F.swiglu(g.detach(), u.detach().double()).dtype == mt.float64  # as g * u


@pytest.mark.parametrize("call, message", [
    (lambda: F.swiglu(mt.randn(3, 4), mt.randn(4)), r"same shape, got \(3, 4\) and \(4,\)"),
    (lambda: F.swiglu(mt.randn(3, 4), [1.0]), "expected up to be a Tensor"),
    (lambda: F.swiglu(mt.ones(3, dtype=mt.int64), mt.randn(3)), "floating-point gate"),
])
def test_swiglu_errors(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_swiglu_module():
    layer = nn.SwiGLU()
    assert list(layer.parameters()) == []
    g, u = mt.randn(2, 5), mt.randn(2, 5)
    np.testing.assert_array_equal(host(layer(g, u)), host(F.swiglu(g, u)))


# --- rms_norm ----------------------------------------------------------------------------
RMS_CASES = [((4, 6), 1, True), ((2, 3, 5), 1, True), ((2, 3, 5), 2, False),
             ((3, 1), 1, True), ((12, 64, 33), 1, True)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("shape, ndims, weighted", RMS_CASES, ids=str)
def test_rms_norm_matches_the_formula(shape, ndims, weighted, layout, dtype):
    rng = np.random.default_rng(6)
    values = rng.standard_normal(shape)
    w = rng.standard_normal(shape[len(shape) - ndims:]) if weighted else None
    x = stored(values, layout, dtype)
    out = F.rms_norm(x, shape[len(shape) - ndims:],
                     mt.tensor(w, dtype=dtype) if weighted else None, eps=1e-6)
    assert out.dtype == dtype
    np.testing.assert_allclose(host(out), rms_norm_np(values.astype(dtype), ndims, w),
                               rtol=RTOL[dtype] * 10, atol=RTOL[dtype])


@pytest.mark.parametrize("shape, ndims, weighted", RMS_CASES[:4], ids=str)
def test_rms_norm_gradcheck(shape, ndims, weighted):
    x = stored(np.random.default_rng(7).standard_normal(shape), "sliced", mt.float64)
    x = x.requires_grad_(True)
    tensors = [x]
    if weighted:
        tensors.append(mt.randn(*shape[len(shape) - ndims:], dtype=mt.float64,
                                requires_grad=True))
    normalized = shape[len(shape) - ndims:]
    assert gradcheck(lambda *t: F.rms_norm(t[0], normalized, *t[1:], eps=1e-6), tensors)


def test_rms_norm_statistics_dtype():
    x64 = mt.randn(3, 8, dtype=mt.float64, requires_grad=True)
    y = F.rms_norm(x64, 8)
    assert y.dtype == mt.float64 and y.grad_fn.saved_tensors[1].dtype == np.float64
    xb = mt.randn(3, 8).bfloat16()
    y = F.rms_norm(xb.requires_grad_(True), 8, mt.ones(8).bfloat16())
    assert y.dtype == mt.bfloat16 and y.grad_fn.saved_tensors[1].dtype == np.float32
    with mt.autocast("bf16"):
        y = F.rms_norm(xb, 8, mt.ones(8, requires_grad=True))
    assert y.dtype == mt.float32 and y.grad_fn.saved_tensors[1].dtype == np.float32


def test_rms_norm_long_input_split_over_threads_matches():
    """Long enough for backend/threads.py to split the rows: the pieces' weight gradients
    are added, and the result equals the formula."""
    rng = np.random.default_rng(8)
    values, w = rng.standard_normal((2100, 512)), rng.standard_normal(512)
    x = mt.tensor(values, dtype=mt.float64, requires_grad=True)
    weight = mt.tensor(w, dtype=mt.float64, requires_grad=True)
    y = F.rms_norm(x, 512, weight, eps=1e-6)
    np.testing.assert_allclose(host(y), rms_norm_np(values, 1, w), rtol=1e-12)
    g = rng.standard_normal(values.shape)
    y.backward(mt.tensor(g, dtype=mt.float64))
    rstd = 1 / np.sqrt((values ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(host(weight.grad), (g * values * rstd).sum(0), rtol=1e-10)


# --- against PyTorch ---------------------------------------------------------------------
def test_rms_norm_and_swiglu_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((4, 7, 32), (32,),
                                                                    (4, 7, 32)))
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    torch.nn.functional.rms_norm(tx, (32,), tw, eps=1e-6).backward(torch.tensor(g))
    mx, mw = mt.tensor(x, requires_grad=True), mt.tensor(w, requires_grad=True)
    y = F.rms_norm(mx, (32,), mw, eps=1e-6)
    y.backward(mt.tensor(g))
    ty = torch.nn.functional.rms_norm(torch.tensor(x), (32,), torch.tensor(w), eps=1e-6)
    np.testing.assert_allclose(host(y), ty.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(mx.grad), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(mw.grad), tw.grad.numpy(), rtol=1e-5, atol=1e-4)

    gate, up = (rng.standard_normal((4, 7, 32)).astype(np.float32) * 3 for _ in range(2))
    tg, tu = torch.tensor(gate, requires_grad=True), torch.tensor(up, requires_grad=True)
    ts = torch.nn.functional.silu(tg) * tu
    ts.backward(torch.tensor(g))
    mg, mu = mt.tensor(gate, requires_grad=True), mt.tensor(up, requires_grad=True)
    ms = F.swiglu(mg, mu)
    ms.backward(mt.tensor(g))
    np.testing.assert_allclose(host(ms), ts.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(mg.grad), tg.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(mu.grad), tu.grad.numpy(), rtol=1e-5, atol=1e-6)


# --- the kernel hooks ---------------------------------------------------------------------
def _standin_kernels(calls: list) -> SimpleNamespace:
    """NumPy stand-ins with the kernel hooks' signatures, recording each call's name and
    arguments; they compute in float64 and return float32, as a kernel would."""
    def record(name, fn):
        def call(*args):
            calls.append((name, args))
            return fn(*args)
        return call

    def rms_forward(x, weight, eps, n):
        rows = x.reshape(-1, n).astype(np.float64)
        rstd = 1 / np.sqrt((rows ** 2).mean(-1) + eps)
        out = rows * rstd[:, None] * (weight.reshape(-1) if weight is not None else 1)
        return out.reshape(x.shape).astype(np.float32), rstd.astype(np.float32)

    def rms_backward(grad, x, weight, rstd, n):
        rows, g = x.reshape(-1, n).astype(np.float64), grad.reshape(-1, n)
        x_hat = rows * rstd[:, None]
        g_hat = g * weight.reshape(-1)
        dx = rstd[:, None] * (g_hat - x_hat * (g_hat * x_hat).mean(-1, keepdims=True))
        return (dx.reshape(x.shape).astype(np.float32),
                (g * x_hat).sum(0).reshape(weight.shape).astype(np.float32))

    def rotary(x, cos, sin, inverse):
        return rotary_np(x, cos, -sin if inverse else sin).astype(np.float32)

    def swiglu_backward(grad, gate, up):
        s = 1 / (1 + np.exp(-gate))
        return ((grad * up * s * (1 + gate * (1 - s))).astype(np.float32),
                (grad * gate * s).astype(np.float32))

    supported = lambda *arrays: all(a is None or a.dtype == np.float32 for a in arrays)  # noqa: E731
    return SimpleNamespace(
        supports_rms_norm=supported, supports_rotary=supported, supports_swiglu=supported,
        rms_norm_forward=record("rms_norm_forward", rms_forward),
        rms_norm_backward=record("rms_norm_backward", rms_backward),
        rotary_forward=record("rotary_forward", rotary),
        swiglu_forward=record("swiglu_forward",
                              lambda g, u: swiglu_np(g, u).astype(np.float32)),
        swiglu_backward=record("swiglu_backward", swiglu_backward))


@pytest.fixture
def kernel_calls(monkeypatch):
    calls: list = []
    monkeypatch.setattr(NumpyBackend, "fused_kernels", lambda self: _standin_kernels(calls))
    return calls


def _forward_backward(fn, *inputs, seed=10):
    leaves = [mt.tensor(a, requires_grad=True) for a in inputs]
    out = fn(*leaves)
    grad = np.random.default_rng(seed).standard_normal(out.shape).astype(np.float32)
    out.backward(mt.tensor(grad))
    return host(out), [host(t.grad) for t in leaves]


def test_the_ops_call_the_kernel_hooks(kernel_calls, monkeypatch):
    rng = np.random.default_rng(11)
    x, w = rng.standard_normal((3, 4, 8)).astype(np.float32), rng.random(8).astype(np.float32)
    cos, sin = (host(t) for t in F.rotary_tables(4, 8))
    ops = {
        "rms_norm": (lambda x, w: F.rms_norm(x, 8, w, eps=1e-5), (x, w)),
        "rotary": (lambda x: F.apply_rotary(x.view(3, 4, 2, 4)[:, :, :, :],
                                            mt.tensor(cos[:, :2]), mt.tensor(sin[:, :2])),
                   (x,)),
        "swiglu": (F.swiglu, (x, x[::-1].copy())),
    }
    results = {name: _forward_backward(fn, *args) for name, (fn, args) in ops.items()}
    names = [name for name, _ in kernel_calls]
    assert names == ["rms_norm_forward", "rms_norm_backward", "rotary_forward",
                     "rotary_forward", "swiglu_forward", "swiglu_backward"]
    args = dict(kernel_calls[:2])
    np.testing.assert_array_equal(args["rms_norm_forward"][0], x)
    assert args["rms_norm_forward"][2:] == (1e-5, 8)
    rstd = args["rms_norm_backward"][3]
    assert rstd.shape == (12,) and rstd.dtype == np.float32
    assert args["rms_norm_backward"][4] == 8
    assert kernel_calls[2][1][3] is False and kernel_calls[3][1][3] is True  # the inverse
    monkeypatch.setattr(NumpyBackend, "fused_kernels", lambda self: None)
    for name, (fn, args) in ops.items():  # the NumPy paths give the same
        out, grads = _forward_backward(fn, *args)
        np.testing.assert_allclose(results[name][0], out, rtol=1e-5, atol=1e-6)
        for a, b in zip(results[name][1], grads):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_unsupported_inputs_fall_back_to_numpy(kernel_calls):
    x = mt.randn(3, 4, 2, 8, dtype=mt.float64, requires_grad=True)
    F.apply_rotary(x, *F.rotary_tables(4, 8, dtype=mt.float64)).sum().backward()
    F.rms_norm(x, 8).sum().backward()
    F.swiglu(x, x).sum().backward()
    assert kernel_calls == []
