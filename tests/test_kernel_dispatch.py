"""The ops' fused-kernel branches, run on the CPU with NumPy standing in for the kernels.

On a CUDA backend the ops hand layer norm, GELU, cross-entropy, attention and AdamW to the
kernels in ``backend/kernels`` and keep only what those return (mean and 1/std, the
log-sum-exp, ...). No GPU is needed to check that wiring: here the NumPy backend is made
to offer a stand-in module with the same functions, computed in NumPy (the attention and
cross-entropy ones are the tiled twins of the .cu files in ``tests/kernel_twins.py``), and
the ops' results and gradients through it must equal the vectorised paths'. What is left
for a GPU is only whether each .cu file computes what its stand-in does (tests marked
cuda in test_kernels.py).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn.functional as F
from minitorch_gpu.backend import kernels as real
from minitorch_gpu.backend.numpy_backend import NumpyBackend
from minitorch_gpu.nn import GPT, GPTConfig
from minitorch_gpu.ops import attention as attention_ops
from minitorch_gpu.optim import AdamW

import kernel_twins as reference

F32 = np.float32
FLOATS = (mt.float16, mt.bfloat16, mt.float32, mt.float64)


def _layer_norm_forward(x, weight, bias, eps, normalized_dims=1):
    axes = tuple(range(x.ndim - normalized_dims, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    rows = x.shape[:x.ndim - normalized_dims]
    return y.astype(F32), mean.reshape(rows).astype(F32), rstd.reshape(rows).astype(F32)


def _layer_norm_backward(dy, x, weight, mean, rstd, normalized_dims=1):
    axes = tuple(range(x.ndim - normalized_dims, x.ndim))
    shape = x.shape[:x.ndim - normalized_dims] + (1,) * normalized_dims
    x_hat = (x - mean.reshape(shape)) * rstd.reshape(shape)
    g = dy * (weight if weight is not None else 1.0)
    dx = rstd.reshape(shape) * (g - g.mean(axis=axes, keepdims=True)
                                - x_hat * (g * x_hat).mean(axis=axes, keepdims=True))
    batch = tuple(range(x.ndim - normalized_dims))
    return dx.astype(F32), (dy * x_hat).sum(axis=batch).astype(F32), dy.sum(axis=batch)


def _gelu_terms(x, approximate):
    if approximate == "tanh":
        c = math.sqrt(2 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x ** 3))
        return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (
            1 + 3 * 0.044715 * x * x)
    from minitorch_gpu.backend.numpy_backend import _erf
    cdf = 0.5 * (1 + _erf(x / math.sqrt(2)))
    return x * cdf, cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _adamw_update(param, grad, exp_avg, exp_avg_sq, *, lr, beta1, beta2, eps, weight_decay,
                  step):
    param *= F32(1.0 - lr * weight_decay)
    exp_avg *= F32(beta1)
    exp_avg += F32(1 - beta1) * grad
    exp_avg_sq *= F32(beta2)
    exp_avg_sq += F32(1 - beta2) * grad * grad
    denom = np.sqrt(exp_avg_sq) / F32(math.sqrt(1 - beta2 ** step)) + F32(eps)
    param -= F32(lr / (1 - beta1 ** step)) * exp_avg / denom


def _checked(name, fn):
    """The stand-in of kernel ``name``, refusing what the real launcher refuses (float64
    and bf16 included: the ops must widen before they call)."""
    def call(*arrays, **kwargs):
        for a in arrays:
            if isinstance(a, np.ndarray) and a.dtype in FLOATS:
                assert a.dtype == F32, f"{name} got {a.dtype}: the op must pass float32"
        return fn(*arrays, **kwargs)
    return call


def _flash_checked(name, fn):
    """The stand-in of a flash-attention launcher, which reads q, k, v (and do) as stored:
    it takes what ``supports_flash_attention`` accepts (float32, bf16 or fp16 of one dtype,
    any strides), do in q's dtype, and the forward's float32 o and lse."""
    def call(q, k, v, *rest, **kwargs):
        assert real.supports_flash_attention(q, k, v, None, 0.0), (name, q.dtype, q.shape)
        if name == "flash_attention_backward":
            o, do, lse = rest[:3]
            assert o.dtype == lse.dtype == F32 and do.dtype == q.dtype, (o.dtype, do.dtype)
        return fn(q, k, v, *rest, **kwargs)
    return call


STANDIN = SimpleNamespace(
    supports_layer_norm=real.supports_layer_norm, supports_gelu=real.supports_gelu,
    supports_cross_entropy=real.supports_cross_entropy, supports_adamw=real.supports_adamw,
    supports_flash_attention=real.supports_flash_attention,
    layer_norm_forward=_checked("layer_norm_forward", _layer_norm_forward),
    layer_norm_backward=_checked("layer_norm_backward", _layer_norm_backward),
    gelu_forward=_checked("gelu_forward",
                          lambda x, approximate="tanh": _gelu_terms(x, approximate)[0]),
    gelu_backward=_checked("gelu_backward",
                           lambda x, dy, approximate="tanh": dy * _gelu_terms(x, approximate)[1]),
    cross_entropy_forward=_checked("cross_entropy_forward", reference.cross_entropy_forward),
    cross_entropy_backward=_checked(
        "cross_entropy_backward",
        lambda logits, targets, lse, dloss, ignore_index=-100, label_smoothing=0.0:
        reference.cross_entropy_backward(logits, targets, lse,
                                         np.broadcast_to(np.asarray(dloss, F32),
                                                         (logits.shape[0],)),
                                         ignore_index, label_smoothing)),
    adamw_update=_checked("adamw_update", _adamw_update),
    flash_attention_forward=_flash_checked("flash_attention_forward",
                                           reference.flash_attention_forward),
    flash_attention_backward=_flash_checked("flash_attention_backward",
                                            reference.flash_attention_backward),
    supports_attention_softmax=real.supports_attention_softmax,
    attention_softmax_forward=reference.attention_softmax_forward,
    attention_softmax_backward=reference.attention_softmax_backward,
)


@pytest.fixture
def standin(monkeypatch):
    """Make the CPU backend offer the stand-in kernels (as the CuPy backend offers its own);
    returns a function that turns them off again, for the reference run. Its ``seen`` maps
    each stand-in called to the arguments of its last call."""
    calls = []
    seen = {}

    def counting(name, fn):
        def call(*args, **kwargs):
            calls.append(name)
            seen[name] = args
            return fn(*args, **kwargs)
        return call

    module = SimpleNamespace(**{name: counting(name, fn) if not name.startswith("supports")
                                else fn for name, fn in vars(STANDIN).items()})
    # the packages' adamw_step: adamw_update over a group's parameters (the counted one)
    module.adamw_step = lambda params, grads, ms, vs, steps, **hyper: [
        module.adamw_update(*arrays, step=step, **hyper)
        for *arrays, step in zip(params, grads, ms, vs, steps)]
    state = {"on": True}
    monkeypatch.setattr(NumpyBackend, "fused_kernels",
                        lambda self: module if state["on"] else None)

    def switch(on: bool) -> list:
        state["on"] = on
        return calls
    switch.seen = seen
    return switch


def gpt_run(precision=None):
    mt.manual_seed(0)
    model = GPT(GPTConfig(block_size=40, vocab_size=70, n_layer=2, n_head=2, n_embd=32,
                          bias=True))
    idx = mt.randint(0, 70, (2, 37))  # 37: not a multiple of the 32-key tile
    targets = mt.randint(0, 70, (2, 37))
    with mt.autocast("bf16", enabled=precision == "bf16"):
        logits, loss = model(idx, targets)
    loss.backward()
    return (float(loss), logits.float().detach().numpy(),
            {n: p.grad.numpy().copy() for n, p in model.named_parameters()})


@pytest.mark.parametrize("attention", ["dense", "flash"])
@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_gpt_through_the_kernel_branches_matches_the_vectorised_ops(standin, monkeypatch,
                                                                    precision, attention):
    if attention == "flash":  # attention past the dense path's memory budget
        monkeypatch.setattr(attention_ops, "DENSE_MAX_BYTES", 0)
    standin(False)
    loss_ref, logits_ref, grads_ref = gpt_run(precision)
    calls = standin(True)
    loss, logits, grads = gpt_run(precision)
    # every hot op took its kernel branch, forward and backward
    expected = {"dense": {"attention_softmax_forward", "attention_softmax_backward"},
                "flash": {"flash_attention_forward", "flash_attention_backward"}}
    assert {"layer_norm_forward", "layer_norm_backward", "gelu_forward", "gelu_backward",
            "cross_entropy_forward", "cross_entropy_backward"} | expected[attention] \
        <= set(calls)
    assert not expected["flash" if attention == "dense" else "dense"] & set(calls)
    tol = 1e-5 if precision == "float32" else 2e-2  # bf16: rounding at other places
    assert loss == pytest.approx(loss_ref, rel=tol)
    np.testing.assert_allclose(logits, logits_ref, rtol=tol, atol=tol)
    for name, g in grads.items():
        err = np.linalg.norm(g - grads_ref[name]) / max(np.linalg.norm(grads_ref[name]), 1e-12)
        assert err < (1e-5 if precision == "float32" else 3e-2), (name, err)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_branch_scales_each_reduction(standin, reduction, smoothing):
    mt.manual_seed(0)
    data = mt.randn(6, 300).numpy()
    targets = mt.tensor([0, 5, -1, 299, 7, -1])

    def run():
        logits = mt.tensor(data, requires_grad=True)
        loss = F.cross_entropy(logits, targets, ignore_index=-1, reduction=reduction,
                               label_smoothing=smoothing)
        (loss.sum() if reduction == "none" else loss).backward()
        return loss.detach().numpy(), logits.grad.numpy()

    standin(False)
    loss_ref, grad_ref = run()
    calls = standin(True)
    loss, grad = run()
    assert "cross_entropy_backward" in calls
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, grad_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("attention", ["dense", "flash"])
def test_attention_branch_on_gpt_head_views_and_non_causal(standin, monkeypatch, attention):
    if attention == "flash":
        monkeypatch.setattr(attention_ops, "DENSE_MAX_BYTES", 0)
    mt.manual_seed(0)
    qkv = mt.randn(2, 21, 3 * 48).numpy()

    def run(causal):
        x = mt.tensor(qkv, requires_grad=True)
        q, k, v = x.split(48, dim=2)
        q, k, v = (t.view(2, 21, 3, 16).transpose(1, 2) for t in (q, k, v))  # strided views
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        (y * y).sum().backward()
        return y.detach().numpy(), x.grad.numpy()

    for causal in (True, False):
        standin(False)
        y_ref, g_ref = run(causal)
        calls = standin(True)
        y, g = run(causal)
        assert {"dense": "attention_softmax_backward",
                "flash": "flash_attention_backward"}[attention] in calls
        np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
        # a gradient that is exactly 0 one way (a query that sees one key) is rounding
        # noise the other way: compare against the largest gradient
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-6 * np.abs(g_ref).max())


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_flash_branch_reads_gpt_heads_as_stored(standin, monkeypatch, precision):
    """GPT's attention hands the flash kernels q, k, v as c_attn wrote them: in their dtype
    (bf16 under autocast, not widened) and as strided views of the one (B, T, 3C)
    projection (not copied); its backward gets the output gradient's head view as well."""
    monkeypatch.setattr(attention_ops, "DENSE_MAX_BYTES", 0)
    standin(True)
    gpt_run(precision)
    dtype = {"float32": mt.float32, "bf16": mt.bfloat16}[precision]
    C = 32  # gpt_run's n_embd: 2 heads of 16
    q, k, v = standin.seen["flash_attention_forward"][:3]
    for x in (q, k, v):
        assert x.dtype == dtype and x.shape == (2, 2, 37, 16)
        assert x.strides[-2] == 3 * C * x.itemsize  # rows 3C apart: a head view of qkv
    assert np.may_share_memory(q, k) and np.may_share_memory(q, v)  # of one buffer
    q, k, v, o, do = standin.seen["flash_attention_backward"][:5]
    assert q.dtype == do.dtype == dtype and q.strides[-2] == 3 * C * q.itemsize
    assert do.strides[-2] == C * do.itemsize  # a head view of the (B, T, C) gradient
    assert o.dtype == F32 and o.flags.c_contiguous  # the forward's float32 output


