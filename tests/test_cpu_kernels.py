"""The fused CPU kernels (backend/cpu_kernels, compiled by numba) against the NumPy code
they replace: every op that has a kernel, forward and backward, through the public ops
with the kernels on and off, within 1e-5 relative in float32; the kernels' own arguments
and errors; the switch; a GPT's and a Llama's training steps with and without them.

The NumPy code is the reference (its gradients are checked against central differences
in float64 by the op tests); the kernels take float32 only.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn.functional as F
from minitorch_gpu.backend import cpu_kernels, get_backend
from minitorch_gpu.backend.cpu_kernels import compiler
from minitorch_gpu.ops import attention

import kernel_twins
from training_steps import train_steps

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason="numba is not installed (the kernels are optional)")

CPU = get_backend("cpu")
RTOL = 1e-5


@contextlib.contextmanager
def kernels(on: bool):
    """The CPU backend with its fused kernels on or off for the block."""
    before = CPU.use_fused_kernels
    CPU.use_fused_kernels = on
    try:
        yield
    finally:
        CPU.use_fused_kernels = before


def close(ours, ref, rtol=RTOL):
    """Within ``rtol`` of the reference, relative to its largest magnitude (an element near
    zero is held to the same absolute error as the rest)."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape
    scale = max(np.abs(ref).max(), 1e-30)
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=rtol * scale)


def run_both(fn, arrays, grad_seed=0):
    """``fn(*tensors)``'s output and its inputs' gradients, with the kernels on and off."""
    results = []
    for on in (True, False):
        with kernels(on):
            tensors = [mt.tensor(a, requires_grad=True) for a in arrays]
            out = fn(*tensors)
            grad = np.random.default_rng(grad_seed).standard_normal(out.shape).astype(
                np.float32)
            out.backward(mt.tensor(grad))
            results.append([out.data.copy()] + [t.grad.data.copy() for t in tensors])
    return results


