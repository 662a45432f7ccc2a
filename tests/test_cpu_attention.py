"""The CPU's flash attention kernel (backend/cpu_kernels/attention.py) against the dense
path: values and gradients against attention written out in float64 NumPy (the
reference) and against the ops' float32 dense path; odd lengths, head sizes 17, 32, 64
and 128, causal and not, more queries than keys and fewer, grouped queries, GPT's strided
heads read in place, bf16 inputs read as stored (autocast), dropout masks equal to the CUDA
kernels' (the hash's NumPy twin), the split over threads, the measured dispatch rule, bad
arguments, and a GPT's and a Llama's training steps with the kernel on and off.

Results are compared within float32 rounding of the reference (relative to its largest
magnitude), never bit for bit: the kernel sums in another order than BLAS.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn.functional as F
from minitorch_gpu.backend import cpu_kernels, get_backend
from minitorch_gpu.backend.cpu_kernels import attention as cpu_attention
from minitorch_gpu.backend.cpu_kernels import compiler
from minitorch_gpu.ops import attention

import kernel_twins
from training_steps import train_steps

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason="numba is not installed (the kernels are optional)")

CPU = get_backend("cpu")
RTOL = 2e-5  # float32 against float64: sums of up to a few hundred terms, exp32's 3e-7


def close(ours, ref, rtol=RTOL):
    """Within ``rtol`` of the reference, relative to its largest magnitude."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=rtol * max(np.abs(ref).max(), 1e-30))


@contextlib.contextmanager
def flash(on: bool):
    """The flash kernel taking every size (on) or none (off: the dense kernel's path)."""
    before = cpu_attention.FUSED_FROM
    cpu_attention.FUSED_FROM = dict.fromkeys(before, 1 if on else 10 ** 9)
    try:
        yield
    finally:
        cpu_attention.FUSED_FROM = before


