"""Initialisers that fill a parameter in place from the seeded stream (``manual_seed``).

``skipped()`` turns them off while a model is built whose every weight is then copied in
(``from_pretrained``): drawing 124M random numbers, through temporaries as large as the
largest weight, only to overwrite them costs seconds and memory (PyTorch's ``skip_init``
and meta-device builds answer the same need). The parameters then hold whatever
``empty`` gave them, and the random stream is not drawn from.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from ..autograd import no_grad
from ..tensor import Tensor

_state = threading.local()  # per thread: a model built on another thread is initialised


@contextlib.contextmanager
def skipped() -> Iterator[None]:
    """Within it, on this thread, every initialiser below leaves its tensor as it is."""
    before = getattr(_state, "skip", False)
    _state.skip = True
    try:
        yield
    finally:
        _state.skip = before


def _skipping() -> bool:
    return getattr(_state, "skip", False)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with samples of N(mean, std^2): GPT-2 uses std 0.02."""
    if _skipping():
        return tensor
    with no_grad():
        return tensor.normal_(mean, std)


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with samples of U(a, b)."""
    if _skipping():
        return tensor
    with no_grad():
        return tensor.uniform_(a, b)


def zeros_(tensor: Tensor) -> Tensor:
    if _skipping():
        return tensor
    with no_grad():
        return tensor.zero_()


def ones_(tensor: Tensor) -> Tensor:
    if _skipping():
        return tensor
    with no_grad():
        return tensor.fill_(1.0)


def constant_(tensor: Tensor, value: float) -> Tensor:
    if _skipping():
        return tensor
    with no_grad():
        return tensor.fill_(value)
