"""Property tests: the stride rule of ``view`` against NumPy's no-copy reshape, and the
gradients of broadcasting binary ops against NumPy sums of the broadcast gradient."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitorch_gpu as mt
from minitorch_gpu.ops.views import view_strides

PROPERTY = settings(max_examples=150, deadline=None)


# --- view strides -------------------------------------------------------------------------
@st.composite
def layouts(draw):
    """A shape of up to 4 dims (sizes 0..4), a permutation of it and a slicing with
    positive steps: the layouts a view can meet."""
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=4)))
    perm = tuple(draw(st.permutations(range(len(shape)))))
    key = tuple(slice(draw(st.integers(0, max(shape[d] - 1, 0))), None, draw(st.integers(1, 3)))
                for d in perm)
    return shape, perm, key


def numpy_layout(shape, perm, key):
    base = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return base, base.transpose(perm)[key + (Ellipsis,)]  # Ellipsis: 0-d stays an array


@st.composite
def layouts_and_new_shapes(draw):
    """A layout and a shape of the same number of elements: its prime factors (or a 0)
    spread over up to 5 dims, with size-1 dims mixed in."""
    layout = draw(layouts())
    numel = numpy_layout(*layout)[1].size
    factors, n = [], numel
    for p in (2, 3, 5, 7):
        while n > 1 and n % p == 0:
            factors.append(p)
            n //= p
    if n > 1:
        factors.append(n)
    if numel == 0:
        factors = [0] + draw(st.lists(st.integers(1, 3), max_size=2))
    new_shape = [1] * draw(st.integers(1 if factors else 0, 5))
    for f in factors:
        new_shape[draw(st.integers(0, len(new_shape) - 1))] *= f
    return layout, tuple(new_shape)


def element_strides(array: np.ndarray) -> tuple:
    return tuple(s // array.itemsize for s in array.strides)


@PROPERTY
@given(layouts_and_new_shapes())
def test_view_strides_agree_with_numpy_no_copy_reshape(case):
    layout, new_shape = case
    array = numpy_layout(*layout)[1]
    assert int(np.prod(new_shape)) == array.size
    got = view_strides(array.shape, element_strides(array), new_shape)
    try:
        reshaped = np.reshape(array, new_shape, copy=False)
    except ValueError:  # NumPy would have to copy
        assert got is None, (array.shape, element_strides(array), new_shape, got)
        return
    assert got is not None, (array.shape, element_strides(array), new_shape)
    if array.size > 1:  # strides only address memory along dims longer than 1
        expected = element_strides(reshaped)
        assert [s for s, n in zip(got, new_shape) if n > 1] == \
            [s for s, n in zip(expected, new_shape) if n > 1]


@PROPERTY
@given(layouts_and_new_shapes())
def test_view_succeeds_exactly_when_the_strides_allow_and_shares_memory(case):
    (shape, perm, key), new_shape = case
    base, array = numpy_layout(shape, perm, key)
    t_base = mt.from_numpy(base)
    t = t_base.permute(perm)[key]
    assert t.shape == array.shape
    expected = array.reshape(new_shape).tolist()
    if view_strides(t.shape, t.stride(), new_shape) is None:
        with pytest.raises(RuntimeError, match="view"):
            t.view(new_shape)
    else:
        y = t.view(new_shape)
        assert y.tolist() == expected
        assert base.size == 0 or np.shares_memory(y.data, base)
    assert t.reshape(new_shape).tolist() == expected


# --- gradients of broadcasting binary ops --------------------------------------------------
@st.composite
def broadcastable_pairs(draw):
    """Two shapes that broadcast: suffixes of one full shape, some dims replaced by 1."""
    full = draw(st.lists(st.integers(1, 4), min_size=0, max_size=4))

    def operand():
        shape = full[draw(st.integers(0, len(full))):]
        return tuple(1 if draw(st.booleans()) else n for n in shape)

    return operand(), operand()


def sum_to_shape(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """NumPy reference of the backward of broadcasting."""
    lead = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=axes, keepdims=True).reshape(shape)


OPS = {
    "add": (lambda a, b: a + b, lambda g, a, b: (g, g)),
    "sub": (lambda a, b: a - b, lambda g, a, b: (g, -g)),
    "mul": (lambda a, b: a * b, lambda g, a, b: (g * b, g * a)),
    "div": (lambda a, b: a / b, lambda g, a, b: (g / b, -g * a / (b * b))),
}


@pytest.mark.parametrize("op", sorted(OPS))
@settings(max_examples=40, deadline=None)
@given(shapes=broadcastable_pairs(), seed=st.integers(0, 2**16))
def test_broadcast_gradients_are_summed_back_to_each_input(op, shapes, seed):
    forward, local_grads = OPS[op]
    shape_a, shape_b = shapes
    rng = np.random.default_rng(seed)
    a_np = rng.uniform(0.5, 2.0, shape_a) * rng.choice([-1.0, 1.0], shape_a)  # away from 0
    b_np = rng.uniform(0.5, 2.0, shape_b) * rng.choice([-1.0, 1.0], shape_b)
    a = mt.tensor(a_np, dtype="float64", requires_grad=True)
    b = mt.tensor(b_np, dtype="float64", requires_grad=True)
    out = forward(a, b)
    out_shape = np.broadcast_shapes(shape_a, shape_b)
    assert out.shape == out_shape
    g = rng.standard_normal(out_shape)
    out.backward(mt.tensor(g, dtype="float64"))
    a_full, b_full = np.broadcast_to(a_np, out_shape), np.broadcast_to(b_np, out_shape)
    ga, gb = local_grads(g, a_full, b_full)
    assert a.grad.shape == shape_a and b.grad.shape == shape_b
    np.testing.assert_allclose(a.grad.numpy(), sum_to_shape(ga, shape_a), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), sum_to_shape(gb, shape_b), rtol=1e-12, atol=1e-12)
