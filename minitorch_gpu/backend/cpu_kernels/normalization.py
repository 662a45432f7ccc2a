"""Layer norm and RMS norm, forward and backward, a row at a time.

Forward reads each row once into the core's cache and writes it once: the statistics
(mean and 1/std, or 1/rms) come from the cached row, and only they are saved besides the
input. Backward reads x and the gradient once per row: the row sums it needs and dx from
the cached row, and the weight's (and bias's) gradients as column sums accumulated per
piece of rows in float64, the pieces added at the end. Rows are split over the cores for
long inputs (``compiler.split_rows``).

    layer norm: x_hat = (x - mean) rstd,  y = x_hat w + b,
                dx = rstd (g_hat - mean(g_hat) - x_hat mean(g_hat x_hat)),  g_hat = g w
    RMS norm:   y = x rstd w,  dx = rstd g_hat - x rstd^3 mean(g_hat x)
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np

from .activations import _is_float32
from .compiler import jit, split_rows

_ONE = np.float32(1.0)


def _rows(x: Any, n: int) -> Any:
    return np.ascontiguousarray(x).reshape(-1, n)


def _vector(p: Optional[Any], n: int, fill: float) -> Any:
    """A weight or bias as a contiguous (n,) float32 array (fill where there is none)."""
    if p is None:
        return np.full(n, fill, dtype=np.float32)
    return np.ascontiguousarray(p).reshape(n)


def _column_sums(parts: list, shape: tuple) -> Any:
    total = parts[0]
    for more in parts[1:]:
        total += more
    return total.astype(np.float32).reshape(shape)


def supports_layer_norm(x: Any, weight: Optional[Any], bias: Optional[Any]) -> bool:
    """float32 NumPy input, weight and bias (either may be None)."""
    return _is_float32(x, *(p for p in (weight, bias) if p is not None)) and x.size > 0


@jit
def _layer_norm_forward(x, w, b, eps, y, mean, rstd, start, stop):  # pragma: no cover
    n = x.shape[1]
    for r in range(start, stop):
        xr, yr = x[r], y[r]  # rows as 1-D views: indices from 0 vectorise (no wraparound)
        total = np.float32(0.0)
        for j in range(n):
            total += xr[j]
        m = total / n
        var = np.float32(0.0)
        for j in range(n):
            d = xr[j] - m
            var += d * d
        s = _ONE / np.sqrt(var / n + eps)
        mean[r] = m
        rstd[r] = s
        for j in range(n):
            yr[j] = (xr[j] - m) * s * w[j] + b[j]


@jit
def _layer_norm_backward(g, x, w, mean, rstd, dx, dw, db, start, stop):  # pragma: no cover
    n = x.shape[1]
    for r in range(start, stop):
        xr, gr, dxr = x[r], g[r], dx[r]
        m, s = mean[r], rstd[r]
        sum_g = np.float32(0.0)
        sum_gx = np.float32(0.0)
        for j in range(n):
            x_hat = (xr[j] - m) * s
            g_hat = gr[j] * w[j]
            sum_g += g_hat
            sum_gx += g_hat * x_hat
            dw[j] += gr[j] * x_hat
            db[j] += gr[j]
        sum_g /= n
        sum_gx /= n
        for j in range(n):
            x_hat = (xr[j] - m) * s
            dxr[j] = s * (gr[j] * w[j] - sum_g - x_hat * sum_gx)


def layer_norm_forward(x: Any, weight: Optional[Any], bias: Optional[Any], eps: float,
                       n_axes: int) -> Tuple[Any, Any, Any]:
    """(y, mean, rstd) over the last ``n_axes`` dims of float32 ``x``; mean and rstd
    (rows,)."""
    n = math.prod(x.shape[x.ndim - n_axes:])
    rows = _rows(x, n)
    w, b = _vector(weight, n, 1.0), _vector(bias, n, 0.0)
    y = np.empty_like(rows)
    mean = np.empty(rows.shape[0], dtype=np.float32)
    rstd = np.empty_like(mean)
    eps = np.float32(eps)
    split_rows(rows.shape[0], n,
               lambda a, c: _layer_norm_forward(rows, w, b, eps, y, mean, rstd, a, c))
    return y.reshape(x.shape), mean, rstd


def layer_norm_backward(grad: Any, x: Any, weight: Optional[Any], mean: Any, rstd: Any,
                        n_axes: int) -> Tuple[Any, Any, Any]:
    """(dx, dweight, dbias) from ``layer_norm_forward``'s mean and rstd; dweight and
    dbias None where there is no weight."""
    n = math.prod(x.shape[x.ndim - n_axes:])
    rows, g = _rows(x, n), _rows(grad, n)
    w = _vector(weight, n, 1.0)
    dx = np.empty_like(rows)
    parts_w, parts_b = [], []

    def piece(a: int, c: int) -> None:
        dw, db = np.zeros(n), np.zeros(n)  # float64 column sums of this piece
        parts_w.append(dw)
        parts_b.append(db)
        _layer_norm_backward(g, rows, w, mean, rstd, dx, dw, db, a, c)

    split_rows(rows.shape[0], n, piece)
    if weight is None:
        return dx.reshape(x.shape), None, None
    return (dx.reshape(x.shape), _column_sums(parts_w, weight.shape),
            _column_sums(parts_b, weight.shape))


def supports_rms_norm(x: Any, weight: Optional[Any]) -> bool:
    """float32 NumPy input and weight (or None)."""
    return _is_float32(x, *(p for p in (weight,) if p is not None)) and x.size > 0


@jit
def _rms_norm_forward(x, w, eps, y, rstd, start, stop):  # pragma: no cover - compiled
    n = x.shape[1]
    for r in range(start, stop):
        xr, yr = x[r], y[r]
        total = np.float32(0.0)
        for j in range(n):
            total += xr[j] * xr[j]
        s = _ONE / np.sqrt(total / n + eps)
        rstd[r] = s
        for j in range(n):
            yr[j] = xr[j] * s * w[j]


@jit
def _rms_norm_backward(g, x, w, rstd, dx, dw, start, stop):  # pragma: no cover
    n = x.shape[1]
    for r in range(start, stop):
        xr, gr, dxr = x[r], g[r], dx[r]
        s = rstd[r]
        dot = np.float32(0.0)
        for j in range(n):
            dot += gr[j] * w[j] * xr[j]
            dw[j] += gr[j] * xr[j] * s
        c = s * s * s * dot / n
        for j in range(n):
            dxr[j] = s * gr[j] * w[j] - xr[j] * c


def rms_norm_forward(x: Any, weight: Optional[Any], eps: float, n: int) -> Tuple[Any, Any]:
    """(y, rstd) over rows of ``n`` elements of float32 ``x``; rstd (rows,)."""
    rows = _rows(x, n)
    w = _vector(weight, n, 1.0)
    y = np.empty_like(rows)
    rstd = np.empty(rows.shape[0], dtype=np.float32)
    eps = np.float32(eps)
    split_rows(rows.shape[0], n, lambda a, c: _rms_norm_forward(rows, w, eps, y, rstd, a, c))
    return y.reshape(x.shape), rstd


def rms_norm_backward(grad: Any, x: Any, weight: Optional[Any], rstd: Any,
                      n: int) -> Tuple[Any, Optional[Any]]:
    """(dx, dweight) from ``rms_norm_forward``'s rstd; dweight None without a weight."""
    rows, g = _rows(x, n), _rows(grad, n)
    w = _vector(weight, n, 1.0)
    dx = np.empty_like(rows)
    parts = []

    def piece(a: int, c: int) -> None:
        dw = np.zeros(n)
        parts.append(dw)
        _rms_norm_backward(g, rows, w, rstd, dx, dw, a, c)

    split_rows(rows.shape[0], n, piece)
    return dx.reshape(x.shape), (_column_sums(parts, weight.shape) if weight is not None
                                 else None)
