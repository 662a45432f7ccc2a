"""The losses and normalizations of issue 18 beyond the op table's rows: the logits form of
binary cross-entropy stays finite at any logit, errors name the argument, and the modules
(nn.RMSNorm, nn.Softmax, nn.LogSoftmax) follow PyTorch's signatures."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.functional as F
import minitorch_gpu.nn as nn


def test_bce_with_logits_is_finite_at_huge_logits():
    x = mt.tensor([-1000.0, -50.0, 0.0, 50.0, 1000.0], requires_grad=True)
    t = mt.tensor([1.0, 0.0, 0.5, 1.0, 0.0])
    loss = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    np.testing.assert_allclose(loss.detach().numpy(), [1000.0, 0.0, np.log(2), 0.0, 1000.0],
                               atol=1e-6)
    loss.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [-1.0, 0.0, 0.0, 0.0, 1.0], atol=1e-6)


def test_binary_cross_entropy_clamps_its_logs():
    x = mt.tensor([0.0, 1.0])
    t = mt.tensor([1.0, 0.0])
    with np.errstate(divide="ignore"):  # log(0) = -inf, then clamped (NumPy would warn)
        loss = F.binary_cross_entropy(x, t, reduction="none")
    np.testing.assert_allclose(loss.numpy(), [100.0, 100.0])


def test_nll_loss_mean_divides_by_the_summed_weights():
    logp = mt.tensor(np.log(np.full((3, 2), 0.5)))
    w = mt.tensor([1.0, 3.0])
    loss = F.nll_loss(logp, mt.tensor([0, 1, 1]), w)
    np.testing.assert_allclose(loss.item(), np.log(2))


@pytest.mark.parametrize("call, message", [
    (lambda: F.nll_loss(mt.randn(3, 4), mt.tensor([0, 1])), "target has shape"),
    (lambda: F.nll_loss(mt.randn(3, 4), mt.tensor([0, 1, 1]), mt.ones(3)), "weight"),
    (lambda: F.nll_loss(mt.randn(3, 4), mt.tensor([0, 1, 1]), reduction="avg"), "reduction"),
    (lambda: F.cross_entropy(mt.randn(3, 4), mt.rand(3, 5)), "probability targets"),
    (lambda: F.binary_cross_entropy_with_logits(mt.randn(3), mt.rand(4)), "target has shape"),
    (lambda: F.rms_norm(mt.randn(3, 4), 5), "normalized_shape"),
])
def test_loss_errors_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_nll_loss_target_out_of_range():
    with pytest.raises((ValueError, IndexError), match="out of range"):
        F.nll_loss(mt.randn(3, 4), mt.tensor([0, 4, 1]))


def test_rms_norm_module():
    m = nn.RMSNorm([2, 3])
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    x = mt.randn(4, 2, 3)
    y = m(x).detach().numpy()
    eps = np.finfo(np.float32).eps
    expected = x.numpy() / np.sqrt((x.numpy() ** 2).mean(axis=(1, 2), keepdims=True) + eps)
    np.testing.assert_allclose(y, expected, rtol=1e-5)
    assert not list(nn.RMSNorm(3, eps=1e-6, elementwise_affine=False).parameters())


def test_rms_norm_runs_in_float32_under_autocast():
    x = mt.randn(2, 8).to(mt.bfloat16)
    with mt.autocast("bf16"):
        assert F.rms_norm(x, 8).dtype == mt.float32


def test_softmax_modules():
    x = mt.randn(2, 3)
    np.testing.assert_allclose(nn.Softmax(dim=1)(x).numpy(), F.softmax(x, 1).numpy())
    np.testing.assert_allclose(nn.LogSoftmax(-1)(x).numpy(), F.log_softmax(x, -1).numpy())
    with pytest.raises(ValueError, match="dim"):
        nn.Softmax()
