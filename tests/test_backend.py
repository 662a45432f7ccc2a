"""Backends, devices, dtypes, factories, conversions and seeds."""
import math

import ml_dtypes
import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.backend import parse_device
from minitorch_gpu.backend.numpy_backend import _erf


@pytest.mark.parametrize("text, expected", [
    ("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:0", "cuda:0"), ("cuda:3", "cuda:3")])
def test_device_strings(text, expected):
    device = parse_device(text)
    assert str(device) == expected
    assert device == expected and device == parse_device(expected)


def test_cpu_backend_basics():
    backend = mt.get_backend("cpu")
    assert backend.xp is np
    assert mt.zeros(2).device == "cpu"
    backend.synchronize()
    with backend.timer() as timer:
        sum(range(1000))
    assert timer.elapsed_ms >= 0
    assert backend.memory_stats()["peak_rss_bytes"] > 0


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool", "bfloat16",
                                   mt.float16, mt.bfloat16, float, int])
def test_dtypes_round_trip(device, dtype):
    x = mt.zeros(2, 3, dtype=dtype, device=device)
    expected = mt.backend.dtypes.as_dtype(dtype)
    assert x.dtype == expected
    assert x.to(mt.float64).dtype == mt.float64


def test_default_dtypes_follow_pytorch(device):
    assert mt.tensor([1.0, 2.0], device=device).dtype == mt.float32
    assert mt.tensor([1, 2], device=device).dtype == mt.int64
    assert mt.tensor([True], device=device).dtype == mt.bool
    assert mt.tensor(np.zeros(2, dtype=np.float64), device=device).dtype == mt.float64
    assert mt.arange(5, device=device).dtype == mt.int64
    assert mt.arange(0.0, 1.0, 0.25, device=device).dtype == mt.float32
    assert mt.randn(2, device=device).dtype == mt.float32


def test_bfloat16_is_real_storage_rounded_to_nearest_even(device):
    values = np.array([1.0, 1.00390625, 1.01171875, 3.14159], dtype=np.float32)
    x = mt.tensor(values, device=device).bfloat16()
    assert x.dtype == mt.bfloat16 and x.element_size() == 2
    expected = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(x.float().cpu().numpy(), expected)
    y = mt.randn(4, dtype="bf16", device=device)
    assert y.dtype == mt.bfloat16


def test_factories(device):
    assert mt.ones(2, 3, device=device).tolist() == [[1.0] * 3] * 2
    assert mt.full((2,), 7, device=device).tolist() == [7, 7]
    assert mt.full((2,), 0.5, device=device).dtype == mt.float32
    assert mt.arange(1, 7, 2, device=device).tolist() == [1, 3, 5]
    assert mt.empty(3, 1, device=device).shape == (3, 1)
    x = mt.randn(3, 4, dtype="float64", device=device)
    assert mt.zeros_like(x).dtype == mt.float64 and mt.ones_like(x).shape == (3, 4)
    assert mt.full_like(x, 2.0).tolist()[0] == [2.0] * 4
    r = mt.randint(0, 10, (1000,), device=device)
    assert r.dtype == mt.int64 and 0 <= r.min().item() and r.max().item() < 10
    u = mt.rand(1000, device=device)
    assert 0 <= u.min().item() and u.max().item() < 1
    w = mt.zeros(3, requires_grad=True, device=device)
    assert w.requires_grad and w.is_leaf


def test_tensor_copies_its_input_but_from_numpy_shares():
    array = np.zeros(3, dtype=np.float32)
    t = mt.tensor(array)
    t += 1
    assert array.tolist() == [0.0, 0.0, 0.0]
    shared = mt.from_numpy(array)
    shared += 1
    assert array.tolist() == [1.0, 1.0, 1.0]


