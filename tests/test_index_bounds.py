"""Index tensors out of range raise IndexError on every device, in NumPy's words.

NumPy refuses an index outside [-size, size); CuPy takes it modulo the size, so on a GPU
``x[idx]``, ``x[idx] = v`` and the backward's scatter-add would read or write the wrong
element silently. The check is the project's own (``Backend.check_in_range``): at once
on the CPU, kept on the device and raised at the next host read on a GPU, so no op waits
for it. A test that must see the error on every device reads the pending checks
(``raise_deferred_errors``) inside its ``pytest.raises``.
"""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.backend import get_backend
from minitorch_gpu.backend.transfers import DeferredChecks

X = np.arange(24, dtype=np.float64).reshape(2, 3, 4)

# (key builder on a device, the bad index, its axis, the axis's size)
OUT_OF_RANGE = [
    ("past-the-end", lambda d: mt.tensor([0, 2], device=d), 2, 0, 2),
    ("below-minus-size", lambda d: mt.tensor([-3, 1], device=d), -3, 0, 2),
    ("second-axis", lambda d: (slice(None), mt.tensor([[0], [3]], device=d)), 3, 1, 3),
    ("after-ellipsis", lambda d: (Ellipsis, mt.tensor([4], device=d)), 4, 2, 4),
    ("after-none", lambda d: (None, 0, mt.tensor([-4], device=d)), -4, 1, 3),
    ("beside-an-int", lambda d: (1, slice(None), mt.tensor([1, 7], device=d)), 7, 2, 4),
    ("two-arrays", lambda d: (mt.tensor([0, 1], device=d), mt.tensor([2, 5], device=d)), 5,
     1, 3),
    ("after-a-mask", lambda d: (mt.tensor([True, False], device=d),
                                mt.tensor([9], device=d)), 9, 1, 3),
    ("a-list", lambda d: [0, 5], 5, 0, 2),
    ("a-numpy-array", lambda d: (slice(None), np.array([-4])), -4, 1, 3),
]
IDS = [case[0] for case in OUT_OF_RANGE]


def _host(t):
    return t.detach().to("cpu").numpy()


def _message(bad, axis, size):
    return (rf"^indexing a tensor of shape \(2, 3, 4\): index {bad} is out of bounds for "
            rf"axis {axis} with size {size}")


@pytest.mark.parametrize("name, key, bad, axis, size", OUT_OF_RANGE, ids=IDS)
def test_reading_at_an_index_out_of_range_raises_naming_index_axis_and_size(
        device, name, key, bad, axis, size):
    x = mt.tensor(X, device=device)
    with pytest.raises(IndexError, match=_message(bad, axis, size)):
        x[key(device)]
        get_backend(device).raise_deferred_errors()


@pytest.mark.parametrize("name, key, bad, axis, size", OUT_OF_RANGE, ids=IDS)
def test_writing_at_an_index_out_of_range_raises_and_leaves_the_tensor(
        device, name, key, bad, axis, size):
    x = mt.tensor(X, device=device)
    with pytest.raises(IndexError, match=_message(bad, axis, size)):
        x[key(device)] = -1.0
        get_backend(device).raise_deferred_errors()
    if device == "cpu":  # checked before the write (a GPU writes, then reports)
        np.testing.assert_array_equal(x.numpy(), X)


# (key builder, the NumPy key it means): indices from the end are in range, as in NumPy
IN_RANGE = [
    ("from-the-end", lambda d: mt.tensor([-2, 1, -1], device=d), np.array([-2, 1, -1])),
    ("last-axis", lambda d: (Ellipsis, mt.tensor([-4, 3], device=d)), (Ellipsis, [-4, 3])),
    ("second-axis-2d", lambda d: (slice(None), mt.tensor([[-1], [0]], device=d)),
     (slice(None), np.array([[-1], [0]]))),
    ("mask-then-index", lambda d: (mt.tensor([False, True], device=d),
                                   mt.tensor([-3, 2], device=d)), (np.array([1]), [-3, 2])),
    ("empty", lambda d: mt.tensor([], dtype=mt.int64, device=d), np.array([], dtype=int)),
]


@pytest.mark.parametrize("name, key, numpy_key", IN_RANGE, ids=[c[0] for c in IN_RANGE])
def test_indices_in_range_read_write_and_backpropagate_as_numpy(device, name, key,
                                                                numpy_key):
    x = mt.tensor(X, device=device, requires_grad=True)
    out = x[key(device)]
    np.testing.assert_array_equal(_host(out), X[numpy_key])
    out.sum().backward()
    expected = np.zeros_like(X)
    np.add.at(expected, numpy_key, 1.0)  # repeated indices all receive their gradient
    np.testing.assert_array_equal(_host(x.grad), expected)
    y = mt.tensor(X, device=device)
    y[key(device)] = -1.0
    written = X.copy()
    written[numpy_key] = -1.0
    np.testing.assert_array_equal(_host(y), written)
    get_backend(device).raise_deferred_errors()


@pytest.mark.parametrize("key, axis, size, got", [
    (lambda d: mt.tensor([True, False, True], device=d), 0, 2, 3),
    (lambda d: (slice(None), mt.tensor([[True], [False]], device=d)), 1, 3, 2),
    (lambda d: [True], 0, 2, 1),
], ids=["first-axis", "a-2d-mask", "a-list"])
def test_a_mask_of_the_wrong_shape_raises_naming_axis_and_sizes(device, key, axis, size, got):
    x = mt.tensor(X, device=device)
    with pytest.raises(IndexError, match=rf"boolean index did not match indexed array along "
                                         rf"axis {axis}; size of axis is {size} but size of "
                                         rf"corresponding boolean axis is {got}"):
        x[key(device)]


# --- on the CPU playing a GPU: deferred, and no read -----------------------------------------
@pytest.fixture
def gpu_like(monkeypatch):
    """The CPU backend taking the GPU's branches (checks deferred), with checks of its own."""
    backend = get_backend("cpu")
    monkeypatch.setattr(backend, "reads_are_free", False)
    monkeypatch.setattr(backend, "_deferred_checks", DeferredChecks())
    return backend


def test_an_index_check_on_a_gpu_reads_nothing_and_raises_at_the_next_read(gpu_like):
    x = mt.randn(3, 4, requires_grad=True)
    with gpu_like.count_host_reads() as reads:
        x[mt.tensor([2, -3])].sum().backward()
        with mt.no_grad():
            x[:, mt.tensor([0, 3])] = 1.0
        assert reads.count == 0
        # NumPy itself refuses an index past the end where CuPy would wrap it: caught here,
        # the project's own check is still pending, and names the index
        with pytest.raises(IndexError):
            x[:, mt.tensor([1, 6])]
        assert reads.count == 0
        with pytest.raises(IndexError, match=r"^indexing a tensor of shape \(3, 4\): index 6 "
                                             r"is out of bounds for axis 1 with size 4 "
                                             r"\[checked on cpu without waiting"):
            x.sum().item()
    assert reads.count == 1
    gpu_like.raise_deferred_errors()  # reported once, then forgotten
