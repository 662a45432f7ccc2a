"""The neural-network ops as functions (what ``torch.nn.functional`` holds)."""
from .ops import (cross_entropy, dropout, embedding, gelu, layer_norm, log_softmax, relu,
                  scaled_dot_product_attention, sigmoid, softmax, tanh)
from .ops.matmul import matmul as _matmul
from .tensor import Tensor


def linear(x: Tensor, weight: Tensor, bias: Tensor = None) -> Tensor:
    """``x @ weight.T + bias`` with ``weight`` shaped (out_features, in_features)."""
    out = _matmul(x, weight.mT)
    return out if bias is None else out + bias


__all__ = ["cross_entropy", "dropout", "embedding", "gelu", "layer_norm", "linear",
           "log_softmax", "relu", "scaled_dot_product_attention", "sigmoid", "softmax", "tanh"]