def test_conversions(device):
    x = mt.tensor([[1.5, -2.0]], device=device)
    assert x.tolist() == [[1.5, -2.0]]
    assert x[0, 0].item() == 1.5 and isinstance(x[0, 0].item(), float)
    assert float(x[0, 1]) == -2.0
    assert x.cpu().numpy().dtype == np.float32
    assert x.long().tolist() == [[1, -2]]
    assert x.to("cpu", "float64").dtype == mt.float64
    assert x.to(dtype=mt.float32) is x  # nothing to change: no copy
    assert x.clone().data_ptr() != x.data_ptr()
    assert np.asarray(x.cpu()).shape == (1, 2)
    assert "tensor([[ 1.5, -2. ]]" in repr(x.cpu())
    assert "requires_grad=True" in repr(mt.zeros(1, requires_grad=True))
    assert "dtype=float64" in repr(mt.zeros(1, dtype="float64"))


def test_to_device_is_differentiable(device):
    x = mt.randn(3, requires_grad=True)
    y = x.to(device)
    assert y.device == device
    (y * 2).sum().backward()
    assert x.grad.device == "cpu" and x.grad.tolist() == [2.0, 2.0, 2.0]


def test_cast_is_differentiable(device):
    x = mt.randn(3, dtype="float64", requires_grad=True, device=device)
    (x.float() * 3).sum().backward()
    assert x.grad.dtype == mt.float64 and x.grad.tolist() == [3.0, 3.0, 3.0]


def test_manual_seed_makes_random_draws_repeatable(device):
    def draw():
        x = mt.randn(5, device=device)
        u = mt.rand(5, device=device)
        i = mt.randint(0, 100, (5,), device=device)
        d = mt.functional.dropout(mt.ones(50, device=device), p=0.5)
        return x.tolist(), u.tolist(), i.tolist(), d.tolist()

    mt.manual_seed(1234)
    first = draw()
    mt.manual_seed(1234)
    assert draw() == first
    mt.manual_seed(4321)
    assert draw()[0] != first[0]


def test_normal_and_uniform_fill_in_place_under_no_grad(device):
    w = mt.empty(1000, requires_grad=True, device=device)
    with mt.no_grad():
        w.normal_(0.0, 0.02)
    assert abs(w.std().item() - 0.02) < 0.003
    with mt.no_grad():
        w.uniform_(-1.0, 1.0)
    assert -1.0 <= w.min().item() and w.max().item() < 1.0


def test_erf_matches_math_erf():
    x = np.concatenate([np.linspace(-7, 7, 20001), [0.0, -0.0, 2.5, -2.5, 1e-300, np.inf, -np.inf]])
    expected = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(_erf(x), expected, rtol=2e-15, atol=2e-15)
    assert _erf(np.float32(0.5).reshape(1)).dtype == np.float32


def test_deepcopy_and_pickle_keep_the_backend_and_copy_the_data(device):
    import copy
    import pickle

    x = mt.randn(3, device=device, requires_grad=True)
    (x * 2).sum().backward()
    for clone in (copy.deepcopy(x), pickle.loads(pickle.dumps(x))):
        assert clone.backend is x.backend  # one backend per device: ops can mix them
        assert clone.requires_grad and clone.is_leaf
        assert clone.data_ptr() != x.data_ptr()
        assert clone.tolist() == x.tolist()
        assert (clone + x).shape == (3,)
    assert copy.deepcopy(x).grad.tolist() == [2.0, 2.0, 2.0]
    assert copy.deepcopy(x.backend) is x.backend
    with pytest.raises(RuntimeError, match="only leaf tensors"):
        copy.deepcopy(x * 2)


@pytest.mark.parametrize("rows, index", [
    (5, [0, 3, 3, 1, 3, 0]),  # repeats, unsorted
    (5, [4]),
    (5, [-1, 4, 2, -5]),  # negative rows count from the end, and meet their positive twins
    (70, np.random.default_rng(0).integers(0, 70, 500)),
])
def test_scatter_add_of_rows_adds_every_repeat(rows, index):
    backend = mt.get_backend("cpu")
    index = np.asarray(index)
    values = np.random.default_rng(1).standard_normal((len(index), 3))
    expected = np.zeros((rows, 3))
    np.add.at(expected, index, values)
    target = np.zeros((rows, 3))
    backend.scatter_add(target, index, values)
    np.testing.assert_allclose(target, expected, rtol=1e-12, atol=1e-12)
