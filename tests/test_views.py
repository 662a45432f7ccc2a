"""Views and strides behave as PyTorch's: no copies, element strides, view vs reshape."""
import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.ops.views import contiguous_strides, view_strides


def shares(a, b):
    return np.shares_memory(a.data, b.data) if a.device == "cpu" else \
        a.data.data.mem.ptr == b.data.data.mem.ptr


def test_strides_are_in_elements(device):
    x = mt.zeros(2, 3, 4, device=device)
    assert x.stride() == (12, 4, 1)
    assert x.stride(-1) == 1
    assert x.is_contiguous()


@pytest.mark.parametrize("op, shape, strides", [
    (lambda x: x.transpose(0, 2), (4, 3, 2), (1, 4, 12)),
    (lambda x: x.permute(1, 2, 0), (3, 4, 2), (4, 1, 12)),
    (lambda x: x.T, (4, 3, 2), (1, 4, 12)),
    (lambda x: x.mT, (2, 4, 3), (12, 1, 4)),
    (lambda x: x[:, 1], (2, 4), (12, 1)),
    (lambda x: x[:, :, ::2], (2, 3, 2), (12, 4, 2)),
    (lambda x: x.narrow(1, 1, 2), (2, 2, 4), (12, 4, 1)),
    (lambda x: x.unsqueeze(1), (2, 1, 3, 4), (12, 12, 4, 1)),
    (lambda x: x[:, :1].squeeze(1), (2, 4), (12, 1)),
    (lambda x: x[:, :1].expand(2, 5, 4), (2, 5, 4), (12, 0, 1)),
    (lambda x: x.view(6, 4), (6, 4), (4, 1)),
    (lambda x: x.transpose(0, 1).reshape(3, 8), (3, 8), (4, 1)),  # dims 0,1 swap; 2 stays
], ids=["transpose", "permute", "T", "mT", "int-index", "step-slice", "narrow", "unsqueeze",
        "squeeze", "expand", "view", "reshape-of-view"])
def test_views_share_memory_and_report_strides(device, op, shape, strides):
    x = mt.arange(24, dtype="float32", device=device).view(2, 3, 4)
    y = op(x)
    assert y.shape == shape
    if shape != (3, 8):
        assert y.stride() == strides
        assert shares(x, y)
    else:  # swapping dims 0 and 1 then merging them needs a copy
        assert not shares(x, y)


def test_writes_through_a_view_are_seen_by_the_base(device):
    x = mt.zeros(3, 4, device=device)
    t = x.t()
    t[1, 2] = 5.0
    assert x[2, 1].item() == 5.0
    x.narrow(0, 0, 1).fill_(7.0)
    assert x.tolist()[0] == [7.0] * 4


def test_transpose_is_O1_and_not_contiguous(device):
    x = mt.randn(64, 32, device=device)
    t = x.transpose(0, 1)
    assert t.data_ptr() == x.data_ptr()
    assert not t.is_contiguous()
    c = t.contiguous()
    assert c.is_contiguous() and c.data_ptr() != x.data_ptr()
    assert x.contiguous() is x  # contiguous() of a contiguous tensor is itself
    np.testing.assert_array_equal(c.cpu().numpy(), x.cpu().numpy().T)


def test_view_on_non_contiguous_raises_and_names_the_fix(device):
    t = mt.randn(4, 6, device=device).transpose(0, 1)
    with pytest.raises(RuntimeError, match=r"view: .*strides \(1, 6\).*\.reshape\(.*\.contiguous\(\)"):
        t.view(24)
    y = t.reshape(24)  # reshape copies here
    assert y.shape == (24,) and y.is_contiguous()
    np.testing.assert_array_equal(y.cpu().numpy(), t.cpu().numpy().reshape(24))


def test_view_splits_and_merges_within_contiguous_chunks(device):
    x = mt.arange(24, device=device).view(2, 3, 4).transpose(0, 1)  # (3, 2, 4), strides (4, 12, 1)
    y = x.view(3, 2, 2, 2)  # splitting the last dim is fine
    assert y.stride() == (4, 12, 2, 1) and shares(x, y)
    with pytest.raises(RuntimeError):
        x.view(6, 4)  # merging dims 0 and 1 is not


def test_view_infers_minus_one_and_checks_numel(device):
    x = mt.zeros(2, 3, 4, device=device)
    assert x.view(-1, 4).shape == (6, 4)
    assert x.view((4, -1)).shape == (4, 6)
    with pytest.raises(ValueError, match=r"view: shape \(5, 5\) is invalid for a tensor of 24"):
        x.view(5, 5)
    with pytest.raises(ValueError, match="at most one -1"):
        x.view(-1, -1)


def test_reshape_copies_only_when_it_must(device):
    x = mt.randn(4, 6, device=device)
    assert shares(x, x.reshape(2, 12))
    assert shares(x, x.reshape(24))
    assert not shares(x, x.t().reshape(24))


