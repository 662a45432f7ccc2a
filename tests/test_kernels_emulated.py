"""Every CUDA kernel (minitorch_gpu/backend/kernels/*.cu) run on the emulated GPU against
its op: the CPU backend's op takes its kernel branch through the CUDA launchers
(``emulated_cuda.kernels_for_host_arrays``) and is compared, forward and backward, with
the same op on its NumPy code. Odd sizes (rows off a warp, vocabularies off a block,
sequences off a tile), every dtype a launcher accepts, attention at head sizes 17, 32, 64
and 128, each case over two schedule seeds. Each case also checks that the kernels it is
about were launched, so a case that silently fell back to NumPy fails.
"""
from __future__ import annotations

import contextlib
import zlib

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn.functional as F
from minitorch_gpu import optim
from minitorch_gpu.backend import cpu_kernels, emulated_cuda, get_backend
from minitorch_gpu.backend.emulated_cuda import (emulated, kernels_for_host_arrays, launched,
                                                 schedules)

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    emulated_cuda.unavailable_reason() is not None,
    reason=f"no emulated GPU here: {emulated_cuda.unavailable_reason()}")]

CPU = get_backend("cpu")
SEEDS = (0, 1)
BF16 = mt.bfloat16


@contextlib.contextmanager
def kernels(source: str, declined=()):
    """The CPU backend's ops with ``source``'s kernels: "cuda" (emulated), "numba" or
    "numpy" (none)."""
    before = CPU.use_fused_kernels
    try:
        if source == "cuda":
            with emulated():
                offered = kernels_for_host_arrays(declined)
                CPU.fused_kernels = lambda: offered
                yield
        else:
            CPU.use_fused_kernels = source == "numba"
            yield
    finally:
        CPU.__dict__.pop("fused_kernels", None)
        CPU.use_fused_kernels = before


def run(source, fn, arrays, dtype=np.float32, seed=0, declined=(), autocast=False,
        weights=0):
    """fn's output and every input's gradient, with ``source``'s kernels; the inputs in
    ``dtype`` but the last ``weights``, float32 as master weights are."""
    with kernels(source, declined), schedules(seed):
        mt.manual_seed(123)  # the same dropout draws on every side
        tensors = [mt.tensor(a.astype(np.float32)).to(
            dtype if i < len(arrays) - weights else np.float32).requires_grad_()
            for i, a in enumerate(arrays)]
        with mt.autocast("bf16", enabled=autocast):
            out = fn(*tensors)
        grad = np.random.default_rng(5).standard_normal(out.shape).astype(np.float32)
        out.backward(mt.tensor(grad).to(out.dtype))
        return [out.detach().float().numpy()] + [t.grad.float().numpy() for t in tensors]


def close(ours, ref, rtol):
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape, i
        scale = max(float(np.abs(b).max()), 1e-30)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale, err_msg=f"output {i}")


