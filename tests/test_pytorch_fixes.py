"""Where minitorch_gpu gave NumPy's answer (or NumPy's crash) instead of PyTorch's, and
PyTorch's spellings: each fix checked against hard-coded values, so the CPU suite always
checks it, and against torch itself where torch is installed (a development-only
reference)."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.functional as F

try:
    import torch
except ImportError:  # the hard-coded checks still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def host(t: mt.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


# --- indexing: an int and an index array apart ----------------------------------------------
X234 = np.arange(24.0).reshape(2, 3, 4)
IDX = [0, 2]
# (key builder, the shape PyTorch gives for X234); NumPy gives (2, 3) for the first
INDEX_FORMS = [
    (lambda i: (1, slice(None), i), (3, 2)),
    (lambda i: (slice(None), 1, i), (2, 2)),
    (lambda i: (1, i), (2, 4)),
    (lambda i: (1, None, i), (1, 2, 4)),
    (lambda i: (Ellipsis, 1, slice(None), i), (3, 2)),
    (lambda i: (1, slice(None), i[None]), (3, 1, 2)),
]


@pytest.mark.parametrize("n", range(len(INDEX_FORMS)))
def test_int_and_index_apart_place_dims_as_pytorch(n: int) -> None:
    make, shape = INDEX_FORMS[n]
    x = mt.tensor(X234, requires_grad=True)
    out = x[make(mt.tensor(IDX))]
    assert out.shape == shape
    (out * mt.arange(out.numel(), dtype=mt.float64).reshape(shape)).sum().backward()
    if torch is not None:
        tx = torch.tensor(X234, requires_grad=True)
        tout = tx[make(torch.tensor(IDX))]
        np.testing.assert_array_equal(host(out), tout.detach().numpy())
        (tout * torch.arange(tout.numel(), dtype=torch.float64).reshape(shape)).sum().backward()
        np.testing.assert_array_equal(host(x.grad), tx.grad.numpy())


def test_int_slice_index_values_and_gradient() -> None:
    x = mt.tensor(X234, requires_grad=True)
    out = x[1, :, mt.tensor(IDX)]  # x[1][:, [0, 2]]
    np.testing.assert_array_equal(host(out), [[12, 14], [16, 18], [20, 22]])
    (out * mt.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])).sum().backward()
    expected = np.zeros((2, 3, 4))
    expected[1, :, 0], expected[1, :, 2] = [1, 3, 5], [2, 4, 6]
    np.testing.assert_array_equal(host(x.grad), expected)


def test_setitem_places_the_value_as_pytorch() -> None:
    x = mt.zeros(2, 3, 4)
    x[1, :, mt.tensor(IDX)] = mt.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # (3, 2)
    np.testing.assert_array_equal(host(x[1]), [[1, 0, 2, 0], [3, 0, 4, 0], [5, 0, 6, 0]])
    assert float(x[0].abs().sum()) == 0.0


@pytest.mark.parametrize("step, message", [(0, "slice step cannot be zero"),
                                           (-1, "step must be greater than zero")])
def test_slice_steps_pytorch_refuses(step: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mt.arange(5)[::step]
    x = mt.zeros(5)
    with pytest.raises(ValueError, match=message):
        x[::step] = 1.0


# --- scaled_dot_product_attention: a float mask that learns --------------------------------
def _attention_inputs(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in [(2, 3, 4), (2, 5, 4), (2, 5, 3), (3, 5)]]


@pytest.mark.parametrize("others_need_grad", [True, False])
def test_sdpa_float_mask_gets_its_gradient(others_need_grad: bool) -> None:
    q, k, v, m = _attention_inputs()
    ts = [mt.tensor(a, requires_grad=others_need_grad or i == 3)
          for i, a in enumerate((q, k, v, m))]
    out = F.scaled_dot_product_attention(*ts[:3], attn_mask=ts[3], scale=0.7)
    (out ** 2).sum().backward()
    grad = host(ts[3].grad)
    assert grad.shape == (3, 5)  # summed over the batch dim the mask broadcast along
    # dS = P * (dP - rowsum(dP * P)) sums to 0 over each row of keys
    np.testing.assert_allclose(grad.sum(axis=-1), 0.0, atol=1e-12)
    assert np.abs(grad).max() > 1e-3
    if torch is not None:
        tt = [torch.tensor(a, requires_grad=others_need_grad or i == 3)
              for i, a in enumerate((q, k, v, m))]
        tout = torch.nn.functional.scaled_dot_product_attention(*tt[:3], attn_mask=tt[3],
                                                                scale=0.7)
        (tout ** 2).sum().backward()
        for ours, theirs in zip(ts, tt):
            if theirs.requires_grad:
                np.testing.assert_allclose(host(ours.grad), theirs.grad.numpy(), rtol=1e-10,
                                           atol=1e-12)


def test_sdpa_learned_mask_trains_a_bias() -> None:
    """One SGD step on an additive bias moves it: it used to get no gradient at all."""
    q, k, v, m = _attention_inputs(1)
    bias = mt.tensor(m, requires_grad=True)
    F.scaled_dot_product_attention(mt.tensor(q), mt.tensor(k), mt.tensor(v),
                                   attn_mask=bias).sum().backward()
    assert bias.grad is not None and float(bias.grad.abs().sum()) > 0


# --- gather ----------------------------------------------------------------------------------
def test_gather_index_smaller_than_input() -> None:
    x = mt.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    out = x.gather(1, mt.tensor([[3, 0]]))  # (1, 2): reads row 0 only
    np.testing.assert_array_equal(host(out), [[3.0, 0.0]])
    out.sum().backward()
    np.testing.assert_array_equal(host(x.grad), [[1, 0, 0, 1], [0] * 4, [0] * 4])
    if torch is not None:
        t = torch.arange(12.0).reshape(3, 4).gather(1, torch.tensor([[3, 0]]))
        np.testing.assert_array_equal(host(out), t.numpy())


@pytest.mark.parametrize("index, message", [
    ([[5]], "gather: index 5 is out of bounds for dim 1 with size 4"),
    ([[-1]], "gather: index -1 is out of bounds for dim 1 with size 4"),
])
def test_gather_out_of_range_names_gather_dim_and_size(index: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mt.zeros(3, 4).gather(1, mt.tensor(index))


def test_gather_index_larger_than_input_is_refused() -> None:
    with pytest.raises(ValueError, match=r"gather: index of shape \(4, 1\) must be no larger"):
        mt.zeros(3, 4).gather(1, mt.zeros(4, 1, dtype=mt.int64))


# --- view(dtype) ---------------------------------------------------------------------------
def test_view_dtype_same_itemsize_reinterprets_bits() -> None:
    x = mt.tensor([1.0, -2.0])
    bits = x.view(mt.int32)
    assert bits.dtype == mt.int32 and bits.shape == (2,)
    assert bits.tolist() == [0x3F800000, -0x40000000]  # IEEE 754 of 1.0 and -2.0
    assert bits.data_ptr() == x.data_ptr()
    with mt.no_grad():
        bits[0] = 0x40000000  # a view: writes through (2.0)
    assert x.tolist() == [2.0, -2.0]


def test_view_dtype_other_itemsize_changes_the_last_dim() -> None:
    x = mt.zeros(3, 4)
    assert x.view(mt.float64).shape == (3, 2)
    assert x.view(np.int16).shape == (3, 8)
    assert x.view(mt.uint8).shape == (3, 16)
    with pytest.raises(RuntimeError, match="size\\(-1\\) must be divisible by 2"):
        x[:, :3].view(mt.float64)
    with pytest.raises(RuntimeError, match="stride 1"):
        x.t().view(mt.float64)
    if torch is not None:
        t = torch.tensor([[1.5, -3.25, 7.0, 0.1]])
        np.testing.assert_array_equal(host(mt.tensor(t.numpy()).view(mt.int32)),
                                      t.view(torch.int32).numpy())
        np.testing.assert_array_equal(host(mt.tensor(t.numpy()).view(mt.float64)),
                                      t.view(torch.float64).numpy())


# --- integers: wrap as PyTorch, PyTorch's errors -------------------------------------------
@pytest.mark.parametrize("dtype, value, expected", [
    (mt.int32, 0xFFFFFFFF, [-1, -1]),
    (mt.int32, -2 ** 31 - 1, [2 ** 31 - 1, 2 ** 31 - 1]),
    (mt.int32, 2 ** 63, [1, 2]),
    (mt.int64, 0xFFFFFFFF, [0xFFFFFFFF, 0xFFFFFFFF]),
    (mt.int64, 2 ** 63, [-2 ** 63 + 1, -2 ** 63 + 2]),
    (mt.uint8, -1, [255, 255]),
])
def test_python_int_out_of_range_wraps(dtype, value: int, expected: list) -> None:
    a = mt.tensor([1, 2], dtype=dtype)
    assert (a | value).tolist() == expected
    assert (value | a).tolist() == expected
    assert (a | value).dtype == dtype
    if torch is not None:
        ta = torch.tensor([1, 2], dtype=getattr(torch, np.dtype(dtype).name))
        assert (ta | value).tolist() == expected


def test_inplace_arithmetic_wraps_python_ints() -> None:
    a = mt.tensor([1, 2], dtype=mt.int32)
    a += 2 ** 32  # adds 0, as in PyTorch
    a.add_(0xFFFFFFFF)  # adds -1
    a.mul_(2 ** 32 + 3)  # multiplies by 3
    a.sub_(1, alpha=2 ** 32 + 1)  # subtracts 1
    assert a.tolist() == [-1, 2] and a.dtype == mt.int32


def test_python_int_past_uint64_is_an_overflow() -> None:
    with pytest.raises(OverflowError, match="too big"):
        mt.tensor([1]) | 2 ** 64


def test_integer_to_negative_integer_power() -> None:
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not "
                                           "allowed."):
        mt.tensor([1, 2]) ** -1
    assert (mt.tensor([2.0]) ** -1).tolist() == [0.5]
    assert (mt.tensor([2]) ** -1.0).tolist() == [0.5]


def test_integer_tensor_to_negative_integer_tensor_powers() -> None:
    """NumPy refuses any negative integer exponent; PyTorch computes 1 // a ** n."""
    base, exponent = [0, 1, 2, -1, -1, 3, -2], [-1, -3, -1, -1, -2, 2, 3]
    expected = [0, 1, 0, -1, 1, 9, -8]
    assert (mt.tensor(base) ** mt.tensor(exponent)).tolist() == expected
    assert (2 ** mt.tensor([-1, 3])).tolist() == [0, 8]
    if torch is not None:
        assert (torch.tensor(base) ** torch.tensor(exponent)).tolist() == expected