@pytest.mark.parametrize("shape, strides, new_shape, expected", [
    ((2, 3, 4), (12, 4, 1), (24,), (1,)),
    ((2, 3, 4), (12, 4, 1), (6, 4), (4, 1)),
    ((4, 6), (1, 4), (24,), None),
    ((4, 6), (1, 4), (2, 2, 6), (2, 1, 4)),
    ((3, 1, 4), (4, 99, 1), (12,), (1,)),  # a size-1 dim's stride does not matter
    ((2, 3), (0, 1), (6,), None),  # an expanded dim can't merge
    ((2, 3), (0, 1), (2, 3, 1), (0, 1, 1)),
    ((), (), (1, 1), (1, 1)),
], ids=["flatten", "merge-lead", "transposed-flatten", "transposed-split", "size1", "expanded",
        "expanded-unsqueeze", "scalar"])
def test_view_strides_rule(shape, strides, new_shape, expected):
    assert view_strides(shape, strides, new_shape) == expected


def test_flatten_split_chunk_cat_stack(device):
    x = mt.arange(24, dtype="float32", device=device).view(2, 3, 4)
    assert x.flatten().shape == (24,)
    assert x.flatten(1).shape == (2, 12)
    assert shares(x, x.flatten(1))
    parts = x.split(3, dim=2)
    assert [p.shape for p in parts] == [(2, 3, 3), (2, 3, 1)]
    assert all(shares(x, p) for p in parts)
    assert [p.shape[1] for p in x.split([1, 2], dim=1)] == [1, 2]
    chunks = x.chunk(3, dim=2)  # torch.chunk: size ceil(4/3) = 2, so two chunks
    assert [c.shape[2] for c in chunks] == [2, 2]
    np.testing.assert_array_equal(mt.cat(list(parts), dim=2).cpu().numpy(), x.cpu().numpy())
    s = mt.stack([x, x], dim=1)
    assert s.shape == (2, 2, 3, 4)
    np.testing.assert_array_equal(s[:, 1].cpu().numpy(), x.cpu().numpy())


def test_integer_array_indexing_copies(device):
    x = mt.arange(12, dtype="float32", device=device).view(4, 3)
    y = x[mt.tensor([0, 2, 2], device=device)]
    assert y.shape == (3, 3) and not shares(x, y)
    assert y[:, 0].tolist() == [0.0, 6.0, 6.0]


def test_in_place_on_a_view_bumps_the_shared_version(device):
    x = mt.zeros(3, 3, device=device)
    v = x[0]
    before = x._version[0]
    v.add_(1.0)
    assert x._version[0] == before + 1
    assert x.sum().item() == 3.0


def test_detach_shares_memory_but_not_the_graph(device):
    x = mt.randn(3, requires_grad=True, device=device)
    y = (x * 2).detach()
    assert not y.requires_grad and y.grad_fn is None
    d = x.detach()
    assert shares(x, d)


@pytest.mark.parametrize("op", [
    lambda x: x.sum(0), lambda x: x.mean(-1, keepdim=True), lambda x: x.var(0),
    lambda x: x.amax(1), lambda x: mt.cat([x, x], 0), lambda x: mt.stack([x, x], 1),
    lambda x: x[:, mt.tensor([0, 2], device=x.device)], lambda x: x[x > 3],
    lambda x: x.masked_fill(x > 3, 0.0),
], ids=["sum", "mean", "var", "amax", "cat", "stack", "int-index", "bool-index", "masked_fill"])
def test_copying_ops_on_permuted_inputs_return_row_major_results(device, op):
    # PyTorch lays these results out row-major whatever the input's layout, so .view of
    # them works; NumPy would keep the permuted layout
    base = np.arange(24.0).reshape(2, 3, 4)
    x = mt.tensor(base, device=device).permute(2, 1, 0)  # (4, 3, 2), strides (1, 4, 12)
    y = op(x)
    assert y.is_contiguous() and y.stride() == contiguous_strides(y.shape)
    assert y.view(-1).shape == (y.numel(),)
    np.testing.assert_array_equal(y.cpu().numpy(), op(mt.tensor(base.transpose(2, 1, 0).copy(),
                                                                device=device)).cpu().numpy())


def test_a_0d_integer_tensor_indexes_like_an_int(device):
    x = mt.arange(12, dtype="float32", device=device).view(4, 3)
    i = mt.tensor(2, device=device)
    y = x[i]
    assert y.shape == (3,) and shares(x, y)  # a view, as x[2]
    assert x[i, mt.tensor(1, device=device)].item() == 7.0
    x[i] = 0.0
    assert x.sum().item() == sum(range(12)) - (6 + 7 + 8)
    assert x[mt.tensor([2], device=device)].shape == (1, 3)  # a 1-d index still gathers
