"""What each layer costs, counted from shapes, not measured.

FLOPs: 2 M N K per matrix product (the attention core's Q K^T and A V over the whole
T x T square, with every query head, as ``flops_per_token`` counts them) and a few per element for elementwise
work (the constants are in the cost functions below). Bytes: the least a layer must move,
its inputs and outputs once each and its weights read once. ``register_cost`` teaches the
profiler a new layer type.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..nn import (GELU, GPT, MLP, Block, CausalSelfAttention, CrossEntropyLoss, Dropout,
                  Embedding, GroupedCausalAttention, Identity, LayerNorm, Linear, Llama,
                  LlamaAttention, LlamaDecoderLayer, LlamaMLP, Module, ModuleDict, ModuleList,
                  PackedCausalAttention, ReLU, RMSNorm, Rotary, ScaledDotProductAttention,
                  Sequential, SwiGLU, Tanh)
from ..nn.layers import residual_fuses
from ..tensor import Tensor

__all__ = ["Cost", "Spec", "layer_cost", "register_cost", "spec_bytes", "tensor_specs"]

Spec = Tuple[Tuple[int, ...], int]  # (shape, bytes per element) of one tensor


@dataclass(frozen=True)
class Cost:
    """A module's own work in one call: FLOPs and the bytes it must move (None: unknown)."""

    flops: Optional[int]
    bytes: Optional[int]


CostFn = Callable[[Module, bool, List[Spec], List[Spec]], Cost]
_COSTS: Dict[type, CostFn] = {}


def register_cost(*module_types: type) -> Callable[[CostFn], CostFn]:
    """Teach the profiler what a module type costs: ``fn(module, training, inputs,
    outputs) -> Cost`` where inputs and outputs are ``(shape, itemsize)`` of the tensors
    passed positionally and returned. For a module with children, only its own work
    (what it does around them)."""
    def decorate(fn: CostFn) -> CostFn:
        for module_type in module_types:
            _COSTS[module_type] = fn
        return fn
    return decorate


def _numel(spec: Spec) -> int:
    return math.prod(spec[0])


def spec_bytes(*specs: Spec) -> int:
    """The bytes of the tensors ``specs`` describe, each once."""
    return sum(_numel(s) * s[1] for s in specs)


def _param_bytes(module: Module) -> int:
    return sum(p.nbytes for p in module.parameters(recurse=False))


@register_cost(Linear)
def _linear_cost(m: Linear, training: bool, inputs: List[Spec], outputs: List[Spec]) -> Cost:
    x, y = inputs[0], outputs[0]
    rows = _numel(x) // m.in_features  # (B, T, in) -> B*T rows
    flops = 2 * rows * m.in_features * m.out_features
    if m.bias is not None:
        flops += rows * m.out_features
    residual = inputs[1:2]  # a block's skip connection, added in the same node
    if residual:
        flops += rows * m.out_features
    return Cost(flops, spec_bytes(x, y, *residual) + _param_bytes(m))


@register_cost(Embedding)
def _embedding_cost(m: Embedding, training: bool, inputs: List[Spec],
                    outputs: List[Spec]) -> Cost:
    # no arithmetic: the rows of the ids are read from the table and written out
    return Cost(0, spec_bytes(inputs[0]) + 2 * spec_bytes(outputs[0]))


@register_cost(LayerNorm)
def _layer_norm_cost(m: LayerNorm, training: bool, inputs: List[Spec],
                     outputs: List[Spec]) -> Cost:
    # per element: sum for the mean, subtract it, square, sum for the variance, scale by
    # 1/std (5), then the gain and the bias when there are ones
    per_element = 5 + (m.weight is not None) + (m.bias is not None)
    return Cost(per_element * _numel(inputs[0]),
                spec_bytes(inputs[0], outputs[0]) + _param_bytes(m))


@register_cost(RMSNorm)
def _rms_norm_cost(m: RMSNorm, training: bool, inputs: List[Spec],
                   outputs: List[Spec]) -> Cost:
    # per element: square, sum for the mean of squares, scale by rstd (3; the rsqrt is per
    # row), then the gain when there is one
    per_element = 3 + (getattr(m, "weight", None) is not None)
    return Cost(per_element * _numel(inputs[0]),
                spec_bytes(inputs[0], outputs[0]) + _param_bytes(m))


