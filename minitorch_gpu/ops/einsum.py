"""einsum as batched matrix products: each pair of operands becomes one (batched) matmul.

Subscripts are parsed once (implicit and explicit ``->`` modes, ``...``). A single operand
is a sum over the indices it drops and a permute. Two operands: indices only one of them
has and the output lacks are summed away first; the rest sort into batch (both and the
output), contracted (both, not the output) and kept (one and the output), and the pair is
permuted and reshaped to (batch, m, k) @ (batch, k, n), one call of the backend's matmul
(BLAS, cuBLAS), then reshaped and permuted to the output. More operands contract left to
right, each intermediate keeping the indices still needed. Backward of a pair is two more
such contractions of the gradient with the other operand, on raw arrays. An index repeated
within one operand (a trace, a diagonal) first takes that diagonal as a strided view.
"""
from __future__ import annotations

import math
import string
from typing import Any, List, Sequence, Tuple

from ..autograd import Function, unbroadcast
from ..tensor import Tensor
from ._util import require_tensor
from .promotion import promote_operands

_LETTERS = string.ascii_letters


def _parse(equation: str, shapes: Sequence[tuple]) -> Tuple[List[str], str]:
    """(input subscripts, output subscripts) with ``...`` replaced by spare letters."""
    equation = equation.replace(" ", "")
    if "->" in equation:
        lhs, out = equation.split("->")
        explicit = True
    else:
        lhs, out, explicit = equation, "", False
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"einsum: the equation has {len(terms)} operands, got {len(shapes)} "
                         f"tensors")
    spare = [c for c in _LETTERS if c not in equation]
    ell_ndim = 0
    for term, shape in zip(terms, shapes):
        named = len(term.replace("...", ""))
        if "..." in term:
            ell_ndim = max(ell_ndim, len(shape) - named)
        elif named != len(shape):
            raise ValueError(f"einsum: subscripts {term!r} name {named} dims, but the operand "
                             f"has shape {tuple(shape)}")
    ell = "".join(spare[:ell_ndim])
    subs = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            own = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", ell[ell_ndim - own:])
        for c in term:
            if c not in _LETTERS:
                raise ValueError(f"einsum: invalid subscript {c!r} in {equation!r}")
        subs.append(term)
    if explicit:
        out = out.replace("...", ell)
        unknown = set(out) - set("".join(subs))
        if unknown or len(set(out)) != len(out):
            raise ValueError(f"einsum: output subscripts {out!r} must be distinct and appear "
                             f"in the inputs")
    else:  # implicit: the indices seen once, in alphabetical order, after the ellipsis dims
        counts = {}
        for c in "".join(subs):
            counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return subs, out


def _sizes(subs: Sequence[str], shapes: Sequence[tuple]) -> dict:
    sizes: dict = {}
    for term, shape in zip(subs, shapes):
        for c, n in zip(term, shape):
            if sizes.get(c, n) != n and 1 not in (sizes.get(c), n):
                raise ValueError(f"einsum: subscript {c!r} has size {sizes[c]} in one operand "
                                 f"and {n} in another")
            sizes[c] = max(sizes.get(c, n), n)
    return sizes


def _single(xp: Any, a: Any, sa: str, out: str) -> Any:
    """One operand: sum the dropped indices, permute to ``out``, broadcast new ones."""
    drop = tuple(i for i, c in enumerate(sa) if c not in out)
    if drop:
        a = a.sum(axis=drop)
        sa = "".join(c for c in sa if c in out)
    a = xp.transpose(a, [sa.index(c) for c in out if c in sa])
    return a


def _contract(backend: Any, a: Any, sa: str, b: Any, sb: str, out: str, sizes: dict) -> Any:
    """einsum(f"{sa},{sb}->{out}") of two raw arrays as one batched matmul. Every index of
    ``out`` must be in ``sa`` or ``sb``; size-1 dims broadcast."""
    xp = backend.xp
    a = _single(xp, a, sa, "".join(c for c in sa if c in sb or c in out))
    sa = "".join(c for c in sa if c in sb or c in out)
    b = _single(xp, b, sb, "".join(c for c in sb if c in sa or c in out))
    sb = "".join(c for c in sb if c in sa or c in out)
    batch = [c for c in out if c in sa and c in sb]
    left = [c for c in out if c in sa and c not in sb]
    right = [c for c in out if c in sb and c not in sa]
    inner = [c for c in sa if c in sb and c not in out]
    a = xp.transpose(a, [sa.index(c) for c in batch + left + inner])
    b = xp.transpose(b, [sb.index(c) for c in batch + inner + right])
    size = lambda cs: math.prod(sizes[c] for c in cs)  # noqa: E731
    a = xp.broadcast_to(a, tuple(sizes[c] for c in batch + left + inner)) \
        if a.shape != tuple(sizes[c] for c in batch + left + inner) else a
    b = xp.broadcast_to(b, tuple(sizes[c] for c in batch + inner + right)) \
        if b.shape != tuple(sizes[c] for c in batch + inner + right) else b
    a = a.reshape(size(batch), size(left), size(inner))  # (batch, m, k)
    b = b.reshape(size(batch), size(inner), size(right))  # (batch, k, n)
    product = backend.matmul(a, b)  # (batch, m, n)
    product = product.reshape(tuple(sizes[c] for c in batch + left + right))
    order = batch + left + right
    return xp.transpose(product, [order.index(c) for c in out])


