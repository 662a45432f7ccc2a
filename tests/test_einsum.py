"""einsum: the subscript forms of attention and MoE code against NumPy's einsum, forward
and backward (the backward by central differences in the op table; here by NumPy's own
contractions of the gradient), one matmul per operand pair, and its errors."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.backend.numpy_backend import NumpyBackend

FORMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),  # implicit
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),  # attention scores
    ("bhqk,bhkd->bhqd", [(2, 3, 4, 6), (2, 3, 6, 5)]),  # attention output
    ("bsd,ed->bse", [(2, 3, 4), (5, 4)]),  # a projection
    ("bse,bsk->bke", [(2, 3, 4), (2, 3, 5)]),  # MoE: gather tokens per expert
    ("ekd,edf->ekf", [(3, 4, 5), (3, 5, 2)]),  # MoE: per-expert matmul
    ("...d,ed->...e", [(2, 3, 4), (5, 4)]),
    ("b...i,bij->b...j", [(2, 3, 7, 4), (2, 4, 5)]),
    ("bte,eo,bt->bo", [(2, 3, 4), (4, 5), (2, 3)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,ij->i", [(3, 4), (3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij,kl->", [(2, 3), (4, 5)]),
    ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)]),  # a size-1 dim broadcast
    ("ii->i", [(3, 3)]),  # a diagonal
    ("ii", [(3, 3)]),  # a trace
    ("bii,bi->b", [(2, 4, 4), (2, 4)]),
]


@pytest.mark.parametrize("equation, shapes", FORMS, ids=[f[0] for f in FORMS])
def test_einsum_against_numpy(equation, shapes):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]
    tensors = [mt.tensor(a, requires_grad=True) for a in arrays]
    out = mt.einsum(equation, *tensors)
    expected = np.einsum(equation, *[np.broadcast_to(a, a.shape) for a in arrays])
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-10, atol=1e-12)
    grad = rng.standard_normal(expected.shape)
    (out * mt.tensor(grad)).sum().backward()
    lhs = equation.split("->")[0].split(",")
    out_sub = equation.split("->")[1] if "->" in equation else None
    if "..." in equation or out_sub is None or "bij,bjk" in equation:
        return  # the op table and the PyTorch battery check these gradients
    for i, t in enumerate(tensors):  # d/dA_i = einsum(grad, the others -> A_i)
        others = [arrays[j] for j in range(len(arrays)) if j != i]
        subs = [out_sub] + [lhs[j] for j in range(len(arrays)) if j != i]
        if not set(lhs[i]) <= set("".join(subs)) or len(set(lhs[i])) != len(lhs[i]):
            continue  # a summed-away or repeated index: the op table checks these gradients
        np.testing.assert_allclose(t.grad.numpy(), np.einsum(
            ",".join(subs) + "->" + lhs[i], grad, *others), rtol=1e-10, atol=1e-12)


def test_einsum_is_one_matmul_per_pair(monkeypatch):
    calls = []
    original = NumpyBackend.matmul

    def counting(self, *args, **kwargs):
        calls.append(args[0].shape)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(NumpyBackend, "matmul", counting)
    q, k = mt.randn(2, 3, 4, 5, requires_grad=True), mt.randn(2, 3, 6, 5, requires_grad=True)
    mt.einsum("bhqd,bhkd->bhqk", q, k).sum().backward()
    assert len(calls) == 3  # forward, then one for each gradient


def test_einsum_keeps_bf16():
    a = mt.randn(2, 3).to(mt.bfloat16)
    b = mt.randn(3, 4).to(mt.bfloat16)
    out = mt.einsum("ij,jk->ik", a, b)
    assert out.dtype == mt.bfloat16
    np.testing.assert_allclose(out.float().numpy(), (a.float() @ b.float()).numpy(), rtol=1e-2,
                               atol=1e-2)


def test_einsum_takes_a_list_and_promotes():
    a, b = mt.randn(2, 3), mt.ones(3, 4, dtype=mt.float64)
    out = mt.einsum("ij,jk->ik", [a, b])
    assert out.dtype == mt.float64 and tuple(out.shape) == (2, 4)


@pytest.mark.parametrize("equation, shapes, message", [
    ("ij->i", [(3, 3, 3)], "name 2 dims"),
    ("iij->j", [(3, 2, 4)], "size"),
    ("ij,jk->ik", [(3, 4), (5, 6)], "size"),
    ("ij->ik", [(3, 4)], "output subscripts"),
    ("ijk->i", [(3, 4)], "name 3 dims"),
    ("ij,jk->ik", [(3, 4)], "operands"),
])
def test_einsum_errors(equation, shapes, message):
    with pytest.raises(ValueError, match=message):
        mt.einsum(equation, *[mt.randn(*s) for s in shapes])
