"""Behaviours a PyTorch user takes for granted, each pinned with hard-coded expectations:
gradients at the edges of an op's domain, reductions over unusual dims, memory layout of
results, indexing, dtype promotion and the factories' arguments."""
import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.functional as F


def grad_of(fn, values, dtype="float64", device="cpu"):
    x = mt.tensor(values, dtype=dtype, device=device, requires_grad=True)
    fn(x).sum().backward()
    return x.grad.cpu().numpy()


# --- pow at zero ------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy warns on the inf/nan it makes here
def test_pow_with_exponent_zero_has_zero_gradient_even_at_base_zero(device):
    # x ** 0 is the constant 1: its gradient is 0 everywhere, not 0 * 0^-1 = nan at 0
    np.testing.assert_array_equal(grad_of(lambda x: x ** 0, [-2.0, 0.0, 3.0], device=device),
                                  [0.0, 0.0, 0.0])
    e = mt.tensor([0.0, 2.0], dtype="float64", device=device)
    np.testing.assert_array_equal(grad_of(lambda x: x ** e, [0.0, 0.0], device=device),
                                  [0.0, 0.0])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy warns on the inf/nan it makes here
def test_pow_gradient_for_the_exponent_at_base_zero(device):
    base = mt.tensor([0.0, 0.0, 0.0], dtype="float64", device=device)
    e = mt.tensor([-1.0, 0.0, 2.0], dtype="float64", device=device, requires_grad=True)
    (base ** e).sum().backward()
    # d/de 0^e: 0 for e >= 0 (as PyTorch), inf * log(0) = -inf for e < 0 (not nan)
    np.testing.assert_array_equal(e.grad.cpu().numpy(), [-np.inf, 0.0, 0.0])


# --- reductions over unusual dims --------------------------------------------------------
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "var", "std"])
def test_empty_dim_tuple_reduces_every_dim(device, op):
    values = np.arange(6.0).reshape(2, 3)
    x = mt.tensor(values, dtype="float64", device=device)
    expected = {"sum": 15.0, "mean": 2.5, "amax": 5.0, "amin": 0.0,
                "var": np.var(values, ddof=1), "std": np.std(values, ddof=1)}[op]
    out = getattr(x, op)(())
    assert out.shape == ()
    assert out.item() == pytest.approx(expected)
    assert getattr(x, op)((), keepdim=True).shape == (1, 1)


@pytest.mark.parametrize("dim", [0, -1, (0,), ()])
def test_reductions_of_a_0d_tensor_accept_dim_0_and_minus_1(device, dim):
    x = mt.tensor(3.0, dtype="float64", device=device, requires_grad=True)
    for op in ("sum", "mean", "amax", "amin"):
        out = getattr(x, op)(dim, keepdim=True)
        assert out.shape == () and out.item() == 3.0
    x.sum(dim).backward()
    assert x.grad.item() == 1.0


def test_max_min_argmax_of_a_0d_tensor_along_dim_0(device):
    x = mt.tensor(3.0, device=device)
    values, indices = x.max(0)
    assert (values.item(), indices.item()) == (3.0, 0)
    values, indices = x.min(-1, keepdim=True)
    assert values.shape == () and indices.shape == ()
    assert x.argmax(0).item() == 0 and x.argmin(-1, keepdim=True).shape == ()
    with pytest.raises(IndexError):
        x.argmax(1)


def test_transpose_and_squeeze_of_a_0d_tensor_keep_it(device):
    x = mt.tensor(3.0, device=device)
    assert x.transpose(0, -1).shape == () and x.squeeze(0).shape == ()


def test_extrema_of_an_empty_tensor_along_a_nonempty_dim_are_empty(device):
    x = mt.zeros(0, 3, device=device)
    assert x.amax(1).shape == (0,)
    assert x.amin(1, keepdim=True).shape == (0, 1)
    values, indices = x.max(1)
    assert values.shape == (0,) and indices.shape == (0,)
    assert x.argmax(1).shape == (0,)
    for reduce in (lambda: x.amax(0), lambda: x.max(0), lambda: x.argmin(0), lambda: x.max()):
        with pytest.raises(ValueError, match="non-empty"):
            reduce()


def test_softmax_of_an_empty_tensor_is_empty(device):
    x = mt.zeros(2, 0, device=device)
    assert x.softmax(-1).shape == (2, 0)
    assert x.log_softmax(1).shape == (2, 0)


def test_var_and_std_refuse_integer_input():
    for op in (lambda x: x.var(), lambda x: x.std(0)):
        with pytest.raises(TypeError, match="floating-point"):
            op(mt.tensor([1, 2, 3]))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy warns on the inf/nan it makes here
