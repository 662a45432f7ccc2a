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