def test_flash_branch_on_bf16_is_float32_attention_rounded_once(standin, monkeypatch):
    """The kernels widen bf16 exactly as they load it and compute in float32: attention of
    bf16 heads is, bit for bit, the float32 attention of the same values with its output
    rounded to bf16 once (and its float32 gradients rounded once by the engine)."""
    monkeypatch.setattr(attention_ops, "DENSE_MAX_BYTES", 0)
    calls = standin(True)
    mt.manual_seed(0)
    values = mt.randn(2, 21, 3 * 48).to(mt.bfloat16).float().numpy()  # bf16's values
    upstream = mt.randn(2, 21, 48).to(mt.bfloat16).float().numpy()

    def run(dtype):
        x = mt.tensor(values, dtype=dtype, requires_grad=True)
        y = F.packed_causal_attention(x, 3)
        y.backward(mt.tensor(upstream, dtype=dtype))
        return y.detach(), x.grad

    y16, g16 = run(mt.bfloat16)
    y32, g32 = run(mt.float32)
    assert calls.count("flash_attention_backward") == 2
    assert y16.dtype == g16.dtype == mt.bfloat16
    np.testing.assert_array_equal(y16.float().numpy(), y32.to(mt.bfloat16).float().numpy())
    np.testing.assert_array_equal(g16.float().numpy(), g32.to(mt.bfloat16).float().numpy())