def test_var_gradient_without_degrees_of_freedom_is_inf_not_nan(device):
    # correction 2 over 2 elements divides by 0: +-inf where the input is off its mean
    g = grad_of(lambda x: x.var(0, correction=2), [[1.0], [3.0]], device=device)
    np.testing.assert_array_equal(g, [[-np.inf], [np.inf]])
    # one element, unbiased: the centered value is 0, so the gradient is 0 * inf = nan
    assert np.isnan(grad_of(lambda x: x.var(), [2.0], device=device)).all()


def test_integer_sums_are_int64(device):
    x = mt.tensor([200, 100], dtype="uint8", device=device)
    assert x.sum().dtype == mt.int64 and x.sum().item() == 300
    assert (x > 150).sum(0).dtype == mt.int64


# --- dtype promotion ----------------------------------------------------------------------
@pytest.mark.parametrize("make, expected", [
    (lambda f, i: f * i, "float32"),  # a float tensor keeps its dtype against int tensors
    (lambda f, i: i + f, "float32"),
    (lambda f, i: mt.maximum(i, f), "float32"),
    (lambda f, i: mt.where(i > 1, i, f), "float32"),
    (lambda f, i: i * 2.5, "float32"),  # int tensor with a float number: default float
    (lambda f, i: 2.5 - i, "float32"),
    (lambda f, i: i ** 0.5, "float32"),
    (lambda f, i: i / 2, "float32"),  # true division of integers
    (lambda f, i: i / i, "float32"),
    (lambda f, i: i * 2, "int64"),
    (lambda f, i: f * np.float64(2.0), "float32"),  # NumPy scalars count as numbers
    (lambda f, i: np.float64(2.0) * f, "float32"),
    (lambda f, i: f + np.int64(1), "float32"),
    (lambda f, i: i.to(mt.int32) + np.int64(1), "int32"),
    (lambda f, i: f * mt.tensor(2.0, dtype="float64", device=f.device), "float32"),  # 0-d keeps float32
    (lambda f, i: f * mt.tensor([2.0], dtype="float64", device=f.device), "float64"),
    (lambda f, i: i.to(mt.bfloat16) * i, "bfloat16"),
    (lambda f, i: i.exp(), "float32"),
    (lambda f, i: i.sigmoid(), "float32"),
    (lambda f, i: (i > 1).tanh(), "float32"),
    (lambda f, i: i.clamp(0.5, 2.5), "float32"),
    (lambda f, i: f.to(mt.bfloat16).clamp(0, 1), "bfloat16"),
    (lambda f, i: mt.where(i > 1, 1.0, 0.0), "float32"),
    (lambda f, i: mt.where(i > 1, 1, 0), "int64"),
])
def test_mixed_dtypes_promote_as_in_pytorch(device, make, expected):
    f = mt.tensor([1.5, -2.0, 3.0], device=device)  # float32
    i = mt.tensor([1, 2, 3], device=device)  # int64
    assert str(make(f, i).dtype) == expected


def test_cat_and_stack_promote_like_binary_ops(device):
    i = mt.tensor([1, 2], device=device)
    f = mt.tensor([0.5, 1.5], device=device, requires_grad=True)
    joined = mt.cat([i, f])
    assert joined.dtype == mt.float32 and joined.tolist() == [1.0, 2.0, 0.5, 1.5]
    stacked = mt.stack([f, i, mt.tensor([True, False], device=device)])
    assert stacked.dtype == mt.float32 and stacked[2].tolist() == [1.0, 0.0]
    assert mt.cat([i, i.to(mt.int32)]).dtype == mt.int64
    (joined.sum() + stacked.sum()).backward()
    assert f.grad.dtype == mt.float32 and f.grad.tolist() == [2.0, 2.0]


def test_integer_results_of_promoted_ops_are_exact():
    i = mt.tensor([1, 2, 3])
    assert (i * 2.5).tolist() == [2.5, 5.0, 7.5]
    assert (i / 2).tolist() == [0.5, 1.0, 1.5]
    np.testing.assert_allclose((i.sigmoid()).numpy(), 1 / (1 + np.exp(-np.array([1, 2, 3]))),
                               rtol=1e-6)


def test_gradients_flow_through_promotion(device):
    x = mt.tensor([1.0, 2.0], device=device, requires_grad=True)  # float32
    w = mt.tensor([3.0, 4.0], dtype="float64", device=device, requires_grad=True)
    y = x * w  # float64 (both have dims): x is cast, its gradient cast back
    assert y.dtype == mt.float64
    (y * mt.tensor([1, 2], device=device)).sum().backward()  # int tensor: stays float64
    assert x.grad.dtype == mt.float32 and x.grad.tolist() == [3.0, 8.0]
    assert w.grad.dtype == mt.float64 and w.grad.tolist() == [1.0, 4.0]


def test_numpy_scalars_on_the_left_stay_in_the_graph(device):
    x = mt.tensor([1.0, 2.0], device=device, requires_grad=True)
    y = np.float64(3.0) * x + np.float32(1.0)  # NumPy defers to Tensor's reflected ops
    assert isinstance(y, mt.Tensor) and y.dtype == mt.float32
    y.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    assert isinstance(np.ones(2) - x, mt.Tensor)