@register_cost(Rotary)
def _rotary_cost(m: Rotary, training: bool, inputs: List[Spec], outputs: List[Spec]) -> Cost:
    # q and k rotated: each output element is x_i cos +- x_j sin, 3 operations; reads q, k
    # and the cos and sin rows of these positions (T, head_dim / 2), writes q and k
    q, k = inputs[:2]
    T = q[0][1]
    table = 8 if q[1] == 8 else 4  # the tables are float32 (float64 for a float64 model)
    tables = 2 * T * (m.tables.head_dim // 2) * table
    return Cost(3 * (_numel(q) + _numel(k)), spec_bytes(q, k, *outputs) + tables)


@register_cost(SwiGLU)
def _swiglu_cost(m: SwiGLU, training: bool, inputs: List[Spec], outputs: List[Spec]) -> Cost:
    # silu(g) * u = g * sigmoid(g) * u: the sigmoid 4 (negate, exp, add one, divide), then
    # two products: 6 per element; gate and up read, the product written
    gate, up = inputs[:2]
    return Cost(6 * _numel(gate), spec_bytes(gate, up, outputs[0]))


@register_cost(GELU)
def _gelu_cost(m: GELU, training: bool, inputs: List[Spec], outputs: List[Spec]) -> Cost:
    # tanh form: 0.5 x (1 + tanh(c (x + 0.044715 x^3))): 9 operations, tanh counted as one;
    # exact form: 0.5 x (1 + erf(x / sqrt 2)): 5
    per_element = 9 if m.approximate == "tanh" else 5
    return Cost(per_element * _numel(inputs[0]), spec_bytes(inputs[0], outputs[0]))


@register_cost(ReLU, Tanh)
def _pointwise_cost(m: Module, training: bool, inputs: List[Spec],
                    outputs: List[Spec]) -> Cost:
    return Cost(_numel(inputs[0]), spec_bytes(inputs[0], outputs[0]))


@register_cost(Dropout)
def _dropout_cost(m: Dropout, training: bool, inputs: List[Spec],
                  outputs: List[Spec]) -> Cost:
    if not training or m.p == 0.0:
        return Cost(0, 0)  # the identity: it returns its input, moving nothing
    x = inputs[0]  # draw, compare, scale: 3 per element; a byte of mask besides x and y
    return Cost(3 * _numel(x), spec_bytes(x, outputs[0]) + _numel(x))


def _scores_cost(heads: int, L: int, S: int, E: int, Ev: int, dropout: bool) -> int:
    """FLOPs of attention over ``heads`` (batch x heads) (L, S) score matrices: Q K^T and
    A V over the full square (the causal half is not subtracted, as in flops_per_token);
    softmax: scale, max, subtract, exp, sum, divide ~ 5 per score; dropout 3 more."""
    scores = heads * L * S
    return 2 * scores * E + 2 * scores * Ev + (8 if dropout else 5) * scores


@register_cost(ScaledDotProductAttention)
def _attention_cost(m: ScaledDotProductAttention, training: bool, inputs: List[Spec],
                    outputs: List[Spec]) -> Cost:
    q, k, v = inputs[:3]
    L, E = q[0][-2:]
    S, Ev = v[0][-2:]
    flops = _scores_cost(_numel(q) // (L * E), L, S, E, Ev, training and m.dropout > 0.0)
    # the least traffic: q, k, v read and the output written once. An implementation that
    # writes the T x T scores to memory moves far more; a flash-style one moves this.
    return Cost(flops, spec_bytes(q, k, v, outputs[0]))


@register_cost(PackedCausalAttention)
def _packed_attention_cost(m: PackedCausalAttention, training: bool, inputs: List[Spec],
                           outputs: List[Spec]) -> Cost:
    (qkv,) = inputs[:1]
    B, T, C3 = qkv[0]
    head_dim = C3 // (3 * m.n_head)
    flops = _scores_cost(B * m.n_head, T, T, head_dim, head_dim,
                         training and m.dropout > 0.0)
    return Cost(flops, spec_bytes(qkv, outputs[0]))  # qkv read, the output written


@register_cost(GroupedCausalAttention)
def _grouped_attention_cost(m: GroupedCausalAttention, training: bool, inputs: List[Spec],
                            outputs: List[Spec]) -> Cost:
    # the products of all n_head query heads (grouped-query attention shares keys, not
    # work); q (B, T, H D) read, k and v (B, T, Hkv D) read once each, the output written
    q, k, v = inputs[:3]
    B, T, width = q[0]
    head_dim = width // m.n_head
    flops = _scores_cost(B * m.n_head, T, T, head_dim, head_dim,
                         training and m.dropout > 0.0)
    return Cost(flops, spec_bytes(q, k, v, outputs[0]))


@register_cost(CrossEntropyLoss)
def _cross_entropy_cost(m: CrossEntropyLoss, training: bool, inputs: List[Spec],
                        outputs: List[Spec]) -> Cost:
    logits, targets = inputs[:2]
    # per logit: max, subtract, exp, sum; per row a log and a pick, lost in the rounding
    return Cost(4 * _numel(logits), spec_bytes(logits, targets, *outputs))


@register_cost(Block, LlamaDecoderLayer)
def _block_cost(m: Module, training: bool, inputs: List[Spec], outputs: List[Spec]) -> Cost:
    # the two residual adds, each reading two (B, T, C) and writing one, where the block
    # makes them: an add whose dropout does nothing runs inside the projection before it
    # (nn.layers.residual_projection) and is counted there (_linear_cost)
    attn = m.attn if isinstance(m, Block) else m.self_attn
    adds = sum(not residual_fuses(d) for d in (attn.resid_dropout, m.mlp.dropout))
    x = inputs[0]
    return Cost(adds * _numel(x), adds * 3 * spec_bytes(x))


@register_cost(GPT)
def _gpt_cost(m: GPT, training: bool, inputs: List[Spec], outputs: List[Spec]) -> Cost:
    B, T = inputs[0][0]
    # the residual stream's dtype: the weights' (the logits are bf16 under autocast)
    C, itemsize = m.config.n_embd, m.transformer.wte.weight.element_size()
    # token rows + position rows: read (B, T, C) and (T, C), write (B, T, C)
    return Cost(B * T * C, (2 * B * T * C + T * C) * itemsize)


# Identity returns its input; CausalSelfAttention's core reads the heads in place and
# writes them side by side (the KV-cache path, which generation takes, is not profiled);
# LlamaAttention and LlamaMLP only call their children (views of q and k, no copies); the
# Llama adds no position rows (its positions are the rotation of q and k); the containers
# only call their children
@register_cost(Identity, CausalSelfAttention, MLP, LlamaAttention, LlamaMLP, Llama,
               Sequential, ModuleList, ModuleDict)
def _nothing_of_its_own(m: Module, training: bool, inputs: List[Spec],
                        outputs: List[Spec]) -> Cost:
    return Cost(0, 0)


def layer_cost(module: Module, training: bool, inputs: List[Spec], outputs: List[Spec],
               leaf: bool) -> Cost:
    """What one call of ``module`` cost, by the function registered for its type or the
    nearest base type; an unknown leaf layer's bytes are still its inputs, outputs and
    weights."""
    for cls in type(module).__mro__:
        fn = _COSTS.get(cls)
        if fn is not None:
            return fn(module, training, inputs, outputs)
    if leaf:  # an unknown layer: its traffic is known, its arithmetic is not
        return Cost(None, spec_bytes(*inputs, *outputs) + _param_bytes(module))
    return Cost(None, None)


def tensor_specs(values: Any) -> List[Spec]:
    """(shape, itemsize) of every Tensor in ``values`` (nested tuples and lists too)."""
    out: List[Spec] = []
    stack = [values]
    while stack:
        value = stack.pop()
        if isinstance(value, Tensor):
            out.append((tuple(value.shape), value.element_size()))
        elif isinstance(value, (tuple, list)):
            stack.extend(reversed(value))
    return out