def test_a_masked_attention_keeps_the_vectorised_path(standin):
    calls = standin(True)
    q = mt.randn(1, 2, 5, 8)
    mask = mt.ones(5, 5, dtype=mt.bool_).tril()
    F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert "flash_attention_forward" not in calls
    assert "attention_softmax_forward" not in calls


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_dense_attention_branch_with_dropout(standin, precision):
    """Dropout inside the softmax kernel: the mask is the hash of a seed the op draws from
    the backend's stream, the same in backward; output and gradients equal attention
    computed by hand in float64 with that mask."""
    calls = standin(True)
    mt.manual_seed(0)
    dtype = {"float32": mt.float32, "bf16": mt.bfloat16}[precision]
    data = [mt.randn(2, 3, 9, 8).numpy() for _ in range(3)]
    p = 0.3
    q, k, v = (mt.tensor(d, dtype=dtype, requires_grad=True) for d in data)
    backend = mt.get_backend("cpu")
    state = backend.get_rng_state()
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    (y.float() * y.float()).sum().backward()
    assert {"attention_softmax_forward", "attention_softmax_backward"} <= set(calls)
    backend.set_rng_state(state)  # the seed the op drew
    seed = backend.randint(0, 2 ** 62, (1,), np.dtype(np.int64)).view(np.uint64)
    keep = reference.dropout_keep(seed, (2, 3, 9, 9), p)
    assert 0.5 < keep.mean() < 0.9

    xs = [mt.tensor(t.detach().float().numpy(), dtype=mt.float64, requires_grad=True)
          for t in (q, k, v)]
    scores = xs[0] @ xs[1].transpose(-1, -2) / math.sqrt(8)
    scores = scores.masked_fill(~mt.ones(9, 9, dtype=mt.bool_).tril(), float("-inf"))
    attended = F.softmax(scores, dim=-1) * mt.tensor(keep.astype(np.float64)) / (1 - p)
    expected = attended @ xs[2]
    (expected * expected).sum().backward()
    tol = 1e-5 if precision == "float32" else 3e-2
    np.testing.assert_allclose(y.float().detach().numpy(), expected.detach().numpy(),
                               rtol=tol, atol=tol)
    for ours, theirs in zip((q, k, v), xs):
        g, g_ref = ours.grad.float().numpy(), theirs.grad.numpy()
        assert np.linalg.norm(g - g_ref) / np.linalg.norm(g_ref) < tol


def test_adamw_branch_matches_the_vectorised_update(standin):
    def run():
        mt.manual_seed(0)
        layer = mt.nn.Linear(8, 4)
        opt = AdamW(layer.parameters(), lr=1e-2, weight_decay=0.1)
        for _ in range(3):
            (layer(mt.randn(5, 8)) ** 2).sum().backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().numpy().copy() for p in layer.parameters()]

    standin(False)
    reference_params = run()
    calls = standin(True)
    params = run()
    assert calls.count("adamw_update") == 6  # 2 parameters x 3 steps
    for p, r in zip(params, reference_params):
        np.testing.assert_allclose(p, r, rtol=1e-6, atol=1e-7)