def test_and_or_invert_are_bitwise_on_integers_and_logical_on_bools(device):
    i = mt.tensor([12, 10], device=device)
    assert (i & 6).tolist() == [4, 2] and (i | 1).tolist() == [13, 11]
    assert (~i).tolist() == [-13, -11] and (i & 6).dtype == mt.int64
    m = mt.tensor([True, False], device=device)
    assert (m & True).tolist() == [True, False] and (~m).tolist() == [False, True]
    assert (m | mt.tensor([False, False], device=device)).dtype == mt.bool_
    f = mt.tensor([1.0, 2.0], device=device)
    for op in (lambda: f & f, lambda: f | m, lambda: ~f, lambda: i & 1.5):
        with pytest.raises(TypeError, match="integer or bool"):
            op()


# --- attention with a mask that hides every key from a query ------------------------------
@pytest.mark.parametrize("mask", [
    np.array([[True, True], [False, False]]),
    np.array([[0.0, 0.0], [-np.inf, -np.inf]]),
], ids=["bool", "float"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy warns about -inf - -inf
def test_sdpa_query_that_sees_no_key_gets_zeros_not_nan(device, mask):
    rng = np.random.default_rng(0)
    q, k, v = (mt.tensor(rng.standard_normal((2, 3)), dtype="float64", device=device,
                         requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mt.tensor(mask, device=device))
    out.sum().backward()
    assert out[1].tolist() == [0.0, 0.0, 0.0]
    # the first query attends to both keys: softmax(q k^T / sqrt(3)) v
    qn, kn, vn = (t.detach().cpu().numpy() for t in (q, k, v))
    s = qn[0] @ kn.T / np.sqrt(3)
    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    np.testing.assert_allclose(out[0].detach().cpu().numpy(), p @ vn)
    assert q.grad[1].tolist() == [0.0, 0.0, 0.0]
    for t in (q, k, v):
        assert np.isfinite(t.grad.cpu().numpy()).all()


# --- factories ----------------------------------------------------------------------------
def test_randint_takes_high_and_size_like_torch(device):
    x = mt.randint(5, (2, 3), device=device)
    assert x.shape == (2, 3) and x.dtype == mt.int64
    assert 0 <= int(x.data.min()) and int(x.data.max()) < 5
    assert mt.randint(2, 4, [7], device=device).shape == (7,)


@pytest.mark.parametrize("fill, expected", [
    (np.int64(1), "int64"), (np.int32(1), "int64"), (np.bool_(True), "bool"),
    (np.float64(1.5), "float32"), (1, "int64"), (1.5, "float32"), (True, "bool"),
])
def test_full_infers_its_dtype_from_numpy_scalars_too(fill, expected):
    assert str(mt.full((2,), fill).dtype) == expected


def test_bf16_matmul_and_attention_return_bf16():
    rng = np.random.default_rng(0)
    a = mt.tensor(rng.standard_normal((2, 3, 4)), dtype="bfloat16", requires_grad=True)
    w = mt.tensor(rng.standard_normal((4, 5)), dtype="bfloat16", requires_grad=True)
    for out in (a @ w, a @ a.mT, a[0] @ w, F.linear(a, w.mT)):
        assert out.dtype == mt.bfloat16
    expected = a.detach().float().numpy() @ w.detach().float().numpy()
    np.testing.assert_allclose((a @ w).float().detach().numpy(), expected, rtol=1e-2, atol=1e-2)
    (a @ w).float().sum().backward()
    assert a.grad.dtype == mt.bfloat16 and w.grad.dtype == mt.bfloat16
    out = F.scaled_dot_product_attention(a, a, a, is_causal=True)
    assert out.dtype == mt.bfloat16 and out.shape == (2, 3, 4)


def test_bf16_gelu_and_sigmoid_are_computed_in_float32(device):
    import ml_dtypes
    x32 = np.array([-3.5, -3.0, -1.0, 0.5, 2.0, 6.0], dtype=np.float32)
    x = mt.tensor(x32, device=device).bfloat16()
    exact = x32.astype(ml_dtypes.bfloat16).astype(np.float64)  # the bf16 inputs, exactly
    for approximate in ("tanh", "none"):
        out = mt.gelu(x, approximate=approximate)
        assert out.dtype == mt.bfloat16
        ref = mt.gelu(mt.tensor(exact, device=device), approximate=approximate).numpy() \
            if device == "cpu" else mt.gelu(mt.tensor(exact, device=device), approximate=approximate).cpu().numpy()
        # one bf16 rounding of the float32 result: relative error below 2^-8
        np.testing.assert_allclose(out.float().cpu().numpy(), ref, rtol=2 ** -8, atol=1e-30)
    s = x.sigmoid()
    np.testing.assert_allclose(s.float().cpu().numpy(), 1 / (1 + np.exp(-exact)), rtol=2 ** -8)
