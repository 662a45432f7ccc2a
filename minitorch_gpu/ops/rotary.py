"""Rotary position embeddings (RoPE), Llama's and Hugging Face's "rotate-half" convention.

For a head of dim D (even) and h = D / 2:

    inv_freq[i] = theta ** (-2 i / D),   i < h
    angle(p, i) = p * inv_freq[i]        (p: the token's position)
    x = [x1 | x2]                        (the head's first and second halves)
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin

which is Hugging Face's ``q * cos + rotate_half(q) * sin`` with cos and sin repeated over
both halves (``torch.cat((freqs, freqs), -1)``); element i of the head is paired with
element i + h, not with its neighbour (Meta's original interleaved-complex form pairs
2i with 2i + 1: a checkpoint converted by Hugging Face has its q/k rows permuted for this
one). The tables here are (T, h): the half that is not repeated.

``rotary_tables`` computes cos and sin in float64 and casts them once, so large positions
keep their angle (Hugging Face computes inv_freq and the angles in float32; at position
4,096 that moves an angle by about 1e-4). ``RotaryTables`` is the cache a model keeps:
one table per (dtype, device) up to a capacity of positions, sliced (a view) per call.

``apply_rotary`` is one Function: it reads q or k as stored (a strided head view of a
projection, bf16 under autocast), computes in float32 or wider, and returns a new
contiguous array of the input's dtype. The backward is the same rotation by the
negative angle; cos and sin are constants and get no gradient.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import numpy as np

from ..autograd import Function
from ..backend import dtypes, get_backend
from ..backend.threads import row_pieces, run_split
from ..tensor import Tensor
from ._util import require_float, require_tensor, widened, work_dtype
from .embedding import embedding


def _positions(positions_or_length: Any, start: int) -> np.ndarray:
    """The positions as float64 host values: ``start`` .. ``start + T - 1`` for a length T,
    else the given integer positions plus ``start``."""
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
        raise ValueError(f"rotary_tables: start must be an int >= 0, got {start!r}")
    if isinstance(positions_or_length, (int, np.integer)) and \
            not isinstance(positions_or_length, bool):
        if positions_or_length < 0:
            raise ValueError(f"rotary_tables: length must be >= 0, got {positions_or_length}")
        return np.arange(start, start + positions_or_length, dtype=np.float64)
    if isinstance(positions_or_length, Tensor):
        positions = positions_or_length._backend.to_numpy(positions_or_length.data)
    else:
        positions = np.asarray(positions_or_length)
    if positions.ndim != 1 or (positions.size and positions.dtype.kind not in "iu"):
        raise ValueError(f"rotary_tables: expected a length (int) or a 1-D sequence of "
                         f"integer positions, got {type(positions_or_length).__name__} of "
                         f"shape {positions.shape} and dtype {positions.dtype}")
    return positions.astype(np.float64) + start


def _angles(positions: np.ndarray, head_dim: int, theta: float) -> np.ndarray:
    """(T, head_dim // 2) float64 angles, after checking head_dim and theta."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or \
            head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rotary_tables: head_dim must be an even int > 0, got {head_dim!r}")
    if not (isinstance(theta, (int, float, np.number)) and math.isfinite(theta) and theta > 0):
        raise ValueError(f"rotary_tables: theta must be a finite number > 0, got {theta!r}")
    inv_freq = float(theta) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    return np.outer(positions, inv_freq)


def rotary_tables(positions_or_length: Union[int, Sequence[int], Tensor], head_dim: int,
                  theta: float = 10000.0, *, start: int = 0, dtype: Any = dtypes.float32,
                  device: Any = "cpu") -> tuple:
    """(cos, sin), each a (T, head_dim // 2) Tensor of ``dtype`` on ``device``, for positions
    ``start`` .. ``start + T - 1`` (``positions_or_length`` an int T) or for the given
    integer positions (plus ``start``). Computed in float64, then cast: exact angles at
    any position. Constants: they never require grad."""
    angles = _angles(_positions(positions_or_length, start), head_dim, theta)
    backend = get_backend(device)
    dtype = dtypes.as_dtype(dtype)
    if not dtypes.is_floating(dtype):
        raise ValueError(f"rotary_tables: dtype must be floating point, got {dtype}")
    # Tensor(), a factory: made from host numbers alone, a constant where it is captured
    return tuple(Tensor(table.astype(dtype), device=backend.device)
                 for table in (np.cos(angles), np.sin(angles)))


class RotaryTables:
    """The cos/sin tables of one head_dim and theta for positions 0 .. capacity - 1, made
    once per (dtype, device) on first use; ``tables(start, length, ...)`` hands out rows
    start .. start + length - 1 as views (no copy). What a model keeps: one object per
    model, the KV cache's decoding steps slicing it at their position."""

    def __init__(self, head_dim: int, capacity: int, theta: float = 10000.0) -> None:
        _angles(np.zeros(0), head_dim, theta)  # the checks, with rotary_tables' messages
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or \
                capacity < 1:
            raise ValueError(f"RotaryTables: capacity must be an int >= 1, got {capacity!r}")
        self.head_dim, self.capacity, self.theta = int(head_dim), int(capacity), float(theta)
        self._tables: dict = {}  # (dtype, device) -> (cos, sin) of all `capacity` positions

    def __call__(self, start: int, length: int, dtype: Any = dtypes.float32,
                 device: Any = "cpu") -> tuple:
        """(cos, sin) for positions start .. start + length - 1: views of the cached
        (capacity, head_dim // 2) tables."""
        if not (isinstance(start, (int, np.integer)) and isinstance(length, (int, np.integer))
                and start >= 0 and length >= 0):
            raise ValueError(f"RotaryTables: start and length must be ints >= 0, got "
                             f"start={start!r}, length={length!r}")
        if start + length > self.capacity:
            raise ValueError(f"RotaryTables: positions {start} .. {start + length - 1} exceed "
                             f"the capacity of {self.capacity} positions")
        dtype = dtypes.as_dtype(dtype)
        backend = get_backend(device)
        key = (dtype, backend.device)
        tables = self._tables.get(key)
        if tables is None:
            tables = rotary_tables(self.capacity, self.head_dim, self.theta, dtype=dtype,
                                   device=backend.device)
            self._tables[key] = tables
        return tuple(Tensor._make(t.data[start:start + length], backend, False)
                     for t in tables)

    def at(self, positions: Tensor, dtype: Any = dtypes.float32) -> tuple:
        """(cos, sin) for the positions in ``positions``, an integer tensor (T,): rows
        gathered by an op (``embedding``) rather than sliced by a Python int, so that a
        captured decode step reads the position it is given at every call."""
        require_tensor(positions, "RotaryTables.at", "positions")
        backend = positions._backend
        key = (dtypes.as_dtype(dtype), backend.device)
        if key not in self._tables:
            self(0, 0, dtype, backend.device)  # make the tables of this dtype and device
        return tuple(embedding(positions, table) for table in self._tables[key])

    def __repr__(self) -> str:
        return (f"RotaryTables(head_dim={self.head_dim}, capacity={self.capacity}, "
                f"theta={self.theta})")


def _rotate(xp: Any, x: Any, cos: Any, sin: Any, inverse: bool) -> Any:
    """x (..., T, H, D) rotated by the (T, D/2) tables (by minus the angle if ``inverse``)
    into a new contiguous array of x's dtype, computed in float32 or wider, as
        out = x * [cos | cos] + [x2 | x1] * [-sin | sin]
    with the tables joined once per call ((T, D), small): each product then runs over
    whole heads (inner loops of D, not D/2, which halves the cost at Llama's head sizes),
    and the final add is one contiguous pass. x is read where it lies (any strides); long
    inputs are split over the cores."""
    work = work_dtype(x)
    h = x.shape[-1] // 2
    c = cos.astype(work, copy=False)
    s = sin.astype(work, copy=False)
    both_cos = xp.concatenate([c, c], axis=-1)[:, None, :]  # (T, 1, D): broadcast over heads
    signed_sin = xp.concatenate([s, -s] if inverse else [-s, s], axis=-1)[:, None, :]
    out = xp.empty(x.shape, dtype=work)
    split_t = x.ndim == 3  # (T, H, D): the pieces cut T, so the tables are cut with them

    def piece(r: Any) -> None:
        x_, o = widened(x[r]), out[r]  # bf16: a float32 copy per piece; else x's view
        c_, s_ = (both_cos[r], signed_sin[r]) if split_t else (both_cos, signed_sin)
        xp.multiply(x_, c_, out=o)
        swapped = xp.empty(o.shape, dtype=work)  # [x2 | x1]
        swapped[..., :h] = x_[..., h:]
        swapped[..., h:] = x_[..., :h]
        swapped *= s_
        o += swapped

    run_split(piece, row_pieces(out))
    return out.astype(x.dtype, copy=False)


class ApplyRotary(Function):
    """x (..., T, H, D) rotated pairwise (i, i + D/2) by the angles of cos/sin (T, D/2);
    ``inverse`` rotates by minus the angle. Backward rotates the gradient the other way
    (a rotation's transpose is its inverse). Saves only cos and sin.

    The backend's fused kernel ``rotary_forward`` takes the inputs it supports, for the
    backward too: CUDA's (x read in place, any strides, bf16 included) and the CPU's
    (numba, float32)."""

    @staticmethod
    def forward(ctx, x, cos, sin, inverse, head_dim):
        ctx.inverse, ctx.head_dim = inverse, head_dim
        ctx.save_for_backward(cos, sin)
        return _rotate_heads(ctx, x, cos, sin, inverse, head_dim)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return (_rotate_heads(ctx, grad, cos, sin, not ctx.inverse, ctx.head_dim),
                None, None, None, None)


def _rotate_heads(ctx, x, cos, sin, inverse, head_dim):
    """x rotated, on the backend's fused kernel where it takes x, else ``_rotate``; with
    ``head_dim`` x is (..., T, H * head_dim), heads side by side (a projection's layout),
    viewed as (..., T, H, head_dim) for the rotation and the result given x's shape
    again."""
    shape = x.shape
    if head_dim is not None:
        x = x.reshape(*shape[:-1], shape[-1] // head_dim, head_dim)  # a view when it can be
    kernels = ctx.backend.fused_kernels()  # backend/kernels (CUDA) or cpu_kernels (numba)
    if kernels is not None and kernels.supports_rotary(x, cos, sin):
        out = kernels.rotary_forward(x, cos, sin, inverse)
    else:
        out = _rotate(ctx.xp, x, cos, sin, inverse)
    return out.reshape(shape)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, *, inverse: bool = False,
                 head_dim: Optional[int] = None) -> Tensor:
    """Rotary position embedding of ``x`` (..., T, H, D), e.g. ``q.view(B, T, H, D)``, by
    the (T, D/2) tables of ``rotary_tables`` (broadcast over the batch and the heads), in
    the rotate-half convention (module docstring). With ``head_dim``, x is a projection's
    (..., T, H * head_dim), heads side by side, and the result has its shape: the same
    rotation without the two views around it (what a Llama's attention does per token).
    Returns a new contiguous tensor of x's dtype; bf16 is computed in float32, float64
    stays float64. No autocast rule: it keeps its input's dtype, as the elementwise ops
    do. ``cos`` and ``sin`` must not require grad (they are constants): that is a
    ValueError, not a silent None gradient."""
    require_tensor(x, "apply_rotary", "x")
    require_float(x, "apply_rotary", "x")
    for name, table in (("cos", cos), ("sin", sin)):
        require_tensor(table, "apply_rotary", name)
        require_float(table, "apply_rotary", name)
        if table.requires_grad:
            raise ValueError(f"apply_rotary: {name} must not require grad (the tables are "
                             f"constants; detach it or make it with rotary_tables)")
    if head_dim is not None:
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or \
                x.ndim < 2 or x.shape[-1] % head_dim:
            raise ValueError(f"apply_rotary: head_dim must be an int >= 2 dividing the last "
                             f"dim of x (..., T, H * head_dim), got head_dim={head_dim!r} for "
                             f"x of shape {tuple(x.shape)}")
        shape = (*x.shape[:-1], x.shape[-1] // head_dim, head_dim)
    elif x.ndim < 3:
        raise ValueError(f"apply_rotary: expected x of shape (..., T, H, D), at least 3 dims, "
                         f"got shape {tuple(x.shape)}")
    else:
        shape = tuple(x.shape)
    d = shape[-1]
    if d % 2:
        raise ValueError(f"apply_rotary: expected an even head dim D, got x of shape "
                         f"{tuple(x.shape)}")
    expected = (shape[-3], d // 2)
    for name, table in (("cos", cos), ("sin", sin)):
        if tuple(table.shape) != expected:
            raise ValueError(f"apply_rotary: expected {name} of shape (T, D/2) = {expected} "
                             f"for x of shape {tuple(x.shape)}, got {tuple(table.shape)}")
    return ApplyRotary.apply(x, cos, sin, bool(inverse), head_dim)
