"""Activations and elementwise math against PyTorch (a development-only reference: the
file is skipped without it): forward values, dtypes and gradients of the same call on
both sides, including the extremes (+-100 in float32) where a naive formula overflows.
The op table (tests/op_table.py) checks the same ops against NumPy and central
differences on every backend.
"""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.functional as F
import minitorch_gpu.nn as nn

torch = pytest.importorskip("torch")
TF = torch.nn.functional

EXTREMES = np.array([-100.0, -30.0, -20.5, -1.5, -0.0, 0.0, 0.7, 19.5, 20.5, 30.0, 100.0])


def pair(values, dtype="float32", requires_grad=True):
    """The same values as (ours, theirs)."""
    values = np.asarray(values, dtype=dtype)
    ours = mt.tensor(values, requires_grad=requires_grad)
    theirs = torch.tensor(values, requires_grad=requires_grad)
    return ours, theirs


def assert_same(ours, theirs, rtol=1e-6, atol=1e-7):
    theirs = theirs.detach()
    assert ours.dtype == np.dtype(str(theirs.dtype).replace("torch.", "")), \
        f"{ours.dtype} vs {theirs.dtype}"
    assert tuple(ours.shape) == tuple(theirs.shape)
    np.testing.assert_allclose(ours.detach().numpy().astype(np.float64),
                               theirs.numpy().astype(np.float64), rtol=rtol, atol=atol)


ACTIVATIONS = [  # (ours, theirs)
    (F.silu, TF.silu),
    (F.softplus, TF.softplus),
    (lambda x: F.softplus(x, beta=0.5, threshold=5.0),
     lambda x: TF.softplus(x, beta=0.5, threshold=5.0)),
    (F.logsigmoid, TF.logsigmoid),
    (F.leaky_relu, TF.leaky_relu),
    (lambda x: F.leaky_relu(x, negative_slope=0.3), lambda x: TF.leaky_relu(x, 0.3)),
    (F.elu, TF.elu),
    (lambda x: F.elu(x, alpha=0.5), lambda x: TF.elu(x, alpha=0.5)),
    (F.hardtanh, TF.hardtanh),
    (lambda x: F.hardtanh(x, min_val=-2.0, max_val=20.5),
     lambda x: TF.hardtanh(x, min_val=-2.0, max_val=20.5)),
    (F.mish, TF.mish),
]


@pytest.mark.filterwarnings("error")  # no overflow or invalid-value warnings either
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index", range(len(ACTIVATIONS)))
def test_activations_match_pytorch_at_the_extremes(index, dtype):
    ours_fn, theirs_fn = ACTIVATIONS[index]
    x, tx = pair(EXTREMES, dtype)
    y, ty = ours_fn(x), theirs_fn(tx)
    # the tanh form of the sigmoid rounds silu(-20) = -4e-8 to -0 in float32: absolute
    # error below float32's resolution at 1, never an overflow
    atol = 1e-7 if dtype == "float32" else 1e-30
    assert_same(y, ty, rtol=1e-6, atol=atol)
    assert np.isfinite(y.detach().numpy()).all()
    y.sum().backward()
    ty.sum().backward()
    assert_same(x.grad, tx.grad, rtol=1e-6, atol=atol)


@pytest.mark.parametrize("module, theirs", [
    (nn.SiLU(), torch.nn.SiLU()), (nn.Softplus(2.0, 3.0), torch.nn.Softplus(2.0, 3.0)),
    (nn.LeakyReLU(0.1), torch.nn.LeakyReLU(0.1)), (nn.ELU(0.7), torch.nn.ELU(0.7)),
    (nn.Hardtanh(-0.5, 0.5), torch.nn.Hardtanh(-0.5, 0.5)), (nn.Mish(), torch.nn.Mish()),
    (nn.LogSigmoid(), torch.nn.LogSigmoid())], ids=lambda m: type(m).__name__)
def test_activation_modules_match_pytorch(module, theirs):
    values = np.random.default_rng(0).standard_normal((3, 5)) * 3
    x, tx = pair(values, "float64")
    assert_same(module(x), theirs(tx), rtol=1e-12, atol=1e-15)