class EinsumPair(Function):
    """einsum of two operands, one batched matmul each way."""

    @staticmethod
    def forward(ctx, a, b, sa, sb, out, sizes):
        ctx.save_for_backward(a, b)
        ctx.subs = (sa, sb, out, sizes)
        # bf16 products come back in float32 (Backend.matmul): rounded once, to the operands'
        return _contract(ctx.backend, a, sa, b, sb, out, sizes).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        sa, sb, out, sizes = ctx.subs
        need_a, need_b = ctx.needs_input_grad[:2]
        grad_a = grad_b = None
        if need_a:  # every index of a is in b or out (the wrapper summed the others)
            full = "".join(c for c in sa)
            grad_a = unbroadcast(_contract(ctx.backend, grad, out, b, sb, full, sizes),
                                 a.shape).astype(a.dtype, copy=False)
        if need_b:
            grad_b = unbroadcast(_contract(ctx.backend, grad, out, a, sa, sb, sizes),
                                 b.shape).astype(b.dtype, copy=False)
        return grad_a, grad_b, None, None, None, None


def _diagonal(xp: Any, a: Any, sub: str) -> Tuple[Any, str]:
    """The view of ``a`` on the diagonal of each index repeated in ``sub`` (strides only)."""
    unique = "".join(dict.fromkeys(sub))
    shape, strides = [], []
    for c in unique:
        places = [i for i, d in enumerate(sub) if d == c]
        sizes = {a.shape[i] for i in places}
        if len(sizes) != 1:
            raise ValueError(f"einsum: repeated subscript {c!r} over dims of different sizes "
                             f"{sorted(sizes)}")
        shape.append(a.shape[places[0]])
        strides.append(sum(a.strides[i] for i in places))
    return xp.lib.stride_tricks.as_strided(a, tuple(shape), tuple(strides)), unique


class Diagonal(Function):
    """einsum's repeated index within one operand ("ii->i", "ii", "bii->bi")."""

    @staticmethod
    def forward(ctx, a, sub):
        ctx.a_shape, ctx.a_dtype, ctx.sub = a.shape, a.dtype, sub
        view, _ = _diagonal(ctx.xp, a, sub)
        return view.copy()

    @staticmethod
    def backward(ctx, grad):
        buffer = ctx.xp.zeros(ctx.a_shape, dtype=ctx.a_dtype)
        view, _ = _diagonal(ctx.xp, buffer, ctx.sub)
        view[...] = grad  # the diagonal of a fresh contiguous buffer: every place once
        return buffer, None


def _reduce_alone(t: Tensor, sub: str, keep: str) -> Tuple[Tensor, str]:
    """Sum ``t`` over the indices of ``sub`` not in ``keep``; permute to ``sub``'s order kept."""
    drop = tuple(i for i, c in enumerate(sub) if c not in keep)
    if drop:
        t = t.sum(drop)
        sub = "".join(c for c in sub if c in keep)
    return t, sub


def einsum(equation: str, *operands: Any) -> Tensor:
    """Einstein summation, as torch.einsum: ``einsum("bhqd,bhkd->bhqk", q, k)``. Operands
    may also be given as one list. Contractions run as batched matmuls (see the module).

    >>> einsum("ij,jk->ik", a, b)  # a @ b
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        raise TypeError(f"einsum: equation must be a str, got {type(equation).__name__}")
    if not operands:
        raise ValueError("einsum: give at least one operand")
    for i, t in enumerate(operands):
        require_tensor(t, "einsum", f"operand {i}")
    subs, out = _parse(equation, [tuple(t.shape) for t in operands])
    sizes = _sizes(subs, [tuple(t.shape) for t in operands])
    tensors = list(operands)
    for i, sub in enumerate(subs):
        if len(set(sub)) != len(sub):
            tensors[i] = Diagonal.apply(tensors[i], sub)
            subs[i] = "".join(dict.fromkeys(sub))
    if len(tensors) > 1:  # one dtype for every product, as + would promote
        first = tensors[0]
        for i in range(1, len(tensors)):
            first, tensors[i] = promote_operands(first, tensors[i])
        tensors = [t.to(first.dtype) if t.dtype != first.dtype else t for t in tensors]
    current, sub = tensors[0], subs[0]
    for i in range(1, len(tensors)):
        later = "".join(subs[i + 1:]) + out
        current, sub = _reduce_alone(current, sub, subs[i] + later)
        other, other_sub = _reduce_alone(tensors[i], subs[i], sub + later)
        # the pair's output: what later operands or the output still need, in a's order
        keep = "".join(dict.fromkeys(c for c in sub + other_sub if c in later))
        current = EinsumPair.apply(current, other, sub, other_sub, keep, sizes)
        sub = keep
    current, sub = _reduce_alone(current, sub, out)
    missing = [c for c in out if c not in sub]
    if missing:  # only a size-1 broadcast could leave one: not reachable for valid input
        raise ValueError(f"einsum: output subscripts {missing} not produced")
    return current.permute(tuple(sub.index(c) for c in out)) if sub != out else current
