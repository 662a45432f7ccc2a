"""fp16 mixed precision, op by op, on each device: under ``autocast("fp16")`` every op a
float16 activation reaches (the products, attention on each of its paths, the
normalisations, the activations, rotary, the loss) against the same op in float32 on
fp16-rounded inputs, within fp16's rounding; the dtype each returns; float32 gradients.
The fused kernels that read float32 or bf16 only (the CPU's numba kernels, most CUDA
kernels) leave float16 to the reference ops; CUDA's flash attention reads it as stored.
The GEMMs: fp16 operands through cuBLAS as CUDA_R_16F with float32 compute on the GPU,
widened to float32 for BLAS on the CPU. And a GPT and a Llama whose fp16 loss and
gradients stay close to float32's."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn.functional as F
from minitorch_gpu.amp import autocast_dtype
from minitorch_gpu.nn import GPT, GPTConfig
from minitorch_gpu.nn.build import build_model

F16, F32 = mt.float16, mt.float32
TARGETS = np.array([0, 3, 1, 2, 5, 4, 0, 1])


def _half(t):
    return t.half()


def _same(t):
    return t


def _attention(L, causal=True, mask=False):
    def run(n, q, k, v):
        attn_mask = None
        if mask:
            keep = np.tril(np.ones((L, L), bool)) | np.eye(L, k=1, dtype=bool)
            attn_mask = mt.tensor(keep, device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                              is_causal=causal and not mask)
    return run


def _rotary(n, x):
    cos, sin = F.rotary_tables(x.shape[1], x.shape[3], device=x.device)
    return F.apply_rotary(n(x), cos, sin)


# (name, fn(narrow, *inputs), input shapes, output dtype under autocast, CPU only)
# ``narrow`` casts to float16 in the autocast run and is the identity in the reference,
# whose inputs are already rounded to float16: so only fp16's rounding inside differs
CASES = [
    ("matmul", lambda n, a, b: a @ b, [(8, 16), (16, 12)], F16, False),
    ("matmul-batched", lambda n, a, b: a @ b, [(2, 3, 5, 8), (2, 3, 8, 4)], F16, False),
    ("matmul-transposed", lambda n, a, b: a.transpose(-1, -2) @ b, [(3, 16, 8), (3, 16, 5)],
     F16, False),
    ("linear", lambda n, x, w, b: F.linear(x, w, b), [(4, 6, 16), (12, 16), (12,)], F16,
     False),
    ("sdpa-causal", _attention(16), [(2, 2, 16, 8)] * 3, F16, False),
    ("sdpa-not-causal", _attention(12, causal=False), [(2, 3, 12, 16)] * 3, F16, False),
    ("sdpa-mask", _attention(10, mask=True), [(2, 2, 10, 8)] * 3, F16, False),
    # long enough for the CPU's flash kernel in float32/bf16 (float16: the NumPy path)
    ("sdpa-causal-256", _attention(256), [(1, 2, 256, 16)] * 3, F16, False),
    ("sdpa-tiled-1024", _attention(1024), [(1, 1, 1024, 8)] * 3, F16, True),
    ("layer-norm", lambda n, x, w, b: F.layer_norm(n(x), (16,), w, b),
     [(4, 5, 16), (16,), (16,)], F32, False),
    ("rms-norm", lambda n, x, w: F.rms_norm(n(x), (16,), w), [(4, 5, 16), (16,)], F32, False),
    ("softmax", lambda n, x: F.softmax(n(x), dim=-1), [(4, 33)], F32, False),
    ("log-softmax", lambda n, x: F.log_softmax(n(x), dim=-1), [(4, 33)], F32, False),
    ("cross-entropy", lambda n, x: F.cross_entropy(
        n(x), mt.tensor(TARGETS, device=x.device)), [(8, 7)], F32, False),
    ("gelu-tanh", lambda n, x: F.gelu(n(x), approximate="tanh"), [(6, 40)], F16, False),
    ("gelu-erf", lambda n, x: F.gelu(n(x)), [(6, 40)], F16, False),
    ("swiglu", lambda n, g, u: F.swiglu(n(g), n(u)), [(5, 24), (5, 24)], F16, False),
    ("rotary", _rotary, [(2, 6, 3, 8)], F16, False),
]


def _inputs(shapes, device):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float16).astype(np.float32)
              for shape in shapes]  # values fp16 holds exactly: the casts lose nothing
    return [mt.tensor(a, device=device, requires_grad=True) for a in arrays]


def _run(fn, shapes, device, narrow):
    inputs = _inputs(shapes, device)
    y = fn(narrow, *inputs)
    weights = mt.tensor(np.random.default_rng(1).standard_normal(y.shape).astype(np.float32),
                        device=device)
    (y.float() * weights).sum().backward()
    return y, [x.grad for x in inputs]


@pytest.mark.parametrize("name, fn, shapes, dtype, cpu_only", CASES, ids=[c[0] for c in CASES])
def test_fp16_ops_match_float32_within_fp16_rounding(device, name, fn, shapes, dtype,
                                                     cpu_only):
    if cpu_only and device != "cpu":
        pytest.skip("the emulated GPU's flash kernel over 1,024 keys takes minutes")
    with mt.autocast("fp16"):
        assert autocast_dtype() == F16
        y, grads = _run(fn, shapes, device, _half)
    reference, reference_grads = _run(fn, shapes, device, _same)
    assert y.dtype == dtype and reference.dtype == F32
    assert y.shape == reference.shape
    ours, theirs = y.float().detach().cpu().numpy(), reference.detach().cpu().numpy()
    assert np.isfinite(ours).all()
    scale = np.abs(theirs).max()
    # fp16 keeps 11 bits: each rounding is within 2^-11 relative; a few of them pile up
    np.testing.assert_allclose(ours, theirs, rtol=4e-3, atol=4e-3 * scale)
    for grad, expected in zip(grads, reference_grads):
        assert grad.dtype == F32  # the leaves' gradients in their own dtype
        g, e = grad.cpu().numpy(), expected.cpu().numpy()
        assert np.linalg.norm(g - e) <= 1e-2 * np.linalg.norm(e) + 1e-6, name


def test_fp16_attention_takes_a_path_that_reads_float16(device, paths):
    """CUDA's flash kernels read float16 as stored; the dense kernel (float32/bf16
    probabilities) and every CPU kernel decline it, for the NumPy/CuPy paths."""
    q = mt.randn(1, 2, 256, 16, device=device)
    with mt.autocast("fp16"):
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert out.dtype == F16
    assert paths == (["kernel"] if device == "cuda" else ["full"])


def test_fp16_matmul_on_the_cpu_is_float32_blas_on_float16_values():
    """Widened exactly, multiplied in float32, rounded once to float16: the arithmetic of a
    GPU's fp16 tensor cores with float32 accumulation."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((33, 70)).astype(np.float16)
    b = rng.standard_normal((70, 9)).astype(np.float16)
    product = (mt.tensor(a) @ mt.tensor(b)).numpy()
    assert product.dtype == np.float16
    expected = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(product, expected)