def check(name, fn, shapes, expected, seed, dtype=np.float32, rtol=None, declined=(),
          scale=1.0, autocast=False, weights=0):
    """The op on the CUDA kernels equals the op on NumPy, and ``expected`` kernels ran."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays = [rng.standard_normal(s) * scale for s in shapes]
    launched.clear()
    ours = run("cuda", fn, arrays, dtype, seed, declined, autocast, weights)
    ran = set(launched)
    assert set(expected) <= ran, f"expected {sorted(expected)} to run, ran {sorted(ran)}"
    ref = run("numpy", fn, arrays, dtype, seed, autocast=autocast, weights=weights)
    if rtol is None:
        rtol = 1e-5 if dtype == np.float32 and not autocast else 2e-2
    close(ours, ref, rtol)


ELEMENTWISE = {
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [(7, 13)],
                  {"gelu_forward", "gelu_backward"}),
    "gelu_erf": (lambda x: F.gelu(x), [(3, 301)], {"gelu_forward", "gelu_backward"}),
    "swiglu": (lambda g, u: F.swiglu(g, u), [(5, 11), (5, 11)],
               {"swiglu_forward", "swiglu_backward"}),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (37,), w, b), [(3, 5, 37), (37,), (37,)],
                   {"layernorm_forward", "layernorm_backward_dx",
                    "layernorm_backward_dweight_dbias"}),
    "layer_norm_no_affine": (lambda x: F.layer_norm(x, (17,)), [(9, 17)],
                             {"layernorm_forward", "layernorm_backward_dx"}),
    "rms_norm": (lambda x, w: F.rms_norm(x, (23,), w, 1e-6), [(4, 3, 23), (23,)],
                 {"rms_norm_forward", "rms_norm_backward_dx", "rms_norm_backward_dweight"}),
    "rms_norm_no_weight": (lambda x: F.rms_norm(x, (19,)), [(8, 19)],
                           {"rms_norm_forward", "rms_norm_backward_dx"}),
    "rotary": (lambda x: F.apply_rotary(x, *F.rotary_tables(7, 10, start=3)), [(2, 7, 3, 10)],
               {"rotary_forward"}),
    "rotary_heads_side_by_side": (lambda x: F.apply_rotary(
        x, *F.rotary_tables(9, 8, start=3), head_dim=8), [(3, 9, 32)], {"rotary_forward"}),
    "rotary_inverse": (lambda x: F.apply_rotary(x, *F.rotary_tables(5, 6), inverse=True),
                       [(1, 5, 2, 6)], {"rotary_forward"}),
}
# the launchers that read bf16 as stored (INPUT_DTYPE 1), besides float32
BF16_CASES = ("swiglu", "rms_norm", "rms_norm_no_weight", "rotary",
              "rotary_heads_side_by_side")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name, dtype", [(n, "float32") for n in sorted(ELEMENTWISE)] +
                         [(n, "bfloat16") for n in BF16_CASES])
def test_elementwise_and_row_kernels_match_their_ops(name, dtype, seed):
    fn, shapes, expected = ELEMENTWISE[name]
    weights = 1 if name == "rms_norm" else 0  # float32 master weights beside bf16 x
    check(name, fn, shapes, expected, seed, np.float32 if dtype == "float32" else BF16,
          weights=weights)


def _targets(rows, classes, ignore=False):
    t = np.arange(rows) * 7 % classes
    if ignore:
        t[::3] = -100
    return mt.tensor(t)


CROSS_ENTROPY = {
    "mean": (lambda z: F.cross_entropy(z, _targets(45, 65)), [(45, 65)]),
    "vocabulary_off_the_block": (lambda z: F.cross_entropy(z, _targets(6, 700)), [(6, 700)]),
    "smoothing": (lambda z: F.cross_entropy(z, _targets(31, 17), label_smoothing=0.1),
                  [(31, 17)]),
    # rows 0, 3, ..., 18 ignored: the last row among them
    "ignored_targets": (lambda z: F.cross_entropy(z, _targets(19, 11, ignore=True)),
                        [(19, 11)]),
    "sum": (lambda z: F.cross_entropy(z, _targets(12, 9), reduction="sum"), [(12, 9)]),
    "none": (lambda z: F.cross_entropy(z, _targets(12, 9), reduction="none"), [(12, 9)]),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(CROSS_ENTROPY))
def test_cross_entropy_kernels_match_the_op(name, seed):
    fn, shapes = CROSS_ENTROPY[name]
    check(name, fn, shapes, {"cross_entropy_forward", "cross_entropy_backward"}, seed,
          scale=3.0)


SOFTMAX = {"softmax_forward": "attention_softmax_forward",
           "softmax_backward": "attention_softmax_backward"}
DENSE = {
    "causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
               [(2, 3, 17, 8)] * 3),
    "keys_off_the_block": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                           [(1, 2, 5, 8), (1, 2, 300, 8), (1, 2, 300, 5)]),
    "more_queries_than_keys": (lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True), [(1, 2, 12, 4), (1, 2, 7, 4), (1, 2, 7, 4)]),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("precision", ["float32", "bf16-autocast"])
@pytest.mark.parametrize("name", sorted(DENSE))
def test_the_dense_attention_softmax_kernel_matches_the_op(name, precision, seed):
    fn, shapes = DENSE[name]
    check(name, fn, shapes, set(SOFTMAX.values()), seed, autocast=precision != "float32")


@pytest.mark.skipif(not cpu_kernels.available(), reason="numba is not installed")
@pytest.mark.parametrize("seed", SEEDS)
def test_attention_dropout_drops_what_the_cpu_kernel_drops(seed):
    """The CUDA kernel and numba's hash the same (seed, index): the same elements dropped,
    so the same outputs and gradients."""
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((2, 2, 33, 8)) for _ in range(3)]

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    launched.clear()
    ours = run("cuda", fn, arrays, seed=seed)
    assert set(SOFTMAX.values()) <= set(launched)
    close(ours, run("numba", fn, arrays, seed=seed), 1e-5)


HEAD_DIMS = (17, 32, 64, 128)
FLASH = {"flash_attention_forward", "flash_attention_backward_preprocess",
         "flash_attention_backward_dq", "flash_attention_backward_dkdv"}
NO_DENSE = ("supports_attention_softmax",)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_flash_attention_kernels_match_the_op(head_dim, causal, dtype, seed):
    """Queries and keys of different lengths, neither a multiple of a tile."""
    shapes = [(1, 2, 21, head_dim), (1, 2, 37, head_dim), (1, 2, 37, head_dim)]
    if causal:
        shapes[0] = (1, 2, 37, head_dim)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    check(f"flash{head_dim}{causal}", fn, shapes, FLASH, seed, getattr(mt, dtype),
          declined=NO_DENSE)


@pytest.mark.parametrize("seed", SEEDS)
def test_flash_attention_reads_grouped_query_heads_without_repeating_them(seed):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q.view(2, 2, 2, 19, 32), k.view(2, 2, 1, 19, 32),
                                              v.view(2, 2, 1, 19, 32), is_causal=True)
    check("gqa", fn, [(2, 4, 19, 32), (2, 2, 19, 32), (2, 2, 19, 32)], FLASH, seed,
          declined=NO_DENSE)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_flash_attention_reads_a_packed_projections_heads_in_place(dtype, seed):
    """GPT's attention on its (B, T, 3C) projection: q, k, v strided views of one buffer."""
    def fn(qkv):
        return F.packed_causal_attention(qkv, 2)
    check(f"packed{dtype}", fn, [(2, 23, 3 * 64)], FLASH, seed, getattr(mt, dtype),
          declined=NO_DENSE)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_adamw_kernel_matches_the_optimizer(seed):
    """Three steps of AdamW (weight decay on one parameter, not the other) on the kernel
    and on the NumPy update."""
    rng = np.random.default_rng(4)
    starts = [rng.standard_normal((37, 5)), rng.standard_normal(301)]
    grads = [[rng.standard_normal(s.shape) for s in starts] for _ in range(3)]
    results = []
    for source in ("cuda", "numpy"):
        with kernels(source), schedules(seed):
            launched.clear()
            params = [mt.nn.Parameter(mt.tensor(s.astype(np.float32))) for s in starts]
            opt = optim.AdamW([{"params": params[:1], "weight_decay": 0.1},
                               {"params": params[1:], "weight_decay": 0.0}], lr=1e-2)
            for step in grads:
                for p, g in zip(params, step):
                    p.grad = mt.tensor(g.astype(np.float32))
                opt.step()
            if source == "cuda":
                assert "adamw_update" in launched
            results.append([p.detach().numpy().copy() for p in params])
    close(results[0], results[1], 1e-5)
