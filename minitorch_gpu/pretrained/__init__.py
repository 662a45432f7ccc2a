"""Models from elsewhere: Hugging Face folders and Hub names, and this project's own runs.

``from_pretrained(source)`` gives a model ready for ``model(idx)`` (``(logits, loss)``, as
any GPT or Llama here), for ``source`` one of:

- a Hugging Face model folder (config.json, model.safetensors or its shards,
  tokenizer.json): GPT-2 or Llama, chosen by config.json's ``model_type``;
- ``hf:NAME``, a model on the Hugging Face Hub (``hf:gpt2``), fetched and cached;
- a run directory of this project (its best.ckpt, else last.ckpt) or a checkpoint file.

::

    model = mt.from_pretrained("hf:gpt2")
    loaded = load_pretrained("checkpoints/shakespeare_char")  # model, tokenizer, config
    export_hf("checkpoints/shakespeare_char", "out/shakespeare_hf")  # hf_export.py

Inputs-and-outputs layer: may import ``data/`` and ``checkpoint/`` beside it, ``nn``/
``optim``, the engine and the foundation; never ``train/``, ``profiler/``, ``bench/`` or the
CLI above (``model.init_from``, which fills a run config in, is ``train/init_from.py``).
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Union

import numpy as np

from ..backend import dtypes
from ..checkpoint import CheckpointError
from ..data.tokenizer import Tokenizer
from ..nn.memory import check_workload, workload
from ..nn.build import build_model
from ..nn import CausalLM, GPTConfig, init
from .hf_config import PretrainedError
from .hf_folder import load_folder_weights, read_folder
from .hub import HUB_PREFIX, hub_folder

__all__ = ["Pretrained", "PretrainedError", "from_pretrained", "load_pretrained",
           "resolve_source"]

# check_memory(config, dtype name): refuses (raises) before any weight is read
MemoryCheck = Callable[[GPTConfig, str], None]
_DTYPES = {"float32": dtypes.float32, "float64": dtypes.float64}


@dataclass
class Pretrained:
    """A loaded model with what came with it."""

    model: CausalLM  # in eval mode, on the device asked for
    tokenizer: Optional[Tokenizer]  # None: an HF folder with no tokenizer files
    config: GPTConfig  # the model's shape (its vocabulary cut back to the tokenizer's)
    source: str  # what was asked for
    kind: str  # "hf" (a Hugging Face folder or Hub name) or "checkpoint" (a run of ours)
    path: Path  # the folder or checkpoint file read
    meta: Dict[str, Any]  # a checkpoint's metadata; an HF folder's bos/eos token ids


def from_pretrained(source: Union[str, Path], device: str = "cpu", **options: Any) -> CausalLM:
    """The model of ``source`` (see the module's docstring), in eval mode on ``device``;
    ``options`` are load_pretrained's."""
    return load_pretrained(source, device, **options).model


def resolve_source(source: Union[str, Path]) -> Path:
    """The folder or checkpoint file ``source`` names (an ``hf:`` name fetched), or
    PretrainedError naming what was expected."""
    text = str(source)
    if text.startswith(HUB_PREFIX):
        return hub_folder(text[len(HUB_PREFIX):])
    path = Path(text).expanduser()
    if not path.exists():
        raise PretrainedError(f"{text}: no such file or folder; expected a Hugging Face model "
                              f"folder, hf:NAME, a run directory or a .ckpt file")
    return path


def load_pretrained(source: Union[str, Path], device: str = "cpu", *,
                    dtype: Optional[str] = None, block_size: Optional[int] = None,
                    keep_padding: bool = False,
                    check_memory: Union[bool, MemoryCheck] = True,
                    memory_advice: str = "pass check_memory=False to try anyway"
                    ) -> Pretrained:
    """``source``'s model on ``device`` with its tokenizer and shape, or PretrainedError
    (one line: a missing or foreign source, a config this project does not compute, weights
    that disagree with the config, a pickle, a damaged file).

    ``dtype``: the weights' dtype here, float32 or float64, whatever the file stores (bf16
    files are widened); None: float32 for a Hugging Face model, a checkpoint's own. ``block_size``: crop the context (a Llama's KV cache and rotary
    tables are made that long; a Hub Llama may say 131072). ``keep_padding``: keep a
    vocabulary padded past the tokenizer's (sampling otherwise never draws padding ids).
    ``check_memory``: True checks the weights and a one-sequence KV cache against the
    device's free memory before anything is read or built (``memory.py``; a refusal,
    MemoryLimitError, ends with ``memory_advice``); a callable ``(config, dtype)``
    replaces that check; False skips it."""
    if dtype is not None and dtype not in _DTYPES:
        raise PretrainedError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if block_size is not None and not (isinstance(block_size, numbers.Integral) and
                                       not isinstance(block_size, bool) and block_size >= 1):
        # here, not after a checkpoint was read (crop_block_size's ValueError, a TypeError)
        raise PretrainedError(f"block_size must be a positive int, got {block_size!r}")

    def memory_check(from_checkpoint: bool) -> Optional[MemoryCheck]:
        return _default_memory_check(device, from_checkpoint, memory_advice) \
            if check_memory is True else check_memory or None
    path = resolve_source(source)
    if path.is_dir() and (path / "config.json").is_file():
        return _load_folder(str(source), path, device, dtype or "float32", block_size, keep_padding,
                            memory_check(False))  # one file tensor held at a time
    if path.is_dir() and not any((path / n).is_file() for n in ("best.ckpt", "last.ckpt")):
        raise PretrainedError(f"{path}: neither a Hugging Face model folder (no config.json) "
                              f"nor a run directory (no best.ckpt or last.ckpt)")
    return _load_checkpoint(str(source), path, device, dtype, block_size, keep_padding,
                            memory_check(True))  # the checkpoint's arrays all held


def _default_memory_check(device: str, from_checkpoint: bool, advice: str) -> MemoryCheck:
    from ..backend import get_backend

    def check(config: GPTConfig, dtype: str) -> None:
        names = {"n_layer": "n_layer", "n_embd": "n_embd", "block_size": "block_size",
                 "vocab_size": "vocab_size"}
        if config.arch == "llama":  # the KV cache's heads, the MLP's width
            names.update(n_kv_head="n_kv_head", ffn_hidden="ffn_hidden")
        check_workload(workload("generate", config, dtype=dtype, device=device,
                                from_checkpoint=from_checkpoint), get_backend(device), None,
                       names, advice)
    return check


def _load_folder(source: str, path: Path, device: str, dtype: str,
                 block_size: Optional[int], keep_padding: bool,
                 memory_check: Optional[MemoryCheck]) -> Pretrained:
    folder = read_folder(path)
    config, tokenizer = folder.config, folder.tokenizer
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise PretrainedError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but "
                              f"config.json's vocab_size is {config.vocab_size}")
    if tokenizer is not None and not keep_padding:
        # a vocabulary padded for speed: the padding rows are never read or sampled
        config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)
    if block_size is not None:  # a GPT-2's position table read only that far; a Llama's
        # rotary tables and KV cache made that long
        config = dataclasses.replace(config, block_size=min(block_size, config.block_size))
    if memory_check is not None:
        memory_check(config, dtype)
    # every weight is read from the files (map_file_tensors checks it): no random init;
    # a float64 model is cast from float32 memory never written, quietly
    with init.skipped(), np.errstate(invalid="ignore", over="ignore"):
        model = build_model(config, _DTYPES[dtype])
    load_folder_weights(model, folder)  # one file tensor read at a time
    return Pretrained(model.to(device).eval(), tokenizer, config, source, "hf", path,
                      dict(folder.special))


def _load_checkpoint(source: str, path: Path, device: str, dtype: Optional[str],
                     block_size: Optional[int], keep_padding: bool,
                     memory_check: Optional[MemoryCheck]) -> Pretrained:
    from .inference import load_for_inference, resolve_checkpoint

    def check(config: GPTConfig, meta: Dict[str, Any]) -> None:
        if memory_check is not None:  # the trainer keeps float32 weights for bf16 runs
            memory_check(config, dtype or ("float64" if meta.get("dtype") == "float64"
                                           else "float32"))
    try:
        model, tokenizer, meta = load_for_inference(path, "cpu", keep_padding=keep_padding,
                                                    check_memory=check)
    except CheckpointError as exc:
        raise PretrainedError(str(exc)) from None
    if block_size is not None and block_size < model.config.block_size:
        model.crop_block_size(block_size)
    if dtype is not None:
        model = model.to(_DTYPES[dtype])
    model = model.to(device).eval()
    return Pretrained(model, tokenizer, model.config, source, "checkpoint",
                      resolve_checkpoint(path), meta)
