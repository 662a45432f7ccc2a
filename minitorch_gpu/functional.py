"""The neural-network ops as functions (what ``torch.nn.functional`` holds)."""
from .ops import (cross_entropy, dropout, embedding, gelu, layer_norm, linear, log_softmax,
                  packed_causal_attention, relu, scaled_dot_product_attention, sigmoid,
                  softmax, tanh)
from .ops.activations import elu, hardtanh, leaky_relu, logsigmoid, mish, silu, softplus


__all__ = ["cross_entropy", "dropout", "embedding", "gelu", "layer_norm", "linear",
           "log_softmax", "packed_causal_attention", "relu", "scaled_dot_product_attention", "sigmoid", "softmax", "tanh"]
__all__ += ["elu", "hardtanh", "leaky_relu", "logsigmoid", "mish", "silu", "softplus"]
from .ops import (binary_cross_entropy, binary_cross_entropy_with_logits, nll_loss, normalize,
                  rms_norm)
__all__ += ["binary_cross_entropy", "binary_cross_entropy_with_logits", "nll_loss",
            "normalize", "rms_norm"]
from .ops import one_hot, pad
__all__ += ["one_hot", "pad"]
from .ops import apply_rotary, rotary_tables, swiglu
from .ops.rotary import RotaryTables
__all__ += ["RotaryTables", "apply_rotary", "rotary_tables", "swiglu"]
from .ops import cached_grouped_attention, grouped_causal_attention
__all__ += ["cached_grouped_attention", "grouped_causal_attention"]
