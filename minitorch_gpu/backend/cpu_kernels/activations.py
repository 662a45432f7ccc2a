"""GELU (GPT-2's tanh form) and SwiGLU, forward and backward, one pass each.

GELU's tanh form is written through the sigmoid: 0.5 (1 + tanh(u)) = sigmoid(2u), so
    gelu(x) = x / (1 + e),  e = exp(-2u),  u = sqrt(2/pi) (x + 0.044715 x^3),
    gelu'(x) = s + 2 x s (1 - s) u',  s = 1 / (1 + e),  1 - s = e s,
one exp per element and no cancellation where x is very negative (the tanh form's 1 +
tanh(u) loses every digit there). Backward recomputes s from x instead of reading a saved
derivative: one exp costs less than the bytes of saving it.

SwiGLU: y = gate * s * up with s = sigmoid(gate); d/dgate = dy up s (1 + gate (1 - s)),
d/dup = dy gate s, s again recomputed.
"""
from __future__ import annotations

import math
from typing import Any, Tuple

import numpy as np

from .compiler import exp32, jit, split_rows

_C = np.float32(math.sqrt(2.0 / math.pi))  # u = C (x + K x^3)
_K = np.float32(0.044715)
_MINUS_2C = np.float32(-2.0 * math.sqrt(2.0 / math.pi))
_3K = np.float32(3 * 0.044715)
_ONE, _TWO = np.float32(1.0), np.float32(2.0)
# e = exp(-2u) is capped at exp(60) (where x < -8 and gelu, gelu' < 1e-25): the compiler
# may reorder a product of several factors, and e near float32's top times x and u' would
# overflow to inf before s^2 took it back to 0 (inf * 0 = nan)
_EXP_CAP = np.float32(60.0)


def _is_float32(*arrays: Any) -> bool:
    return all(type(a) is np.ndarray and a.dtype == np.float32 for a in arrays)


def supports_gelu(x: Any, approximate: str = "tanh") -> bool:
    """A float32 NumPy array, the tanh form (the erf form stays with the NumPy code)."""
    return approximate == "tanh" and _is_float32(x) and x.size > 0


@jit
def _gelu_forward(x, y):  # pragma: no cover - compiled
    for i in range(x.size):
        v = x[i]
        y[i] = v / (_ONE + exp32(min(_MINUS_2C * (v + _K * (v * v * v)), _EXP_CAP)))


@jit
def _gelu_backward(x, dy, dx):  # pragma: no cover - compiled
    for i in range(x.size):
        v = x[i]
        v2 = v * v
        e = exp32(min(_MINUS_2C * (v + _K * (v2 * v)), _EXP_CAP))
        s = _ONE / (_ONE + e)
        du = _C * (_ONE + _3K * v2)
        dx[i] = dy[i] * (s + _TWO * v * s * (e * s) * du)


def _flat(array: Any) -> Any:
    return np.ascontiguousarray(array).reshape(-1)


def gelu_forward(x: Any, approximate: str = "tanh") -> Any:
    """GELU of float32 ``x`` (tanh form), a new array of its shape."""
    _check_form("gelu_forward", approximate)
    flat = _flat(x)
    y = np.empty_like(flat)
    split_rows(flat.size, 1, lambda a, b: _gelu_forward(flat[a:b], y[a:b]))
    return y.reshape(x.shape)


def gelu_backward(x: Any, dy: Any, approximate: str = "tanh") -> Any:
    """``dy * gelu'(x)``, float32 of one shape."""
    _check_form("gelu_backward", approximate)
    _check_same("gelu_backward", x, dy=dy)
    xf, gf = _flat(x), _flat(dy)
    dx = np.empty_like(xf)
    split_rows(xf.size, 1, lambda a, b: _gelu_backward(xf[a:b], gf[a:b], dx[a:b]))
    return dx.reshape(x.shape)


def supports_swiglu(gate: Any, up: Any) -> bool:
    """float32 NumPy gate and up of one shape."""
    return _is_float32(gate, up) and gate.shape == up.shape and gate.size > 0


@jit
def _swiglu_forward(gate, up, y):  # pragma: no cover - compiled
    for i in range(gate.size):
        g = gate[i]
        y[i] = g / (_ONE + exp32(-g)) * up[i]


@jit
def _swiglu_backward(dy, gate, up, d_gate, d_up):  # pragma: no cover
    for i in range(gate.size):
        g = gate[i]
        s = _ONE / (_ONE + exp32(-g))
        d = dy[i]
        d_up[i] = d * g * s
        d_gate[i] = d * up[i] * s * (_ONE + g * (_ONE - s))


def swiglu_forward(gate: Any, up: Any) -> Any:
    """silu(gate) * up for float32 arrays of one shape."""
    _check_same("swiglu_forward", gate, up=up)
    g, u = _flat(gate), _flat(up)
    y = np.empty_like(g)
    split_rows(g.size, 1, lambda a, b: _swiglu_forward(g[a:b], u[a:b], y[a:b]))
    return y.reshape(gate.shape)


def swiglu_backward(dy: Any, gate: Any, up: Any) -> Tuple[Any, Any]:
    """(d gate, d up) of ``swiglu_forward`` for the output gradient ``dy``."""
    _check_same("swiglu_backward", gate, up=up, dy=dy)
    g, u, d = _flat(gate), _flat(up), _flat(dy)
    d_gate, d_up = np.empty_like(g), np.empty_like(g)
    split_rows(g.size, 1, lambda a, b: _swiglu_backward(
        d[a:b], g[a:b], u[a:b], d_gate[a:b], d_up[a:b]))
    return d_gate.reshape(gate.shape), d_up.reshape(gate.shape)


def _check_form(op: str, approximate: str) -> None:
    if approximate != "tanh":
        raise ValueError(f"{op}: the CPU kernel computes approximate='tanh' only, got "
                         f"{approximate!r}")


def _check_same(op: str, first: Any, **others: Any) -> None:
    """float32 NumPy arrays, all of ``first``'s shape."""
    for name, a in (("input", first), *others.items()):
        if not _is_float32(a):
            raise TypeError(f"{op}: {name} must be a float32 NumPy array, got "
                            f"{type(a).__name__} of {getattr(a, 'dtype', None)}")
        if a.shape != first.shape:
            raise ValueError(f"{op}: {name} has shape {tuple(a.shape)}, expected "
                             f"{tuple(first.shape)}")
