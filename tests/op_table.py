"""The op table: every differentiable op of minitorch_gpu, each row with a NumPy float64
reference and the inputs to check it on.

``tests/test_ops.py`` runs every row forward against its reference and backward against
central differences, on each backend and memory layout. Adding an op means adding rows
here; the harness needs no change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

import minitorch_gpu as mt
import minitorch_gpu.functional as F

LAYOUTS = ("contiguous", "transposed", "sliced")


def can_be_noncontiguous(shape: tuple, layout: str) -> bool:
    """Whether ``layout`` can make a leaf of ``shape`` non-contiguous at all: a transpose
    needs two dims longer than 1 (size-1 dims don't count for contiguity), a slice two
    elements."""
    if layout == "transposed":
        return sum(n > 1 for n in shape) >= 2
    return layout == "sliced" and int(np.prod(shape, dtype=np.int64)) > 1


# --- input specs --------------------------------------------------------------------------
@dataclass(frozen=True)
class Float:
    """A random float input, drawn inside the op's domain.

    ``dist`` is one of
      "normal":   N(0, 1);
      "positive": U(0.5, 2), for log, sqrt and the base of pow;
      "nonzero":  +-U(0.5, 2), for divisors;
      "distinct": a shuffled grid 0.1 apart (plus jitter of +-0.01) shifted by ``offset``,
                  for ops with kinks or ties (abs, relu, clamp, max, ...): every value
                  stays at least 0.03 from its neighbours and from the kinks the rows
                  choose, far beyond gradcheck's step of 1e-6, and argmax is unique.
    """

    shape: tuple
    dist: str = "normal"
    offset: float = 0.0  # shifts the "distinct" grid, so two such inputs never tie
    grad: bool = True  # whether the input requires grad (and is gradchecked)

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        n = int(np.prod(self.shape, dtype=np.int64))
        if self.dist == "normal":
            values = rng.standard_normal(n)
        elif self.dist == "positive":
            values = rng.uniform(0.5, 2.0, n)
        elif self.dist == "nonzero":
            values = rng.choice([-1.0, 1.0], n) * rng.uniform(0.5, 2.0, n)
        elif self.dist == "distinct":
            grid = (rng.permutation(n) - n // 2) * 0.1 + self.offset
            values = grid + rng.uniform(-0.01, 0.01, n)
        else:
            raise ValueError(f"Float: unknown dist {self.dist!r}")
        return values.reshape(self.shape)


@dataclass(frozen=True, eq=False)
class Const:
    """A fixed input (integer indices, bool masks, an additive float mask): sent to the
    device as given, never made non-contiguous, never requires grad."""

    value: Any

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.value)


@dataclass(frozen=True, eq=False)
class OpCase:
    """One row: an op applied to some inputs, and what its output must be."""

    name: str  # unique; test ids are "<name>-<layout>-<backend>"
    fn: Callable[..., Any]  # applies the op to Tensors, one per input; may return a tuple
    ref: Optional[Callable[..., Any]]  # the op on NumPy float64 host arrays (None: see check)
    inputs: tuple  # Float/Const specs, passed positionally to fn and ref
    check: Optional[Callable[..., None]] = None  # random ops: asserts on (out, *inputs)
    noncontiguous: bool = True  # also run with transposed and sliced leaves
    float32: bool = False  # in the float32 smoke subset
    rtol: float = 1e-10
    atol: float = 1e-12  # for outputs that cancel to ~0, where rtol means nothing

    @property
    def differentiable(self) -> bool:
        return any(isinstance(s, Float) and s.grad for s in self.inputs)

    @property
    def layouts(self) -> tuple:
        """"contiguous", and the other LAYOUTS that make some float input non-contiguous
        (a transposed 1-D or 0-d leaf would only repeat the contiguous run)."""
        shapes = [s.shape for s in self.inputs if isinstance(s, Float)]
        return ("contiguous",) + tuple(
            layout for layout in LAYOUTS[1:] if self.noncontiguous
            and any(can_be_noncontiguous(shape, layout) for shape in shapes))


CASES: list = []


def case(name: str, fn: Callable, ref: Optional[Callable], *inputs: Any, **options: Any) -> None:
    CASES.append(OpCase(name, fn, ref, tuple(inputs), **options))


# --- NumPy references ---------------------------------------------------------------------
_erf = np.vectorize(math.erf, otypes=[np.float64])
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_ref(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def cross_entropy_ref(logits: np.ndarray, target: np.ndarray, ignore_index: int = -100,
                      reduction: str = "mean", label_smoothing: float = 0.0) -> np.ndarray:
    """torch.nn.functional.cross_entropy with class ids; classes in dim 1 ((C,) for one)."""
    if logits.ndim == 1:
        logits, target = logits[None], target[None]
    logp = log_softmax_ref(logits, axis=1)  # (N, C, d...)
    valid = target != ignore_index
    picked = np.take_along_axis(logp, np.where(valid, target, 0)[:, None], axis=1)[:, 0]
    loss = -(1 - label_smoothing) * picked - label_smoothing * logp.mean(axis=1)
    loss = np.where(valid, loss, 0.0)  # (N, d...)
    if reduction == "none":
        return loss.reshape(target.shape if logits.ndim > 1 else ())
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum()


def layer_norm_ref(x: np.ndarray, ndims: int, weight: Optional[np.ndarray] = None,
                   bias: Optional[np.ndarray] = None, eps: float = 1e-5) -> np.ndarray:
    axes = tuple(range(x.ndim - ndims, x.ndim))
    out = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Optional[np.ndarray] = None,
                  causal: bool = False, scale: Optional[float] = None) -> np.ndarray:
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale  # (..., L, S)
    L, S = scores.shape[-2:]
    if causal:  # query i sees keys 0..i (top-left aligned)
        scores = np.where(np.tril(np.ones((L, S), dtype=bool)), scores, -np.inf)
    elif mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
    return softmax_ref(scores, axis=-1) @ v


# --- elementwise: binary ------------------------------------------------------------------
# (tag, left shape, right shape): odd sizes, size-1 dims, broadcasting both ways, 0-d.
BINARY_SHAPES = [
    ("odd", (5, 7), (5, 7)),
    ("size1-dims", (1, 7, 1), (1, 7, 1)),
    ("broadcast-col-row", (3, 1), (1, 4)),
    ("broadcast-trailing", (2, 3, 4), (4,)),
    ("broadcast-rank", (5,), (2, 1, 5)),
    ("scalar-shaped-right", (2, 3), ()),
    ("scalar-shaped-left", (), (2, 3)),
]
PYTHON_SCALAR = 1.7


def binary_cases(name: str, fn: Callable, ref: Callable, left: Float, right: Float,
                 float32: bool = False) -> None:
    """Rows for a binary op over BINARY_SHAPES, plus a Python scalar on either side.
    ``left``/``right`` give each side's distribution (their shapes are replaced)."""
    for tag, a_shape, b_shape in BINARY_SHAPES:
        case(f"{name}-{tag}", fn, ref, Float(a_shape, left.dist, left.offset),
             Float(b_shape, right.dist, right.offset),
             float32=float32 and tag == "broadcast-col-row")
    case(f"{name}-python-scalar-right", lambda a: fn(a, PYTHON_SCALAR),
         lambda a: ref(a, PYTHON_SCALAR), Float((3, 5), left.dist, left.offset))
    case(f"{name}-python-scalar-left", lambda b: fn(PYTHON_SCALAR, b),
         lambda b: ref(PYTHON_SCALAR, b), Float((3, 5), right.dist, right.offset))


NORMAL, POSITIVE, NONZERO = Float((), "normal"), Float((), "positive"), Float((), "nonzero")
# maximum/minimum: both sides on grids 0.05 apart, so no element pair ever ties
GRID_A, GRID_B = Float((), "distinct", 0.0), Float((), "distinct", 0.05)

binary_cases("add", lambda a, b: a + b, np.add, NORMAL, NORMAL, float32=True)
binary_cases("sub", lambda a, b: a - b, np.subtract, NORMAL, NORMAL)
binary_cases("mul", lambda a, b: a * b, np.multiply, NORMAL, NORMAL, float32=True)
binary_cases("div", lambda a, b: a / b, np.divide, NORMAL, NONZERO, float32=True)
binary_cases("pow-tensor-tensor", lambda a, b: a ** b, np.power, POSITIVE, NORMAL)
binary_cases("maximum", mt.maximum, np.maximum, GRID_A, GRID_B)
binary_cases("minimum", mt.minimum, np.minimum, GRID_A, GRID_B)
case("add-functional", mt.add, np.add, Float((3, 4)), Float((4,)))

# --- elementwise: pow with a scalar, and unary ops ---------------------------------------
case("pow-int-exponent", lambda x: x ** 3, lambda x: x ** 3, Float((3, 5)))
case("pow-float-exponent", lambda x: x.pow(2.5), lambda x: x ** 2.5, Float((3, 5), "positive"))
case("pow-negative-exponent", lambda x: mt.pow(x, -1.5), lambda x: x ** -1.5,
     Float((3, 5), "positive"))
case("pow-scalar-base", lambda x: 2.0 ** x, lambda x: 2.0 ** x, Float((3, 5)), float32=True)

UNARY = [  # (name, fn, ref, dist, offset, in the float32 subset)
    ("neg", lambda x: -x, np.negative, "normal", 0.0, False),
    ("exp", mt.exp, np.exp, "normal", 0.0, True),
    ("log", lambda x: x.log(), np.log, "positive", 0.0, True),
    ("sqrt", lambda x: x.sqrt(), np.sqrt, "positive", 0.0, True),
    ("tanh", mt.tanh, np.tanh, "normal", 0.0, True),
    ("sin", mt.sin, np.sin, "normal", 0.0, False),
    ("cos", lambda x: x.cos(), np.cos, "normal", 0.0, False),
    ("sigmoid", lambda x: x.sigmoid(), lambda x: 1.0 / (1.0 + np.exp(-x)), "normal", 0.0, True),
    # kinks at 0: the grid shifted by 0.05 keeps every value >= 0.04 away from it
    ("relu", F.relu, lambda x: np.maximum(x, 0.0), "distinct", 0.05, True),
    ("abs", lambda x: abs(x), np.abs, "distinct", 0.05, False),
    ("gelu-tanh", lambda x: F.gelu(x, approximate="tanh"), lambda x: gelu_ref(x, "tanh"),
     "normal", 0.0, True),
    ("gelu-erf", lambda x: F.gelu(x, approximate="none"), lambda x: gelu_ref(x, "none"),
     "normal", 0.0, True),
    # clamp bounds are multiples of 0.1; the grid shifted by 0.05 stays >= 0.04 away
    ("clamp-min", lambda x: x.clamp(min=-0.3), lambda x: np.maximum(x, -0.3), "distinct",
     0.05, False),
    ("clamp-max", lambda x: mt.clamp(x, max=0.4), lambda x: np.minimum(x, 0.4), "distinct",
     0.05, False),
    ("clamp-both", lambda x: x.clamp(-0.3, 0.4), lambda x: np.clip(x, -0.3, 0.4), "distinct",
     0.05, True),
]
for _name, _fn, _ref, _dist, _offset, _float32 in UNARY:
    case(f"{_name}-odd", _fn, _ref, Float((3, 5), _dist, _offset), float32=_float32)
    case(f"{_name}-3d", _fn, _ref, Float((2, 3, 4), _dist, _offset))
    case(f"{_name}-0d", _fn, _ref, Float((), _dist, _offset))


def in_bf16(op: Callable) -> Callable:
    """``op`` applied to its input rounded to bf16, every float output widened back to the
    input's dtype (the harness compares float64): a row for a bf16 path, forward only
    (gradcheck's steps of 1e-6 vanish in bf16's 8 bits)."""
    def run(x: mt.Tensor) -> Any:
        outs = op(x.to(mt.bfloat16))
        widened = [t.to(x.dtype) if t.dtype == mt.bfloat16 else t
                   for t in (outs if isinstance(outs, tuple) else (outs,))]
        return tuple(widened) if isinstance(outs, tuple) else widened[0]
    return run


def bf16_values(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bf16 as the row's input is, back in float64 for the reference."""
    return x.astype(mt.bfloat16).astype(np.float64)


# one-sided bounds on bf16: CuPy's clip fills in a None bound only for float/int kinds
# (bf16 is kind 'V'), so these must never reach it with one; in place too
BF16_BOUND = float(np.float64(-0.3).astype(mt.bfloat16))  # the bound as bf16 rounds it
case("clamp-min-bf16", in_bf16(lambda x: x.clamp(min=-0.3)),
     lambda x: np.maximum(bf16_values(x), BF16_BOUND),
     Float((3, 5), "distinct", 0.05, grad=False))
case("clamp-max-bf16-inplace", in_bf16(lambda x: x.clamp_(max=-0.3)),
     lambda x: np.minimum(bf16_values(x), BF16_BOUND),
     Float((3, 5), "distinct", 0.05, grad=False))
case("tril", lambda x: x.tril(), np.tril, Float((4, 5)))
case("tril-batched-above", lambda x: mt.tril(x, 1), lambda x: np.tril(x, 1), Float((2, 4, 5)))
case("triu-below", lambda x: mt.triu(x, diagonal=-1), lambda x: np.triu(x, -1), Float((5, 4)))
case("sigmoid-large", lambda x: (x * 40).sigmoid(), lambda x: 1.0 / (1.0 + np.exp(-40 * x)),
     Float((3, 5)))

# --- activations (ops/activations.py) ------------------------------------------------------
def _sigmoid_ref(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _softplus_ref(x: np.ndarray, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
    return np.where(beta * x > threshold, x, np.logaddexp(0.0, beta * x) / beta)


ACTIVATIONS = [  # (name, fn, ref, dist, offset, in the float32 subset)
    ("silu", F.silu, lambda x: x * _sigmoid_ref(x), "normal", 0.0, True),
    ("softplus", F.softplus, _softplus_ref, "normal", 0.0, True),
    # beta 2, threshold 1: x = 0.5 is the switch; the grid shifted by 0.05 stays clear of it
    ("softplus-beta-threshold", lambda x: F.softplus(x, beta=2.0, threshold=1.0),
     lambda x: _softplus_ref(x, 2.0, 1.0), "distinct", 0.05, False),
    ("logsigmoid", F.logsigmoid, lambda x: -np.logaddexp(0.0, -x), "normal", 0.0, True),
    ("leaky-relu", lambda x: F.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x),
     "distinct", 0.05, True),
    ("elu", lambda x: F.elu(x, alpha=1.5), lambda x: np.where(x > 0, x, 1.5 * np.expm1(x)),
     "distinct", 0.05, True),
    ("hardtanh", lambda x: F.hardtanh(x, -0.3, 0.4), lambda x: np.clip(x, -0.3, 0.4),
     "distinct", 0.05, True),
    ("mish", F.mish, lambda x: x * np.tanh(np.logaddexp(0.0, x)), "normal", 0.0, True),
]
for _name, _fn, _ref, _dist, _offset, _float32 in ACTIVATIONS:
    case(f"{_name}-odd", _fn, _ref, Float((3, 5), _dist, _offset), float32=_float32)
    case(f"{_name}-3d", _fn, _ref, Float((2, 3, 4), _dist, _offset))
    case(f"{_name}-0d", _fn, _ref, Float((), _dist, _offset))
# x * 30 reaches +-100: no overflow, and the gradient stays finite
for _name, _fn, _ref, _dist, _offset, _float32 in ACTIVATIONS:
    if _dist == "normal":
        case(f"{_name}-large", lambda x, f=_fn: f(x * 30), lambda x, r=_ref: r(x * 30),
             Float((3, 5)))

# --- elementwise math (ops/elementwise_math.py, ops/rounding.py) ---------------------------
# domains kept away from the singular points: tan's +-pi/2, asin/acos/atanh's +-1, acosh's 1
MATH = [  # (name, fn, ref, dist, offset, in the float32 subset)
    ("rsqrt", mt.rsqrt, lambda x: 1.0 / np.sqrt(x), "positive", 0.0, True),
    ("erf", lambda x: x.erf(), _erf, "normal", 0.0, True),
    ("exp2", mt.exp2, np.exp2, "normal", 0.0, False),
    ("log2", lambda x: x.log2(), np.log2, "positive", 0.0, False),
    ("log10", mt.log10, np.log10, "positive", 0.0, False),
    ("tan", lambda x: mt.tan(x * 0.7), lambda x: np.tan(x * 0.7), "nonzero", 0.0, False),
    ("asin", lambda x: (x * 0.4).asin(), lambda x: np.arcsin(x * 0.4), "nonzero", 0.0, False),
    ("acos", lambda x: mt.acos(x * 0.4), lambda x: np.arccos(x * 0.4), "nonzero", 0.0, False),
    ("atan", mt.atan, np.arctan, "normal", 0.0, False),
    ("sinh", mt.sinh, np.sinh, "normal", 0.0, False),
    ("cosh", lambda x: x.cosh(), np.cosh, "normal", 0.0, False),
    ("asinh", mt.asinh, np.arcsinh, "normal", 0.0, False),
    ("acosh", lambda x: mt.acosh(x + 1), lambda x: np.arccosh(x + 1), "positive", 0.0, False),
    ("atanh", lambda x: (x * 0.4).atanh(), lambda x: np.arctanh(x * 0.4), "nonzero", 0.0,
     False),
    # piecewise constant, zero gradient: the grid keeps every value >= 0.04 from the steps
    ("floor", mt.floor, np.floor, "distinct", 0.05, False),
    ("ceil", lambda x: x.ceil(), np.ceil, "distinct", 0.05, False),
    ("trunc", mt.trunc, np.trunc, "distinct", 0.05, False),
    ("round", lambda x: x.round(), np.round, "distinct", 0.05, False),
    ("round-decimals", lambda x: mt.round(x, decimals=1), lambda x: np.round(x, 1),
     "distinct", 0.0, False),
    ("sign", lambda x: x.sign(), np.sign, "distinct", 0.05, False),
]
for _name, _fn, _ref, _dist, _offset, _float32 in MATH:
    case(f"{_name}-odd", _fn, _ref, Float((3, 5), _dist, _offset), float32=_float32)
    case(f"{_name}-3d", _fn, _ref, Float((2, 3, 4), _dist, _offset))
    case(f"{_name}-0d", _fn, _ref, Float((), _dist, _offset))

binary_cases("atan2", mt.atan2, np.arctan2, NORMAL, NONZERO)
binary_cases("logaddexp", mt.logaddexp, np.logaddexp, NORMAL, NORMAL)
# remainder/fmod have kinks where a / b is an integer: random draws are never that close
binary_cases("remainder", lambda a, b: a % b, np.remainder, NORMAL, NONZERO)
binary_cases("fmod", mt.fmod, np.fmod, NORMAL, NONZERO)
case("floor-divide", lambda a, b: a // b, np.floor_divide, Float((5, 7)), Float((5, 7), "nonzero"))
case("floor-divide-broadcast", mt.floor_divide, np.floor_divide, Float((3, 1)),
     Float((1, 4), "nonzero"))
case("floor-divide-python-scalar-left", lambda b: 3.5 // b, lambda b: np.floor_divide(3.5, b),
     Float((3, 5), "nonzero"))
case("div-floor", lambda a, b: mt.div(a, b, rounding_mode="floor"), np.floor_divide,
     Float((2, 3, 4)), Float((4,), "nonzero"))
case("div-trunc", lambda a, b: a.div(b, rounding_mode="trunc"), lambda a, b: np.trunc(a / b),
     Float((3, 1)), Float((1, 4), "nonzero"))
INT_A = np.array([[7, -7, 6, 0], [-9, 9, 1, -1]])
INT_B = np.array([[2, 2, -4, 3], [-2, 4, -3, 5]])
case("floor-divide-int64", lambda a, b: a // b, np.floor_divide, Const(INT_A), Const(INT_B))
case("remainder-int64", mt.remainder, np.remainder, Const(INT_A), Const(INT_B))
case("fmod-int64", lambda a, b: a.fmod(b), np.fmod, Const(INT_A), Const(INT_B))
case("div-trunc-int64", lambda a, b: mt.div(a, b, rounding_mode="trunc"),
     lambda a, b: np.trunc(a / b).astype(np.int64), Const(INT_A), Const(INT_B))
case("lerp-scalar-weight", lambda a, b: mt.lerp(a, b, 0.3), lambda a, b: a + 0.3 * (b - a),
     Float((3, 5)), Float((3, 5)), float32=True)
case("lerp-tensor-weight", lambda a, b, w: a.lerp(b, w), lambda a, b, w: a + w * (b - a),
     Float((3, 5)), Float((3, 5)), Float((3, 5)))
case("lerp-broadcast", mt.lerp, lambda a, b, w: a + w * (b - a), Float((2, 3, 4)),
     Float((4,)), Float((3, 1)))

# --- elementwise: selection ---------------------------------------------------------------
MASK_3x4 = np.array([[True, False, True, True], [False, False, True, False],
                     [True, True, False, False]])
case("where", mt.where, np.where, Const(MASK_3x4), Float((3, 4)), Float((3, 4)))
case("where-broadcast", mt.where, np.where, Const(MASK_3x4[:, :1]), Float((1, 4)),
     Float((3, 4)))
case("where-python-scalar", lambda c, a: mt.where(c, a, 0.5), lambda c, a: np.where(c, a, 0.5),
     Const(MASK_3x4), Float((3, 4)))
case("masked-fill", lambda x, m: x.masked_fill(m, -1.5), lambda x, m: np.where(m, -1.5, x),
     Float((3, 4)), Const(MASK_3x4))
case("masked-fill-broadcast", lambda x, m: mt.masked_fill(x, m, 2.0),
     lambda x, m: np.where(m, 2.0, x), Float((3, 4)), Const(MASK_3x4[:1]))

# --- reductions ---------------------------------------------------------------------------
REDUCE_DIMS = [("all", None), ("dim1", 1), ("dim-neg", -1), ("dims-tuple", (0, 2))]
REDUCTIONS = [  # (name, fn(x, dim, keepdim), ref(x, axis, keepdims), dist)
    ("sum", lambda x, d, k: x.sum(d, keepdim=k), np.sum, "normal"),
    ("mean", lambda x, d, k: mt.mean(x, d, keepdim=k), np.mean, "normal"),
    ("var-c0", lambda x, d, k: x.var(d, keepdim=k, correction=0),
     lambda x, axis, keepdims: np.var(x, axis=axis, keepdims=keepdims), "normal"),
    ("var-c1", lambda x, d, k: mt.var(x, d, keepdim=k, correction=1),
     lambda x, axis, keepdims: np.var(x, axis=axis, keepdims=keepdims, ddof=1), "normal"),
    ("std-c0", lambda x, d, k: x.std(d, keepdim=k, correction=0),
     lambda x, axis, keepdims: np.std(x, axis=axis, keepdims=keepdims), "normal"),
    ("std-c1", lambda x, d, k: x.std(d, keepdim=k),  # the default is unbiased
     lambda x, axis, keepdims: np.std(x, axis=axis, keepdims=keepdims, ddof=1), "normal"),
    # amax/amin: distinct values, so the gradient goes to one element only
    ("amax", lambda x, d, k: x.amax(d, keepdim=k), np.amax, "distinct"),
    ("amin", lambda x, d, k: mt.amin(x, d, keepdim=k), np.amin, "distinct"),
]


def reduction_case(name: str, fn: Callable, ref: Callable, dist: str, dim: Any,
                   keepdim: bool, float32: bool) -> None:
    case(name, lambda x: fn(x, dim, keepdim), lambda x: ref(x, axis=dim, keepdims=keepdim),
         Float((2, 3, 4), dist), float32=float32)


for _name, _fn, _ref, _dist in REDUCTIONS:
    for _tag, _dim in REDUCE_DIMS:
        for _keepdim in (False, True):
            reduction_case(f"{_name}-{_tag}-{'keepdim' if _keepdim else 'nokeepdim'}", _fn,
                           _ref, _dist, _dim, _keepdim,
                           float32=_tag == "dim-neg" and not _keepdim)


def max_min_case(name: str, largest: bool, dim: Optional[int], keepdim: bool) -> None:
    """max/min along a dim give (values, indices); the indices must be NumPy's argmax."""
    method, ref, arg = ("max", np.max, np.argmax) if largest else ("min", np.min, np.argmin)
    if dim is None:
        case(name, lambda x: getattr(x, method)(), lambda x: ref(x), Float((2, 3, 4), "distinct"))
        return
    case(name, lambda x: getattr(x, method)(dim, keepdim=keepdim),
         lambda x: (ref(x, axis=dim, keepdims=keepdim), arg(x, axis=dim, keepdims=keepdim)),
         Float((2, 3, 4), "distinct"))


for _largest, _method in ((True, "max"), (False, "min")):
    max_min_case(f"{_method}-all", _largest, None, False)
    for _dim in (0, 1, -1):
        for _keepdim in (False, True):
            max_min_case(f"{_method}-dim{_dim}-{'keepdim' if _keepdim else 'nokeepdim'}",
                         _largest, _dim, _keepdim)

# --- sort, topk, cumsum, multinomial -----------------------------------------------------
def sort_ref(x: np.ndarray, axis: int, descending: bool) -> tuple:
    """(values, indices) of np's stable sort; the rows' inputs are distinct, so -x sorts
    descending with the same indices torch.sort gives."""
    order = np.argsort(-x if descending else x, axis=axis, kind="stable")
    return np.take_along_axis(x, order, axis=axis), order


def topk_ref(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple:
    values, order = sort_ref(x, axis, largest)
    return np.take(values, np.arange(k), axis=axis), np.take(order, np.arange(k), axis=axis)


# the indices are outputs too: the harness checks them exactly, and gradchecks the values
for _dim in (0, -1):
    for _descending in (False, True):
        case(f"sort-dim{_dim}-{'descending' if _descending else 'ascending'}",
             lambda x, d=_dim, s=_descending: x.sort(d, descending=s),
             lambda x, d=_dim, s=_descending: sort_ref(x, d, s), Float((4, 5), "distinct"),
             float32=_dim == -1)
case("sort-3d-functional", lambda x: mt.sort(x, 1, descending=True),
     lambda x: sort_ref(x, 1, True), Float((2, 3, 4), "distinct"))
for _largest in (True, False):
    for _k in (1, 3):
        case(f"topk-{'largest' if _largest else 'smallest'}-k{_k}",
             lambda x, k=_k, b=_largest: x.topk(k, largest=b),
             lambda x, k=_k, b=_largest: topk_ref(x, k, -1, b), Float((4, 5), "distinct"),
             float32=_k == 3 and _largest)
case("topk-dim0", lambda x: mt.topk(x, 2, dim=0), lambda x: topk_ref(x, 2, 0, True),
     Float((5, 3), "distinct"))
case("topk-k-is-size", lambda x: x.topk(5, dim=1, largest=False),
     lambda x: topk_ref(x, 5, 1, False), Float((2, 5, 3), "distinct"))
# sorted=False leaves the order open: sort what it chose, to compare and gradcheck it
case("topk-unsorted", lambda x: x.topk(3, sorted=False).values.sort(-1).values,
     lambda x: np.sort(topk_ref(x, 3, -1, True)[0], axis=-1), Float((4, 6), "distinct"))
# bf16 has no Thrust sort on CuPy, and topk's partition must see none: the distinct grid
# stays distinct in bf16 (steps of 0.1; bf16 moves |x| <= 1.2 by at most 0.005)
case("sort-bf16-descending", in_bf16(lambda x: x.sort(-1, descending=True)),
     lambda x: sort_ref(bf16_values(x), -1, True), Float((4, 5), "distinct", grad=False))
for _largest in (True, False):
    case(f"topk-bf16-{'largest' if _largest else 'smallest'}",
         in_bf16(lambda x, b=_largest: x.topk(3, dim=0, largest=b)),
         lambda x, b=_largest: topk_ref(bf16_values(x), 3, 0, b),
         Float((6, 4), "distinct", grad=False))
for _dim in (0, 1, -1):
    case(f"cumsum-dim{_dim}", lambda x, d=_dim: x.cumsum(d), lambda x, d=_dim: np.cumsum(x, d),
         Float((2, 3, 4)), float32=_dim == -1)
case("cumsum-1d-functional", lambda x: mt.cumsum(x, 0), np.cumsum, Float((7,)))
case("cumsum-int64", lambda i: i.cumsum(1), lambda i: np.cumsum(i, 1),
     Const(np.array([[1, -2, 3], [4, 5, -6]])))
case("cumsum-bool", lambda m: mt.cumsum(m, -1), lambda m: np.cumsum(m, -1), Const(MASK_3x4))

# weights of 0 where ZERO_WEIGHTS is 0; every row keeps 3 or more
ZERO_WEIGHTS = np.array([[0, 1, 1, 0, 1, 1], [1, 0, 0, 0, 1, 1], [1, 1, 1, 1, 1, 0],
                         [0, 0, 1, 1, 1, 0]], dtype=np.float64)


def multinomial_case(name: str, num_samples: int, replacement: bool, masked: bool,
                     shape: tuple = (4, 6)) -> None:
    """multinomial draws at random: seeded inside fn, the row checks what every draw must
    satisfy (in range, never a weight of 0, distinct without replacement). Unmasked rows
    run on the transposed and sliced leaves too."""
    def check(out: np.ndarray, p: np.ndarray, *mask: np.ndarray) -> None:
        rows = out.reshape(-1, num_samples)
        assert out.shape == shape[:-1] + (num_samples,), out.shape
        assert out.dtype == np.int64 and ((rows >= 0) & (rows < shape[-1])).all(), out
        if mask:
            assert (np.take_along_axis(mask[0], rows, axis=1) != 0).all(), "drew a weight 0"
        if not replacement:
            assert all(len(set(row)) == num_samples for row in rows.tolist()), out

    def draw(p: mt.Tensor, *mask: mt.Tensor) -> mt.Tensor:
        mt.manual_seed(1234)
        return mt.multinomial(p * mask[0] if mask else p, num_samples, replacement)

    inputs = (Float(shape, "positive", grad=False),) + ((Const(ZERO_WEIGHTS),) if masked else ())
    case(name, draw, None, *inputs, check=check)


multinomial_case("multinomial-replacement", 50, True, masked=True)
multinomial_case("multinomial-no-replacement", 3, False, masked=True)
multinomial_case("multinomial-one-sample", 1, False, masked=True)
multinomial_case("multinomial-permutation", 6, False, masked=False)
multinomial_case("multinomial-1d", 20, True, masked=False, shape=(6,))

# --- matmul -------------------------------------------------------------------------------
MATMUL_SHAPES = [
    ("1d-1d", (5,), (5,)),
    ("1d-2d", (3,), (3, 4)),
    ("2d-1d", (4, 3), (3,)),
    ("2d-2d", (3, 5), (5, 2)),
    ("3d-3d", (2, 3, 4), (2, 4, 5)),
    ("broadcast-batch", (2, 1, 3, 4), (5, 4, 2)),
    ("2d-3d", (3, 4), (2, 4, 5)),
    ("3d-1d", (2, 3, 4), (4,)),
    ("1d-3d", (3,), (2, 3, 4)),
    ("3d-2d", (2, 3, 4), (4, 5)),  # a linear layer: folded into one GEMM
    ("4d-2d", (2, 1, 3, 4), (4, 2)),
]
for _tag, _a, _b in MATMUL_SHAPES:
    case(f"matmul-{_tag}", lambda a, b: a @ b, np.matmul, Float(_a), Float(_b),
         float32=_tag in ("2d-2d", "broadcast-batch"))
case("matmul-functional", mt.matmul, np.matmul, Float((3, 4)), Float((4, 2)))
case("linear", F.linear, lambda x, w, b: x @ w.T + b, Float((2, 3, 4)), Float((5, 4)),
     Float((5,)), float32=True)
case("linear-no-bias", F.linear, lambda x, w: x @ w.T, Float((2, 3, 4)), Float((5, 4)))
case("linear-2d", F.linear, lambda x, w, b: x @ w.T + b, Float((3, 4)), Float((2, 4)),
     Float((2,)))
case("linear-1d", F.linear, lambda x, w, b: x @ w.T + b, Float((4,)), Float((3, 4)),
     Float((3,)))
case("linear-4d", F.linear, lambda x, w, b: x @ w.T + b, Float((2, 1, 3, 4)), Float((5, 4)),
     Float((5,)))
# a block's skip connection added in the linear's node (F.linear's residual)
case("linear-residual", lambda x, w, b, r: F.linear(x, w, b, residual=r),
     lambda x, w, b, r: x @ w.T + b + r, Float((2, 3, 4)), Float((5, 4)), Float((5,)),
     Float((2, 3, 5)), float32=True)
case("linear-residual-no-bias", lambda x, w, r: F.linear(x, w, residual=r),
     lambda x, w, r: x @ w.T + r, Float((3, 4)), Float((2, 4)), Float((3, 2)))

# --- softmax, log-softmax -----------------------------------------------------------------
for _dim in (0, 1, -1):
    case(f"softmax-dim{_dim}", lambda x, d=_dim: x.softmax(d), lambda x, d=_dim: softmax_ref(x, d),
         Float((2, 3, 4)), float32=_dim == -1)
    case(f"log-softmax-dim{_dim}", lambda x, d=_dim: F.log_softmax(x, d),
         lambda x, d=_dim: log_softmax_ref(x, d), Float((2, 3, 4)), float32=_dim == -1)
# logits of +-100 overflow exp unless the op subtracts the max first
case("softmax-large", lambda x: F.softmax(x * 50, -1), lambda x: softmax_ref(x * 50, -1),
     Float((3, 5)))
case("log-softmax-large", lambda x: (x * 50).log_softmax(-1),
     lambda x: log_softmax_ref(x * 50, -1), Float((3, 5)))

# --- cross-entropy ------------------------------------------------------------------------
TARGET_2D = np.array([1, 0, -100, 3, 1])  # (N,) with an ignored row; classes C = 4
TARGET_3D = np.array([[0, 3, -100], [2, 2, 1]])  # (N, d) for logits (N, C, d) = (2, 4, 3)
for _reduction in ("mean", "sum", "none"):
    for _smoothing in (0.0, 0.1):
        _tag = f"{_reduction}{'-smooth' if _smoothing else ''}"
        _options = dict(reduction=_reduction, label_smoothing=_smoothing)
        case(f"cross-entropy-2d-{_tag}", lambda x, t, o=_options: F.cross_entropy(x, t, **o),
             lambda x, t, o=_options: cross_entropy_ref(x, t, **o), Float((5, 4)),
             Const(TARGET_2D), float32=_reduction == "mean" and not _smoothing)
        case(f"cross-entropy-3d-{_tag}", lambda x, t, o=_options: F.cross_entropy(x, t, **o),
             lambda x, t, o=_options: cross_entropy_ref(x, t, **o), Float((2, 4, 3)),
             Const(TARGET_3D))
case("cross-entropy-ignore-index", lambda x, t: F.cross_entropy(x, t, ignore_index=1),
     lambda x, t: cross_entropy_ref(x, t, ignore_index=1), Float((5, 4)), Const(TARGET_2D % 4))
case("cross-entropy-1d", F.cross_entropy, cross_entropy_ref, Float((4,)), Const(np.array(2)))

# --- layer norm ---------------------------------------------------------------------------
case("layer-norm-1dim", lambda x, w, b: F.layer_norm(x, 5, w, b),
     lambda x, w, b: layer_norm_ref(x, 1, w, b), Float((3, 5)), Float((5,)), Float((5,)),
     float32=True)
case("layer-norm-2dims", lambda x, w, b: F.layer_norm(x, (3, 4), w, b),
     lambda x, w, b: layer_norm_ref(x, 2, w, b), Float((2, 3, 4)), Float((3, 4)), Float((3, 4)))
case("layer-norm-1dim-no-affine", lambda x: F.layer_norm(x, (4,)),
     lambda x: layer_norm_ref(x, 1), Float((2, 3, 4)))
case("layer-norm-2dims-no-affine", lambda x: F.layer_norm(x, [3, 4]),
     lambda x: layer_norm_ref(x, 2), Float((2, 3, 4)))
case("layer-norm-weight-only", lambda x, w: F.layer_norm(x, 5, weight=w),
     lambda x, w: layer_norm_ref(x, 1, w), Float((3, 5)), Float((5,)))
case("layer-norm-eps", lambda x, w, b: F.layer_norm(x, 5, w, b, eps=0.1),
     lambda x, w, b: layer_norm_ref(x, 1, w, b, eps=0.1), Float((3, 5)), Float((5,)),
     Float((5,)))

# --- embedding ----------------------------------------------------------------------------
REPEATED_IDS = np.array([[0, 2, 2], [5, 0, 2]])  # ids 0 and 2 repeat: their grads must add
case("embedding", F.embedding, lambda ids, w: w[ids], Const(REPEATED_IDS), Float((6, 3)),
     float32=True)
case("embedding-1d", F.embedding, lambda ids, w: w[ids], Const(np.array([1, 1, 1, 4])),
     Float((5, 2)))


# --- dropout ------------------------------------------------------------------------------
def dropout_case(name: str, p: float, seed: int) -> None:
    """Dropout with p in (0, 1): seeded inside fn so every call draws the same mask.

    The mask is not reproducible on the host, so instead of a reference the row checks
    that each element is either dropped or the input scaled by 1/(1-p).
    """
    def fn(x: mt.Tensor) -> mt.Tensor:
        mt.manual_seed(seed)
        return F.dropout(x, p)

    def check(out: np.ndarray, x: np.ndarray) -> None:
        kept = out != 0  # the inputs are nonzero, so a zero output was dropped
        assert kept.any() and not kept.all(), f"dropout(p={p}) kept {kept.sum()} of {kept.size}"
        np.testing.assert_allclose(out, x * kept / (1 - p), rtol=1e-12, atol=0)

    case(name, fn, None, Float((6, 7), "nonzero"), check=check)


case("dropout-p0", lambda x: F.dropout(x, 0.0), lambda x: x, Float((3, 4)))
case("dropout-eval", lambda x: F.dropout(x, 0.5, training=False), lambda x: x, Float((3, 4)))
case("dropout-p1", lambda x: F.dropout(x, 1.0), lambda x: np.zeros_like(x), Float((3, 4)))
dropout_case("dropout-p0.3", 0.3, seed=1234)
dropout_case("dropout-p0.6", 0.6, seed=99)

# --- scaled dot-product attention ---------------------------------------------------------
SDPA_BOOL_MASK = np.array([[True, False, True, True, False],  # (L, S) = (3, 5); every
                           [False, False, False, False, True],  # query sees some key
                           [True, True, True, True, True]])
SDPA_FLOAT_MASK = np.random.default_rng(7).standard_normal((2, 3, 5))


def attention_case(name: str, q: tuple, k: tuple, v: tuple, mask: Any = None,
                   float32: bool = False, **options: Any) -> None:
    inputs = [Float(q), Float(k), Float(v)]
    if mask is None:
        case(name, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **options),
             lambda q, k, v: attention_ref(q, k, v, causal=options.get("is_causal", False),
                                           scale=options.get("scale")),
             *inputs, float32=float32)
    else:
        case(name, lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
             lambda q, k, v, m: attention_ref(q, k, v, mask=m), *inputs, Const(mask))


attention_case("sdpa", (2, 3, 4), (2, 3, 4), (2, 3, 4), float32=True)
attention_case("sdpa-2d", (3, 4), (5, 4), (5, 2))
attention_case("sdpa-l-ne-s", (2, 3, 4), (2, 5, 4), (2, 5, 3))
attention_case("sdpa-causal", (2, 4, 3), (2, 4, 3), (2, 4, 2), is_causal=True)
attention_case("sdpa-causal-l-lt-s", (1, 3, 4), (1, 5, 4), (1, 5, 2), is_causal=True)
attention_case("sdpa-bool-mask", (2, 3, 4), (2, 5, 4), (2, 5, 3), mask=SDPA_BOOL_MASK)
attention_case("sdpa-float-mask", (2, 3, 4), (2, 5, 4), (2, 5, 3), mask=SDPA_FLOAT_MASK)
attention_case("sdpa-broadcast-batch", (2, 1, 3, 4), (3, 5, 4), (3, 5, 2))
attention_case("sdpa-scale", (2, 3, 4), (2, 5, 4), (2, 5, 3), scale=0.3)
# batch dims that only the value (and the mask) have: the scores broadcast up to them
attention_case("sdpa-value-batch", (3, 4), (5, 4), (2, 5, 2))
attention_case("sdpa-bool-mask-value-batch", (3, 4), (5, 4), (2, 5, 2),
               mask=np.stack([SDPA_BOOL_MASK, SDPA_BOOL_MASK[::-1]]))
attention_case("sdpa-float-mask-value-batch", (3, 4), (5, 4), (2, 5, 2), mask=SDPA_FLOAT_MASK)
# a float mask that requires grad (a learned additive bias) gets dS, summed over the dims
# it was broadcast along
for _name, _mask in (("sdpa-learned-mask", (2, 3, 5)), ("sdpa-learned-mask-broadcast", (3, 1))):
    case(_name, lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
         lambda q, k, v, m: attention_ref(q, k, v, mask=m),
         Float((2, 3, 4)), Float((2, 5, 4)), Float((2, 5, 3)), Float(_mask))
case("sdpa-learned-mask-scale", lambda q, k, v, m: F.scaled_dot_product_attention(
    q, k, v, attn_mask=m, scale=0.3), lambda q, k, v, m: attention_ref(q, k, v, mask=m, scale=0.3),
     Float((2, 3, 4), grad=False), Float((2, 5, 4), grad=False), Float((2, 5, 3)),
     Float((2, 3, 5)))


def packed_attention_ref(qkv: np.ndarray, n_head: int) -> np.ndarray:
    """Split (B, T, 3C) into q, k, v heads (B, nh, T, hs), attend causally, heads side by
    side again: (B, T, C)."""
    B, T, C3 = qkv.shape
    heads = qkv.reshape(B, T, 3, n_head, C3 // (3 * n_head)).transpose(2, 0, 3, 1, 4)
    out = attention_ref(*heads, causal=True)  # (B, nh, T, hs)
    return out.transpose(0, 2, 1, 3).reshape(B, T, C3 // 3)


for name, shape, n_head in (("packed-causal-attention", (2, 5, 12), 2),
                            ("packed-causal-attention-one-head", (1, 4, 9), 1),
                            ("packed-causal-attention-t1", (3, 1, 18), 3)):
    case(name, lambda qkv, n=n_head: F.packed_causal_attention(qkv, n),
         lambda qkv, n=n_head: packed_attention_ref(qkv, n), Float(shape), float32=True)



def grouped_attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_head: int,
                          n_kv_head: int) -> np.ndarray:
    """q (B, T, H hs), k, v (B, T, Hkv hs) split into heads, k and v repeated to the query's
    heads (query head h uses kv head h // (H / Hkv)), causal attention, heads side by side."""
    B, T, width = q.shape
    hs = width // n_head
    heads = lambda a, n: a.reshape(B, T, n, hs).transpose(0, 2, 1, 3)
    group = n_head // n_kv_head
    out = attention_ref(heads(q, n_head), np.repeat(heads(k, n_kv_head), group, axis=1),
                        np.repeat(heads(v, n_kv_head), group, axis=1), causal=True)
    return out.transpose(0, 2, 1, 3).reshape(B, T, width)


for name, (B, T, H, Hkv, hs) in (("grouped-causal-attention", (2, 5, 4, 2, 3)),
                                 ("grouped-causal-attention-mqa", (1, 4, 3, 1, 2)),
                                 ("grouped-causal-attention-mha", (2, 3, 2, 2, 4))):
    case(name, lambda q, k, v, h=H, g=Hkv: F.grouped_causal_attention(q, k, v, h, g),
         lambda q, k, v, h=H, g=Hkv: grouped_attention_ref(q, k, v, h, g),
         Float((B, T, H * hs)), Float((B, T, Hkv * hs)), Float((B, T, Hkv * hs)),
         float32=name.endswith("attention"))

# --- shape ops and views ------------------------------------------------------------------
X234 = Float((2, 3, 4))
case("transpose", lambda x: x.transpose(0, 2), lambda x: np.swapaxes(x, 0, 2), X234)
case("transpose-negative", lambda x: mt.transpose(x, -1, -2), lambda x: np.swapaxes(x, -1, -2),
     X234)
case("permute", lambda x: x.permute(2, 0, 1), lambda x: np.transpose(x, (2, 0, 1)), X234)
case("permute-negative", lambda x: mt.permute(x, (-1, 0, 1)),
     lambda x: np.transpose(x, (2, 0, 1)), X234)
case("T", lambda x: x.T, lambda x: x.T, X234)
case("mT", lambda x: x.mT, lambda x: np.swapaxes(x, -1, -2), X234)
case("t-2d", lambda x: x.t(), lambda x: x.T, Float((3, 5)))
case("unsqueeze", lambda x: x.unsqueeze(1), lambda x: np.expand_dims(x, 1), X234)
case("unsqueeze-negative", lambda x: mt.unsqueeze(x, -1), lambda x: np.expand_dims(x, -1), X234)
case("squeeze-all", lambda x: x.squeeze(), np.squeeze, Float((1, 3, 1, 4)))
case("squeeze-dim", lambda x: x.squeeze(2), lambda x: np.squeeze(x, 2), Float((1, 3, 1, 4)))
case("squeeze-dims-tuple", lambda x: mt.squeeze(x, (0, -2)), lambda x: np.squeeze(x, (0, 2)),
     Float((1, 3, 1, 4)))
case("squeeze-not-size1", lambda x: x.squeeze(1), lambda x: x, Float((1, 3, 1, 4)))
case("expand", lambda x: x.expand(3, 4), lambda x: np.broadcast_to(x, (3, 4)), Float((3, 1)))
case("expand-new-dims", lambda x: x.expand(2, -1, 4), lambda x: np.broadcast_to(x, (2, 3, 4)),
     Float((3, 1)))
case("expand-as", lambda x, y: x.expand_as(y) * y, lambda x, y: x * y, Float((1, 4)),
     Float((3, 4)))
case("reshape", lambda x: x.reshape(4, 6), lambda x: x.reshape(4, 6), X234)
case("reshape-infer", lambda x: mt.reshape(x, (-1, 3)), lambda x: x.reshape(-1, 3), X234)
# view needs strides it can express: run it on contiguous inputs only
case("view", lambda x: x.view(6, 4), lambda x: x.reshape(6, 4), X234, noncontiguous=False)
case("view-infer", lambda x: x.view(2, -1), lambda x: x.reshape(2, -1), X234,
     noncontiguous=False)
case("flatten", lambda x: x.flatten(), lambda x: x.reshape(-1), X234)
case("flatten-from-dim1", lambda x: x.flatten(1), lambda x: x.reshape(2, 12), X234)
case("flatten-range", lambda x: mt.flatten(x, 0, 1), lambda x: x.reshape(6, 4), X234)
case("narrow", lambda x: x.narrow(1, 1, 2), lambda x: x[:, 1:3], X234)
case("narrow-negative-start", lambda x: mt.narrow(x, -1, -3, 2), lambda x: x[..., 1:3], X234)

# basic indexing: views
X45 = Float((4, 5))
case("slice-steps", lambda x: x[1:, ::2], lambda x: x[1:, ::2], X45)
case("slice-negative", lambda x: x[-3:-1, -2], lambda x: x[-3:-1, -2], X45)
case("slice-int-negative", lambda x: x[-1], lambda x: x[-1], X45)
case("slice-ellipsis-none", lambda x: x[..., None, 1::3], lambda x: x[..., None, 1::3], X234)
case("slice-step-3d", lambda x: x[::2, 1, ::3], lambda x: x[::2, 1, ::3], X234)
# advanced indexing: copies whose backward scatter-adds (repeated indices add up)
INDEX_2x2 = np.array([[0, 1], [3, 3]])
ROW_MASK = np.array([True, False, True, True])
ELEMENT_MASK = np.array([[True, False, False, True, True], [False, False, True, False, False],
                         [True, True, True, True, True], [False, False, False, False, True]])
case("index-list-repeated", lambda x: x[[0, 2, 2]], lambda x: x[[0, 2, 2]], X45)
case("index-tensor", lambda x, i: x[i], lambda x, i: x[i], X45, Const(INDEX_2x2))
case("index-tensor-dim1", lambda x, i: x[:, i], lambda x, i: x[:, i], X45, Const(INDEX_2x2))
case("index-two-lists", lambda x: x[[0, 3, 0], [4, 1, 4]], lambda x: x[[0, 3, 0], [4, 1, 4]],
     X45)
case("index-bool-mask", lambda x, m: x[m], lambda x, m: x[m], X45, Const(ELEMENT_MASK))
case("index-bool-rows", lambda x, m: x[m], lambda x, m: x[m], X45, Const(ROW_MASK))
# PyTorch applies the ints first, then places the index arrays among the dims left: in
# x[1, :, i] the array stands alone and stays in place, (3, 2), where NumPy gives (2, 3)
INDEX_PAIR = np.array([0, 2])
case("index-int-slice-tensor", lambda x, i: x[1, :, i], lambda x, i: x[1][:, i], X234,
     Const(INDEX_PAIR))
case("index-int-none-tensor", lambda x, i: x[1, None, i], lambda x, i: x[1][None][:, i],
     X234, Const(INDEX_PAIR))
case("index-int-slice-two-tensors", lambda x, i: x[i, 1, :, i],
     lambda x, i: x[:, 1][i, :, i], Float((3, 2, 4, 5)), Const(INDEX_PAIR))
case("index-ellipsis-int-slice-tensor", lambda x, i: x[..., 1, :, i],
     lambda x, i: x[..., 1, :, :][..., :, i], Float((2, 3, 4, 5)), Const(INDEX_PAIR))
GATHER_DIM1 = np.array([[0, 0, 4], [1, 2, 1], [3, 3, 3], [4, 0, 2]])  # (4, 3) into (4, 5)
GATHER_DIM0 = np.array([[0, 3, 3, 1, 0], [2, 2, 0, 3, 1]])  # (2, 5) into (4, 5)
case("gather-dim1", lambda x, i: x.gather(1, i),
     lambda x, i: np.take_along_axis(x, i, axis=1), X45, Const(GATHER_DIM1))
case("gather-dim0", lambda x, i: mt.gather(x, 0, i),
     lambda x, i: np.take_along_axis(x, i, axis=0), X45, Const(GATHER_DIM0))
case("gather-dim-negative", lambda x, i: x.gather(-1, i),
     lambda x, i: np.take_along_axis(x, i, axis=-1), X45, Const(GATHER_DIM1))
# as PyTorch, the index may be smaller than the input in the other dims
case("gather-smaller-index", lambda x, i: x.gather(1, i),
     lambda x, i: np.take_along_axis(x[:2], i, axis=1), X45, Const(GATHER_DIM1[:2, :2]))

# several outputs, several inputs
case("split-int", lambda x: x.split(2, dim=1), lambda x: np.split(x, [2, 4], axis=1),
     Float((2, 5, 3)))
case("split-sizes", lambda x: mt.split(x, [1, 3, 1], dim=-2),
     lambda x: np.split(x, [1, 4], axis=1), Float((2, 5, 3)))
case("chunk", lambda x: x.chunk(3), lambda x: np.split(x, [2, 4], axis=0), Float((5, 4)))
case("chunk-dim", lambda x: mt.chunk(x, 2, dim=-1), lambda x: np.split(x, [2], axis=-1),
     Float((3, 4)))
case("cat", lambda a, b, c: mt.cat([a, b, c], dim=1),
     lambda a, b, c: np.concatenate([a, b, c], axis=1),
     Float((2, 1, 3)), Float((2, 3, 3)), Float((2, 2, 3)))
case("cat-negative-dim", lambda a, b: mt.cat((a, b), dim=-1),
     lambda a, b: np.concatenate([a, b], axis=-1), Float((3, 2)), Float((3, 5)))
case("stack", lambda a, b, c: mt.stack([a, b, c]), lambda a, b, c: np.stack([a, b, c]),
     Float((2, 3)), Float((2, 3)), Float((2, 3)))
case("stack-last", lambda a, b: mt.stack([a, b], dim=-1), lambda a, b: np.stack([a, b], -1),
     Float((2, 3)), Float((2, 3)))

# copies and casts
def row_major(t: mt.Tensor) -> mt.Tensor:
    """``t``, after checking that a copy op really gave a contiguous tensor."""
    assert t.is_contiguous(), f"strides {t.stride()} for shape {tuple(t.shape)}"
    return t


case("contiguous", lambda x: row_major(x.contiguous()), lambda x: x, X234)
case("clone", lambda x: row_major(x.clone()), lambda x: x, X234)
case("clone-functional", lambda x: row_major(mt.clone(x)), lambda x: x, X45)
# forward only: a float32 round trip is exactly NumPy's, and its gradient is not worth
# checking by finite differences at float32 precision
case("to-cast-chain", lambda x: x.to(mt.float32).to("float64"),
     lambda x: x.astype(np.float32).astype(np.float64), Float((3, 4), grad=False), rtol=0,
     atol=0)
case("to-same-dtype", lambda x: x.to(mt.float64).double(), lambda x: x, X45)

# --- losses, normalizations, grouped-query attention and einsum (issue 18) ----------------
def _log_softmax1(x: np.ndarray) -> np.ndarray:
    return log_softmax_ref(x, axis=1)


def nll_ref(logp: np.ndarray, target: np.ndarray, weight: Optional[np.ndarray] = None,
            ignore_index: int = -100, reduction: str = "mean") -> np.ndarray:
    """torch.nn.functional.nll_loss: -w[t] logp[t], the mean divided by the summed weights."""
    if logp.ndim > 2:
        logp = np.moveaxis(logp, 1, -1).reshape(-1, logp.shape[1])
    flat = target.reshape(-1)
    valid = flat != ignore_index
    safe = np.where(valid, flat, 0)
    w = (weight[safe] if weight is not None else np.ones(flat.shape)) * valid
    loss = -logp[np.arange(flat.size), safe] * w
    if reduction == "none":
        return loss.reshape(target.shape)
    return loss.sum() if reduction == "sum" else loss.sum() / w.sum()


def soft_cross_entropy_ref(x: np.ndarray, p: np.ndarray, smoothing: float = 0.0) -> np.ndarray:
    p = p * (1 - smoothing) + smoothing / x.shape[1]
    return -(log_softmax_ref(x, axis=1) * p).sum(axis=1).mean()


def bce_logits_ref(x: np.ndarray, t: np.ndarray, pw: Optional[np.ndarray] = None) -> np.ndarray:
    pw = 1.0 if pw is None else pw
    log_sig = -np.logaddexp(0, -x)
    log_one_minus = -np.logaddexp(0, x)
    return -(pw * t * log_sig + (1 - t) * log_one_minus).mean()


def rms_norm_ref(x: np.ndarray, ndims: int, weight: Optional[np.ndarray] = None,
                 eps: float = 1e-6) -> np.ndarray:
    axes = tuple(range(x.ndim - ndims, x.ndim))
    y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    return y * weight if weight is not None else y


def repeated_heads_attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                                 causal: bool = False) -> np.ndarray:
    group = q.shape[-3] // k.shape[-3]
    return attention_ref(q, np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3),
                         causal=causal)


_W4 = np.array([0.5, 2.0, 1.0, 1.5])
for _red in ("mean", "sum", "none"):
    case(f"nll-loss-weighted-{_red}",
         lambda x, t, w, r=_red: F.nll_loss(x, t, mt.tensor(w), reduction=r),
         lambda x, t, w, r=_red: nll_ref(x, t, w, reduction=r),
         Float((5, 4)), Const(np.array([0, 3, 1, -100, 2])), Const(_W4))
case("nll-loss-3d", lambda x, t: F.nll_loss(x, t), nll_ref, Float((2, 4, 3)),
     Const(np.array([[0, 3, 1], [2, 2, 0]])))
case("cross-entropy-weighted", lambda x, t, w: F.cross_entropy(x, t, weight=mt.tensor(w)),
     lambda x, t, w: nll_ref(_log_softmax1(x), t, w), Float((5, 4)),
     Const(np.array([0, 3, 1, 1, 2])), Const(_W4))
case("cross-entropy-probabilities", lambda x, p: F.cross_entropy(x, p, label_smoothing=0.1),
     lambda x, p: soft_cross_entropy_ref(x, p, 0.1), Float((5, 4)), Float((5, 4), "positive"))
case("binary-cross-entropy", lambda x, t: F.binary_cross_entropy(F.sigmoid(x), t),
     lambda x, t: bce_logits_ref(x, t), Float((3, 5)), Float((3, 5), "positive", grad=False))
case("binary-cross-entropy-with-logits",
     lambda x, t, pw: F.binary_cross_entropy_with_logits(x, t, pos_weight=pw),
     lambda x, t, pw: bce_logits_ref(x, t, pw), Float((3, 5)), Float((3, 5), "positive"),
     Float((5,), "positive", grad=False))
case("rms-norm", lambda x, w: F.rms_norm(x, (5,), w, eps=1e-6),
     lambda x, w: rms_norm_ref(x, 1, w), Float((3, 5)), Float((5,)), float32=True)
case("rms-norm-2dims", lambda x: F.rms_norm(x, (3, 5), eps=1e-6),
     lambda x: rms_norm_ref(x, 2), Float((2, 3, 5)))
case("normalize", lambda x: F.normalize(x, dim=-1),
     lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True), Float((3, 5), "nonzero"))
case("normalize-p1", lambda x: F.normalize(x, p=1, dim=0),
     lambda x: x / np.abs(x).sum(axis=0, keepdims=True), Float((3, 5), "distinct", 0.05))
# p = 0 counts the nonzero entries (PyTorch's vector_norm; it raised ZeroDivisionError here),
# inf and -inf take the largest and smallest |x|, any other p the sum of |x|^p
case("normalize-p0", lambda x: F.normalize(x, p=0, dim=1),
     lambda x: x / np.maximum(np.count_nonzero(x, axis=1, keepdims=True), 1e-12),
     Float((3, 5), "distinct", 0.05))
case("normalize-p3", lambda x: F.normalize(x, p=3, dim=-1),
     lambda x: x / (np.abs(x) ** 3).sum(axis=-1, keepdims=True) ** (1 / 3),
     Float((3, 5), "nonzero"))
case("normalize-p-inf", lambda x: F.normalize(x, p=math.inf, dim=1),
     lambda x: x / np.abs(x).max(axis=1, keepdims=True), Float((3, 5), "distinct", 0.05))
case("normalize-p-minus-inf", lambda x: F.normalize(x, p=-math.inf, dim=1),
     lambda x: x / np.abs(x).min(axis=1, keepdims=True), Float((3, 5), "distinct", 0.05))
case("sdpa-gqa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
     repeated_heads_attention_ref, Float((2, 6, 3, 4)), Float((2, 2, 5, 4)),
     Float((2, 2, 5, 3)))
case("sdpa-gqa-causal",
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
     lambda q, k, v: repeated_heads_attention_ref(q, k, v, causal=True), Float((4, 5, 3)),
     Float((2, 5, 3)), Float((2, 5, 3)))
for _eq, _shapes in (("ij,jk->ik", [(3, 4), (4, 5)]),
                     ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
                     ("...d,ed->...e", [(2, 3, 4), (5, 4)]),
                     ("bte,eo,bt->bo", [(2, 3, 4), (4, 5), (2, 3)]),
                     ("ij->ji", [(3, 4)]),
                     ("ij,ij", [(3, 4), (3, 4)]),
                     ("bii,bi->b", [(2, 4, 4), (2, 4)])):
    case(f"einsum-{_eq}", lambda *ts, e=_eq: mt.einsum(e, *ts),
         lambda *arrays, e=_eq: np.einsum(e, *arrays), *(Float(s) for s in _shapes))

# --- logsumexp, prod, cumprod, var_mean/std_mean ------------------------------------------
def logsumexp_ref(x: np.ndarray, axis: Any, keepdims: bool = False) -> np.ndarray:
    peak = x.max(axis=axis, keepdims=True)
    out = np.log(np.exp(x - peak).sum(axis=axis, keepdims=True)) + peak
    return out if keepdims else np.squeeze(out, axis)


for _tag, _dim in (("dim1", 1), ("dim-neg", -1), ("dims-tuple", (0, 2))):
    for _keepdim in (False, True):
        case(f"logsumexp-{_tag}-{'keepdim' if _keepdim else 'nokeepdim'}",
             lambda x, d=_dim, k=_keepdim: x.logsumexp(d, keepdim=k),
             lambda x, d=_dim, k=_keepdim: logsumexp_ref(x, d, k), Float((2, 3, 5)),
             float32=_tag == "dim1" and not _keepdim)
case("logsumexp-large", lambda x: mt.logsumexp(x * 400.0, 0),
     lambda x: logsumexp_ref(x * 400.0, 0), Float((3, 4)))
# zeros come from a fixed mask (x * mask), so gradcheck crosses prod's zero branches:
# rows of ZERO_COUNTS hold no, one and two zeros
ZERO_COUNTS = np.array([[1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0, 1.0],
                        [0.0, 1.0, 1.0, 0.0, 1.0]])
case("prod-all", lambda x: x.prod(), np.prod, Float((3, 5), "nonzero"))
for _dim in (0, 1, -1):
    case(f"prod-dim{_dim}", lambda x, d=_dim: mt.prod(x, d), lambda x, d=_dim: np.prod(x, d),
         Float((2, 3, 5), "nonzero"))
case("prod-keepdim", lambda x: x.prod(1, keepdim=True), lambda x: np.prod(x, 1, keepdims=True),
     Float((3, 5)))
case("prod-zeros-rows", lambda x, m: (x * m).prod(1), lambda x, m: np.prod(x * m, 1),
     Float((3, 5)), Const(ZERO_COUNTS))
case("prod-zeros-cols", lambda x, m: (x * m).prod(0), lambda x, m: np.prod(x * m, 0),
     Float((3, 5)), Const(ZERO_COUNTS))
case("prod-zeros-all-one", lambda x, m: (x * m[1]).prod(), lambda x, m: np.prod(x * m[1]),
     Float((5,)), Const(ZERO_COUNTS))
case("prod-zeros-all-two", lambda x, m: (x * m).prod(), lambda x, m: np.prod(x * m),
     Float((3, 5)), Const(ZERO_COUNTS))
for _dim in (0, 1, -1):
    case(f"cumprod-dim{_dim}", lambda x, d=_dim: x.cumprod(d), lambda x, d=_dim: np.cumprod(x, d),
         Float((2, 3, 5), "nonzero"))
case("cumprod-1d", lambda x: mt.cumprod(x, 0), np.cumprod, Float((7,), "nonzero"))
case("cumprod-zeros", lambda x, m: (x * m).cumprod(1), lambda x, m: np.cumprod(x * m, 1),
     Float((3, 5)), Const(ZERO_COUNTS))
case("cumprod-zeros-dim0", lambda x, m: mt.cumprod(x * m.T, 0),
     lambda x, m: np.cumprod(x * m.T, 0), Float((5, 3)), Const(ZERO_COUNTS))
case("var-mean-dim", lambda x: mt.var_mean(x, 1),
     lambda x: (np.var(x, 1, ddof=1), np.mean(x, 1)), Float((3, 5)))
case("var-mean-all-c0", lambda x: mt.var_mean(x, correction=0),
     lambda x: (np.var(x), np.mean(x)), Float((3, 5)))
case("std-mean-dims-keepdim", lambda x: mt.std_mean(x, (0, 2), keepdim=True),
     lambda x: (np.std(x, (0, 2), ddof=1, keepdims=True), np.mean(x, (0, 2), keepdims=True)),
     Float((2, 3, 5)))
case("sum-dtype", lambda x: x.sum(1, dtype=mt.float64), lambda x: x.sum(1), Float((3, 5)))

# --- repeat, flip, roll, unflatten, pad ---------------------------------------------------
X35 = Float((3, 5))
case("repeat", lambda x: x.repeat(2, 3), lambda x: np.tile(x, (2, 3)), X35)
case("repeat-new-dims", lambda x: mt.repeat(x, 2, 1, 3), lambda x: np.tile(x, (2, 1, 3)), X35)
case("repeat-interleave-int", lambda x: x.repeat_interleave(3, dim=1),
     lambda x: np.repeat(x, 3, 1), X35)
case("repeat-interleave-flat", lambda x: mt.repeat_interleave(x, 2), lambda x: np.repeat(x, 2),
     X35)
case("repeat-interleave-tensor", lambda x, r: x.repeat_interleave(r, dim=0),
     lambda x, r: np.repeat(x, r, 0), X35, Const(np.array([2, 0, 3])))
case("flip", lambda x: x.flip(0), lambda x: np.flip(x, 0), X234)
case("flip-dims", lambda x: mt.flip(x, (0, -1)), lambda x: np.flip(x, (0, 2)), X234)
case("roll", lambda x: x.roll(2, 1), lambda x: np.roll(x, 2, 1), X35)
case("roll-tuples", lambda x: mt.roll(x, (1, -2), (0, 2)), lambda x: np.roll(x, (1, -2), (0, 2)),
     X234)
case("roll-flat", lambda x: x.roll(-4), lambda x: np.roll(x, -4), X35)
case("unflatten", lambda x: x.unflatten(2, (2, 2)), lambda x: x.reshape(2, 3, 2, 2), X234)
case("unflatten-infer", lambda x: mt.unflatten(x, 0, (-1, 1)), lambda x: x.reshape(3, 1, 5), X35)
case("pad-constant", lambda x: F.pad(x, (1, 2)), lambda x: np.pad(x, ((0, 0), (1, 2))), X35)
case("pad-constant-3d-value", lambda x: F.pad(x, (0, 1, 2, 0, 1, 1), value=-0.5),
     lambda x: np.pad(x, ((1, 1), (2, 0), (0, 1)), constant_values=-0.5), X234)
case("pad-constant-crop", lambda x: F.pad(x, (-1, 2, 1, -2)),
     lambda x: np.pad(x, ((1, 0), (0, 2)))[:-2, 1:], X35)
case("pad-reflect", lambda x: F.pad(x, (2, 3), mode="reflect"),
     lambda x: np.pad(x, ((0, 0), (2, 3)), mode="reflect"), X35)
case("pad-reflect-2d", lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"),
     lambda x: np.pad(x, ((0, 0), (2, 1), (1, 2)), mode="reflect"), X234)
case("pad-replicate-2d", lambda x: F.pad(x, (3, 1, 0, 2), mode="replicate"),
     lambda x: np.pad(x, ((0, 0), (0, 2), (3, 1)), mode="edge"), X234)


# --- scatter, scatter_add, scatter_reduce, masked_select ----------------------------------
def scatter_ref(a: np.ndarray, dim: int, index: np.ndarray, src: Any, reduce: str = "set",
                include_self: bool = True) -> np.ndarray:
    """torch's scatter family element by element (the table's sizes are small)."""
    out = a.copy()
    groups: dict = {}
    for pos in np.ndindex(*index.shape):
        target = list(pos)
        target[dim] = index[pos]
        value = src if np.isscalar(src) else src[pos]
        groups.setdefault(tuple(target), []).append(value)
    for target, values in groups.items():
        if reduce == "set":
            out[target] = values[-1]
            continue
        values = ([a[target]] if include_self else []) + values
        out[target] = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "amax": np.max,
                       "amin": np.min}[reduce](values)
    return out


SCATTER_DIM1 = np.array([[0, 4, 2], [1, 3, 0], [4, 0, 2]])  # distinct per row: (3, 3) into (3, 5)
SCATTER_REPEATS = np.array([[0, 0, 3], [2, 2, 2], [4, 1, 4]])  # positions repeat in a row
case("scatter-src", lambda x, s, i: x.scatter(1, i, s),
     lambda x, s, i: scatter_ref(x, 1, i, s), X35, Float((3, 3)), Const(SCATTER_DIM1))
case("scatter-value", lambda x, i: mt.scatter(x, 1, i, value=1.5),
     lambda x, i: scatter_ref(x, 1, i, 1.5), X35, Const(SCATTER_DIM1[:2]))
case("scatter-add", lambda x, s, i: x.scatter_add(1, i, s),
     lambda x, s, i: scatter_ref(x, 1, i, s, "sum"), X35, Float((3, 3)), Const(SCATTER_REPEATS))
case("scatter-add-dim0", lambda x, s, i: mt.scatter_add(x, 0, i, s),
     lambda x, s, i: scatter_ref(x, 0, i, s, "sum"), Float((5, 3)), Float((3, 3)),
     Const(SCATTER_REPEATS))
for _reduce in ("sum", "prod", "mean", "amax", "amin"):
    for _self in (True, False):
        # distinct values: amax/amin's gradient goes to one element, never a tie
        case(f"scatter-reduce-{_reduce}-{'self' if _self else 'noself'}",
             lambda x, s, i, r=_reduce, inc=_self: x.scatter_reduce(1, i, s, r, include_self=inc),
             lambda x, s, i, r=_reduce, inc=_self: scatter_ref(x, 1, i, s, r, inc),
             Float((3, 5), "distinct"), Float((3, 3), "distinct", offset=0.05),
             Const(SCATTER_REPEATS))
case("masked-select", lambda x, m: x.masked_select(m), lambda x, m: x[m], Float((4, 5)),
     Const(ELEMENT_MASK))
case("masked-select-broadcast", lambda x, m: mt.masked_select(x, m),
     lambda x, m: np.broadcast_to(x, m.shape)[m], Float((1, 5)), Const(ELEMENT_MASK))


# --- the Llama ops: rms_norm (above), swiglu, rotary (ops/activations.py, ops/rotary.py) ---
def swiglu_ref(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return g * _sigmoid_ref(g) * u


def rotary_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
               inverse: bool = False) -> np.ndarray:
    """The rotate-half rotation of x (..., T, H, D) by (T, D/2) tables."""
    h = x.shape[-1] // 2
    c, s = cos[:, None, :], (-sin if inverse else sin)[:, None, :]
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


case("swiglu-odd", F.swiglu, swiglu_ref, Float((3, 5)), Float((3, 5)), float32=True)
case("swiglu-3d", F.swiglu, swiglu_ref, Float((2, 3, 4)), Float((2, 3, 4)))
case("swiglu-0d", F.swiglu, swiglu_ref, Float(()), Float(()))
case("swiglu-large", lambda g, u: F.swiglu(g * 30, u), lambda g, u: swiglu_ref(g * 30, u),
     Float((3, 5)), Float((3, 5)))
# the tables are drawn at random (the rotation is linear in them): cos and sin are
# constants, so they never require grad and only x is gradchecked
for _name, _shape in (("apply-rotary-bthd", (2, 3, 2, 6)), ("apply-rotary-thd", (3, 2, 4)),
                      ("apply-rotary-5d", (2, 1, 3, 2, 4))):
    _half = (_shape[-3], _shape[-1] // 2)
    case(_name, F.apply_rotary, rotary_ref, Float(_shape), Float(_half, grad=False),
         Float(_half, grad=False), float32=_name.endswith("bthd"))
case("apply-rotary-inverse", lambda x, c, s: F.apply_rotary(x, c, s, inverse=True),
     lambda x, c, s: rotary_ref(x, c, s, inverse=True), Float((2, 3, 2, 6)),
     Float((3, 3), grad=False), Float((3, 3), grad=False))
case("rms-norm-3d-weight", lambda x, w: F.rms_norm(x, 6, w, eps=1e-6),
     lambda x, w: rms_norm_ref(x, 1, w), Float((2, 3, 6)), Float((6,)))

_names = [c.name for c in CASES]
if len(set(_names)) != len(_names):
    raise ValueError(f"op_table: duplicate case names "
                     f"{sorted({n for n in _names if _names.count(n) > 1})}")
