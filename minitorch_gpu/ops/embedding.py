"""Embedding lookup as one Function: a gather forward, a scatter-add backward."""
from __future__ import annotations

from ..autograd import Function
from ..backend import dtypes
from ..tensor import Tensor
from ._util import require_tensor


class Embedding(Function):
    @staticmethod
    def forward(ctx, indices, weight):
        ctx.save_for_backward(indices)
        ctx.weight_shape = weight.shape
        return ctx.xp.take(weight, indices, axis=0)  # (*indices.shape, C)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        grad_weight = ctx.xp.zeros(ctx.weight_shape, dtype=grad.dtype)
        # a token seen twice gets both gradients: scatter-add, not assignment
        ctx.backend.scatter_add(grad_weight, indices.reshape(-1),
                                grad.reshape(-1, ctx.weight_shape[1]))
        return None, grad_weight


def embedding(indices: Tensor, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (V, C) picked by integer ``indices`` of any shape: (..., C)."""
    require_tensor(indices, "embedding", "indices")
    require_tensor(weight, "embedding", "weight")
    if not dtypes.is_integer(indices.dtype):
        raise TypeError(f"embedding: indices must be an integer tensor, got {indices.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, dim), got shape "
                         f"{tuple(weight.shape)}")
    vocab = weight.shape[0]
    # at once on the CPU; on a GPU checked on the device and read at the next host read
    # (a log point), so the lookup never waits for it (Backend.check_in_range)
    indices._backend.check_in_range(indices.data, vocab, "embedding: index",
                                    f"is out of range for {vocab} embeddings "
                                    f"(expected 0 <= index < {vocab})")
    return Embedding.apply(indices, weight)