def test_arange_past_the_dtype_range() -> None:
    with pytest.raises(RuntimeError, match="cannot be converted to type int64 without "
                                           "overflow"):
        mt.arange(2 ** 63 - 2, 2 ** 63 + 1)
    with pytest.raises(RuntimeError, match="more than"):
        mt.arange(0, 2 ** 62)
    with pytest.raises(RuntimeError, match="unsupported range"):
        mt.arange(0, float("inf"))
    # narrower integer dtypes wrap, as PyTorch's do
    assert mt.arange(2 ** 31 - 2, 2 ** 31 + 1, dtype=mt.int32).tolist() == \
        [2 ** 31 - 2, 2 ** 31 - 1, -2 ** 31]
    assert mt.arange(-1, 2, dtype=mt.uint8).tolist() == [255, 0, 1]


# --- PyTorch's spellings --------------------------------------------------------------------
def test_type_names_and_casts() -> None:
    x = mt.zeros(2)
    assert x.type() == "torch.FloatTensor"
    assert x.double().type() == "torch.DoubleTensor"
    assert mt.tensor([1]).type() == "torch.LongTensor"
    assert (x > 0).type() == "torch.BoolTensor"
    assert x.type(mt.float64).dtype == mt.float64
    assert x.type("torch.IntTensor").dtype == mt.int32
    with pytest.raises(ValueError, match="unknown type"):
        x.type("torch.ComplexTensor")


