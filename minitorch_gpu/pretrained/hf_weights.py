"""A Hugging Face model's weights <-> this project's state dict, name by name.

The Llama here uses Hugging Face's LlamaForCausalLM names, so its keys move as they are.
GPT-2 here uses nanoGPT's names, which are Hugging Face's GPT2LMHeadModel's, but Hugging
Face's GPT-2 keeps OpenAI's ``Conv1D`` layers: their weights are stored (in, out), the
transpose of a Linear's (out, in), so those four per block are transposed on the way in
and out. Files saved from the bare ``GPT2Model``/``LlamaModel`` (the Hub's ``gpt2`` is one)
lack the ``transformer.``/``model.`` prefix; GPT-2 files may hold the attention's causal
mask (``attn.bias``, ``attn.masked_bias``), a buffer that is not a weight. A tied model's
file may hold ``lm_head.weight`` or not (it is the token embedding).

Rotary positions: Hugging Face's Llama checkpoints rotate the two halves of each head
(``rotate_half``), the convention ``ops/rotary.py`` computes, so q_proj and k_proj need no
permutation (Meta's original consolidated checkpoints rotate interleaved pairs and are not
read here: convert them with transformers' conversion script first).
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from ..nn import GPTConfig
from .hf_config import PretrainedError

__all__ = ["CONV1D", "VOCAB_ROWS", "FileTensor", "export_arrays", "ignored_key", "is_conv1d",
           "map_file_tensors"]

# GPT-2's Conv1D weights, stored (in, out)
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_PREFIX = {"gpt2": "transformer.", "llama": "model."}
_IGNORED = re.compile(r"^(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$"
                      r"|^(model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")
# the (vocab_size, n_embd) arrays a padded vocabulary is cut from
VOCAB_ROWS = ("transformer.wte.weight", "model.embed_tokens.weight", "lm_head.weight")
_FLOATS = ("F16", "BF16", "F32", "F64")


def is_conv1d(config: GPTConfig, key: str) -> bool:
    return config.arch == "gpt2" and key.endswith(CONV1D)


def ignored_key(key: str) -> bool:
    """A file key that holds no weight: GPT-2's causal-mask buffers, an old Llama's
    rotary inverse frequencies."""
    return bool(_IGNORED.match(key))


class FileTensor:
    """One weight in a safetensors file (``handle``: a ``hf_folder.WeightsFile``), read
    only when ``detach()`` is called: what ``Module.load_state_dict`` copies from, so one
    array at a time is in memory. ``rows`` keeps only the first rows (a vocabulary cut
    back, a position table cropped); ``transpose`` turns a Conv1D's (in, out) into a
    Linear's (out, in)."""

    def __init__(self, handle: Any, name: str, shape: Tuple[int, ...], transpose: bool,
                 rows: Optional[int]) -> None:
        self.handle, self.name, self.transpose, self.rows = handle, name, transpose, rows
        shape = shape[::-1] if transpose else shape
        self.shape = (min(rows, shape[0]),) + shape[1:] if rows is not None else shape

    def detach(self) -> np.ndarray:
        with self.handle.mapped() as handle:  # the file is mapped for this read alone
            if self.rows is None:
                array = handle.get_tensor(self.name)
            elif self.transpose:  # the rows of the transpose are the stored columns
                array = handle.get_slice(self.name)[:, :self.rows]
            else:
                array = handle.get_slice(self.name)[:self.rows]
        return np.ascontiguousarray(array.T if self.transpose else array)