def reference(q, k, v, do, causal, scale, keep=None, dropout_p=0.0):
    """(o, lse, dq, dk, dv) of attention written out in float64; k, v broadcast over q's
    batch dims (grouped queries), their gradients summed back; ``keep`` the dropout mask."""
    q, k, v, do = (np.asarray(a, np.float64) for a in (q, k, v, do))
    s = q @ np.swapaxes(k, -1, -2) * scale  # (..., L, S)
    L, S = s.shape[-2:]
    if causal:
        s = np.where(np.tri(L, S, dtype=bool), s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    p = np.exp(s - top)
    total = p.sum(axis=-1, keepdims=True)
    p /= total
    a = p if keep is None else p * keep / (1.0 - dropout_p)
    o = a @ v
    dv = np.swapaxes(a, -1, -2) @ do
    da = do @ np.swapaxes(v, -1, -2)
    dp = da if keep is None else da * keep / (1.0 - dropout_p)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    dq, dk = ds @ k, np.swapaxes(ds, -1, -2) @ q

    def summed(g, shape):  # over the dims k, v were broadcast along
        axes = tuple(i for i, (n, m) in enumerate(zip(g.shape, shape)) if m == 1 and n != 1)
        return g.sum(axis=axes, keepdims=True)
    return o, (top + np.log(total))[..., 0], dq, summed(dk, k.shape), summed(dv, v.shape)


def _randn(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


# name -> (q shape, k/v shape, causal): odd lengths, the four head sizes, L != S both
# ways, grouped queries (..., Hkv, G, L, E) over (..., Hkv, 1, S, E), several tiles
CASES = {
    "odd_causal_17": ((2, 3, 7, 17), (2, 3, 7, 17), True),
    "odd_32": ((1, 2, 37, 32), (1, 2, 37, 32), False),
    "tiles_causal_64": ((2, 2, 131, 64), (2, 2, 131, 64), True),
    "tiles_128": ((1, 2, 70, 128), (1, 2, 150, 128), False),
    "more_queries_causal": ((1, 2, 90, 32), (1, 2, 67, 32), True),
    "more_keys_causal": ((1, 1, 40, 17), (1, 1, 100, 17), True),
    "grouped_causal": ((2, 2, 3, 77, 32), (2, 2, 1, 77, 32), True),
    "grouped_64": ((1, 3, 2, 65, 64), (1, 3, 1, 65, 64), False),
    "one_query": ((2, 2, 1, 16), (2, 2, 33, 16), False),
    "head_size_1": ((1, 2, 9, 1), (1, 2, 9, 1), True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_launchers_match_float64_attention(name):
    q_shape, kv_shape, causal = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    q, do = _randn(rng, q_shape), _randn(rng, q_shape)
    k, v = _randn(rng, kv_shape), _randn(rng, kv_shape)
    scale = 1.0 / np.sqrt(q_shape[-1])
    o, lse = cpu_kernels.flash_attention_forward(q, k, v, causal, scale)
    grads = cpu_kernels.flash_attention_backward(q, k, v, o, do, lse, causal, scale)
    assert o.dtype == lse.dtype == np.float32 and lse.shape == q_shape[:-1]
    assert [g.shape for g in grads] == [q_shape, kv_shape, kv_shape]
    for ours, ref in zip((o, lse, *grads), reference(q, k, v, do, causal, scale)):
        close(ours, ref)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("head_size", [17, 32, 64, 128])
def test_gpt_heads_are_read_in_place(head_size, causal):
    """q, k, v as GPT's (B, nh, T, hs) strided views of the packed (B, T, 3C) projection,
    and dO as a view of the (B, T, C) gradient, give the results of contiguous copies; the
    layout asks for no copy."""
    rng = np.random.default_rng(head_size)
    B, T, H = 2, 45, 3
    qkv = _randn(rng, (B, T, 3, H, head_size))
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    do = _randn(rng, (B, T, H, head_size)).transpose(0, 2, 1, 3)
    assert not q.flags.c_contiguous and not do.flags.c_contiguous
    arrays, _, _ = cpu_attention.attention_layout([q, k, v, do], 1)
    assert all(a is b for a, b in zip(arrays, (q, k, v, do)))  # read where they lie
    scale = head_size ** -0.5
    o, lse = cpu_kernels.flash_attention_forward(q, k, v, causal, scale)
    grads = cpu_kernels.flash_attention_backward(q, k, v, o, do, lse, causal, scale)
    for ours, ref in zip((o, lse, *grads), reference(q, k, v, do, causal, scale)):
        close(ours, ref)


@pytest.mark.parametrize("shape, causal", [((2, 3, 70, 17), True), ((1, 2, 33, 64), False),
                                           ((1, 2, 2, 40, 32), True)])
def test_dropout_drops_what_the_cuda_kernel_drops(shape, causal):
    """The weights are dropped where the CUDA kernels' hash of (seed, index in the
    (..., L, S) weights) says (its NumPy twin, kernel_twins.dropout_keep), scaled by
    1 / (1 - p), and backward recomputes the same mask."""
    rng = np.random.default_rng(9)
    kv_shape = shape[:-3] + (1,) + shape[-2:] if len(shape) == 5 else shape
    q, do = _randn(rng, shape), _randn(rng, shape)
    k, v = _randn(rng, kv_shape), _randn(rng, kv_shape)
    seed, p, scale = np.array([1234567890123], np.uint64), 0.3, 0.2
    keep = kernel_twins.dropout_keep(seed, shape[:-1] + (kv_shape[-2],), p)
    o, lse = cpu_kernels.flash_attention_forward(q, k, v, causal, scale, p, seed)
    grads = cpu_kernels.flash_attention_backward(q, k, v, o, do, lse, causal, scale, p, seed)
    for ours, ref in zip((o, lse, *grads), reference(q, k, v, do, causal, scale, keep, p)):
        close(ours, ref)
    other, _ = cpu_kernels.flash_attention_forward(q, k, v, causal, scale, p, seed + 1)
    assert not np.allclose(other, o)  # another seed, another mask


def test_bf16_inputs_are_read_as_stored_and_computed_in_float32():
    """bf16 q, k, v, dO (autocast's; GPT's heads as strided views) give what their exact
    float32 widenings give: the kernels widen each element as they load it."""
    rng = np.random.default_rng(13)
    qkv = _randn(rng, (2, 70, 3, 2, 32)).astype(mt.bfloat16)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    do = _randn(rng, (2, 2, 70, 32)).astype(mt.bfloat16)
    wide = [a.astype(np.float32) for a in (q, k, v, do)]
    o, lse = cpu_kernels.flash_attention_forward(q, k, v, True, 0.2)
    o32, lse32 = cpu_kernels.flash_attention_forward(*wide[:3], True, 0.2)
    grads = cpu_kernels.flash_attention_backward(q, k, v, o, do, lse, True, 0.2)
    grads32 = cpu_kernels.flash_attention_backward(*wide[:3], o32, wide[3], lse32, True, 0.2)
    assert o.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    for ours, ref in zip((o, lse, *grads), (o32, lse32, *grads32)):
        close(ours, ref, 1e-6)


def test_gpt_attention_under_bf16_autocast_takes_the_kernel(paths):
    """Under autocast GPT's attention hands the kernel its bf16 projection as stored; the
    output (rounded to bf16) and the float32 gradient match float64 attention of the
    bf16-rounded inputs within bf16's rounding."""
    rng = np.random.default_rng(14)
    B, T, H, E = 2, 40, 2, 16
    data = _randn(rng, (B, T, 3 * H * E))
    grad = _randn(rng, (B, T, H * E))
    with flash(True), mt.autocast("bf16"):
        x = mt.tensor(data, requires_grad=True)
        out = F.packed_causal_attention(x, H)
    out.backward(mt.tensor(grad))
    assert paths == ["kernel"] and out.dtype == mt.bfloat16
    heads = data.astype(mt.bfloat16).astype(np.float64).reshape(B, T, 3, H, E)
    q, k, v = (heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    do = grad.reshape(B, T, H, E).transpose(0, 2, 1, 3)
    o, _, dq, dk, dv = reference(q, k, v, do, True, E ** -0.5)
    close(out.detach().float().numpy(), o.transpose(0, 2, 1, 3).reshape(B, T, H * E), 1e-2)
    ref_grad = np.stack([g.transpose(0, 2, 1, 3) for g in (dq, dk, dv)], axis=2)
    close(x.grad.numpy(), ref_grad.reshape(B, T, 3 * H * E), 2e-2)


def test_dropout_on_the_kernel_path_equals_the_dense_path(paths):
    """Through the op, the flash kernel and the dense path's softmax kernel draw the seed
    alike and drop the same weights: one result within rounding."""
    rng = np.random.default_rng(5)
    arrays = [_randn(rng, (2, 2, 50, 16)) for _ in range(3)]
    grad = _randn(rng, (2, 2, 50, 16))
    results = []
    for on in (True, False):
        with flash(on):
            mt.manual_seed(7)
            tensors = [mt.tensor(a, requires_grad=True) for a in arrays]
            out = F.scaled_dot_product_attention(*tensors, dropout_p=0.4, is_causal=True)
            out.backward(mt.tensor(grad))
            results.append([out.data] + [t.grad.data for t in tensors])
    assert paths == ["kernel", "dense"]
    assert np.mean(results[0][0] == 0) < 0.1  # not everything dropped: a real comparison
    for ours, ref in zip(*results):
        close(ours, ref, 1e-5)


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _sdpa_gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


# name -> (the op on tensors, input shapes): each through the kernel branch, against the
# same op with the kernel off (the dense kernel's path) and in float64 (NumPy's full path)
OPS = {
    "causal": (_sdpa, [(2, 3, 67, 32)] * 3),
    "not_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                   [(1, 2, 30, 17), (1, 2, 41, 17), (1, 2, 41, 17)]),
    "enable_gqa": (_sdpa_gqa, [(2, 4, 33, 16), (2, 2, 33, 16), (2, 2, 33, 16)]),
    "packed": (lambda qkv: F.packed_causal_attention(qkv, 4), [(2, 37, 3 * 4 * 16)]),
    "grouped": (lambda q, k, v: F.grouped_causal_attention(q, k, v, 6, 2),
                [(2, 29, 6 * 8), (2, 29, 2 * 8), (2, 29, 2 * 8)]),
    "grouped_128": (lambda q, k, v: F.grouped_causal_attention(q, k, v, 2, 1),
                    [(1, 21, 2 * 128), (1, 21, 128), (1, 21, 128)]),
}


def _run(fn, arrays, dtype, grad_seed=3):
    tensors = [mt.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    out = fn(*tensors)
    grad = np.random.default_rng(grad_seed).standard_normal(out.shape).astype(dtype)
    out.backward(mt.tensor(grad))
    return [out.data.copy()] + [t.grad.data.copy() for t in tensors]


@pytest.mark.parametrize("name", sorted(OPS))
def test_the_ops_kernel_branch_matches_the_dense_path_and_float64(name, paths):
    fn, shapes = OPS[name]
    rng = np.random.default_rng(sorted(OPS).index(name))
    arrays = [_randn(rng, s) for s in shapes]
    with flash(True):
        fused = _run(fn, arrays, np.float32)
        float64 = _run(fn, arrays, np.float64)  # not float32: NumPy's full path
    with flash(False):
        dense = _run(fn, arrays, np.float32)
    assert paths == ["kernel", "full", "dense"]
    for ours, ref64, ref32 in zip(fused, float64, dense):
        assert ours.dtype == np.float32
        close(ours, ref64)
        close(ours, ref32)


def test_the_work_split_over_threads_gives_one_result(monkeypatch):
    rng = np.random.default_rng(11)
    q, k, v, do = (_randn(rng, (3, 2, 150, 32)) for _ in range(4))
    results = []
    for split_from in (1, 1 << 60):  # split over every core, then on one thread
        monkeypatch.setattr(compiler, "SPLIT_FROM", split_from)
        o, lse = cpu_kernels.flash_attention_forward(q, k, v, True, 0.2)
        results.append((o, lse, *cpu_kernels.flash_attention_backward(
            q, k, v, o, do, lse, True, 0.2)))
    for split, whole in zip(*results):
        close(split, whole, 1e-6)


def test_long_sequences_take_the_kernel_where_numpy_tiled_them(paths):
    """From TILED_FROM keys the kernel, not the NumPy tiled loop, holds attention to O(L E)
    memory: both keep only the log-sum-exp, and agree."""
    rng = np.random.default_rng(12)
    arrays = [_randn(rng, (1, 1, attention.TILED_FROM + 3, 8)) for _ in range(3)]
    fused = _run(_sdpa, arrays, np.float32)
    CPU.use_fused_kernels = False
    try:
        tiled = _run(_sdpa, arrays, np.float32)
    finally:
        CPU.use_fused_kernels = True
    assert paths == ["kernel", "tiled"]
    for ours, ref in zip(fused, tiled):
        close(ours, ref)


@pytest.mark.parametrize("kernels", ["Haswell", "SkylakeX", None])
def test_the_dispatch_rule_and_what_the_kernel_declines(monkeypatch, kernels):
    """The crossover of the BLAS kernels NumPy runs (AVX-512 ones move it up)."""
    monkeypatch.setattr(cpu_attention, "blas_kernels", lambda: kernels)
    T = cpu_attention.FUSED_FROM["avx512" if kernels == "SkylakeX" else "avx2"]
    x = np.ones((2, 3, T, 16), np.float32)
    short = x[:, :, :T - 1]
    assert cpu_kernels.supports_flash_attention(x, x, x, None, 0.1)
    assert not cpu_kernels.supports_attention_softmax(x, x, x, None)  # the kernel's
    assert not cpu_kernels.supports_flash_attention(short, short, short, None, 0.0)
    assert cpu_kernels.supports_attention_softmax(short, short, short, None)  # dense's
    assert not cpu_kernels.supports_flash_attention(x[:, :, :1], x, x, None, 0.0)  # 1 query
    assert not cpu_kernels.supports_flash_attention(x, short, short, None, 0.0)  # keys
    wide = np.ones((1, 1, 2 * T, cpu_attention.WIDE_HEAD + 1), np.float32)
    assert cpu_kernels.supports_flash_attention(wide, wide, wide, None, 0.0)
    assert not cpu_kernels.supports_flash_attention(*[wide[:, :, :-1]] * 3, None, 0.0)
    assert not cpu_kernels.supports_flash_attention(x, x, x, np.ones((1, 1), bool), 0.0)
    assert not cpu_kernels.supports_flash_attention(x.astype(np.float64), x, x, None, 0.0)
    assert not cpu_kernels.supports_flash_attention(x, x[:1], x[:1], None, 0.0)  # broadcast
    assert not cpu_kernels.supports_flash_attention(x, x, x[..., :8], None, 0.0)  # Ev != E
    grouped = x.reshape(2, 3, 1, -1, 16)
    assert cpu_kernels.supports_flash_attention(np.concatenate([grouped] * 2, axis=2),
                                                grouped, grouped, None, 0.0)


@pytest.mark.parametrize("call, error, message", [
    (lambda x: cpu_kernels.flash_attention_forward(x.astype(np.float64), x, x, True, 1.0),
     TypeError, "q must be a float32 or bfloat16 NumPy array"),
    (lambda x: cpu_kernels.flash_attention_forward(x, x[:1], x[:1], True, 1.0),
     ValueError, "must share their batch dims"),
    (lambda x: cpu_kernels.flash_attention_forward(x, x, x[..., :3], True, 1.0),
     ValueError, r"expected k and v of shape \(\.\.\., S, 4\)"),
    (lambda x: cpu_kernels.flash_attention_forward(x, x, x, True, 1.0, 0.5),
     ValueError, "dropout needs seed"),
    (lambda x: cpu_kernels.flash_attention_forward(x, x, x, True, 1.0, 1.0),
     ValueError, r"dropout_p must be in \[0, 1\)"),
    (lambda x: cpu_kernels.flash_attention_backward(x, x, x, x, x, x[..., 0, :], True, 1.0),
     ValueError, r"lse must be a float NumPy array of shape \(2, 3, 5\)"),
])
def test_bad_arguments_are_refused_naming_them(call, error, message):
    with pytest.raises(error, match=message):
        call(np.ones((2, 3, 5, 4), np.float32))


def _train(arch: str, on: bool, dropout: float):
    """``train_steps`` of a tiny model with attention on the flash kernel (on) or the
    dense path (off)."""
    with flash(on):
        return train_steps(arch, (3, 37), dropout, n_embd=64, block_size=40)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_training_steps_agree_with_the_kernel_on_and_off(arch, dropout, paths):
    fused_losses, fused = _train(arch, True, dropout)
    n = len(paths)
    ref_losses, ref = _train(arch, False, dropout)
    assert set(paths[:n]) == {"kernel"} and set(paths[n:]) == {"dense"}
    np.testing.assert_allclose(fused_losses, ref_losses, rtol=1e-5)
    assert fused.keys() == ref.keys()
    for name in ref:
        close(fused[name], ref[name], 1e-5)