def test_method_forms() -> None:
    x = mt.tensor([1.0, -2.0, 3.0])
    assert x.add(1).tolist() == [2.0, -1.0, 4.0]
    assert x.add(x, alpha=2).tolist() == [3.0, -6.0, 9.0]
    assert x.sub(1, alpha=2).tolist() == [-1.0, -4.0, 1.0]
    assert x.mul(2).tolist() == x.multiply(2).tolist() == [2.0, -4.0, 6.0]
    assert x.neg().tolist() == [-1.0, 2.0, -3.0]
    assert x.where(x > 0, 0.0).tolist() == [1.0, 0.0, 3.0]
    assert x.gt(0).tolist() == [True, False, True] and x.eq(3).tolist() == [False, False, True]
    assert (x > 0).logical_not().tolist() == [False, True, False]
    i = mt.tensor([1, 6])
    assert i.bitwise_and(3).tolist() == [1, 2] and i.bitwise_or(3).tolist() == [3, 7]
    assert i.bitwise_xor(3).tolist() == [2, 5] and i.bitwise_not().tolist() == [-2, -7]


def test_reflected_bitwise_operators() -> None:
    i = mt.tensor([1, 6])
    assert (3 & i).tolist() == [1, 2]
    assert (3 | i).tolist() == [3, 7]
    assert (3 ^ i).tolist() == (i ^ 3).tolist() == [2, 5]
    assert (True ^ mt.tensor([True, False])).tolist() == [False, True]