def map_file_tensors(config: GPTConfig, own_shapes: Mapping[str, Tuple[int, ...]],
                     entries: Mapping[str, Tuple[Any, str, Tuple[int, ...]]],
                     where: str, rows: Mapping[str, Tuple[int, int]]) -> Dict[str, FileTensor]:
    """Our state dict's keys -> FileTensors, from ``entries`` (each file key -> (handle,
    dtype name, shape), read from the headers alone). Every key the model has must be
    found with its shape (a tied lm_head is the embedding's FileTensor itself, so it is
    read and copied once), and every key of the file must be used; else PretrainedError
    naming the first few. ``rows[key] = (stored, kept)``: the file must hold ``stored``
    rows of our key (what config.json declares) and the first ``kept`` are read."""
    prefix = _PREFIX[config.arch]
    by_name: Dict[str, str] = {}  # our name -> file key, both spellings of the prefix
    for file_key in entries:
        if not ignored_key(file_key):
            ours = file_key if file_key.startswith(prefix) or file_key == "lm_head.weight" \
                else prefix + file_key
            if ours in by_name:  # both spellings: which one to read is anyone's guess
                raise PretrainedError(f"{where}: the weights files hold both {by_name[ours]} "
                                      f"and {file_key}, one weight spelt two ways")
            by_name[ours] = file_key
    embedding = "transformer.wte.weight" if config.arch == "gpt2" else "model.embed_tokens.weight"
    spare_head = None  # a tied model's head is its embedding, as Hugging Face ties it: an
    if config.tie_embeddings and embedding in by_name:  # lm_head.weight in the file is not read
        spare_head = by_name.pop("lm_head.weight", None)
        by_name["lm_head.weight"] = by_name[embedding]
    missing = [key for key in own_shapes if key not in by_name]
    unexpected = sorted(set(by_name.values()) - {by_name[k] for k in own_shapes if k in by_name}
                        - {k for k in entries if ignored_key(k)} - {spare_head})
    if missing:
        raise PretrainedError(f"{where}: {len(missing)} weight(s) of the {config.arch} that "
                              f"config.json describes are not in the weights files: "
                              f"{_few(missing)}")
    if unexpected:
        raise PretrainedError(f"{where}: the weights files hold {len(unexpected)} tensor(s) "
                              f"that the {config.arch} config.json describes has no place "
                              f"for: {_few(unexpected)}")
    out: Dict[str, FileTensor] = {}
    made: Dict[Tuple[str, Optional[int]], FileTensor] = {}  # one per array read
    for key, shape in own_shapes.items():
        name = by_name[key]
        handle, dtype, stored = entries[name]
        if dtype not in _FLOATS:
            raise PretrainedError(f"{where}: {name} is {dtype}; expected floats "
                                  f"({', '.join(_FLOATS)})")
        declared, kept = rows.get(key, (None, None))
        transpose = is_conv1d(config, key)
        tensor = made.setdefault((name, kept), FileTensor(handle, name, tuple(stored),
                                                          transpose, kept))
        if tensor.shape != tuple(shape):
            want = tuple(shape)[::-1] if transpose else tuple(shape)
            raise PretrainedError(f"{where}: {name} has shape {tuple(stored)}, but "
                                  f"config.json's model needs {want}"
                                  f"{' (stored transposed, as Conv1D)' if transpose else ''}")
        if declared is not None and stored[0] != declared:  # more rows than config.json says
            raise PretrainedError(f"{where}: {name} has {stored[0]} rows, but config.json's "
                                  f"model has {declared}")
        out[key] = tensor
    return out


def export_arrays(config: GPTConfig, state: Mapping[str, np.ndarray]
                  ) -> Iterator[Tuple[str, np.ndarray]]:
    """(file key, array) of a Hugging Face file for our state dict ``state`` (NumPy arrays):
    Conv1D weights transposed, GPT-2's missing biases written as zeros, a tied lm_head
    left out (Hugging Face ties it to the embedding on load)."""
    for key, array in state.items():
        if key == "lm_head.weight" and config.tie_embeddings:
            continue
        yield key, np.ascontiguousarray(array.T) if is_conv1d(config, key) \
            else array
    if config.arch == "gpt2" and not config.bias:
        for key, width in _gpt2_bias_shapes(config):
            yield key, np.zeros(width, dtype=np.float32)


def _gpt2_bias_shapes(config: GPTConfig) -> List[Tuple[str, int]]:
    C = config.n_embd
    out = []
    for i in range(config.n_layer):
        block = f"transformer.h.{i}."
        out += [(block + "ln_1.bias", C), (block + "attn.c_attn.bias", 3 * C),
                (block + "attn.c_proj.bias", C), (block + "ln_2.bias", C),
                (block + "mlp.c_fc.bias", 4 * C), (block + "mlp.c_proj.bias", C)]
    return out + [("transformer.ln_f.bias", C)]


def _few(keys: List[str], n: int = 5) -> str:
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")
