"""bf16 mixed precision on the CPU: the rounding (bit for bit against ml_dtypes), which ops
autocast lowers and which it keeps in float32, gradients in float32, and a GPT whose bf16
loss and gradients stay close to float32's."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn.functional as F
from minitorch_gpu.amp import autocast_dtype
from minitorch_gpu.backend import dtypes
from minitorch_gpu.backend.dtypes import float32_to_bfloat16
from minitorch_gpu.nn import GPT, GPTConfig

BF16 = dtypes.bfloat16


def bits_of(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


EDGES = np.array([
    0.0, -0.0, 1.0, -1.0,
    1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8),  # ties: down to even, up to even
    1 + 2 ** -8 + 2 ** -20,  # just above a tie: up
    np.finfo(np.float32).tiny, np.finfo(np.float32).tiny / 3,  # smallest normal, subnormal
    1e-45, -1e-45, 2 ** -133 * 3,  # subnormals, one a tie
    np.finfo(np.float32).max, -np.finfo(np.float32).max,  # round up past bf16's max: inf
    3.3961776e38,  # just below the bf16 overflow boundary
    np.inf, -np.inf, np.nan, -np.nan,
], dtype=np.float32)


@pytest.mark.parametrize("name, values", [
    ("edges", EDGES),
    ("nan payloads", np.array([0x7F800001, 0xFFC12345, 0x7FFFFFFF, 0x7FA00000],
                              dtype=np.uint32).view(np.float32)),
    ("random bits", np.random.default_rng(0).integers(0, 2 ** 32, 200_000, dtype=np.uint64)
     .astype(np.uint32).view(np.float32)),
    ("random normals", np.random.default_rng(1).standard_normal(200_000).astype(np.float32)),
])
def test_bf16_rounding_matches_ml_dtypes_bit_for_bit(name, values):
    ours = float32_to_bfloat16(values).view(np.uint16)
    with np.errstate(invalid="ignore"):
        theirs = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    mismatched = np.flatnonzero(ours != theirs)
    assert mismatched.size == 0, [(hex(bits_of(values)[i]), hex(ours[i]), hex(theirs[i]))
                                  for i in mismatched[:5]]


def test_ties_go_to_even_and_overflow_to_inf():
    out = float32_to_bfloat16(np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8,
                                        np.finfo(np.float32).max], dtype=np.float32))
    assert out.astype(np.float32).tolist() == [1.0, 1 + 4 * 2 ** -8, np.inf]


def test_the_cast_op_rounds_with_it_and_keeps_shape(device):
    x = mt.tensor([[1 + 2 ** -8, 2.5], [np.nan, -3e38]], device=device)
    y = x.T.to(BF16)  # a non-contiguous input
    assert y.dtype == BF16 and y.shape == (2, 2)
    expected = float32_to_bfloat16(np.array([[1 + 2 ** -8, np.nan], [2.5, -3e38]],
                                            dtype=np.float32))
    assert_same_bf16(y.cpu().numpy(), expected)
    assert mt.tensor(1.5).to(BF16).shape == ()


def assert_same_bf16(ours: np.ndarray, expected: np.ndarray) -> None:
    """Bit for bit, except that any NaN matches any NaN: CUDA's conversion gives its one
    canonical NaN (0x7FFF) where ml_dtypes keeps the sign and quiets the payload."""
    ours, expected = ours.view(np.uint16), expected.view(np.uint16)
    nan = (expected & 0x7FFF) > 0x7F80
    assert (((ours & 0x7FFF) > 0x7F80) == nan).all()
    mismatched = np.flatnonzero((ours != expected) & ~nan)
    assert mismatched.size == 0, [(hex(ours[i]), hex(expected[i])) for i in mismatched[:5]]


@pytest.mark.cuda
@pytest.mark.skipif(not mt.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_cast_is_the_bit_exact_rounding():
    """CuPy's astype (one kernel) against the bit-level rounding: ties, subnormals,
    overflow, infinities, NaNs and 200,000 random bit patterns."""
    values = np.concatenate([EDGES, np.random.default_rng(0).integers(
        0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    for shape in ((values.size,), (values.size // 4, 4)):
        x = mt.tensor(values.reshape(shape), device="cuda")
        y = (x.T if x.ndim == 2 else x).to(BF16)  # a non-contiguous input too
        expected = float32_to_bfloat16(values.reshape(shape))
        assert_same_bf16(y.cpu().numpy(), expected.T if x.ndim == 2 else expected)


# --- autocast ---------------------------------------------------------------------------
def test_autocast_lowers_matmuls_and_keeps_reductions_in_float32(device):
    mt.manual_seed(0)
    x = mt.randn(4, 8, device=device, requires_grad=True)
    w = mt.randn(6, 8, device=device, requires_grad=True)
    b = mt.randn(6, device=device, requires_grad=True)
    with mt.autocast("bf16"):
        assert autocast_dtype() == BF16
        y = F.linear(x, w, b)
        z = x @ w.T
        ln = F.layer_norm(y, (6,))
        sm = F.softmax(y, dim=-1)
        loss = F.cross_entropy(y, mt.tensor([0, 1, 2, 3], device=device))
        q = mt.randn(2, 5, 4, device=device)
        att = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        plain = x + 1.0  # not on either list: ordinary promotion
    assert autocast_dtype() is None
    assert (y.dtype, z.dtype, att.dtype) == (BF16, BF16, BF16)
    assert (ln.dtype, sm.dtype, loss.dtype, plain.dtype) == (mt.float32,) * 4
    # the product runs on bf16-rounded operands with float32 accumulation
    xb = float32_to_bfloat16(x.detach().cpu().numpy()).astype(np.float32)
    wb = float32_to_bfloat16(w.detach().cpu().numpy()).astype(np.float32)
    bb = float32_to_bfloat16(b.detach().cpu().numpy()).astype(np.float32)
    expected = float32_to_bfloat16(xb @ wb.T + bb).astype(np.float32)
    np.testing.assert_allclose(y.detach().cpu().numpy().astype(np.float32), expected, rtol=2 ** -7)
    # the leaves' gradients come back in their own dtype, float32
    loss.backward()
    assert (x.grad.dtype, w.grad.dtype, b.grad.dtype) == (mt.float32,) * 3


def test_bf16_times_float64_stays_float64_and_autocast_ends_on_an_exception():
    a, b = mt.randn(3, 4).to(BF16), mt.randn(4, 2, dtype=mt.float64)
    assert (a @ b).dtype == mt.float64  # NumPy's promotion: the wider operand wins
    with pytest.raises(ZeroDivisionError):
        with mt.autocast("bf16"):
            1 / 0
    assert autocast_dtype() is None


def test_linear_saves_its_input_in_bf16():
    mt.manual_seed(0)
    layer = mt.nn.Linear(16, 16)
    x = mt.randn(8, 16, requires_grad=True)
    with mt.autocast("bf16"):
        y = layer(x)
    saved_x, saved_w = y.grad_fn.saved_tensors
    assert saved_x.dtype == BF16 and saved_w.dtype == BF16  # half the bytes of float32


def test_autocast_nests_switches_off_and_decorates():
    with mt.autocast("bf16"):
        with mt.autocast("bf16", enabled=False):
            assert autocast_dtype() is None
            assert (mt.randn(2, 3) @ mt.randn(3, 2)).dtype == mt.float32
        assert autocast_dtype() == BF16

    @mt.autocast("bfloat16")
    def product(a, b):
        return a @ b

    assert product(mt.randn(2, 3), mt.randn(3, 2)).dtype == BF16
    assert autocast_dtype() is None
    with pytest.raises(ValueError, match=r"autocast: dtype must be bf16 \(bfloat16\) or fp16 "
                                         r"\(float16\), got float64"):
        mt.autocast("float64")


def test_a_gpt_in_bf16_stays_close_to_float32():
    mt.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=65, n_layer=2, n_head=4, n_embd=64,
                          bias=True))
    idx, targets = mt.randint(0, 65, (8, 32)), mt.randint(0, 65, (8, 32))
    _, loss32 = model(idx, targets)
    loss32.backward()
    grads32 = {n: p.grad.cpu().numpy().copy() for n, p in model.named_parameters()}
    model.zero_grad()
    with mt.autocast("bf16"):
        logits, loss16 = model(idx, targets)
    loss16.backward()
    assert logits.dtype == BF16 and loss16.dtype == mt.float32
    assert float(loss16) == pytest.approx(float(loss32), rel=1e-2)
    for name, p in model.named_parameters():
        assert p.dtype == mt.float32 and p.grad.dtype == mt.float32  # master weights
        error = np.linalg.norm(p.grad.cpu().numpy() - grads32[name]) / np.linalg.norm(grads32[name])
        assert error < 0.03, (name, error)


def test_batched_bf16_products_on_each_device(device):
    """A > 2-D bf16 product (attention's non-flash path, with dropout or a mask) runs on
    either backend (CuPy 14 routes batched bf16 matmul to a kernel that refuses it, so the
    backend widens those), and the bias of a bf16 linear is added before the one rounding."""
    mt.manual_seed(0)
    a = mt.randn(2, 3, 5, 8, device=device).to(BF16)
    b = mt.randn(2, 3, 8, 4, device=device).to(BF16)
    out = a @ b
    assert out.dtype == BF16 and out.shape == (2, 3, 5, 4)
    expected = a.float().cpu().numpy() @ b.float().cpu().numpy()
    np.testing.assert_allclose(out.float().cpu().numpy(), expected, rtol=2 ** -7, atol=1e-6)
    q = mt.randn(2, 2, 6, 8, device=device, requires_grad=True)
    with mt.autocast("bf16"):
        y = F.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=0.1)
    y.float().sum().backward()
    assert y.dtype == BF16 and q.grad.dtype == mt.float32