@pytest.mark.cuda
@pytest.mark.skipif(not mt.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shapes, transpose_b", [
    (((8, 16), (16, 12)), False),  # gemmEx
    (((8, 16), (12, 16)), True),  # a linear layer's x @ w.T, read in place
    (((2, 3, 5, 8), (2, 3, 8, 4)), False),  # gemmStridedBatchedEx
])
def test_fp16_products_go_to_cublas_as_cuda_r_16f_with_float32_compute(monkeypatch, shapes,
                                                                       transpose_b):
    from minitorch_gpu.backend import cupy_backend
    from minitorch_gpu.backend import _cupy
    cublas = _cupy.cublas()
    seen = []
    for name in ("gemmEx", "gemmStridedBatchedEx"):
        real = getattr(cublas, name)

        def spy(*args, _real=real, _name=name):
            # Atype, Btype, Ctype and computeType sit at fixed places in each signature
            places = (8, 11, 15, 17) if _name == "gemmEx" else (8, 12, 17, 21)
            seen.append((_name, *(args[i] for i in places)))
            return _real(*args)

        monkeypatch.setattr(cublas, name, spy)
    monkeypatch.setattr(cupy_backend, "_cublas", cublas)
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(np.float16) for s in shapes)
    ta, tb = mt.tensor(a, device="cuda"), mt.tensor(b, device="cuda")
    out = ta @ (tb.T if transpose_b else tb)
    assert out.dtype == F16
    wide_b = (b.T if transpose_b else b).astype(np.float32)
    expected = (a.astype(np.float32) @ wide_b)
    np.testing.assert_allclose(out.cpu().numpy().astype(np.float32), expected,
                               rtol=2 ** -10, atol=1e-6 * np.abs(expected).max())
    name = "gemmEx" if len(shapes[0]) == 2 else "gemmStridedBatchedEx"
    # fp16 operands (CUDA_R_16F = 2), C in float32 (0), CUBLAS_COMPUTE_32F (68)
    assert seen == [(name, 2, 2, 0, cublas.CUBLAS_COMPUTE_32F)]
    assert cublas.CUBLAS_COMPUTE_32F == 68


