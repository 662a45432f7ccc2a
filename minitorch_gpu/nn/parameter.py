"""Parameter: a Tensor that a Module registers as one of its learnable weights."""
from __future__ import annotations

from typing import Optional

from ..creation import empty
from ..tensor import Tensor


class Parameter(Tensor):
    """A leaf tensor that requires grad and that ``Module`` lists in ``parameters()``.

    ``Parameter(t)`` shares ``t``'s memory (as ``torch.nn.Parameter`` does); results of ops
    on a Parameter are plain Tensors.

    >>> w = Parameter(mt.randn(4, 3))
    >>> w.requires_grad, w.is_leaf
    (True, True)
    """

    __slots__ = ()

    def __new__(cls, data: Optional[Tensor] = None, requires_grad: bool = True) -> "Parameter":
        if data is None:
            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter: expected a Tensor, got {type(data).__name__}")
        param = cls._make(data.detach().data, data.backend, False)
        param.requires_grad_(requires_grad)
        return param

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
