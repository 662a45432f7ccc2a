"""A Hugging Face ``config.json`` <-> this project's GPTConfig, for GPT-2 and Llama.

Hugging Face names a model's shape per family (GPT-2's ``n_embd``, ``n_positions``;
Llama's ``hidden_size``, ``num_key_value_heads``); ``model_type`` says which. Only what the
models here compute is accepted: a config asking for anything else (exact GELU, rotary
scaling, cross-attention...) is refused with one line naming the key, never loaded into a
model that would silently compute something different.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Dict

from ..nn import GPTConfig

__all__ = ["MODEL_TYPES", "PretrainedError", "config_from_hf", "hf_config"]

MODEL_TYPES = ("gpt2", "llama")  # config.json's model_type -> arch, one for one

# GPT-2's MLP here is GELU's tanh form, which Hugging Face calls gelu_new (and PyTorch's
# tanh GELU gelu_pytorch_tanh: the same function)
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")


class PretrainedError(ValueError):
    """A source that cannot be loaded or written: one line naming what and why."""


def config_from_hf(data: Any, where: str) -> GPTConfig:
    """The GPTConfig of a Hugging Face config.json's contents ``data`` (read from
    ``where``, named in errors)."""
    if not isinstance(data, dict):
        raise PretrainedError(f"{where}: expected a JSON object, got {type(data).__name__}")
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES:
        raise PretrainedError(f"{where}: model_type {model_type!r} is not one this project "
                              f"builds; expected one of {', '.join(MODEL_TYPES)}")

    def get(key: str, default: Any = None, kind: type = numbers.Integral) -> Any:
        value = data.get(key, default)
        if value is None or isinstance(value, bool) or not isinstance(value, kind):
            raise PretrainedError(f"{where}: {key} must be a "
                                  f"{'number' if kind is numbers.Real else 'positive int'}, "
                                  f"got {value!r}")
        return value

    def refuse_unless(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise PretrainedError(f"{where}: {key} = {data.get(key)!r}: {what}")

    shape = _gpt2(data, get, refuse_unless) if model_type == "gpt2" else \
        _llama(data, get, refuse_unless)
    try:
        return GPTConfig(**shape, dropout=0.0)
    except ValueError as exc:  # GPTConfig's own rules: heads dividing the width...
        raise PretrainedError(f"{where}: {exc}") from None


def _gpt2(data: Dict[str, Any], get: Callable, refuse_unless: Callable) -> Dict[str, Any]:
    n_embd = get("n_embd", 768)
    refuse_unless(data.get("n_inner") in (None, 4 * n_embd), "n_inner",
                  f"the MLP here is 4 x n_embd ({4 * n_embd}) wide")
    refuse_unless(data.get("activation_function", "gelu_new") in _TANH_GELU,
                  "activation_function", "the MLP here is GELU's tanh form (gelu_new)")
    refuse_unless(data.get("scale_attn_weights", True) is True, "scale_attn_weights",
                  "attention here is scaled by 1/sqrt(head size)")
    refuse_unless(not data.get("scale_attn_by_inverse_layer_idx", False),
                  "scale_attn_by_inverse_layer_idx", "not implemented here")
    refuse_unless(not data.get("add_cross_attention", False), "add_cross_attention",
                  "a decoder-only model has no cross-attention")
    return dict(arch="gpt2", n_embd=n_embd, n_layer=get("n_layer", 12),
                n_head=get("n_head", 12),
                block_size=get("n_positions", data.get("n_ctx", 1024)),
                vocab_size=get("vocab_size", 50257),
                norm_eps=get("layer_norm_epsilon", 1e-5, numbers.Real),
                bias=True, tie_embeddings=bool(data.get("tie_word_embeddings", True)))


def _llama(data: Dict[str, Any], get: Callable, refuse_unless: Callable) -> Dict[str, Any]:
    n_embd, n_head = get("hidden_size"), get("num_attention_heads")
    rope = data.get("rope_parameters") or {}  # transformers >= 5 keeps rope_theta here
    scaling = data.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type")) or rope.get("rope_type")
    refuse_unless(rope_type in (None, "default"),
                  "rope_scaling" if scaling else "rope_parameters",
                  f"rotary scaling {rope_type!r} (long-context RoPE) is not implemented "
                  f"here, only plain rotary positions")
    theta = data.get("rope_theta", rope.get("rope_theta", 10000.0))
    refuse_unless(data.get("head_dim") in (None, n_embd // n_head), "head_dim",
                  f"the head size here is hidden_size / num_attention_heads "
                  f"({n_embd // n_head})")
    refuse_unless(data.get("hidden_act", "silu") == "silu", "hidden_act",
                  "the MLP here is SwiGLU (silu)")
    refuse_unless(data.get("pretraining_tp", 1) in (None, 1), "pretraining_tp",
                  "tensor-parallel slicing of the projections is not implemented")
    bias = bool(data.get("attention_bias", False))
    refuse_unless(bool(data.get("mlp_bias", False)) == bias, "mlp_bias",
                  f"must equal attention_bias ({bias}): one bias setting here")
    if isinstance(theta, bool) or not isinstance(theta, numbers.Real):
        raise PretrainedError(f"rope_theta must be a number, got {theta!r}")
    return dict(arch="llama", n_embd=n_embd, n_head=n_head, n_layer=get("num_hidden_layers"),
                n_kv_head=get("num_key_value_heads", n_head),
                ffn_hidden=get("intermediate_size"),
                block_size=get("max_position_embeddings", 2048),
                vocab_size=get("vocab_size", 32000),
                norm_eps=get("rms_norm_eps", 1e-6, numbers.Real), rope_theta=float(theta),
                bias=bias, tie_embeddings=bool(data.get("tie_word_embeddings", False)))


def hf_config(config: GPTConfig, dtype: str, special: Dict[str, Any]) -> Dict[str, Any]:
    """A config.json for ``config`` that transformers' AutoModelForCausalLM builds the same
    model from; ``dtype`` names the stored weights (``float32`` or ``bfloat16``),
    ``special`` the tokenizer's bos/eos ids, where it has them."""
    c = config
    common = dict(vocab_size=c.vocab_size, tie_word_embeddings=c.tie_embeddings,
                  torch_dtype=dtype, initializer_range=0.02, use_cache=True, **special)
    if c.arch == "gpt2":
        # GPT-2 here may have no biases (bias: false); Hugging Face's always has them, so
        # the export writes zeros there: the same function
        return dict(architectures=["GPT2LMHeadModel"], model_type="gpt2",
                    n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
                    n_positions=c.block_size, n_ctx=c.block_size, n_inner=None,
                    activation_function="gelu_new", layer_norm_epsilon=c.norm_eps,
                    resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.dropout,
                    scale_attn_weights=True, **common)
    return dict(architectures=["LlamaForCausalLM"], model_type="llama",
                hidden_size=c.n_embd, intermediate_size=c.ffn_hidden,
                num_hidden_layers=c.n_layer, num_attention_heads=c.n_head,
                num_key_value_heads=c.kv_heads, head_dim=c.head_dim,
                max_position_embeddings=c.block_size, rms_norm_eps=c.norm_eps,
                rope_theta=c.rope_theta, rope_scaling=None, hidden_act="silu",
                attention_bias=c.bias, mlp_bias=c.bias, attention_dropout=c.dropout,
                pretraining_tp=1, **common)