def test_axis_and_keepdims_aliases() -> None:
    x = mt.tensor(np.arange(6.0).reshape(2, 3))
    assert x.sum(axis=0).tolist() == [3.0, 5.0, 7.0]
    assert mt.sum(x, axis=1, keepdims=True).shape == (2, 1)
    assert x.mean(axis=1).tolist() == [1.0, 4.0]
    assert x.amax(axis=0, keepdims=True).shape == (1, 3)
    assert x.max(axis=1)[1].tolist() == [2, 2]
    assert x.argmin(axis=1).tolist() == [0, 0]
    assert mt.cat([x, x], axis=1).shape == (2, 6)
    assert mt.softmax(x, axis=0).shape == (2, 3)
    with pytest.raises(TypeError, match="both dim= and its alias axis="):
        x.sum(dim=0, axis=1)
    if torch is not None:
        t = torch.tensor(np.arange(6.0).reshape(2, 3))
        assert t.sum(axis=0).tolist() == x.sum(axis=0).tolist()
        assert tuple(torch.sum(t, axis=1, keepdims=True).shape) == (2, 1)


def test_more_method_spellings_match_torch() -> None:
    rng = np.random.default_rng(3)
    values = rng.standard_normal((2, 3, 4))
    x = mt.tensor(values, requires_grad=True)
    forms = [
        lambda t: t.divide(2), lambda t: t.true_divide(t + 3), lambda t: t.absolute(),
        lambda t: t.square(), lambda t: t.clamp_min(0.1), lambda t: t.clamp_max(0.1),
        lambda t: t.movedim(0, -1), lambda t: t.movedim((0, 1), (2, 0)),
        lambda t: t.swapaxes(0, 2), lambda t: t.unbind(1)[2], lambda t: t[0].mm(t[1].mT),
        lambda t: t.bmm(t.mT), lambda t: t[0, 0].dot(t[1, 1]), lambda t: t[0, 0].outer(t[0, 1]),
        lambda t: t[0].mv(t[1, 0]),
    ]
    for i, form in enumerate(forms):
        out = form(x)
        out.sum().backward()
        assert x.grad is not None, i
        x.grad = None
        if torch is not None:
            np.testing.assert_allclose(host(out), form(torch.tensor(values)).numpy(),
                                       rtol=1e-12, err_msg=str(i))
    assert x.greater(0).tolist() == (x > 0).tolist()
    assert x.ndimension() == 3 and x.nelement() == 24 and x.is_floating_point()
    assert x.type_as(mt.tensor([1])).dtype == mt.int64
    assert x.new_zeros(2, 2).dtype == mt.float64 and x.new_ones((3,)).tolist() == [1, 1, 1]
    assert x.new_tensor([1, 2]).dtype == mt.float64
    assert x.index_select(2, mt.tensor([3, 0])).shape == (2, 3, 2)
    assert x.allclose(x) and x.equal(x) and not x.equal(x + 1)
