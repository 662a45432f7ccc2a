"""The layers of a GPT and a Llama: Linear, Embedding, LayerNorm, RMSNorm, Dropout, GELU,
SwiGLU, the attention core and the loss (and ReLU, Tanh, Identity, for the small models people build first).

Each owns its parameters and calls one fused op of the core (``minitorch_gpu.functional``);
none touches the array module itself. Shapes and default initialisations follow PyTorch.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

from .. import functional as F
from ..creation import empty
from ..tensor import Tensor
from . import init
from .module import Module
from .parameter import Parameter


def _positive_int(value: Any, layer: str, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{layer}: {name} must be a positive int, got {value!r}")
    return value


class Linear(Module):
    """``y = x @ weight.T + bias``: x (..., in_features) -> (..., out_features).

    ``weight`` is (out_features, in_features), as in PyTorch, so weights load key by key.
    Initialised as PyTorch's: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.in_features = _positive_int(in_features, "Linear", "in_features")
        self.out_features = _positive_int(out_features, "Linear", "out_features")
        self.weight = Parameter(empty(out_features, in_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None) -> Tensor:
        """``x @ weight.T + bias``; with ``residual`` (the output's shape) that plus
        ``residual``, in the same node (``F.linear``'s ``residual``)."""
        return F.linear(x, self.weight, self.bias, residual=residual)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table: integer ids of any shape (...) -> rows of ``weight`` (..., dim).
    Initialised N(0, 1) as PyTorch's."""

    def __init__(self, num_embeddings: int, embedding_dim: int, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.num_embeddings = _positive_int(num_embeddings, "Embedding", "num_embeddings")
        self.embedding_dim = _positive_int(embedding_dim, "Embedding", "embedding_dim")
        self.weight = Parameter(empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.weight)

    def forward(self, indices: Tensor) -> Tensor:
        return F.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` dims, then scale (and shift, unless
    ``bias=False``: nanoGPT's option, which PyTorch added in 2.1)."""

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) \
            else tuple(normalized_shape)
        for n in shape:
            _positive_int(n, "LayerNorm", "normalized_shape")
        if not eps > 0:
            raise ValueError(f"LayerNorm: eps must be > 0, got {eps}")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(empty(*shape, device=device, dtype=dtype))
            if bias:
                self.bias = Parameter(empty(*shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}")


class Dropout(Module):
    """Zero each element with probability ``p`` in training mode (scaling the rest by
    1/(1-p)); the identity in ``eval()`` mode."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def residual_fuses(dropout: Dropout) -> bool:
    """Whether a skip connection around ``dropout`` runs inside the projection before it:
    while the dropout does nothing (p = 0, or eval mode)."""
    return dropout.p == 0.0 or not dropout.training


def residual_projection(residual: Optional[Tensor], proj: Linear, dropout: Dropout,
                        y: Tensor) -> Tensor:
    """``residual + dropout(proj(y))``: a block's skip connection around its last
    projection. While the dropout does nothing (p = 0, or eval mode) the add runs inside
    the projection's node (``Linear``'s ``residual``): one pass over the residual stream
    and one graph node fewer; otherwise as written. Without a residual,
    ``dropout(proj(y))``. The residual is then the projection's second positional
    argument, so its hooks see it: a forward hook gets the sum as the projection's
    output, and a forward pre-hook that returns one value (replacing the arguments)
    drops it."""
    if residual is None:
        return dropout(proj(y))
    if residual_fuses(dropout):
        # the dropout is the identity here; it is still called, so that hooks (the
        # profiler's rows) see every module; residual positional, so they see it too
        return dropout(proj(y, residual))
    return residual + dropout(proj(y))


class GELU(Module):
    """GELU activation; ``approximate="tanh"`` is the form GPT-2 was trained with."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class ScaledDotProductAttention(Module):
    """softmax(q k^T / sqrt(d)) v with an optional mask and causal masking: the part of
    attention with no weights, as a module of its own so that hooks (the profiler's) see
    it as one layer. Dropout on the attention weights applies in training mode only."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"ScaledDotProductAttention: dropout must be in [0, 1], got "
                             f"{dropout}")
        self.dropout = float(dropout)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None,
                is_causal: bool = False) -> Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0)

    def extra_repr(self) -> str:
        return f"dropout={self.dropout}"


class PackedCausalAttention(Module):
    """GPT's attention core: causal self-attention of ``n_head`` heads from the packed
    projection qkv (B, T, 3C) to (B, T, C), heads side by side, with no head copied either
    way (``F.packed_causal_attention``). Dropout on the weights in training mode only."""

    def __init__(self, n_head: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_head = _positive_int(n_head, "PackedCausalAttention", "n_head")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"PackedCausalAttention: dropout must be in [0, 1], got {dropout}")
        self.dropout = float(dropout)

    def forward(self, qkv: Tensor) -> Tensor:
        return F.packed_causal_attention(qkv, self.n_head,
                                         dropout_p=self.dropout if self.training else 0.0)

    def extra_repr(self) -> str:
        return f"n_head={self.n_head}, dropout={self.dropout}"


class CrossEntropyLoss(Module):
    """The mean cross-entropy between logits (N, C) and class ids (N,), as a module (as
    PyTorch's): ``ignore_index`` targets count for nothing."""

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = int(ignore_index)

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits, targets, ignore_index=self.ignore_index)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}"


class ReLU(Module):
    """max(x, 0)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class SiLU(Module):
    """x * sigmoid(x) (Llama's MLP activation)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace  # accepted for PyTorch's signature; results are new tensors

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class Softplus(Module):
    """log(1 + exp(beta x)) / beta, linear where beta x > threshold."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = float(beta), float(threshold)

    def forward(self, x: Tensor) -> Tensor:
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class LeakyReLU(Module):
    """x for x > 0, else negative_slope * x."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = float(negative_slope), inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class ELU(Module):
    """x for x > 0, else alpha (exp(x) - 1)."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = float(alpha), inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class Hardtanh(Module):
    """x clamped to [min_val, max_val]."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0,
                 inplace: bool = False) -> None:
        super().__init__()
        if min_val > max_val:
            raise ValueError(f"Hardtanh: min_val ({min_val}) must not exceed max_val "
                             f"({max_val})")
        self.min_val, self.max_val, self.inplace = float(min_val), float(max_val), inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"


class Mish(Module):
    """x * tanh(softplus(x))."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.mish(x)


class LogSigmoid(Module):
    """log(sigmoid(x))."""

    def forward(self, x: Tensor) -> Tensor:
        return F.logsigmoid(x)


class Identity(Module):
    """Returns its input: a placeholder where a layer is switched off."""

    def forward(self, x: Any) -> Any:
        return x


class RMSNorm(Module):
    """Root-mean-square normalization over the trailing ``normalized_shape`` dims, scaled by
    ``weight`` (ones at first), as torch.nn.RMSNorm; ``eps`` None: the input dtype's machine
    epsilon."""

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: Optional[float] = None,
                 elementwise_affine: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) \
            else tuple(normalized_shape)
        for n in shape:
            _positive_int(n, "RMSNorm", "normalized_shape")
        if eps is not None and not eps > 0:
            raise ValueError(f"RMSNorm: eps must be > 0 or None, got {eps}")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(empty(*shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class SwiGLU(Module):
    """silu(gate) * up, Llama's gated MLP activation: ``forward(gate, up)`` takes the two
    projections (same shape). No parameters: the projections are the MLP's Linears."""

    def forward(self, gate: Tensor, up: Tensor) -> Tensor:
        return F.swiglu(gate, up)


class Softmax(Module):
    """softmax along ``dim``, as torch.nn.Softmax (``dim`` is required here: PyTorch's
    implicit choice is deprecated)."""

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__()
        if dim is None:
            raise ValueError("Softmax: give dim (the dim whose entries sum to 1)")
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """log_softmax along ``dim``, as torch.nn.LogSoftmax."""

    def forward(self, x: Tensor) -> Tensor:
        return F.log_softmax(x, self.dim)
