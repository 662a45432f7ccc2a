"""Where a checkpoint's parts sit in a safetensors file: tensor names and metadata entries.

Tensors are named by their part and place: ``model.<state-dict key>`` (a tied entry, the
same array under two keys, is stored once, under its first key), ``optimizer.<path>`` and
``meta.<path>`` for the arrays of the optimizer state and the metadata, the path being
their place in the nested data (``optimizer.state.0.exp_avg``,
``meta.rng.backends.cuda:0.data``; ``optimizer#<i>`` when a path is taken). The file's
``__metadata__`` holds, as JSON strings::

    format     "minitorch-gpu-checkpoint": what marks a file as ours
    version    "3" (1 and 2 were ZIP archives; see legacy_zip.py)
    meta       {"tree": the metadata, encoded (tree.py), "arrays": [tensor names]}
    model      {"keys": [state-dict keys in order], "tied": {key: the key stored}}
    optimizer  {"tree": the encoded state dict or null, "arrays": [tensor names]}
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from .tree import array_of, array_paths, is_array

__all__ = ["FORMAT", "VERSION", "Layout", "TreePart", "array_names", "layout_metadata",
           "model_tensors", "parse_layout", "read_version"]

FORMAT = "minitorch-gpu-checkpoint"  # __metadata__'s "format": what marks a file as ours
VERSION = 3  # __metadata__'s "version": raise it when old readers can't read the new layout
# (3: a safetensors file; 1 and 2, ZIP archives of .npy members, are still read)


@dataclass
class TreePart:
    """An encoded tree (metadata or optimizer state) and the tensor names of its arrays."""

    tree: Any
    arrays: List[str]


@dataclass
class Layout:
    """A checkpoint's __metadata__, parsed: what each part is made of."""

    meta: TreePart
    model_keys: List[str]
    tied: Dict[str, str]  # state-dict key -> the key whose tensor it shares
    optimizer: TreePart  # tree None when no optimizer state was saved


def model_tensors(model_state: Mapping[str, Any]) -> Tuple[Dict[str, str], List[Tuple[str, Any]]]:
    """``(tied, tensors)`` of a state dict: tied keys -> the first key of their array, and
    the (tensor name, array) pairs to write, each array once. TypeError for a bad entry."""
    tied: Dict[str, str] = {}
    tensors: List[Tuple[str, Any]] = []
    first_key: Dict[int, str] = {}
    for key, value in model_state.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"save_checkpoint: model_state key {key!r}: expected a non-empty "
                            "str")
        if not is_array(value):
            raise TypeError(f"save_checkpoint: model_state[{key!r}] is a "
                            f"{type(value).__name__}; expected a Tensor or an array")
        identity = id(array_of(value))
        if identity in first_key:
            tied[key] = first_key[identity]
        else:
            first_key[identity] = key
            tensors.append((f"model.{key}", value))
    return tied, tensors


def array_names(tree: Any, count: int, part: str) -> List[str]:
    """Tensor names for the ``count`` arrays of an encoded ``tree``: ``part.<path>`` by the
    first place each appears, ``part#<i>`` when that name is already taken."""
    paths = array_paths(tree)
    taken: Set[str] = set()
    names: List[str] = []
    for i in range(count):
        name = ".".join((part, *paths[i])) if i in paths else None
        names.append(f"{part}#{i}" if name is None or name in taken else name)
        taken.add(names[-1])
    return names


def layout_metadata(meta: TreePart, model_keys: List[str], tied: Dict[str, str],
                    optimizer: TreePart) -> Dict[str, str]:
    """The __metadata__ entries of a checkpoint (str -> str, as the format requires)."""
    def dump(value: Any) -> str:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))

    return {"format": FORMAT, "version": str(VERSION),
            "meta": dump({"tree": meta.tree, "arrays": meta.arrays}),
            "model": dump({"keys": model_keys, "tied": tied}),
            "optimizer": dump({"tree": optimizer.tree, "arrays": optimizer.arrays})}


def read_version(metadata: Mapping[str, str]) -> Optional[int]:
    """The version of a file whose metadata names our format, else None (a foreign file).
    ValueError when the version is not a number."""
    if metadata.get("format") != FORMAT:
        return None
    version = metadata.get("version", "")
    if not version.isdigit() or not 1 <= int(version) < 10 ** 6:
        raise ValueError(f"its metadata's version is {version[:40]!r}, expected a number")
    return int(version)


def parse_layout(metadata: Mapping[str, str]) -> Layout:
    """The parts of a checkpoint from its __metadata__; ValueError naming what is wrong."""
    meta = _tree_part(metadata, "meta", dict)
    optimizer = _tree_part(metadata, "optimizer", (dict, type(None)))
    model = _json_entry(metadata, "model")
    keys, tied = model.get("keys"), model.get("tied")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or \
            len(set(keys)) != len(keys):
        raise ValueError("its metadata's model keys are not a list of distinct str")
    if not isinstance(tied, dict) or not all(
            key in keys and isinstance(to, str) and to in keys and to not in tied
            for key, to in tied.items()):
        raise ValueError("its metadata's model 'tied' is not a map of its keys to untied keys")
    return Layout(meta, keys, tied, optimizer)


def _json_entry(metadata: Mapping[str, str], name: str) -> Dict[str, Any]:
    if name not in metadata:
        raise ValueError(f"its metadata has no {name!r} entry")
    value = json.loads(metadata[name])
    if not isinstance(value, dict):
        raise ValueError(f"its metadata's {name!r} is a {type(value).__name__}, expected a "
                         "dict")
    return value


def _tree_part(metadata: Mapping[str, str], name: str, kind: Any) -> TreePart:
    value = _json_entry(metadata, name)
    tree, arrays = value.get("tree"), value.get("arrays")
    if not isinstance(tree, kind):
        raise ValueError(f"its metadata's {name!r} tree is a {type(tree).__name__}")
    if not isinstance(arrays, list) or not all(isinstance(a, str) for a in arrays):
        raise ValueError(f"its metadata's {name!r} arrays are not a list of tensor names")
    return TreePart(tree, arrays)