def test_activations_refuse_integer_input():
    for fn in (F.silu, F.softplus, F.logsigmoid, F.leaky_relu, F.elu, F.hardtanh, F.mish):
        with pytest.raises(TypeError, match="floating"):
            fn(mt.tensor([1, 2]))


def test_bf16_silu_is_computed_in_float32():
    x = mt.tensor([-3.0, 0.5, 4.0]).to(mt.bfloat16)
    y = F.silu(x)
    assert y.dtype == mt.bfloat16
    expected = TF.silu(torch.tensor([-3.0, 0.5, 4.0]).bfloat16().float()).bfloat16()
    np.testing.assert_array_equal(y.float().numpy(), expected.float().numpy())


# --- elementwise math ---------------------------------------------------------------------
UNARY_MATH = ["rsqrt", "erf", "exp2", "log2", "log10", "tan", "asin", "acos", "atan", "sinh",
              "cosh", "asinh", "acosh", "atanh", "floor", "ceil", "round", "trunc", "sign"]
DOMAIN = {"rsqrt": (0.1, 4), "log2": (0.1, 4), "log10": (0.1, 4), "acosh": (1.1, 4),
          "asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9), "tan": (-1.4, 1.4)}


@pytest.mark.parametrize("name", UNARY_MATH)
def test_unary_math_matches_pytorch_as_function_and_method(name):
    low, high = DOMAIN.get(name, (-3, 3))
    values = np.random.default_rng(1).uniform(low, high, (4, 5))
    x, tx = pair(values, "float64")
    for y, ty in ((getattr(mt, name)(x), getattr(torch, name)(tx)),
                  (getattr(x, name)(), getattr(tx, name)())):
        assert_same(y, ty, rtol=1e-12, atol=1e-15)
        y.sum().backward()
        ty.sum().backward()
        assert_same(x.grad, tx.grad, rtol=1e-12, atol=1e-15)
        x.grad, tx.grad = None, None


@pytest.mark.parametrize("name", UNARY_MATH + ["isnan", "isinf", "isfinite"])
def test_integer_inputs_give_what_pytorch_gives(name):
    values = np.array([[1, 2, 3], [4, 5, 9]])
    if name in ("asin", "acos", "atanh"):
        values = np.array([[0, 0, 0], [0, 0, 0]])
    x, tx = mt.tensor(values), torch.tensor(values)
    assert_same(getattr(mt, name)(x), getattr(torch, name)(tx), rtol=1e-6)


def test_round_to_decimals_matches_pytorch():
    values = np.array([1.2345, -2.5, 0.5, 1.5, 125.0, -175.0, 1234.5678])
    x, tx = pair(values, "float64", requires_grad=False)
    for decimals in (-2, -1, 0, 1, 2):
        assert_same(x.round(decimals=decimals), tx.round(decimals=decimals), rtol=1e-12)


DIVIDENDS = np.array([7.5, -7.5, 6.0, -6.0, 0.5, -0.5, 3.0, 0.0])
DIVISORS = np.array([2.0, 2.0, -4.0, -4.0, -0.3, 0.3, 1.5, -2.0])


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("op", ["floor_divide", "remainder", "fmod", "div-floor", "div-trunc",
                                "div", "operators"])
def test_division_family_matches_pytorch(op, dtype):
    grad = dtype != "int64"
    a_values, b_values = DIVIDENDS, DIVISORS
    if dtype == "int64":
        a_values, b_values = np.array([7, -7, 6, -6, 1, -1, 3, 0]), \
            np.array([2, 2, -4, -4, -3, 3, 2, -2])
    a, ta = pair(a_values, dtype, grad)
    b, tb = pair(b_values, dtype, grad)
    if op == "operators":
        outs = [(a // b, ta // tb), (a % b, ta % tb), (7 // b, 7 // tb), (a % 3, ta % 3)]
    elif op.startswith("div-"):
        mode = op[4:]
        outs = [(mt.div(a, b, rounding_mode=mode), torch.div(ta, tb, rounding_mode=mode)),
                (a.div(b, rounding_mode=mode), ta.div(tb, rounding_mode=mode))]
    elif op == "floor_divide":  # torch gives floor_divide no gradient; ours is zero
        outs = [(mt.floor_divide(a, b), torch.floor_divide(ta.detach(), tb.detach())),
                (a.floor_divide(b), ta.detach().floor_divide(tb.detach()))]
    else:
        outs = [(getattr(mt, op)(a, b), getattr(torch, op)(ta, tb)),
                (getattr(a, op)(b), getattr(ta, op)(tb))]
    for y, ty in outs:
        assert_same(y, ty, rtol=1e-6)
    if grad and op not in ("floor_divide", "operators"):
        y, ty = outs[0]
        y.sum().backward()
        ty.sum().backward()
        assert_same(a.grad, ta.grad)
        assert_same(b.grad, tb.grad, rtol=1e-6)


def test_remainder_and_floor_divide_gradients_follow_pytorch():
    a, ta = pair(DIVIDENDS, "float64")
    b, tb = pair(DIVISORS, "float64")
    (a % b).sum().backward()
    (ta % tb).sum().backward()
    assert_same(a.grad, ta.grad)
    assert_same(b.grad, tb.grad)
    a.grad = None
    (a // b).sum().backward()  # zero, as torch's div(rounding_mode="floor")
    assert (a.grad.numpy() == 0).all()


@pytest.mark.parametrize("op", ["atan2", "logaddexp"])
def test_binary_math_matches_pytorch(op):
    rng = np.random.default_rng(2)
    a, ta = pair(rng.standard_normal((3, 4)) * 50, "float32")
    b, tb = pair(rng.standard_normal((4,)) * 50, "float32")
    y, ty = getattr(mt, op)(a, b), getattr(torch, op)(ta, tb)
    assert_same(y, ty, rtol=1e-6)
    y.sum().backward()
    ty.sum().backward()
    assert_same(a.grad, ta.grad, rtol=1e-5, atol=1e-6)
    assert_same(b.grad, tb.grad, rtol=1e-5, atol=1e-6)
    if op == "logaddexp":  # torch has no integer logaddexp; ours gives float32 like atan2
        return
    ours, theirs = mt.tensor([1, 2]), torch.tensor([1, 2])  # integers give float32
    assert_same(getattr(mt, op)(ours, ours), getattr(torch, op)(theirs, theirs), rtol=1e-6)


def test_lerp_matches_pytorch_with_scalar_and_tensor_weights():
    rng = np.random.default_rng(3)
    s, ts = pair(rng.standard_normal((3, 4)), "float64")
    e, te = pair(rng.standard_normal((4,)), "float64")
    w, tw = pair(rng.uniform(0, 1, (3, 1)), "float64")
    for y, ty in ((mt.lerp(s, e, 0.25), torch.lerp(ts, te, 0.25)),
                  (s.lerp(e, w), ts.lerp(te, tw))):
        assert_same(y, ty, rtol=1e-12)
        y.sum().backward()
        ty.sum().backward()
    for ours, theirs in ((s, ts), (e, te), (w, tw)):
        assert_same(ours.grad, theirs.grad, rtol=1e-12)


def test_predicates_match_pytorch():
    values = np.array([1.0, np.nan, np.inf, -np.inf, 0.0, -2.5])
    x, tx = pair(values, "float32", requires_grad=False)
    for name in ("isnan", "isinf", "isfinite"):
        assert_same(getattr(mt, name)(x), getattr(torch, name)(tx))
        assert_same(getattr(x, name)(), getattr(tx, name)())
    other = np.array([1.0 + 1e-6, np.nan, np.inf, np.inf, 1e-9, -2.4])
    y, ty = pair(other, "float32", requires_grad=False)
    for kwargs in ({}, {"equal_nan": True}, {"rtol": 0.05, "atol": 0.0}):
        assert_same(mt.isclose(x, y, **kwargs), torch.isclose(tx, ty, **kwargs))
        assert_same(x.isclose(y, **kwargs), tx.isclose(ty, **kwargs))


@pytest.mark.parametrize("op", [lambda a, b: a // b, lambda a, b: a % b, mt.fmod,
                                lambda a, b: mt.div(a, b, rounding_mode="trunc")])
def test_integer_division_by_zero_is_an_error_as_in_pytorch(op):
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.tensor([3, 4]) // torch.tensor([1, 0])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(mt.tensor([3, 4]), mt.tensor([1, 0]))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(mt.tensor([3, 4]), 0)
