"""A language model's arrays from its shape alone (Python ints), and a checkpoint's array
table checked against them.

``model_state_shapes(config)`` lists what ``GPT(config).state_dict()`` or
``Llama(config).state_dict()`` holds, by ``config.arch``, lazily: a shape of 10^9 layers
costs nothing until iterated, and ``model_state_shape``/``model_state_count``/
``model_parameter_count`` answer without enumerating the layers. ``check_model_arrays`` is
what inference and resume run on a checkpoint's header before any array is read, in
O(arrays in the file) whatever the metadata claims. The ``gpt_*`` names are the same
functions (they were written for GPT-2 first).
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from ..backend import dtypes
from .lm_config import llama_ffn_hidden

__all__ = ["Shape", "model_shape", "model_state_shapes", "model_state_shape",
           "model_state_count", "model_parameter_count", "check_model_arrays",
           "describe_shape", "gpt_state_shapes", "gpt_state_shape", "gpt_state_count",
           "gpt_parameter_count", "check_gpt_arrays"]


class Shape(NamedTuple):
    """A model's shape with every arch default resolved (GPTConfig.__post_init__'s rules)."""

    arch: str  # gpt2 | llama
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    ffn_hidden: int  # the MLP's width: 4 C for gpt2
    bias: bool
    tie_embeddings: bool

    @property
    def kv_width(self) -> int:  # n_kv_head * head_dim: k_proj's and v_proj's outputs
        return self.n_kv_head * (self.n_embd // self.n_head)


def model_shape(config: Any) -> Shape:
    """The Shape of ``config``: anything with GPTConfig's fields (a GPTConfig, a ModelConfig,
    a memory.Workload); fields it lacks or leaves None take the arch's default."""
    arch = getattr(config, "arch", "gpt2") or "gpt2"
    llama = arch == "llama"
    C, H = config.n_embd, config.n_head
    n_kv_head = getattr(config, "n_kv_head", None) or H
    ffn = getattr(config, "ffn_hidden", None) if llama else 4 * C  # GPT-2's MLP is 4 C
    if ffn is None:
        ffn = llama_ffn_hidden(C, getattr(config, "ffn_multiple_of", None) or 64)
    bias = getattr(config, "bias", None)
    tied = getattr(config, "tie_embeddings", None)
    return Shape(arch, config.n_layer, H, n_kv_head, C, config.block_size, config.vocab_size,
                 ffn, (not llama) if bias is None else bool(bias),
                 (not llama) if tied is None else bool(tied))


# one layer's state dict: (name, shape, is a bias), in state-dict order
def _layer(s: Shape) -> Dict[str, Tuple[int, ...]]:
    C, F, KV = s.n_embd, s.ffn_hidden, s.kv_width
    if s.arch == "llama":
        arrays: List[Tuple[str, Tuple[int, ...], bool]] = [
            ("self_attn.q_proj.weight", (C, C), False), ("self_attn.q_proj.bias", (C,), True),
            ("self_attn.k_proj.weight", (KV, C), False), ("self_attn.k_proj.bias", (KV,), True),
            ("self_attn.v_proj.weight", (KV, C), False), ("self_attn.v_proj.bias", (KV,), True),
            ("self_attn.o_proj.weight", (C, C), False), ("self_attn.o_proj.bias", (C,), True),
            ("mlp.gate_proj.weight", (F, C), False), ("mlp.gate_proj.bias", (F,), True),
            ("mlp.up_proj.weight", (F, C), False), ("mlp.up_proj.bias", (F,), True),
            ("mlp.down_proj.weight", (C, F), False), ("mlp.down_proj.bias", (C,), True),
            ("input_layernorm.weight", (C,), False),
            ("post_attention_layernorm.weight", (C,), False)]
    else:
        arrays = [("ln_1.weight", (C,), False), ("ln_1.bias", (C,), True),
                  ("attn.c_attn.weight", (3 * C, C), False), ("attn.c_attn.bias", (3 * C,), True),
                  ("attn.c_proj.weight", (C, C), False), ("attn.c_proj.bias", (C,), True),
                  ("ln_2.weight", (C,), False), ("ln_2.bias", (C,), True),
                  ("mlp.c_fc.weight", (F, C), False), ("mlp.c_fc.bias", (F,), True),
                  ("mlp.c_proj.weight", (C, F), False), ("mlp.c_proj.bias", (C,), True)]
    return {name: shape for name, shape, is_bias in arrays if s.bias or not is_bias}


def _outer(s: Shape) -> Tuple[Dict[str, Tuple[int, ...]], Dict[str, Tuple[int, ...]]]:
    """(the arrays before the layers, those after), in state-dict order."""
    C, V = s.n_embd, s.vocab_size
    if s.arch == "llama":
        return ({"model.embed_tokens.weight": (V, C)},
                {"model.norm.weight": (C,), "lm_head.weight": (V, C)})
    last = {"transformer.ln_f.weight": (C,)}
    if s.bias:
        last["transformer.ln_f.bias"] = (C,)
    last["lm_head.weight"] = (V, C)
    return ({"transformer.wte.weight": (V, C), "transformer.wpe.weight": (s.block_size, C)},
            last)


_PREFIX = {"gpt2": "transformer.h", "llama": "model.layers"}
_LAYER_KEY = {arch: re.compile(re.escape(prefix) + r"\.(0|[1-9][0-9]*)\.(.+)\Z")
              for arch, prefix in _PREFIX.items()}


