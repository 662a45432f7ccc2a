"""Export a model as a Hugging Face model folder that transformers loads as it is.

``export_hf(source, out_dir)`` writes config.json (GPT2LMHeadModel or LlamaForCausalLM),
model.safetensors (float32 or bf16 as asked; metadata ``format: pt``, which transformers
asks of a safetensors file, besides this project's CRC-32s, which it ignores),
tokenizer.json (``tokenizers``' format: a byte-level BPE as it is, the character
tokenizer as a BPE of single characters giving the same ids) and tokenizer_config.json.
The weights are written before config.json: a folder an interrupted export left has no
config.json, so nothing mistakes it for a model.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Union

import ml_dtypes
import numpy as np

from ..system.atomic import atomic_write
from ..checkpoint.safetensors_file import write_safetensors
from ..data.tokenizer import END_OF_TEXT
from . import load_pretrained
from .hf_config import PretrainedError, hf_config
from .hf_weights import export_arrays

__all__ = ["EXPORT_DTYPES", "export_hf"]

EXPORT_DTYPES = {"float32": np.float32, "bf16": ml_dtypes.bfloat16}
_DTYPE_NAMES = {"float32": "float32", "bf16": "bfloat16"}  # config.json's torch_dtype
# what --overwrite removes first: config.json (so an interrupted export leaves none), the
# tokenizer files (a source without a tokenizer would keep the last one's) and the files
# read beside or instead of model.safetensors
_STALE = ("config.json", "generation_config.json", "model.safetensors.index.json",
          "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")


def export_hf(source: Union[str, Path], out_dir: Union[str, Path], *,
              dtype: str = "float32", overwrite: bool = False, **options: Any) -> Path:
    """Write ``source`` (anything ``load_pretrained`` reads: a run directory, a checkpoint,
    a Hugging Face folder) to the folder ``out_dir`` in Hugging Face's layout; the folder.
    The model is exported exactly as trained (a padded vocabulary kept, so the logits are
    the same). ``out_dir`` must be new or empty unless ``overwrite``; ``options`` are
    load_pretrained's."""
    if dtype not in EXPORT_DTYPES:
        raise PretrainedError(f"dtype must be one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}")
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise PretrainedError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise PretrainedError(f"{out}: the folder is not empty; choose a new one or pass "
                              f"--overwrite")
    loaded = load_pretrained(source, "cpu", keep_padding=True, **options)
    config, tokenizer = loaded.config, loaded.tokenizer
    special = _special_ids(loaded.meta, tokenizer)
    state = {key: value.detach().numpy() for key, value in loaded.model.state_dict().items()}
    cast = EXPORT_DTYPES[dtype]
    # the model's own arrays where no cast is asked for: no second copy of the weights
    tensors = [(key, array.astype(cast, copy=False))
               for key, array in export_arrays(config, state)]
    out.mkdir(parents=True, exist_ok=True)
    for name in _STALE:  # an earlier model's, which a reader would pair with this one's
        (out / name).unlink(missing_ok=True)
    with atomic_write(out / "model.safetensors") as f:
        write_safetensors(f, tensors, {"format": "pt"})
    del tensors, state
    if tokenizer is not None:
        _write_text(out / "tokenizer.json", tokenizer.to_tokenizers_json())
        _write_json(out / "tokenizer_config.json", _tokenizer_config(config, tokenizer))
    _write_json(out / "config.json", hf_config(config, _DTYPE_NAMES[dtype], special))
    return out


def _special_ids(meta: Dict[str, Any], tokenizer: Any) -> Dict[str, Any]:
    """bos/eos ids: an HF source's own; a byte-level BPE's <|endoftext|> (GPT-2's use)."""
    special = {k: v for k, v in meta.items() if k in ("bos_token_id", "eos_token_id")}
    if not special and getattr(tokenizer, "kind", "") == "bpe":
        token = tokenizer.hf.token_to_id(END_OF_TEXT)
        if token is not None:
            special = {"bos_token_id": token, "eos_token_id": token}
    # null rather than left out: transformers' GPT-2 would otherwise say 50256
    return {"bos_token_id": None, "eos_token_id": None, **special}


def _tokenizer_config(config: Any, tokenizer: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                           "model_max_length": config.block_size}
    if getattr(tokenizer, "kind", "") == "bpe" and \
            tokenizer.hf.token_to_id(END_OF_TEXT) is not None:
        out.update(bos_token=END_OF_TEXT, eos_token=END_OF_TEXT)
    return out


def _write_json(path: Path, data: Dict[str, Any]) -> None:
    _write_text(path, json.dumps(data, indent=2) + "\n")


def _write_text(path: Path, text: str) -> None:
    with atomic_write(path, "w") as f:
        f.write(text)
