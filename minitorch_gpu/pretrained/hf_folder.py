"""A Hugging Face model folder: config.json, safetensors weights, tokenizer.json.

The weights are read with the ``safetensors`` package, memory-mapped: the headers first
(every name, dtype and shape checked against the model config.json describes before any
data is read), then one tensor at a time straight into the model's parameters, each file
mapped only while one tensor is read from it (a mapping's touched pages count in the
process's RSS until it is closed: a file held open for the whole load would add the
file's size to the peak). A sharded
model (``model.safetensors.index.json`` naming each tensor's file) reads the same way.
``pytorch_model.bin`` is a pickle (loading one runs whatever code it names): refused.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..data.tokenizer import END_OF_TEXT, BPETokenizer, Tokenizer, tokenizer_from_json
from ..nn import GPTConfig
from .hf_config import PretrainedError, config_from_hf
from .hf_weights import VOCAB_ROWS, map_file_tensors

__all__ = ["HFFolder", "PICKLES", "WeightsFile", "load_folder_weights", "open_weights",
           "read_folder"]

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.ckpt.index",
           "tf_model.h5", "flax_model.msgpack")


@dataclass
class HFFolder:
    """What a folder holds, read and checked, before any weight is: the model's shape,
    the weights' files and the tokenizer (None when the folder has none)."""

    path: Path
    config: GPTConfig  # as config.json says (its vocab_size, its context)
    files: List[Path]
    tokenizer: Optional[Tokenizer]
    special: Dict[str, Any]  # config.json's bos_token_id / eos_token_id


def read_folder(path: Path) -> HFFolder:
    """The folder's config, weight files and tokenizer, or PretrainedError (one line)."""
    config_path = path / "config.json"
    if not config_path.is_file():
        raise PretrainedError(f"{path}: no config.json; expected a Hugging Face model folder "
                              f"(config.json, model.safetensors, tokenizer.json)")
    try:
        data = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PretrainedError(f"{config_path}: not readable JSON ({exc})") from None
    config = config_from_hf(data, str(config_path))
    special = {key: data[key] for key in ("bos_token_id", "eos_token_id")
               if _token_ids(data.get(key))}  # an id, or a list of them (Llama 3's eos)
    return HFFolder(path, config, _weight_files(path), _tokenizer(path), special)


def _token_ids(value: Any) -> bool:
    ids = value if isinstance(value, list) and value else [value]
    return all(isinstance(i, int) and not isinstance(i, bool) for i in ids)


def _weight_files(path: Path) -> List[Path]:
    if (path / WEIGHTS).is_file():
        return [path / WEIGHTS]
    if (path / INDEX).is_file():
        try:
            index = json.loads((path / INDEX).read_text(encoding="utf-8"))
            names = sorted(set(index["weight_map"].values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError,
                AttributeError) as exc:
            raise PretrainedError(f"{path / INDEX}: expected JSON with a weight_map of "
                                  f"tensor -> file ({type(exc).__name__}: {exc})") from None
        for name in names:
            if not isinstance(name, str) or not name or "/" in name or "\\" in name or \
                    name.startswith(".") or not (path / name).is_file():
                raise PretrainedError(f"{path / INDEX}: names {name!r}, which is not a file "
                                      f"in the folder")
        files = [path / name for name in names]
        return files
    pickles = [name for name in PICKLES if (path / name).exists()]
    if pickles:
        raise PretrainedError(
            f"{path}: holds {pickles[0]}, not safetensors; this project reads no pickles "
            f"(unpickling runs code): convert it once where torch is installed with "
            f"python -c \"from transformers import AutoModelForCausalLM as M; "
            f"M.from_pretrained('{path}').save_pretrained('{path}')\"")
    raise PretrainedError(f"{path}: no {WEIGHTS} (or {INDEX} and its shards)")


def _tokenizer(path: Path) -> Optional[Tokenizer]:
    """tokenizer.json, else GPT-2's vocab.json + merges.txt as a byte-level BPE, else None."""
    if (path / "tokenizer.json").is_file():
        try:
            return tokenizer_from_json((path / "tokenizer.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise PretrainedError(f"{path / 'tokenizer.json'}: {exc}") from None
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        import tokenizers
        try:
            model = tokenizers.models.BPE.from_file(str(path / "vocab.json"),
                                                    str(path / "merges.txt"))
        except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception
            raise PretrainedError(f"{path}: vocab.json/merges.txt unreadable ({exc})") from None
        hf = tokenizers.Tokenizer(model)
        hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = tokenizers.decoders.ByteLevel()
        if model.token_to_id(END_OF_TEXT) is not None:  # one token, as GPT-2's tokenizer.json
            hf.add_special_tokens([END_OF_TEXT])  # has it (else split into 8 byte pieces)
        return BPETokenizer(hf)
    return None


class WeightsFile:
    """A safetensors file, memory-mapped (``safetensors.safe_open``) only inside
    ``mapped()``: what a FileTensor reads its one tensor through."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def mapped(self):
        from safetensors import SafetensorError, safe_open
        try:
            handle = safe_open(str(self.path), framework="numpy")
        except (SafetensorError, OSError) as exc:
            raise _unreadable(self.path, exc) from None
        with handle:
            yield handle


@contextlib.contextmanager
def open_weights(files: List[Path]):
    """The files' tensors as {key: (WeightsFile, dtype name, shape)}, from their headers
    (each file mapped while its header is read, then again for each tensor read). A
    damaged file is one line."""
    from safetensors import SafetensorError
    entries: Dict[str, Tuple[Any, str, Tuple[int, ...]]] = {}
    for path in files:
        file = WeightsFile(path)
        with file.mapped() as handle:
            try:
                for key in handle.keys():
                    if key in entries:
                        raise PretrainedError(f"{path}: {key} is also in another weights "
                                              f"file")
                    info = handle.get_slice(key)
                    entries[key] = (file, info.get_dtype(), tuple(info.get_shape()))
            except (SafetensorError, OSError) as exc:
                raise _unreadable(path, exc) from None
    yield entries


def load_folder_weights(model: Any, folder: HFFolder) -> None:
    """Copy the folder's weights into ``model``: folder.config's model, or one keeping
    fewer rows of it (a vocabulary cut back to the tokenizer's, a GPT-2's context cropped),
    whose arrays must still hold the rows config.json declares. Every name and shape is
    checked from the headers before the first tensor is read; then one at a time."""
    ours, theirs = model.config, folder.config
    rows = {key: (theirs.vocab_size, ours.vocab_size) for key in VOCAB_ROWS}
    if ours.arch == "gpt2":
        rows["transformer.wpe.weight"] = (theirs.block_size, ours.block_size)
    own = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    with open_weights(folder.files) as entries:
        model.load_state_dict(map_file_tensors(ours, own, entries, str(folder.path), rows))


def _unreadable(path: Path, exc: Exception) -> PretrainedError:
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return PretrainedError(f"{path}: not a readable safetensors file ({first})")