def model_state_shapes(config: Any) -> Iterator[Tuple[str, Tuple[int, ...]]]:
    """(key, shape) of every entry of the model's ``state_dict()`` (GPT or Llama by
    ``config.arch``), in its order, made lazily: a model of 10^9 layers costs nothing until
    iterated. A tied lm_head is listed under both its names, as state_dict lists it."""
    s = model_shape(config)
    first, last = _outer(s)
    yield from first.items()
    layer, prefix = _layer(s), _PREFIX[s.arch]
    for i in range(s.n_layer):
        for name, shape in layer.items():
            yield f"{prefix}.{i}.{name}", shape
    yield from last.items()


def model_state_shape(config: Any, key: str) -> Optional[Tuple[int, ...]]:
    """The shape of ``key`` in the model's ``state_dict()``, or None if it has no such key;
    without enumerating the layers."""
    s = model_shape(config)
    first, last = _outer(s)
    if key in first or key in last:
        return first.get(key) or last[key]
    match = _LAYER_KEY[s.arch].match(key)
    if match is None or int(match.group(1)) >= s.n_layer:
        return None
    return _layer(s).get(match.group(2))


def model_state_count(config: Any) -> int:
    """Entries in the model's ``state_dict()`` (a tied matrix under both its names)."""
    s = model_shape(config)
    first, last = _outer(s)
    return len(first) + len(last) + s.n_layer * len(_layer(s))


def model_parameter_count(config: Any) -> int:
    """Elements of the model's parameters, a tied embedding/lm_head matrix once (what
    ``num_parameters()`` counts)."""
    s = model_shape(config)
    first, last = _outer(s)
    size = lambda arrays: sum(int(np.prod(shape)) for shape in arrays.values())  # noqa: E731
    tied = s.vocab_size * s.n_embd if s.tie_embeddings else 0
    return size(first) + size(last) + s.n_layer * size(_layer(s)) - tied


def describe_shape(config: Any) -> str:
    """'a GPT (n_layer 12, n_head 12, ...)' or 'a Llama (...)': what the messages name."""
    s = model_shape(config)
    if s.arch == "llama":
        return (f"a Llama (n_layer {s.n_layer}, n_head {s.n_head}, n_kv_head {s.n_kv_head}, "
                f"n_embd {s.n_embd}, ffn_hidden {s.ffn_hidden}, block_size {s.block_size}, "
                f"vocab_size {s.vocab_size})")
    return (f"a GPT (n_layer {s.n_layer}, n_head {s.n_head}, n_embd {s.n_embd}, block_size "
            f"{s.block_size}, vocab_size {s.vocab_size})")


def check_model_arrays(config: Any, dtype: Any,
                       table: Mapping[str, Tuple[Any, Tuple[int, ...]]],
                       file_size: int) -> None:
    """ValueError (one line) unless ``table`` (state-dict key -> (dtype, shape), as a
    checkpoint's header declares them) is the state dict of the model of ``config`` (a
    GPT or a Llama): the same keys and shapes, every dtype ``dtype`` (any floating dtype
    when None), and the weights' bytes within ``file_size``. Costs O(len(table)) whatever
    ``config`` claims: a metadata of 10^9 layers is refused by arithmetic."""
    smallest = np.dtype(dtype).itemsize if dtype is not None else 2  # bf16 at the least
    count = model_parameter_count(config)
    weights = count * smallest
    model = describe_shape(config)
    if weights > file_size:
        held = f"{format_bytes(weights)} in {np.dtype(dtype).name}" if dtype is not None \
            else f"at least {format_bytes(weights)}"
        raise ValueError(f"the metadata describes {model} of {count:,} parameters, {held}, "
                         f"but the whole file is {format_bytes(file_size)}")
    expected = model_state_count(config)
    if len(table) != expected:
        missing = None
        if len(table) < expected:  # one of the first len(table) + 1 expected keys is absent
            for key, _ in model_state_shapes(config):
                if key not in table:
                    missing = key
                    break
        what = f"{missing!r} is missing" if missing is not None else \
            f"{next(k for k in table if model_state_shape(config, k) is None)!r} is not " \
            f"one of its arrays"
        raise ValueError(f"the metadata describes {model} of {expected:,} arrays, the file "
                         f"holds {len(table):,}: {what}")
    for key, (found_dtype, shape) in table.items():
        wanted = model_state_shape(config, key)
        if wanted is None:
            raise ValueError(f"the file holds {key!r}, which {model} has not")
        if tuple(shape) != wanted:
            raise ValueError(f"{key} is {tuple(shape)} in the file, {wanted} in {model}")
        found_dtype = np.dtype(found_dtype)
        if dtype is not None and found_dtype != np.dtype(dtype):
            raise ValueError(f"{key} is {found_dtype.name} in the file, "
                             f"{np.dtype(dtype).name} by the metadata's dtype")
        if dtype is None and not dtypes.is_floating(found_dtype):
            raise ValueError(f"{key} is {found_dtype.name} in the file, expected a floating "
                             f"dtype")


def format_bytes(n: int) -> str:
    """``n`` bytes in decimal units: 512 B, 41.2 GB, 3.2 PB."""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        value /= 1000
        if value < 999.95:
            return f"{value:.1f} {unit}"
    value /= 1000
    return f"{value:.1f} EB" if value < 1e4 else f"{value:.3g} EB"


# the names these functions had when they knew GPT-2 only: the same functions
gpt_state_shapes = model_state_shapes
gpt_state_shape = model_state_shape
gpt_state_count = model_state_count
gpt_parameter_count = model_parameter_count
check_gpt_arrays = check_model_arrays
