"""The autograd engine: accumulation, reuse, deep graphs, retain_graph, no_grad, in-place."""
import gc

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu import Function


def test_reused_node_receives_all_its_gradient(device):
    x = mt.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    y = x * x + x  # x feeds three edges
    y.sum().backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), 2 * np.array([1, 2, 3]) + 1)


def test_diamond_graph(device):
    x = mt.tensor(2.0, dtype="float64", device=device, requires_grad=True)
    a = x * 3  # feeds both branches
    (a.exp() + a.sin()).backward()
    assert x.grad.item() == pytest.approx(3 * np.exp(6.0) + 3 * np.cos(6.0))


def test_gradients_accumulate_across_backward_calls(device):
    x = mt.tensor([1.0, -1.0], device=device, requires_grad=True)
    (x * 3).sum().backward()
    (x * 4).sum().backward()
    assert x.grad.tolist() == [7.0, 7.0]


def test_shared_gradient_arrays_are_not_aliased_between_leaves(device):
    a = mt.ones(3, device=device, requires_grad=True)
    b = mt.ones(3, device=device, requires_grad=True)
    (a + b).sum().backward()  # add hands one gradient array to both inputs
    with mt.no_grad():
        a.grad.mul_(10.0)
    assert b.grad.tolist() == [1.0, 1.0, 1.0]


def test_a_chain_of_ten_thousand_ops_backpropagates(device):
    x = mt.tensor(1.0, dtype="float64", device=device, requires_grad=True)
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.backward()
    assert x.grad.item() == pytest.approx(1.0001 ** 10_000, rel=1e-6)
    del y
    gc.collect()  # and the long graph is freed without blowing the stack


def test_backward_frees_saved_arrays_and_refuses_a_second_pass(device):
    x = mt.randn(4, device=device, requires_grad=True)
    y = (x.exp() * 2).sum()
    node = y.grad_fn.next_nodes[0].next_nodes[0]  # the Exp node
    assert len(node.saved_tensors) == 1
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time.*retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_pass(device):
    x = mt.randn(4, device=device, requires_grad=True)
    y = (x.exp() * 2).sum()
    y.backward(retain_graph=True)
    first = x.grad.cpu().numpy().copy()
    y.backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), 2 * first)


def test_non_scalar_backward_needs_a_gradient(device):
    x = mt.randn(2, 3, device=device, requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match=r"one element; got shape \(2, 3\).*gradient="):
        y.backward()
    y.backward(mt.ones(2, 3, device=device))
    assert x.grad.tolist() == [[2.0] * 3] * 2
    with pytest.raises(RuntimeError, match=r"gradient has shape \(3,\), expected.*\(2, 3\)"):
        (x * 2).backward(mt.ones(3, device=device))


def test_backward_on_a_tensor_outside_the_graph_raises(device):
    with pytest.raises(RuntimeError, match="does not require grad"):
        mt.ones(2, device=device).sum().backward()


def test_no_grad_records_nothing_and_nests(device):
    x = mt.randn(3, device=device, requires_grad=True)
    with mt.no_grad():
        y = x * 2
        with mt.enable_grad():
            z = x * 2
        w = x * 2
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad and z.grad_fn is not None
    assert not w.requires_grad
    assert mt.is_grad_enabled()


def test_no_grad_as_decorator(device):
    @mt.no_grad()
    def step(t):
        return t * 2

    x = mt.randn(3, device=device, requires_grad=True)
    assert not step(x).requires_grad
    assert mt.is_grad_enabled()


def test_no_grad_restores_mode_after_an_exception():
    with pytest.raises(ValueError):
        with mt.no_grad():
            raise ValueError("boom")
    assert mt.is_grad_enabled()


def test_set_grad_enabled_call_and_context():
    with mt.set_grad_enabled(False):
        assert not mt.is_grad_enabled()
    assert mt.is_grad_enabled()
    mt.set_grad_enabled(False)
    assert not mt.is_grad_enabled()
    mt.set_grad_enabled(True)


def test_leaf_and_requires_grad_bookkeeping(device):
    x = mt.randn(3, device=device, requires_grad=True)
    c = mt.randn(3, device=device)
    y = x * c
    assert x.is_leaf and not y.is_leaf and c.is_leaf
    assert y.requires_grad and not (c * 2).requires_grad
    assert repr(y.grad_fn) == "<MulBackward>"
    with pytest.raises(RuntimeError, match="only leaf tensors"):
        y.requires_grad_()
    with pytest.raises(RuntimeError, match="only floating-point"):
        mt.tensor([1, 2], device=device).requires_grad_()


def test_retain_grad_on_a_non_leaf(device):
    x = mt.randn(3, device=device, requires_grad=True)
    y = x * 3
    y.retain_grad()
    (y * y).sum().backward()
    np.testing.assert_allclose(y.grad.cpu().numpy(), 2 * y.detach().cpu().numpy())


