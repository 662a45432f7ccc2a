"""Initialisers that fill a parameter in place from the seeded stream (``manual_seed``)."""
from __future__ import annotations

from ..autograd import no_grad
from ..tensor import Tensor


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with samples of N(mean, std^2): GPT-2 uses std 0.02."""
    with no_grad():
        return tensor.normal_(mean, std)


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with samples of U(a, b)."""
    with no_grad():
        return tensor.uniform_(a, b)


def zeros_(tensor: Tensor) -> Tensor:
    with no_grad():
        return tensor.zero_()


def ones_(tensor: Tensor) -> Tensor:
    with no_grad():
        return tensor.fill_(1.0)


def constant_(tensor: Tensor, value: float) -> Tensor:
    with no_grad():
        return tensor.fill_(value)
