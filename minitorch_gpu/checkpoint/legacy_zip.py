"""Checkpoints of formats 1 and 2: ZIP archives of .npy members, as minitorch-gpu wrote them
before safetensors. Read only; pickles are never loaded.

Members: ``format.json`` ({"format": "minitorch-gpu-checkpoint", "version": 1 or 2}),
``meta.json`` (format 2: {"tree", "arrays": [index entries]}; format 1: the tree alone),
``model.json`` ({"arrays": [{"key", "file", "dtype", "encoding", "shape"}, ...]}),
``optimizer.json`` ({"tree", "arrays"}), and one .npy member per array. An entry's
encoding is "npy" (the member holds the array as it is) or "raw" (an ml_dtypes dtype such
as bfloat16 stored as the unsigned integer of its width).
"""
from __future__ import annotations

import json
import re
import zipfile
from typing import Any, BinaryIO, Callable, Dict, Optional, Tuple

import ml_dtypes
import numpy as np

from .errors import CheckpointError
from .layout import FORMAT
from .safetensors_file import TruncatedError
from .tree import decode_tree

__all__ = ["ZIP_SIGNATURE", "read_legacy"]

ZIP_SIGNATURE = b"PK\x03\x04"  # how a ZIP archive, so every format 1 and 2 file, begins
LEGACY_VERSIONS = (1, 2)


def read_legacy(file: BinaryIO, size: int, name: str, *, meta_only: bool = False,
                load_optimizer: bool = True, check: Optional[Callable[..., None]] = None
                ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray], Optional[Dict[str, Any]]]:
    """``(meta, model, optimizer)`` of the ZIP checkpoint ``file`` (``size`` bytes; ``name``
    for errors). ``check(meta, table, size)`` runs on the model index before any array is
    read. CheckpointError for a foreign ZIP archive, TruncatedError for an incomplete one;
    ValueError, zipfile's and numpy's errors for a damaged one."""
    try:
        archive = zipfile.ZipFile(file)
    except zipfile.BadZipFile:
        raise TruncatedError("it is not a complete ZIP archive") from None
    with archive:
        version = _check_format(archive, name)
        total = sum(info.file_size for info in archive.infolist())
        if total > size:  # a compressed member could expand without limit
            raise ValueError(f"its members hold {total} bytes, more than the whole file's "
                             f"{size}")
        saved = _read_json(archive, "meta.json")
        meta_tree, meta_index = (saved, []) if version == 1 else (
            _field(saved, "meta.json", "tree", dict), _field(saved, "meta.json", "arrays", list))
        meta = decode_tree(meta_tree, [_read_array(archive, e) for e in meta_index])
        if not isinstance(meta, dict):
            raise ValueError(f"meta.json holds a {type(meta).__name__}, expected a dict")
        if meta_only:
            return meta, {}, None
        index = _field(_read_json(archive, "model.json"), "model.json", "arrays", list)
        table = {}
        for i, entry in enumerate(index):
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), str) \
                    or entry["key"] in table:
                raise ValueError(f"model.json entry {i}: expected a new str 'key'")
            table[entry["key"]] = _dtype_and_shape(entry, f"model.json entry {i}")
        if check is not None:
            check(meta, table, size)
        model, by_file = {}, {}  # tied keys share one member
        for entry in index:
            if entry.get("file") not in by_file:
                by_file[entry.get("file")] = _read_array(archive, entry)
            model[entry["key"]] = by_file[entry.get("file")]
        optimizer = None
        if load_optimizer:
            saved = _read_json(archive, "optimizer.json")
            tree = _field(saved, "optimizer.json", "tree", (dict, type(None)))
            arrays = [_read_array(archive, e)
                      for e in _field(saved, "optimizer.json", "arrays", list)]
            optimizer = decode_tree(tree, arrays)
        return meta, model, optimizer


def _check_format(archive: zipfile.ZipFile, name: str) -> int:
    """The version format.json names; CheckpointError unless it marks a checkpoint."""
    if "format.json" not in archive.namelist():
        raise CheckpointError(f"{name!r} is not a minitorch-gpu checkpoint: it is a ZIP "
                              "archive without format.json")
    marker = _read_json(archive, "format.json")
    found = marker.get("format") if isinstance(marker, dict) else None
    if found != FORMAT:
        raise CheckpointError(f"{name!r} is not a minitorch-gpu checkpoint: its format.json "
                              f"names format {str(found)[:60]!r}, expected {FORMAT!r}")
    version = marker.get("version")
    if version not in LEGACY_VERSIONS or isinstance(version, bool):
        raise ValueError(f"format.json: expected version 1 or 2 in a ZIP checkpoint, got "
                         f"{str(version)[:40]!r}")
    return version


def _read_json(archive: zipfile.ZipFile, member: str) -> Any:
    if member not in archive.namelist():
        raise ValueError(f"it has no {member} member")
    return json.loads(archive.read(member).decode("utf-8"))


def _field(data: Any, member: str, key: str, kind: Any) -> Any:
    if not isinstance(data, dict) or not isinstance(data.get(key, ...), kind):
        raise ValueError(f"{member} has no {key!r} of the expected type")
    return data[key]


def _dtype_and_shape(entry: Any, where: str) -> Tuple[np.dtype, Tuple[int, ...]]:
    """The dtype and shape an index entry declares; ValueError if it is malformed."""
    if not isinstance(entry, dict) or not {"file", "dtype", "encoding", "shape"} <= set(entry):
        raise ValueError(f"{where}: expected the keys file, dtype, encoding and shape")
    name, shape = entry["dtype"], entry["shape"]
    if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ValueError(f"{where}: expected 'shape' to be a list of sizes, got {shape!r}")
    dtype = None
    if entry["encoding"] == "npy" and isinstance(name, str) and \
            re.fullmatch(r"[<>|=][biufc]\d{1,2}", name):
        dtype = np.dtype(name)
    elif entry["encoding"] == "raw" and isinstance(name, str) and \
            re.fullmatch(r"[a-z][a-z0-9_]*", name) and isinstance(getattr(ml_dtypes, name, None),
                                                                  type):
        dtype = np.dtype(getattr(ml_dtypes, name))
    if dtype is None:
        raise ValueError(f"{where}: unknown dtype {str(name)[:40]!r} for encoding "
                         f"{str(entry['encoding'])[:20]!r}")
    return dtype, tuple(shape)


def _read_array(archive: zipfile.ZipFile, entry: Any) -> np.ndarray:
    """One .npy member, checked against its index entry (zipfile checks its CRC)."""
    dtype, shape = _dtype_and_shape(entry, f"entry {str(entry.get('file'))[:80]!r}")
    stored = dtype if entry["encoding"] == "npy" else np.dtype(f"u{dtype.itemsize}")
    with archive.open(entry["file"]) as member:
        array = np.lib.format.read_array(member, allow_pickle=False)
        if member.read(1):
            raise ValueError(f"{entry['file']} has bytes after its data")
    if array.dtype != stored or array.shape != shape:
        raise ValueError(f"{entry['file']} holds {array.dtype} {array.shape}, its index says "
                         f"{stored} {shape}")
    return array if entry["encoding"] == "npy" else array.view(dtype)