def test_in_place_on_a_leaf_that_requires_grad_raises(device):
    w = mt.randn(3, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="add_: in-place update of a leaf tensor that requires grad"):
        w += 1
    with pytest.raises(RuntimeError, match="setitem"):
        w[0] = 1.0
    with mt.no_grad():  # an optimizer step
        w -= 0.1 * mt.ones(3, device=device)
    assert w.requires_grad and w.is_leaf


def test_in_place_edit_of_a_saved_array_is_caught(device):
    a = mt.randn(3, device=device)
    w = mt.randn(3, device=device, requires_grad=True)
    y = (a * w).sum()  # Mul saves a for w's gradient
    a.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def test_in_place_edit_of_an_unsaved_input_is_fine(device):
    a = mt.randn(3, device=device)
    w = mt.randn(3, device=device, requires_grad=True)
    y = (a + w).sum()  # Add saves nothing
    a.add_(1.0)
    y.backward()
    assert w.grad.tolist() == [1.0, 1.0, 1.0]


def test_gradient_dtype_follows_the_input(device):
    x = mt.randn(3, device=device, requires_grad=True)  # float32
    y = (x.double() * mt.randn(3, dtype="float64", device=device)).sum()
    y.backward()
    assert x.grad.dtype == mt.float32


def test_custom_function():
    class Cube(Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a ** 3

        @staticmethod
        def backward(ctx, grad):
            (a,) = ctx.saved_tensors
            return 3 * a * a * grad

    x = mt.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    assert mt.testing.gradcheck(lambda t: Cube.apply(t), [x])
    x.grad = None
    Cube.apply(x).sum().backward()
    assert x.grad.tolist() == [3.0, 12.0]


def test_a_wrong_gradient_shape_is_reported_with_the_node_name():
    class Broken(Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, grad):
            return grad.sum(axis=0)

    x = mt.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"BrokenBackward returned a gradient of shape \(3,\) "
                                           r"for an input of shape \(2, 3\)"):
        Broken.apply(x).sum().backward()


def test_gradcheck_catches_a_wrong_backward():
    class Wrong(Function):
        @staticmethod
        def forward(ctx, a):
            return a * a

        @staticmethod
        def backward(ctx, grad):
            return grad  # should be 2 * a * grad

    x = mt.randn(3, dtype="float64", requires_grad=True)
    with pytest.raises(AssertionError, match="backward and central differences disagree"):
        mt.testing.gradcheck(lambda t: Wrong.apply(t), [x])
    assert not mt.testing.gradcheck(lambda t: Wrong.apply(t), [x], raise_exception=False)
    with pytest.raises(TypeError, match="must be float64"):
        mt.testing.gradcheck(lambda t: t * 2, [mt.randn(3, requires_grad=True)])


def test_saved_arrays_are_released_during_backward(device):
    x = mt.randn(8, device=device, requires_grad=True)
    h = x.exp()
    y = (h * h).sum()
    nodes = [y.grad_fn, y.grad_fn.next_nodes[0], h.grad_fn]
    y.backward()
    for node in nodes:
        with pytest.raises(RuntimeError, match="second time"):
            node.saved_tensors


def test_zero_dim_results_are_arrays_not_numpy_scalars(device):
    x = mt.tensor(2.0, dtype="float64", device=device, requires_grad=True)
    y = x.exp()
    assert y.ndim == 0 and hasattr(y.data, "shape") and not isinstance(y.data, np.generic)
    y.backward()
    assert not isinstance(x.grad.data, np.generic)
    with mt.no_grad():
        x.grad.zero_()  # in place on a 0-d gradient really writes
    assert x.grad.item() == 0.0
    v = mt.tensor([1.0, 2.0], device=device)
    assert not isinstance((v @ v).data, np.generic)


def test_ties_share_the_gradient(device):
    x = mt.tensor([[3.0, 1.0, 3.0], [0.0, 2.0, 1.0]], device=device, requires_grad=True)
    x.amax(dim=1).sum().backward()
    assert x.grad.tolist() == [[0.5, 0.0, 0.5], [0.0, 1.0, 0.0]]
    a = mt.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    b = mt.tensor([1.0, 3.0, 2.0], device=device, requires_grad=True)
    mt.maximum(a, b).sum().backward()
    assert a.grad.tolist() == [0.5, 0.0, 1.0] and b.grad.tolist() == [0.5, 1.0, 0.0]
    x.grad = None
    values, indices = x.max(dim=1)  # max(dim) sends the gradient to the one index it returns
    values.sum().backward()
    assert indices.tolist() == [0, 1]
    assert x.grad.tolist() == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
