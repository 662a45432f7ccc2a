"""nn: Parameter, Module registration and traversal, hooks, state dicts, devices and dtypes,
containers, and the layers against NumPy references."""
from __future__ import annotations

import copy
import math
import pickle
from collections import OrderedDict

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn as nn


class TwoLayer(nn.Module):
    def __init__(self, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(4, 8, bias=bias)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(8, 3, bias=bias)
        self.register_buffer("scale", mt.full((3,), 2.0))
        self.register_buffer("scratch", mt.zeros(3), persistent=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) * self.scale


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight


def host(t):
    return t.detach().cpu().numpy()


# --- Parameter ----------------------------------------------------------------------------
def test_parameter_is_a_leaf_that_shares_memory_and_survives_copies():
    data = mt.randn(3, 2)
    p = nn.Parameter(data)
    assert isinstance(p, mt.Tensor) and p.requires_grad and p.is_leaf
    assert p.data_ptr() == data.data_ptr()
    assert repr(p).startswith("Parameter containing:\ntensor(")
    for clone in (copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert type(clone) is nn.Parameter and clone.requires_grad
        assert clone.data_ptr() != p.data_ptr()
        np.testing.assert_array_equal(host(clone), host(p))
    assert type(p * 2) is mt.Tensor  # results of ops are plain tensors
    assert not nn.Parameter(mt.randn(2), requires_grad=False).requires_grad
    with pytest.raises(TypeError, match="Parameter: expected a Tensor, got list"):
        nn.Parameter([1.0, 2.0])
    with pytest.raises(RuntimeError, match="only floating-point tensors can require grad"):
        nn.Parameter(mt.tensor([1, 2]))


# --- registration and traversal -----------------------------------------------------------
def test_named_parameters_modules_and_buffers_follow_attribute_paths():
    model = TwoLayer()
    assert [n for n, _ in model.named_parameters()] == [
        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert [n for n, _ in model.named_modules()] == ["", "fc1", "act", "fc2"]
    assert [n for n, _ in model.named_children()] == ["fc1", "act", "fc2"]
    assert [n for n, _ in model.named_buffers()] == ["scale", "scratch"]
    # a module's own tensors before its children's, as PyTorch orders them; the
    # non-persistent buffer stays out
    assert list(model.state_dict()) == ["scale", "fc1.weight", "fc1.bias", "fc2.weight",
                                        "fc2.bias"]
    assert model.num_parameters() == 4 * 8 + 8 + 8 * 3 + 3
    assert [n for n, _ in TwoLayer(bias=False).named_parameters()] == ["fc1.weight", "fc2.weight"]
    assert model.fc1.weight.shape == (8, 4)  # (out, in) as PyTorch


def test_tied_weights_are_one_parameter_listed_once_but_saved_under_both_names():
    model = Tied()
    assert model.head.weight is model.embed.weight
    assert [n for n, _ in model.named_parameters()] == ["embed.weight"]
    assert [n for n, _ in model.named_parameters(remove_duplicate=False)] == [
        "embed.weight", "head.weight"]
    assert list(model.state_dict()) == ["embed.weight", "head.weight"]
    assert model.num_parameters() == 20


def test_containers_name_and_index_their_children():
    seq = nn.Sequential(nn.Linear(2, 3), nn.GELU(), nn.Linear(3, 1))
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert len(seq) == 3 and isinstance(seq[-1], nn.Linear) and len(seq[:2]) == 2
    x = mt.randn(5, 2)
    np.testing.assert_allclose(host(seq(x)), host(seq[2](seq[1](seq[0](x)))))
    blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    blocks.append(nn.LayerNorm(2))
    assert len(blocks) == 4 and isinstance(blocks[3], nn.LayerNorm)
    assert [n for n, _ in blocks.named_parameters()][-2:] == ["3.weight", "3.bias"]
    with pytest.raises(IndexError, match="ModuleList: index 4 is out of range for 4 modules"):
        blocks[4]
    parts = nn.ModuleDict({"wte": nn.Embedding(3, 2), "ln_f": nn.LayerNorm(2)})
    assert "wte" in parts and list(parts.keys()) == ["wte", "ln_f"]
    assert [n for n, _ in parts.named_parameters()] == ["wte.weight", "ln_f.weight", "ln_f.bias"]


def test_container_editing_and_slicing_follow_pytorch():
    seq = nn.Sequential(nn.Linear(2, 3), nn.GELU(), nn.Linear(3, 1))
    assert list(seq[1:].state_dict()) == ["2.weight", "2.bias"]  # a slice keeps names
    named = nn.Sequential(OrderedDict(fc=nn.Linear(2, 2), act=nn.GELU()))
    assert [n for n, _ in named[1:].named_children()] == ["act"]
    blocks = nn.ModuleList([nn.Linear(1, 1), nn.Linear(3, 3)])
    assert [n for n, _ in blocks[1:].named_children()] == ["0"]  # a list renumbers
    blocks.insert(1, nn.Linear(2, 2))
    assert [m.in_features for m in blocks] == [1, 2, 3]
    assert [n for n, _ in blocks.named_parameters()][-2:] == ["2.weight", "2.bias"]
    parts = nn.ModuleDict({"a": nn.GELU()})
    parts.update({"b": nn.Linear(1, 1)})
    assert isinstance(parts.pop("a"), nn.GELU) and list(parts) == ["b"]
    model = TwoLayer()
    assert model.get_submodule("fc2") is model.fc2 and model.get_submodule("") is model
    with pytest.raises(AttributeError, match="TwoLayer has no child module 'fc3'"):
        model.get_submodule("fc3")


def test_state_dict_prefix_is_prepended_as_given():
    assert list(nn.Linear(2, 2).state_dict(prefix="enc.")) == ["enc.weight", "enc.bias"]
    assert list(TwoLayer().state_dict(prefix="m."))[:2] == ["m.scale", "m.fc1.weight"]


def test_repr_is_readable_and_collapses_identical_blocks():
    assert repr(nn.Linear(4, 3, bias=False)) == "Linear(in_features=4, out_features=3, bias=False)"
    assert repr(nn.Embedding(65, 128)) == "Embedding(65, 128)"
    assert repr(nn.Dropout(0.1)) == "Dropout(p=0.1)"
    assert repr(nn.GELU("tanh")) == "GELU(approximate='tanh')"
    text = repr(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.GELU()]))
    assert text == ("ModuleList(\n  (0-1): 2 x Linear(in_features=2, out_features=2, bias=True)"
                    "\n  (2): GELU(approximate='none')\n)")
    assert "(fc1): Linear(in_features=4, out_features=8, bias=True)" in repr(TwoLayer())


@pytest.mark.parametrize("action, error, message", [
    (lambda m: setattr(m.fc1, "weight", mt.randn(8, 4)), TypeError,
     r"cannot assign Tensor as parameter 'weight' \(nn.Parameter or None expected\)"),
    (lambda m: setattr(m, "fc1", 3), TypeError, "cannot assign int as child module 'fc1'"),
    (lambda m: setattr(m, "scale", 2.0), TypeError, "cannot assign float as buffer 'scale'"),
    (lambda m: m.register_parameter("w", mt.randn(2)), TypeError,
     "register_parameter: 'w' must be a Parameter or None, got Tensor"),
    (lambda m: m.train(0), ValueError, "train: mode must be a bool"),
    (lambda m: m.add_module("forward", nn.GELU()), KeyError,
     "module 'forward': TwoLayer already has an attribute of that name"),
    (lambda m: m.register_buffer("fc1", mt.zeros(1)), KeyError,
     "buffer 'fc1': the name is already a module of TwoLayer"),
    (lambda m: m.fc1.register_buffer("weight", mt.zeros(1)), KeyError,
     "buffer 'weight': the name is already a parameter of Linear"),
    (lambda m: m.add_module("a.b", nn.GELU()), KeyError, "can't be empty or contain '.'"),
    (lambda m: m.register_parameter("", None), KeyError, "can't be empty or contain '.'"),
    (lambda m: m.to(mt.int64), TypeError, "Module.to: only floating-point dtypes"),
    (lambda m: nn.Module()(1), NotImplementedError, "Module has no forward"),
])
def test_bad_registrations_raise_clear_errors(action, error, message):
    with pytest.raises(error, match=message):
        action(TwoLayer())


def test_assigning_before_super_init_says_what_to_do():
    class Broken(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)

    with pytest.raises(AttributeError, match=r"call super\(\).__init__\(\) first in Broken"):
        Broken()

    class PlainFirst(nn.Module):  # plain values before super().__init__() are fine
        def __init__(self):
            self.width = 3
            super().__init__()
            self.fc = nn.Linear(self.width, 1)

    assert [n for n, _ in PlainFirst().named_parameters()] == ["fc.weight", "fc.bias"]


# --- modes, gradients, hooks --------------------------------------------------------------
def test_train_and_eval_reach_every_module_and_switch_dropout():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    assert all(m.training for m in model.modules())
    x = mt.randn(64, 4)
    assert model.eval() is model and not any(m.training for m in model.modules())
    np.testing.assert_array_equal(host(model(x)), host(model[0](x)))  # dropout is identity
    model.train()
    assert (host(model(x)) == 0).mean() > 0.3  # about half the elements dropped


def test_zero_grad_forgets_or_zeroes_gradients():
    model = TwoLayer()
    model(mt.randn(2, 4)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad(set_to_none=False)
    assert all(float(abs(p.grad).sum()) == 0.0 for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_forward_hooks_see_every_call_in_order_and_can_be_removed():
    model = TwoLayer()
    calls = []
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(
            lambda m, args, name=name: calls.append(("pre", name, tuple(args[0].shape)))))
        handles.append(module.register_forward_hook(
            lambda m, args, out, name=name: calls.append(("post", name, tuple(out.shape)))))
    model(mt.randn(2, 4))
    assert calls == [("pre", "", (2, 4)), ("pre", "fc1", (2, 4)), ("post", "fc1", (2, 8)),
                     ("pre", "act", (2, 8)), ("post", "act", (2, 8)), ("pre", "fc2", (2, 8)),
                     ("post", "fc2", (2, 3)), ("post", "", (2, 3))]
    for handle in handles:
        handle.remove()
    calls.clear()
    model(mt.randn(2, 4))
    assert calls == []


def test_hooks_may_replace_arguments_and_outputs():
    layer = nn.Linear(3, 3)
    x = mt.randn(2, 3)
    with layer.register_forward_pre_hook(lambda m, args: (args[0] * 0,)):
        np.testing.assert_allclose(host(layer(x)), np.broadcast_to(host(layer.bias), (2, 3)))
    with layer.register_forward_hook(lambda m, args, out: out + 1):
        np.testing.assert_allclose(host(layer(x)), host(F_linear(x, layer)) + 1, rtol=1e-6)
    np.testing.assert_allclose(host(layer(x)), host(F_linear(x, layer)), rtol=1e-6)


def F_linear(x, layer):
    return x @ layer.weight.mT + layer.bias


# --- state dicts --------------------------------------------------------------------------
def test_state_dict_round_trip_gives_identical_outputs():
    mt.manual_seed(1)
    source = TwoLayer()
    mt.manual_seed(2)
    target = TwoLayer()
    x = mt.randn(5, 4)
    assert not np.allclose(host(source(x)), host(target(x)))
    assert target.load_state_dict(source.state_dict()) == nn.IncompatibleKeys([], [])
    np.testing.assert_array_equal(host(target(x)), host(source(x)))
    # the values were copied: changing the source later leaves the target alone
    with mt.no_grad():
        source.fc1.weight.fill_(0.0)
    assert float(abs(target.fc1.weight).sum()) > 0


def test_load_state_dict_accepts_numpy_arrays_and_casts_dtypes():
    source = TwoLayer()
    arrays = {k: host(v).astype(np.float64) for k, v in source.state_dict().items()}
    target = TwoLayer()
    target.load_state_dict(arrays)
    assert target.fc1.weight.dtype == mt.float32
    np.testing.assert_array_equal(host(target.fc1.weight), host(source.fc1.weight))


def test_load_state_dict_names_missing_unexpected_and_mismatched_keys_and_changes_nothing():
    model = TwoLayer()
    before = {k: host(v).copy() for k, v in model.state_dict().items()}
    bad = {k: v for k, v in TwoLayer().state_dict().items() if k != "fc1.bias"}
    bad["fc2.weight"] = mt.randn(3, 9)
    bad["fc3.weight"] = mt.randn(2, 2)
    with pytest.raises(RuntimeError) as info:
        model.load_state_dict(bad)
    message = str(info.value)
    assert message.startswith("Error(s) in loading state_dict for TwoLayer:")
    assert "Missing key(s) in state_dict: fc1.bias" in message
    assert "Unexpected key(s) in state_dict: fc3.weight" in message
    assert ("size mismatch for fc2.weight: copying a param with shape (3, 9) from checkpoint, "
            "the shape in current model is (3, 8)") in message
    for key, value in model.state_dict().items():  # nothing was half-loaded
        np.testing.assert_array_equal(host(value), before[key])


def test_load_state_dict_non_strict_reports_keys_but_still_refuses_shape_mismatches():
    model = TwoLayer()
    partial = {"fc1.weight": mt.zeros(8, 4), "extra": mt.zeros(1)}
    result = model.load_state_dict(partial, strict=False)
    assert result.unexpected_keys == ["extra"]
    assert "fc1.bias" in result.missing_keys
    assert float(abs(model.fc1.weight).sum()) == 0.0
    with pytest.raises(RuntimeError, match="size mismatch for fc1.weight"):
        model.load_state_dict({"fc1.weight": mt.zeros(4, 8)}, strict=False)
    with pytest.raises(TypeError, match="expected a dict of name -> tensor"):
        model.load_state_dict([1, 2])


# --- devices and dtypes -------------------------------------------------------------------
def test_to_dtype_converts_in_place_keeping_parameters_ties_and_grads():
    model = Tied()
    weight = model.embed.weight
    model.head(mt.randn(2, 4)).sum().backward()
    assert model.double() is model
    assert model.embed.weight is weight and model.head.weight is weight  # same object, still tied
    assert weight.dtype == mt.float64 and weight.grad.dtype == mt.float64
    assert weight.requires_grad
    model.to("cpu", mt.float32)
    assert weight.dtype == mt.float32


def test_gradients_after_a_dtype_change_have_the_new_dtype():
    layer = nn.Linear(3, 2)
    layer(mt.randn(4, 3)).sum().backward()  # the weight's graph node now exists
    layer.zero_grad()
    layer.double()
    layer(mt.randn(4, 3, dtype=mt.float64)).sum().backward()
    assert layer.weight.grad.dtype == mt.float64 and layer.bias.grad.dtype == mt.float64


def test_module_to_device_moves_parameters_and_buffers(device):
    model = TwoLayer().to(device)
    assert all(p.device == device for p in model.parameters())
    assert all(b.device == device for b in model.buffers())
    x = mt.randn(3, 4)
    expected = TwoLayer()
    expected.load_state_dict(model.state_dict())
    np.testing.assert_allclose(host(model(x.to(device))), host(expected(x)), rtol=1e-5,
                               atol=1e-6)


# --- layers against NumPy -----------------------------------------------------------------
def test_linear_matches_numpy_and_initialises_like_pytorch():
    layer = nn.Linear(16, 300)
    bound = 1 / math.sqrt(16)
    w, b = host(layer.weight), host(layer.bias)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert np.abs(b).max() <= bound
    x = mt.randn(2, 5, 16)
    np.testing.assert_allclose(host(layer(x)), host(x) @ w.T + b, rtol=1e-5, atol=1e-6)


def test_embedding_layer_norm_dropout_gelu_forward():
    emb = nn.Embedding(10, 3)
    ids = mt.tensor([[1, 9], [1, 0]])
    np.testing.assert_array_equal(host(emb(ids)), host(emb.weight)[host(ids)])
    ln = nn.LayerNorm(6, bias=False)
    assert [n for n, _ in ln.named_parameters()] == ["weight"] and ln.bias is None
    x = mt.randn(4, 6, dtype=mt.float64)
    ln.double()
    xn = host(x)
    expected = (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(host(ln(x)), expected, rtol=1e-12)
    assert nn.LayerNorm(6, elementwise_affine=False).num_parameters() == 0
    gelu = nn.GELU("tanh")
    np.testing.assert_allclose(
        host(gelu(x)), 0.5 * xn * (1 + np.tanh(math.sqrt(2 / math.pi) * (xn + 0.044715 * xn**3))),
        rtol=1e-12)


@pytest.mark.parametrize("make, message", [
    (lambda: nn.Linear(0, 3), "Linear: in_features must be a positive int, got 0"),
    (lambda: nn.Embedding(5, 2.5), "Embedding: embedding_dim must be a positive int, got 2.5"),
    (lambda: nn.LayerNorm(4, eps=0), "LayerNorm: eps must be > 0"),
    (lambda: nn.Dropout(1.5), r"Dropout: p must be in \[0, 1\], got 1.5"),
    (lambda: nn.GELU("fast"), "GELU: approximate must be 'none' or 'tanh', got 'fast'"),
])
def test_bad_layer_arguments_raise(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_deepcopy_and_pickle_of_a_module_copy_the_weights_and_keep_ties():
    model = Tied()
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone.head.weight is clone.embed.weight  # still one tensor
        assert clone.head.weight is not model.head.weight
        assert type(clone.head.weight) is nn.Parameter
        np.testing.assert_array_equal(host(clone.embed.weight), host(model.embed.weight))


def test_small_activation_modules_and_the_clipping_alias():
    x = mt.randn(3, 4)
    seq = nn.Sequential(nn.Identity(), nn.ReLU(), nn.Tanh())
    np.testing.assert_allclose(host(seq(x)), np.tanh(np.maximum(host(x), 0)), rtol=1e-6)
    layer = nn.Linear(4, 2)
    layer(x).sum().backward()
    assert nn.utils.clip_grad_norm_(layer.parameters(), 1e-3).item() > 1e-3
    total = math.sqrt(sum(float((host(p.grad) ** 2).sum()) for p in layer.parameters()))
    assert total == pytest.approx(1e-3, rel=1e-3)