def _model(arch, device):
    mt.manual_seed(0)
    if arch == "gpt":
        return GPT(GPTConfig(block_size=32, vocab_size=65, n_layer=2, n_head=4, n_embd=64,
                             bias=True)).to(device)
    return build_model(GPTConfig(arch="llama", block_size=32, vocab_size=65, n_layer=2,
                                 n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=128),
                       mt.float32, device)


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_a_model_in_fp16_stays_close_to_float32(device, arch):
    model = _model(arch, device)
    idx = mt.randint(0, 65, (4, 32), device=device)
    targets = mt.randint(0, 65, (4, 32), device=device)
    _, loss32 = model(idx, targets)
    loss32.backward()
    grads32 = {n: p.grad.cpu().numpy().copy() for n, p in model.named_parameters()}
    model.zero_grad()
    scaler = mt.amp.GradScaler()
    with mt.autocast("fp16"):
        logits, loss16 = model(idx, targets)
    scaler.scale(loss16).backward()
    scaler.unscale_(mt.optim.SGD(model.parameters(), lr=0.0))
    assert logits.dtype == F16 and loss16.dtype == F32
    assert float(loss16) == pytest.approx(float(loss32), rel=1e-2)
    for name, p in model.named_parameters():
        assert p.dtype == F32 and p.grad.dtype == F32  # master weights
        error = np.linalg.norm(p.grad.cpu().numpy() - grads32[name]) / np.linalg.norm(
            grads32[name])
        assert error < 0.03, (name, error)


def test_an_fp16_product_that_overflows_is_inf_and_the_scaler_skips_its_step(device):
    """fp16's largest value is 65504: past it a product is inf, not a wrong finite number,
    and the step that sees it is skipped."""
    w = mt.tensor(np.full((4, 4), 300.0, np.float32), device=device, requires_grad=True)
    x = mt.tensor(np.ones((2, 4), np.float32), device=device)
    optimizer = mt.optim.SGD([w], lr=0.1)
    scaler = mt.amp.GradScaler()
    with mt.autocast("fp16"), np.errstate(over="ignore"):
        y = x @ w  # 1,200: fine
        big = (y @ w.T).float()  # 360,000: past fp16's range
    assert np.isfinite(y.float().detach().cpu().numpy()).all()
    assert np.isinf(big.detach().cpu().numpy()).all()
    with np.errstate(invalid="ignore", over="ignore"):
        # the default scale, 2^16, is itself past 65504: y's gradient is inf in fp16
        scaler.scale(y.float().sum()).backward()
        before = w.detach().cpu().numpy().copy()
        assert scaler.step(optimizer) is None
    scaler.update()
    np.testing.assert_array_equal(w.detach().cpu().numpy(), before)
    assert scaler.get_scale() == 2.0 ** 15 and scaler.skipped_steps == 1
