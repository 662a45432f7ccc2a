"""Bad input gets a clear error naming the op, what it expected and what it got."""
import pytest

import minitorch_gpu as mt

F = mt.functional


@pytest.mark.parametrize("call, error, message", [
    (lambda: mt.randn(4, 3) @ mt.randn(5, 2), ValueError,
     r"matmul: inner dimensions differ: \(4, 3\) @ \(5, 2\)"),
    (lambda: mt.randn(2, 3, 4) @ mt.randn(3, 4, 5), ValueError,
     r"matmul \(batch dims\): shapes cannot broadcast: \(2,\) and \(3,\)"),
    (lambda: mt.randn(3) @ mt.tensor(2.0), ValueError, "matmul: both operands need at least 1 dim"),
    (lambda: mt.randn(2, 3) + mt.randn(4), ValueError,
     r"add: shapes cannot broadcast: \(2, 3\) and \(4,\)"),
    (lambda: mt.randn(2, 3) * mt.randn(3, 2), ValueError, r"mul: shapes cannot broadcast"),
    (lambda: mt.where(mt.ones(3, dtype="bool"), mt.randn(2), 0.0), ValueError,
     r"where: shapes cannot broadcast: \(3,\) and \(2,\) and \(\)"),
    (lambda: mt.randn(4, 6).t().view(24), RuntimeError,
     r"view: .*not contiguous.*use \.reshape"),
    (lambda: mt.randn(2, 3).view(4, 2), ValueError, r"view: shape \(4, 2\) is invalid for a tensor of 6"),
    (lambda: F.embedding(mt.tensor([0.0, 1.0]), mt.randn(5, 3)), TypeError,
     "embedding: indices must be an integer tensor, got float32"),
    (lambda: F.embedding(mt.tensor([0, 5]), mt.randn(5, 3)), ValueError,
     r"embedding: index 5 is out of range for 5 embeddings \(expected 0 <= index < 5\)"),
    (lambda: F.embedding(mt.tensor([-1]), mt.randn(5, 3)), ValueError,
     "embedding: index -1 is out of range"),
    (lambda: F.cross_entropy(mt.randn(3, 4), mt.tensor([0, 4, 1])), ValueError,
     r"cross_entropy: target id 4 is out of range for 4 classes"),
    (lambda: F.cross_entropy(mt.randn(3, 4), mt.tensor([0.0, 1.0, 1.0])), TypeError,
     "cross_entropy: target must hold integer class ids"),
    (lambda: F.cross_entropy(mt.randn(3, 4), mt.tensor([0, 1])), ValueError,
     r"cross_entropy: target has shape \(2,\), expected \(3,\)"),
    (lambda: F.cross_entropy(mt.randn(3, 4), mt.tensor([0, 1, 2]), reduction="avg"), ValueError,
     "cross_entropy: reduction must be 'mean', 'sum' or 'none'"),
    (lambda: F.layer_norm(mt.randn(2, 5), 4), ValueError,
     r"layer_norm: normalized_shape \(4,\) does not match the trailing dims of the input's shape \(2, 5\)"),
    (lambda: F.layer_norm(mt.randn(2, 5), 5, weight=mt.ones(4)), ValueError,
     r"layer_norm: weight has shape \(4,\), expected \(5,\)"),
    (lambda: F.linear(mt.randn(2, 3), mt.randn(3, 4)), ValueError,
     r"linear: input has 3 features, weight \(3, 4\) expects 4 \(weight is \(out_features, in_features\)\)"),
    (lambda: F.linear(mt.randn(2, 4), mt.randn(3, 4), mt.randn(4)), ValueError,
     r"linear: bias has shape \(4,\), expected \(3,\)"),
    (lambda: F.linear(mt.tensor([1, 2]), mt.randn(3, 2)), TypeError,
     "linear: expected a floating-point input, got int64"),
    (lambda: F.dropout(mt.randn(3), p=1.5), ValueError, r"dropout: p must be in \[0, 1\], got 1.5"),
    (lambda: F.scaled_dot_product_attention(mt.randn(2, 4, 8), mt.randn(2, 4, 6), mt.randn(2, 4, 6)),
     ValueError, "scaled_dot_product_attention: query and key feature dims differ"),
    (lambda: F.scaled_dot_product_attention(mt.randn(4, 8), mt.randn(4, 8), mt.randn(4, 8),
                                            attn_mask=mt.ones(4, 4, dtype="bool"), is_causal=True),
     ValueError, "give attn_mask or is_causal, not both"),
    (lambda: mt.randn(3).backward(), RuntimeError, "does not require grad"),
    (lambda: (mt.randn(3, requires_grad=True) * 2).backward(), RuntimeError,
     r"grad can be implicitly created only for a tensor with one element; got shape \(3,\)"),
    (lambda: mt.zeros(2, device="tpu"), ValueError,
     "unknown device 'tpu': expected 'cpu', 'cuda' or 'cuda:N'"),
    (lambda: mt.zeros(2, device="cuda:x"), ValueError, "unknown device 'cuda:x'"),
    (lambda: mt.randn(2, 3).transpose(0, 2), IndexError,
     r"transpose: dim 2 is out of range for a tensor of 2 dims"),
    (lambda: mt.randn(2, 3).permute(0, 0), ValueError, "permute: dims .* are not a permutation"),
    (lambda: mt.randn(2, 3).expand(4, 3), ValueError, r"expand: cannot expand shape \(2, 3\) to \(4, 3\)"),
    (lambda: mt.cat([mt.randn(2, 3), mt.randn(2, 4)], dim=0), ValueError,
     r"cat: tensor 1 has shape \(2, 4\), expected \(2, 3\) in every dim but 0"),
    (lambda: mt.stack([mt.randn(2), mt.randn(3)]), ValueError, r"stack: tensor 1 has shape \(3,\)"),
    (lambda: mt.randn(3)[1.5], IndexError, "float index"),
    (lambda: mt.randn(3).sum(dim=(0, 0)), ValueError, "sum: dim .* names a dim twice"),
    (lambda: mt.tril(mt.randn(3)), ValueError, r"tril: expected a tensor of at least 2 dims, got shape \(3,\)"),
    (lambda: mt.randn(2, 2).item(), ValueError, r"item: only a one-element tensor.*\(2, 2\)"),
    (lambda: mt.randn(3, requires_grad=True).numpy(), RuntimeError, r"use tensor.detach\(\).numpy\(\)"),
    (lambda: mt.add(1, 2), TypeError, "add: expected at least one Tensor"),
    (lambda: mt.randn(3) + "a", TypeError, "add: expected a Tensor or a number, got str"),
    (lambda: mt.tensor([1.0]).to("float77"), ValueError, "unknown device 'float77'"),
    (lambda: mt.zeros(-1), ValueError, "zeros: sizes must be non-negative ints"),
    (lambda: mt.randint(5, 5, (2,)), ValueError, "randint: expected low < high"),
    (lambda: mt.manual_seed(1.5), TypeError, "manual_seed: expected an int seed"),
    (lambda: mt.gelu(mt.randn(2), approximate="fast"), ValueError,
     "gelu: approximate must be 'none' or 'tanh'"),
    (lambda: mt.masked_fill(mt.randn(2, 3), mt.ones(2, 3), 0.0), TypeError,
     "masked_fill: mask must be a bool tensor"),
], ids=lambda v: None)
def test_bad_input_raises_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_backward_through_a_freed_graph_names_retain_graph():
    y = (mt.randn(3, requires_grad=True).exp()).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time.*retain_graph=True"):
        y.backward()


@pytest.mark.skipif(mt.cuda.is_available(), reason="this machine has a GPU")
def test_unavailable_cuda_says_what_to_install():
    assert mt.cuda.is_available() is False
    assert mt.cuda.device_count() == 0
    with pytest.raises(RuntimeError, match=r"device 'cuda:0' is not available: .*(pip install|no CUDA GPU)"):
        mt.zeros(2, device="cuda")
    with pytest.raises(RuntimeError, match="device 'cuda:1' is not available"):
        mt.randn(2).to("cuda:1")


@pytest.mark.cuda
def test_ops_across_devices_are_refused():
    if not mt.cuda.is_available():
        pytest.skip(f"no CUDA here: {mt.cuda.unavailable_reason()}")
    with pytest.raises(RuntimeError, match="expected all tensors on one device, got cpu and cuda:0"):
        mt.randn(2) + mt.randn(2, device="cuda")