def _randn(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _tables(length, head_dim):
    """Rotary's float32 (cos, sin) tables for positions 3 .. 3 + length - 1."""
    return F.rotary_tables(length, head_dim, start=3)


# name -> (the op on tensors, the input shapes): odd sizes, and arrays past the split
# threshold (SPLIT_FROM elements) so that both the one-thread and the split runs are tested
CASES = {
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [(7, 13)]),
    "gelu_tanh_split": (lambda x: F.gelu(x, approximate="tanh"), [(600, 513)]),
    "gelu_wide_range": (lambda x: F.gelu(x * 12.0, approximate="tanh"), [(64, 33)]),
    "swiglu": (lambda g, u: F.swiglu(g, u), [(5, 11), (5, 11)]),
    "swiglu_split": (lambda g, u: F.swiglu(g, u), [(300, 1001), (300, 1001)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (37,), w, b), [(3, 5, 37), (37,), (37,)]),
    "layer_norm_split": (lambda x, w, b: F.layer_norm(x, (384,), w, b),
                         [(2048, 384), (384,), (384,)]),
    "layer_norm_two_axes": (lambda x, w, b: F.layer_norm(x, (4, 9), w, b),
                            [(6, 4, 9), (4, 9), (4, 9)]),
    "layer_norm_no_affine": (lambda x: F.layer_norm(x, (17,)), [(9, 17)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (23,), w, 1e-6), [(4, 3, 23), (23,)]),
    "rms_norm_split": (lambda x, w: F.rms_norm(x, (256,), w, 1e-5), [(1500, 256), (256,)]),
    "rms_norm_no_weight": (lambda x: F.rms_norm(x, (19,)), [(8, 19)]),
    "causal_attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                        is_causal=True),
                         [(2, 3, 17, 8), (2, 3, 17, 8), (2, 3, 17, 8)]),
    "attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                  [(2, 3, 9, 8), (2, 3, 14, 8), (2, 3, 14, 5)]),
    "causal_attention_split": (lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True), [(8, 6, 256, 16)] * 3),
    "causal_attention_more_queries": (lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True), [(1, 2, 12, 4), (1, 2, 7, 4), (1, 2, 7, 4)]),
    "attention_scaled": (lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=-0.7), [(1, 2, 10, 4)] * 3),
    "grouped_attention": (lambda q, k, v: F.scaled_dot_product_attention(
        q.view(2, 2, 2, 11, 8), k.view(2, 2, 1, 11, 8), v.view(2, 2, 1, 11, 8),
        is_causal=True), [(2, 4, 11, 8), (2, 2, 11, 8), (2, 2, 11, 8)]),
    "rotary": (lambda x: F.apply_rotary(x, *_tables(7, 10)), [(2, 7, 3, 10)]),
    "rotary_heads_side_by_side": (lambda x: F.apply_rotary(x, *_tables(9, 8), head_dim=8),
                                  [(3, 9, 32)]),
    "rotary_inverse": (lambda x: F.apply_rotary(x, *_tables(5, 6), inverse=True),
                       [(1, 5, 2, 6)]),
    "rotary_split": (lambda x: F.apply_rotary(x, *_tables(256, 64), head_dim=64),
                     [(8, 256, 256)]),
    "cross_entropy": (lambda z, t=None: F.cross_entropy(z, mt.tensor(
        np.arange(z.shape[0]) * 7 % z.shape[1])), [(45, 65)]),
    "cross_entropy_smoothing": (lambda z: F.cross_entropy(z, mt.tensor(
        np.arange(z.shape[0]) * 5 % z.shape[1]), label_smoothing=0.1), [(31, 17)]),
    "cross_entropy_ignore": (lambda z: F.cross_entropy(z, mt.tensor(
        np.where(np.arange(z.shape[0]) % 3 == 0, -100, np.arange(z.shape[0]) % 11)),
        ignore_index=-100), [(20, 11)]),
    "cross_entropy_sum": (lambda z: F.cross_entropy(z, mt.tensor(
        np.arange(z.shape[0]) % 9), reduction="sum"), [(12, 9)]),
    "cross_entropy_none": (lambda z: F.cross_entropy(z, mt.tensor(
        np.arange(z.shape[0]) % 9), reduction="none"), [(12, 9)]),
    "cross_entropy_split": (lambda z: F.cross_entropy(z, mt.tensor(
        np.arange(z.shape[0]) % 1000)), [(600, 1000)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernels_match_the_numpy_code(name):
    fn, shapes = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    arrays = [_randn(rng, s, 3.0 if "cross_entropy" in name else 1.0) for s in shapes]
    fused, reference = run_both(fn, arrays)
    for ours, ref in zip(fused, reference):
        close(ours, ref)


@pytest.mark.parametrize("name", ["gelu_tanh", "layer_norm", "causal_attention",
                                  "cross_entropy", "rms_norm", "swiglu", "rotary"])
def test_kernels_take_strided_inputs(name):
    """A transposed (non-contiguous) input gives the same results as its contiguous copy."""
    fn, shapes = CASES[name]
    rng = np.random.default_rng(7)
    arrays = [_randn(rng, s[::-1]).T if len(s) > 1 else _randn(rng, s) for s in shapes]
    assert not arrays[0].flags.c_contiguous
    strided, contiguous = run_both(fn, arrays)[0], run_both(
        fn, [np.ascontiguousarray(a) for a in arrays])[0]
    for ours, ref in zip(strided, contiguous):
        close(ours, ref)


def test_the_kernels_run_on_float32_and_leave_other_dtypes_to_numpy():
    x32 = np.ones((3, 4), np.float32)
    assert CPU.fused_kernels() is cpu_kernels
    assert cpu_kernels.supports_gelu(x32) and not cpu_kernels.supports_gelu(x32, "none")
    assert not cpu_kernels.supports_gelu(x32.astype(np.float64))
    assert not cpu_kernels.supports_layer_norm(x32, np.ones(4), None)
    assert not cpu_kernels.supports_attention_softmax(x32, x32, x32, np.ones((3, 3), bool))
    assert not cpu_kernels.supports_flash_attention(x32, x32, x32, None, 0.0)
    q, table = np.ones((2, 7, 3, 10), np.float32), np.ones((7, 5), np.float32)
    assert cpu_kernels.supports_rotary(q, table, table)
    assert not cpu_kernels.supports_rotary(q.astype(np.float64), table, table)
    assert not cpu_kernels.supports_rotary(q, table.astype(np.float64), table)
    assert not cpu_kernels.supports_rotary(q[..., :9], table, table)  # D odd
    assert not cpu_kernels.supports_rotary(q, table[:6], table[:6])  # T = 6
    assert not cpu_kernels.supports_rotary(q[0], table, table)  # not (B, T, H, D)
    assert not cpu_kernels.supports_cross_entropy(x32, np.zeros(3, np.float32))
    assert cpu_kernels.supports_cross_entropy(x32, np.zeros(3, np.int64))


def test_the_switch_and_a_missing_numba_turn_the_kernels_off(monkeypatch):
    with kernels(False):
        assert CPU.fused_kernels() is None
    assert CPU.fused_kernels() is cpu_kernels
    monkeypatch.setattr(compiler, "numba", None)
    assert "numba is not importable" in compiler.unavailable_reason()
    assert "pip install" in compiler.unavailable_reason()
    assert CPU.fused_kernels() is None


def test_exp32_is_within_3e_7_and_never_overflows():
    x = np.linspace(-87, 88, 200_001, dtype=np.float32)
    out = np.empty_like(x)
    exp_into = compiler.jit(_exp_loop)
    exp_into(x, out)
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(out - exact) / exact) < 3.1e-7  # about 2.5 float32 ulps
    far = np.array([-1e4, -200, 100, 1e4, np.inf, -np.inf], np.float32)
    out = np.empty_like(far)
    exp_into(far, out)
    assert np.all(np.isfinite(out)) and np.all(out[:2] < 1e-37) and np.all(out[2:4] > 1e38)


def _exp_loop(x, out):
    for i in range(x.size):
        out[i] = compiler.exp32(x[i])


def test_attention_dropout_keeps_the_elements_the_cuda_kernel_keeps():
    """The dropout mask is the CUDA kernel's hash of (seed, index): its NumPy twin gives
    the same kept elements and values, and backward recomputes the same mask."""
    rng = np.random.default_rng(3)
    scores = _randn(rng, (2, 3, 19, 19))
    seed = np.array([987654321987], dtype=np.uint64)
    probs, attended = cpu_kernels.attention_softmax_forward(scores, True, 0.3, 0.25, seed,
                                                            np.float32)
    twin_probs, twin_attended = kernel_twins.attention_softmax_forward(scores, True, 0.3, 0.25,
                                                                       seed, np.float32)
    close(probs, twin_probs)
    assert np.array_equal(attended == 0, twin_attended == 0)
    close(attended, twin_attended)
    d = _randn(rng, scores.shape)
    twin = kernel_twins.attention_softmax_backward(d, probs, 0.3, 0.25, seed)
    close(cpu_kernels.attention_softmax_backward(d.copy(), probs, 0.3, 0.25, seed), twin)


def test_attention_with_dropout_trains_on_the_kernel_path(monkeypatch):
    """Dropout in attention runs on the kernels' path (the mask from a drawn seed) and
    keeps about 1 - p of the weights."""
    paths = []
    real = attention._attend

    def spy(ctx, *args, **kwargs):
        result = real(ctx, *args, **kwargs)
        paths.append(ctx.path)
        return result

    monkeypatch.setattr(attention, "_attend", spy)
    rng = np.random.default_rng(4)
    q, k, v = (mt.tensor(_randn(rng, (2, 2, 64, 8)), requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
    out.sum().backward()
    assert paths == ["dense"] and all(np.isfinite(t.grad.data).all() for t in (q, k, v))


@pytest.mark.parametrize("bad, message", [
    (dict(approximate="none"), "approximate='tanh' only"),
    (dict(dy=np.ones((2, 2), np.float64)), "dy must be a float32 NumPy array"),
    (dict(dy=np.ones((3, 2), np.float32)), "dy has shape (3, 2), expected (2, 2)"),
])
def test_kernel_arguments_are_checked(bad, message):
    args = dict(x=np.ones((2, 2), np.float32), dy=np.ones((2, 2), np.float32),
                approximate="tanh")
    args.update(bad)
    with pytest.raises((TypeError, ValueError), match=message.replace("(", r"\(").replace(
            ")", r"\)")):
        cpu_kernels.gelu_backward(**args)
    with pytest.raises(ValueError, match="dropout needs seed"):
        cpu_kernels.attention_softmax_forward(np.ones((2, 2), np.float32), True, 1.0, 0.5,
                                              None, np.float32)
    with pytest.raises(ValueError, match=r"rotary_forward: expected float32 x \(B, T, H, D\)"):
        cpu_kernels.rotary_forward(np.ones((2, 3, 4, 5), np.float32),
                                   np.ones((3, 2), np.float32), np.ones((3, 2), np.float32),
                                   False)
    with pytest.raises(ValueError, match="step counts from 1"):
        p = np.ones(3, np.float32)
        cpu_kernels.adamw_update(p, p.copy(), p.copy(), p.copy(), lr=1e-3, beta1=0.9,
                                 beta2=0.99, eps=1e-8, weight_decay=0.1, step=0)


def _train(arch: str, on: bool):
    """``train_steps`` of a tiny model with the fused kernels on or off."""
    with kernels(on):
        return train_steps(arch, (4, 16), n_embd=32, block_size=16)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_training_steps_agree_with_and_without_the_kernels(arch):
    fused_losses, fused = _train(arch, True)
    ref_losses, ref = _train(arch, False)
    np.testing.assert_allclose(fused_losses, ref_losses, rtol=RTOL)
    assert fused.keys() == ref.keys()
    for name in ref:
        close(fused[name], ref[name])


def test_adamw_step_splits_parameters_and_matches_one_at_a_time(monkeypatch):
    monkeypatch.setattr(compiler, "SPLIT_FROM", 1)
    rng = np.random.default_rng(5)
    sizes = [(300,), (17, 5), (1000,), (2,), (64, 64)]
    params = [_randn(rng, s) for s in sizes]
    grads = [_randn(rng, s) for s in sizes]
    moments = [[np.abs(_randn(rng, s)) for s in sizes] for _ in range(2)]
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
    expected = [p.copy() for p in params]
    for i, p in enumerate(expected):
        m, v = moments[0][i].copy(), moments[1][i].copy()
        from minitorch_gpu.optim.adamw import adamw_update_
        adamw_update_(np, p, grads[i], m, v, np.empty_like(p), step=i + 1, **hyper)
    cpu_kernels.adamw_step(params, grads, *moments, [i + 1 for i in range(len(sizes))],
                           **hyper)
    for ours, ref in zip(params, expected):
        close(ours, ref)
