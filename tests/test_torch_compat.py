"""The compatibility battery: every public op, the same lambda applied to our tensors and
to PyTorch's, forward values, dtypes and gradients compared (development only: skipped
where torch is not installed; the op table carries the CPU checks in CI).

A case is ``case(name, fn, *inputs)``: ``fn(m, F, *tensors)`` is called once with
``m = minitorch_gpu, F = minitorch_gpu.functional`` and once with ``torch,
torch.nn.functional``; float inputs require grad. Every public name (``minitorch_gpu.ops``,
``functional`` and the Tensor methods) must be covered by a case, by ``UNARY`` (applied as
``m.name(x)`` and ``x.name()`` on both sides) or listed in ``EXEMPT`` with the reason:
``test_every_public_op_is_in_the_battery`` fails for a new op until it is.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.functional as mF
import minitorch_gpu.ops as mops

RNG = np.random.default_rng(0)


def normal(*shape):
    return RNG.standard_normal(shape)


def positive(*shape):
    return RNG.uniform(0.5, 2.0, shape)


def distinct(*shape):  # no ties, away from kinks
    n = math.prod(shape)
    return ((RNG.permutation(n) - n // 2) * 0.1 + 0.05).reshape(shape)


class Const:
    """An input that never requires grad (indices, masks, targets)."""

    def __init__(self, value):
        self.value = np.asarray(value)


CASES: list = []
COVERED: set = set()


def case(name: str, fn: Callable, *inputs: Any, covers: tuple = (), rtol: float = 1e-7) -> None:
    CASES.append((name, fn, inputs, rtol))
    COVERED.update(covers or (name.split("-")[0],))


# --- elementwise and arithmetic ----------------------------------------------------------
UNARY = ("abs", "cos", "sin", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "neg", "tan",
         "sinh", "cosh", "atan", "asinh", "erf", "exp2", "log2", "log10", "rsqrt", "floor",
         "ceil", "round", "trunc", "sign", "isnan", "isinf", "isfinite")
for _name in ("acos", "asin", "atanh"):
    case(_name, lambda m, F, x, n=_name: getattr(m, n)(x), RNG.uniform(-0.9, 0.9, (3, 4)))
case("acosh", lambda m, F, x: m.acosh(x), positive(3, 4) + 1.0)
case("floor_divide", lambda m, F, a, b: m.floor_divide(a, b), Const(distinct(3, 4) * 3),
     Const(positive(4)))  # PyTorch gives it no derivative
for _name in ("atan2", "logaddexp", "fmod", "remainder"):
    case(_name, lambda m, F, a, b, n=_name: getattr(m, n)(a, b), distinct(3, 4) * 3,
         positive(4))
case("bitwise_xor", lambda m, F, a, b: m.bitwise_xor(a, b), Const(np.arange(6)),
     Const(np.arange(6) * 3))
case("lerp", lambda m, F, a, b, w: m.lerp(a, b, w), normal(3, 4), normal(3, 4), positive(4) / 3)
case("isclose", lambda m, F, a, b: m.isclose(a, b), Const([1.0, 2.0, np.nan]),
     Const([1.0 + 1e-9, 2.1, np.nan]))
for _name in ("add", "sub", "mul", "div", "maximum", "minimum", "pow"):
    case(_name, lambda m, F, a, b, n=_name: getattr(m, n)(a, b), positive(3, 4), positive(4))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    case(_name, lambda m, F, a, b, n=_name: getattr(m, n)(a, b), distinct(3, 4),
         Const(distinct(3, 4)))
case("operators", lambda m, F, a, b: (a + 2 * b - b / 3) ** 2 @ b.T, normal(3, 4), normal(3, 4),
     covers=("matmul",))
case("matmul-batched", lambda m, F, a, b: m.matmul(a, b), normal(2, 3, 4), normal(4, 5))
case("method-spellings", lambda m, F, a, b, c: (
    a.add(b), a.mul(b), a.multiply(b), a.sub(b), a.subtract(b), a.div(b), a.neg(), a.negative(),
    a.pow(b), a.maximum(b), a.minimum(b), a.where(c, b), a.eq(b), a.ne(b), a.lt(b), a.le(b),
    a.gt(b), a.ge(b), a.matmul(b.T), a.type(m.float32), c.logical_not(), c.logical_and(c),
    c.logical_or(c), c.bitwise_and(c), c.bitwise_or(c), c.bitwise_xor(c), c.bitwise_not()),
     positive(3, 4), positive(3, 4), Const(normal(3, 4) > 0),
     covers=("multiply", "subtract", "negative", "type"))
case("more-spellings", lambda m, F, a, b, v: (
    a.absolute(), a.square(), a.divide(b), a.true_divide(b), a.greater(b), a.greater_equal(b),
    a.less(b), a.less_equal(b), a.not_equal(b), a.clamp_min(0.8), a.clamp_max(1.2),
    a.mm(b.T), a.mv(v), v.dot(v), v.outer(v), a[None].bmm(b.T[None]), a.type_as(v),
    a.swapaxes(0, 1), a.swapdims(0, 1), a.moveaxis(0, 1), a.movedim(1, 0), a.unbind(1),
    a.index_select(1, m.tensor([2, 0]))),
     positive(3, 4), positive(3, 4), positive(4),
     covers=("absolute", "square", "divide", "true_divide", "greater", "greater_equal", "less",
             "less_equal", "not_equal", "clamp_min", "clamp_max", "mm", "mv", "dot", "outer",
             "bmm", "type_as", "swapaxes", "swapdims", "moveaxis", "movedim", "unbind",
             "index_select"))
case("clamp", lambda m, F, x: m.clamp(x, -0.5, 0.5), distinct(3, 4), covers=("clamp", "clip"))
case("clip-method", lambda m, F, x: x.clip(min=0.1), distinct(3, 4))
case("where", lambda m, F, c, a, b: m.where(c, a, b), Const(normal(3, 4) > 0), normal(3, 4),
     normal(4))
case("masked_fill", lambda m, F, x, c: x.masked_fill(c, 0.5), normal(3, 4),
     Const(normal(3, 4) > 0))
for _name in ("logical_and", "logical_or", "bitwise_and", "bitwise_or"):
    case(_name, lambda m, F, a, b, n=_name: getattr(m, n)(a, b), Const(normal(5) > 0),
         Const(normal(5) > 0))
case("logical_not", lambda m, F, a: m.logical_not(a), Const(normal(5) > 0))
case("bitwise_not", lambda m, F, a: m.bitwise_not(a), Const(np.arange(-3, 3)))
case("int-ops", lambda m, F, a, b: (a * b + a // 3 - b % 4, a & b, a | b), Const(np.arange(6)),
     Const(np.arange(6)[::-1]), covers=())
case("tril", lambda m, F, x: (m.tril(x, -1), m.triu(x, 1), x.tril(), x.triu()), normal(4, 5),
     covers=("tril", "triu"))
case("gelu", lambda m, F, x: (F.gelu(x), F.gelu(x, approximate="tanh")), normal(3, 4))
for _name in ("silu", "softplus", "logsigmoid", "leaky_relu", "elu", "hardtanh", "mish"):
    case(_name, lambda m, F, x, n=_name: getattr(F, n)(x), distinct(3, 4))

# --- reductions --------------------------------------------------------------------------
for _name in ("sum", "mean", "amax", "amin", "logsumexp", "prod", "std", "var"):
    case(_name, lambda m, F, x, n=_name: (getattr(m, n)(x, 1), getattr(x, n)(dim=-1,
                                                                           keepdim=True)),
         distinct(3, 4))
case("sum-all", lambda m, F, x: (x.sum(), x.mean(), m.sum(x, (0, 2))), normal(2, 3, 4), covers=())
case("max", lambda m, F, x: (x.max(), x.max(dim=1)[0], m.max(x, 0).values, x.min(dim=0)[1]),
     distinct(3, 4), covers=("max", "min"))
case("argmax", lambda m, F, x: (m.argmax(x, 1), x.argmin(dim=0), x.argmax()), distinct(3, 4),
     covers=("argmax", "argmin"))
case("any", lambda m, F, c: (m.any(c), m.all(c), c.any(dim=1), c.all(dim=0)),
     Const(normal(3, 4) > 0), covers=("any", "all"))
case("cumsum", lambda m, F, x: (m.cumsum(x, 1), x.cumprod(dim=0)), positive(3, 4),
     covers=("cumsum", "cumprod"))
case("std_mean", lambda m, F, x: (m.std_mean(x, 1), m.var_mean(x, 0)), normal(3, 4),
     covers=("std_mean", "var_mean"))
case("sort", lambda m, F, x: (m.sort(x, 1), m.topk(x, 2), x.argsort(dim=0)), distinct(3, 4),
     covers=("sort", "topk", "argsort"))

# --- shape and indexing ------------------------------------------------------------------
X = normal(2, 3, 4)
case("reshape", lambda m, F, x: (x.reshape(4, 6), m.reshape(x, (-1,)), x.view(6, 4),
                                 x.flatten(1), m.flatten(x), x.unflatten(2, (2, 2))), X,
     covers=("reshape", "view", "flatten", "unflatten"))
case("permute", lambda m, F, x: (x.permute(2, 0, 1), m.transpose(x, 0, 2), x[0].T, x.mT,
                                 x[1].t()), X, covers=("permute", "transpose", "t", "T", "mT"))
case("squeeze", lambda m, F, x: (x.unsqueeze(1).squeeze(1), m.unsqueeze(x, -1),
                                 m.squeeze(x[:1], 0)), X, covers=("squeeze", "unsqueeze"))
case("expand", lambda m, F, x: (x[:, :1].expand(2, 5, 4), x[:1].expand_as(x)), X,
     covers=("expand", "expand_as"))
case("cat", lambda m, F, a, b: (m.cat([a, b], 1), m.stack([a, a], -1)), X, normal(2, 1, 4),
     covers=("cat", "stack"))
case("split", lambda m, F, x: (m.split(x, 2, 2), x.split([1, 2], dim=1), m.chunk(x, 2, 2),
                               m.narrow(x, 1, 1, 2)), X, covers=("split", "chunk", "narrow"))
case("gather", lambda m, F, x, i: (m.gather(x, 1, i), x.gather(2, i[..., :2])), X,
     Const(RNG.integers(0, 3, (2, 2, 4))))
case("scatter", lambda m, F, x, i, s: (x.scatter(1, i, s), m.scatter_add(x, 1, i, s),
                                        x.scatter_reduce(1, i, s, "sum")),
     X, Const(np.array([[[0, 1, 2, 0]], [[2, 2, 1, 0]]])), normal(2, 1, 4),
     covers=("scatter", "scatter_add", "scatter_reduce"))
case("flip", lambda m, F, x: (m.flip(x, (0, 2)), x.roll(1, 2), m.roll(x, -1, 0)), X,
     covers=("flip", "roll"))
case("repeat", lambda m, F, x: (x.repeat(2, 1, 1), m.repeat_interleave(x, 2, 1)), X,
     covers=("repeat", "repeat_interleave"))
case("pad", lambda m, F, x: F.pad(x, (1, 2)), X)
case("one_hot", lambda m, F, i: F.one_hot(i, 5), Const(np.array([0, 4, 2])))
case("masked_select", lambda m, F, x, c: (m.masked_select(x, c), x.masked_select(c)),
     normal(3, 4), Const(normal(3, 4) > 0))
case("nonzero", lambda m, F, c: (m.nonzero(c), c.nonzero()), Const(normal(3, 4) > 0))
case("contiguous", lambda m, F, x: (x.transpose(0, 1).contiguous(), x.clone(), m.clone(x)), X,
     covers=("contiguous", "clone"))
# indexing: PyTorch's rules for where advanced-indexed dims go
_IDX = Const(np.array([2, 0]))
case("getitem-int-slice-tensor", lambda m, F, x, i: x[1, :, i], X, _IDX, covers=("getitem",))
case("getitem-mask", lambda m, F, x, c: x[c], X, Const(normal(2, 3) > 0), covers=())
case("getitem-steps", lambda m, F, x: (x[::2, 1::2], x[..., 1:4:2],
                                       x[None, :, None], x[..., 0], x[-1]), X, covers=())
case("getitem-two-tensors", lambda m, F, x, i: (x[i % 2, :, i], x[:, i, i], x[i % 2, i]), X, _IDX,
     covers=())
case("getitem-tensor-after-slice", lambda m, F, x, i: (x[:, i], x[..., i], x[:, 1:, i]), X, _IDX,
     covers=())

# --- nn functions, losses, attention, einsum ----------------------------------------------
case("softmax", lambda m, F, x: (F.softmax(x, -1), F.log_softmax(x, 1), x.softmax(0),
                                 x.log_softmax(-1)), normal(3, 4), covers=("softmax",
                                                                            "log_softmax"))
case("linear", lambda m, F, x, w, b: F.linear(x, w, b), normal(3, 4), normal(5, 4), normal(5))
case("layer_norm", lambda m, F, x, w, b: F.layer_norm(x, (4,), w, b), normal(3, 4), normal(4),
     normal(4))
case("rms_norm", lambda m, F, x, w: F.rms_norm(x, (4,), w), normal(3, 4), normal(4))
case("normalize", lambda m, F, x: (F.normalize(x), F.normalize(x, p=1, dim=0)), normal(3, 4))
case("normalize-every-p", lambda m, F, x: tuple(
    F.normalize(x, p=p, dim=1) for p in (0, 3, -1, math.inf, -math.inf)), distinct(3, 4))
# zero entries and a row of zeros: the norm clamped at eps, finite gradients (no 0 * inf)
case("normalize-zero-rows", lambda m, F, x: tuple(
    F.normalize(x, p=p, dim=1) for p in (0, 0.5, 1, 2, 3, -1, math.inf, -math.inf)),
    np.array([[0.0, 0.0, 0.0, 0.0], [0.0, -0.55, 0.0, 2.05], [0.35, -1.25, 0.75, 0.15]]))
case("embedding", lambda m, F, i, w: F.embedding(i, w), Const(np.array([[0, 2], [1, 1]])),
     normal(3, 4))
_T = Const(np.array([0, 3, 1, -100, 2]))
for _red in ("mean", "sum", "none"):
    case(f"cross_entropy-{_red}", lambda m, F, x, t, r=_red: (
        F.cross_entropy(x, t, reduction=r), F.cross_entropy(x, t, reduction=r,
                                                            label_smoothing=0.2)),
         normal(5, 4), _T)
    case(f"nll_loss-{_red}", lambda m, F, x, t, w, r=_red: F.nll_loss(x, t, w, reduction=r),
         normal(5, 4), _T, Const(positive(4)))
    case(f"binary_cross_entropy-{_red}", lambda m, F, x, t, w, r=_red: F.binary_cross_entropy(
        x, t, w, reduction=r), RNG.uniform(0.05, 0.95, (3, 4)), Const(RNG.uniform(size=(3, 4))),
        Const(positive(4)))
    case(f"binary_cross_entropy_with_logits-{_red}",
         lambda m, F, x, t, w, pw, r=_red: F.binary_cross_entropy_with_logits(
             x, t, w, reduction=r, pos_weight=pw), normal(3, 4) * 30,
         RNG.uniform(size=(3, 4)), Const(positive(4)), Const(positive(4)))
case("cross_entropy-probabilities", lambda m, F, x, p: F.cross_entropy(x, p, label_smoothing=0.1),
     normal(5, 4), Const(RNG.dirichlet(np.ones(4), 5)))
case("cross_entropy-3d", lambda m, F, x, t: F.cross_entropy(x, t), normal(2, 4, 3),
     Const(RNG.integers(0, 4, (2, 3))))
_Q, _K = normal(2, 4, 5, 8), normal(2, 2, 7, 8)
case("scaled_dot_product_attention", lambda m, F, q, k, v: (
    F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v,
                                                                             is_causal=True)),
     normal(2, 3, 5, 8), normal(2, 3, 7, 8), normal(2, 3, 7, 6))
case("scaled_dot_product_attention-gqa", lambda m, F, q, k, v: F.scaled_dot_product_attention(
    q, k, v, is_causal=True, enable_gqa=True), _Q, _K, normal(2, 2, 7, 8))
case("scaled_dot_product_attention-float-mask", lambda m, F, q, k, v, b:
     F.scaled_dot_product_attention(q, k, v, attn_mask=b), normal(2, 5, 8), normal(2, 7, 8),
     normal(2, 7, 8), normal(5, 7))
for _eq, _shapes in (("ij,jk->ik", [(3, 4), (4, 5)]), ("bhqd,bhkd->bhqk", [(2, 3, 4, 5),
                                                                           (2, 3, 6, 5)]),
                     ("...d,ed->...e", [(2, 3, 4), (5, 4)]), ("bte,eo,bt->bo",
                                                              [(2, 3, 4), (4, 5), (2, 3)]),
                     ("ij,ij", [(3, 4), (3, 4)]), ("bsd,ed->bse", [(2, 3, 4), (5, 4)]),
                     ("ii", [(3, 3)]), ("bii,bi->b", [(2, 4, 4), (2, 4)])):
    case(f"einsum-{_eq}", lambda m, F, *ts, e=_eq: m.einsum(e, *ts),
         *(normal(*s) for s in _shapes))
case("dtypes", lambda m, F, x, i: (x.float(), x.double(), x.half(), x.long(), i.int(), i.bool(),
                                    i.to(m.float32), (i + 0.5), i / 2, i.sqrt()),
     normal(3), Const(np.arange(3)), covers=("float", "double", "half", "long", "int", "bool",
                                             "to", "to_dtype"))

EXEMPT = {
    **{n: "not an op: autograd, storage, device or host access" for n in (
        "backward", "backend", "cpu", "cuda", "data", "data_ptr", "detach", "device", "dim",
        "dtype", "element_size", "grad", "grad_fn", "is_contiguous", "is_cuda", "is_leaf",
        "item", "nbytes", "ndim", "numel", "numpy", "requires_grad", "requires_grad_",
        "retain_grad", "shape", "size", "stride", "tolist", "set_", "to_device", "index_key",
        "reshape_as", "view_as", "bfloat16")},
    **{n: "not an op: a Python value about the tensor or its dtype (test_pytorch_fixes)"
       for n in ("allclose", "equal", "is_floating_point", "is_signed", "ndimension",
                 "nelement")},
    **{n: "creation from a tensor's dtype and device: no gradient, values checked in "
          "test_pytorch_fixes" for n in ("new_empty", "new_full", "new_ones", "new_tensor",
                                          "new_zeros")},
    **{n: "in-place: refused on tensors that require grad; covered by test_torch_semantics"
       for n in ("add_", "sub_", "mul_", "div_", "clamp_", "copy_", "fill_", "zero_",
                 "normal_", "uniform_")},
    **{n: "random: no value to compare (the op table checks its statistics)"
       for n in ("dropout", "multinomial")},
    "packed_causal_attention": "GPT's fused form, no PyTorch twin (the op table compares it "
                               "with split heads)",
    **{n: "Llama's ops, no PyTorch twin: test_llama_ops compares swiglu with silu(g) * u "
          "in torch and rotary with Hugging Face's rotate_half form"
       for n in ("swiglu", "apply_rotary", "rotary_tables", "RotaryTables")},
    **{n: "a Llama's fused form on its projections, no PyTorch twin (test_attention_gqa "
          "compares it with scaled_dot_product_attention(enable_gqa=True))"
       for n in ("grouped_causal_attention", "cached_grouped_attention")},
}
# known failures owned by others: case name -> reason (xfail, not hidden)
KNOWN_FAILURES: dict = {}  # none at the moment (issue 18's fixes all landed)


def _public_names() -> set:
    names = set(mops.__all__) | set(mF.__all__)
    names |= {n for n in dir(mt.Tensor) if not n.startswith("_")}
    return names


def test_every_public_op_is_in_the_battery():
    missing = sorted(_public_names() - COVERED - set(UNARY) - set(EXEMPT))
    assert not missing, (f"public ops with no case in tests/test_torch_compat.py: {missing} "
                         f"(add a case, a UNARY name, or an EXEMPT reason)")


# --- the runner ----------------------------------------------------------------------------
def _to(side: Any, value: Any) -> Any:
    if isinstance(value, Const):
        return side.tensor(np.ascontiguousarray(value.value))
    grad = np.issubdtype(value.dtype, np.floating)
    return side.tensor(np.ascontiguousarray(value), requires_grad=grad)


def _flatten(out: Any) -> list:
    if isinstance(out, (tuple, list)):
        return [y for x in out for y in _flatten(x)]
    return [out]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "").replace("bool_", "bool")


def _run(torch, name, fn, inputs, rtol):
    import torch.nn.functional as tF
    ours_in = [_to(mt, v) for v in inputs]
    theirs_in = [_to(torch, v) for v in inputs]
    theirs = _flatten(fn(torch, tF, *theirs_in))
    ours = _flatten(fn(mt, mF, *ours_in))
    assert len(ours) == len(theirs), f"{name}: {len(ours)} outputs, PyTorch {len(theirs)}"
    loss_ours, loss_theirs = 0.0, 0.0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert tuple(a.shape) == tuple(b.shape), f"{name}[{i}]: shape {tuple(a.shape)}, " \
                                                 f"PyTorch {tuple(b.shape)}"
        assert _dtype_name(a.dtype) == _dtype_name(b.dtype), \
            f"{name}[{i}]: dtype {a.dtype}, PyTorch {b.dtype}"
        expected = b.detach().float().numpy() if b.dtype == torch.bfloat16 else b.detach().numpy()
        got = a.detach().float().numpy() if a.dtype == mt.bfloat16 else a.detach().numpy()
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-9, err_msg=f"{name}[{i}]")
        if b.requires_grad and b.dtype.is_floating_point and b.numel():
            weight = np.cos(np.arange(b.numel())).reshape(tuple(b.shape))
            loss_theirs = loss_theirs + (b * torch.tensor(weight, dtype=b.dtype)).sum()
            loss_ours = loss_ours + (a * mt.tensor(weight, dtype=a.dtype)).sum()
    if isinstance(loss_theirs, float):
        return
    loss_theirs.backward()
    loss_ours.backward()
    for i, (a, b) in enumerate(zip(ours_in, theirs_in)):
        if b.requires_grad:
            expected = b.grad.numpy() if b.grad is not None else np.zeros(tuple(b.shape))
            got = a.grad.numpy() if a.grad is not None else np.zeros(tuple(a.shape))
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9,
                                       err_msg=f"{name}: gradient of input {i}")


def _params():
    for name, fn, inputs, rtol in CASES:
        marks = [pytest.mark.xfail(reason=KNOWN_FAILURES[name], strict=True)] \
            if name in KNOWN_FAILURES else []
        yield pytest.param(name, fn, inputs, rtol, id=name, marks=marks)
    for name in UNARY:
        fn = (lambda m, F, x, n=name: (getattr(m, n)(x), getattr(x, n)()))
        marks = [pytest.mark.xfail(reason=KNOWN_FAILURES[f"unary-{name}"], strict=True)] \
            if f"unary-{name}" in KNOWN_FAILURES else []
        yield pytest.param(name, fn, (positive(3, 4),), 1e-7, id=f"unary-{name}", marks=marks)


@pytest.mark.parametrize("name, fn, inputs, rtol", list(_params()))
def test_same_lambda_as_pytorch(name, fn, inputs, rtol):
    torch = pytest.importorskip("torch")
    _run(torch, name, fn, inputs, rtol)
