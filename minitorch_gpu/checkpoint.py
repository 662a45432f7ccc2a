"""Checkpoint files: a model's state dict, an optimizer's state and JSON metadata in one file.

A checkpoint is a ZIP archive of uncompressed members, written atomically and read without
running any code: arrays are ``.npy`` members read with pickling off, the rest is JSON.
Members, in the order written::

    format.json        {"format": "minitorch-gpu-checkpoint", "version": 2}
    meta.json          {"tree": the caller's metadata, encoded (see encode_tree for tuples,
                       NaN, int keys and arrays), "arrays": [index entries]}
    meta/<n>.npy       its arrays (a CUDA generator's state: 13 MB of bytes, not base64 text)
    model.json         the model's index: {"arrays": [{"key", "file", "dtype", "encoding",
                       "shape"}, ...]} in state-dict order
    model/<key>.npy    one .npy per state-dict entry; tied entries (the same array under
                       two names) share one member
    optimizer.json     {"tree": the encoded state dict, "arrays": [index entries]}; the tree
                       is null when no optimizer state was saved (the member is always
                       there, so a damaged ZIP directory can't hide it)
    optimizer/<n>.npy  its arrays, numbered in the order the tree meets them

Version 1 (still read) had no meta arrays: its meta.json is the encoded metadata alone.
An index entry's ``"encoding"`` is ``"npy"`` (the member holds the array as it is) or
``"raw"``: a dtype the .npy format can't describe (bfloat16 and ml_dtypes' other small
floats) is stored as its unsigned-integer view of the same width, and ``"dtype"`` names the
dtype it loads back as. Members carry a fixed timestamp: the same content gives the same
bytes.

>>> save_checkpoint("out/last.ckpt", model.state_dict(), opt.state_dict(), {"iter": 500})
>>> ckpt = load_checkpoint("out/last.ckpt")
>>> model.load_state_dict(ckpt.model); opt.load_state_dict(ckpt.optimizer)
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import ml_dtypes
import numpy as np

from .atomic import atomic_write
from .backend import backend_of_array
from .tensor import Tensor

__all__ = ["Checkpoint", "CheckpointError", "FORMAT", "VERSION", "decode_tree", "encode_tree",
           "load_checkpoint", "read_checkpoint_meta", "save_checkpoint"]

FORMAT = "minitorch-gpu-checkpoint"  # format.json's "format": what marks a file as ours
VERSION = 2  # format.json's "version": raise it when old readers can't read the new layout
# (2: meta.json became {"tree", "arrays"}, so metadata may hold arrays; 1 is still read)

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")
# load_checkpoint's check: (meta, {state-dict key: (dtype, shape)}, file size in bytes)
TableCheck = Callable[[Dict[str, Any], Dict[str, Tuple[np.dtype, Tuple[int, ...]]], int], None]

# tags of the tree encoding: a JSON object with exactly one of these keys is not a dict
_ARRAY, _TUPLE, _DICT, _FLOAT = "__array__", "__tuple__", "__dict__", "__float__"
_TAGS = frozenset({_ARRAY, _TUPLE, _DICT, _FLOAT})
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

_NPY_KINDS = frozenset("biufc")  # bool, ints, floats, complex: what .npy describes natively
_SAFE_MEMBER = re.compile(r"[A-Za-z0-9_.\-]{1,200}\Z")  # keys used as member names as they are
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a ZIP records: reproducible archives
_READ_CHUNK = 16 << 20  # bytes read from a member at a time
_LOCAL_HEADER = b"PK\x03\x04"  # how every ZIP archive (and this writer's output) begins
_LOCAL_HEADER_SIZE = 30  # bytes before the first member's name in a ZIP

# what reading a damaged file can raise, from zipfile, json, numpy's .npy header parser and
# this module's checks (RuntimeError covers zipfile's "encrypted" and a RecursionError from
# absurdly nested JSON; MemoryError a damaged header asking for an absurd array)
_READ_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, ValueError, OSError,
                EOFError, struct.error, NotImplementedError, RuntimeError, OverflowError,
                MemoryError)


class CheckpointError(RuntimeError):
    """A checkpoint file that can't be loaded: the message names the file and what is wrong."""


@dataclass
class Checkpoint:
    """What ``load_checkpoint`` read: NumPy arrays, ready for ``load_state_dict``."""

    model: Dict[str, np.ndarray] = field(repr=False)  # for Module.load_state_dict
    # for Optimizer.load_state_dict; None when none was saved or load_optimizer=False
    optimizer: Optional[Dict[str, Any]] = field(repr=False)
    meta: Dict[str, Any]  # the metadata given to save_checkpoint
    path: Path  # the file it was read from


# --- the tree encoding: nested containers of numbers, strings and arrays as JSON ------------
def encode_tree(value: Any) -> Tuple[Any, List[np.ndarray]]:
    """``(tree, arrays)``: ``value`` as JSON data plus the arrays taken out of it.

    Dicts with str keys, lists, str, int (any size), finite float, bool and None stay as
    they are; every Tensor or array (NumPy, CuPy) becomes ``{"__array__": i}``, an index
    into ``arrays`` (NumPy, on the host; the same array object twice is one entry); a tuple
    becomes ``{"__tuple__": [...]}``, NaN and infinities ``{"__float__": "nan"}``, and a
    dict with a non-str key (or a key that is one of these tags) ``{"__dict__": [[key,
    value], ...]}``. NumPy scalars become Python numbers. ``decode_tree`` inverts it.

    >>> encode_tree({"state": {0: {"step": 2}}, "betas": (0.9, 0.95)})
    ({'state': {'__dict__': [[0, {'step': 2}]]}, 'betas': {'__tuple__': [0.9, 0.95]}}, [])
    """
    found: List[Any] = []
    tree = _encode(value, found, {}, "encode_tree: value")
    return tree, [_to_host(array) for array in found]


def decode_tree(tree: Any, arrays: Sequence[Any] = ()) -> Any:
    """The value ``encode_tree`` encoded as ``tree``, with ``{"__array__": i}`` as
    ``arrays[i]``. Raises ValueError naming the place where ``tree`` is malformed."""
    return _decode(tree, arrays, "tree")


def _is_array(value: Any) -> bool:
    return isinstance(value, (Tensor, np.ndarray)) or hasattr(value, "__cuda_array_interface__")


def _array_of(value: Any) -> Any:
    """The raw array (NumPy or CuPy) of a Tensor or an array, without copying it."""
    return value.data if isinstance(value, Tensor) else value


def _to_host(value: Any) -> np.ndarray:
    """A Tensor or an array as a NumPy array (CuPy arrays are copied to the host)."""
    if isinstance(value, Tensor):
        return value.backend.to_numpy(value.data)
    if isinstance(value, np.ndarray):
        return value
    return backend_of_array(value).to_numpy(value)


def _encode(value: Any, arrays: List[Any], index_of: Dict[int, int], where: str,
            allow_arrays: bool = True) -> Any:
    """``value`` as JSON data; arrays are appended to ``arrays`` (``index_of``: id -> index)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)  # an int subclass (IntEnum) as a plain int
    if isinstance(value, float):  # np.float64 too
        number = float(value)
        return number if math.isfinite(number) else {_FLOAT: repr(number)}
    if isinstance(value, np.generic) and not isinstance(value, (np.void, np.flexible)):
        item = value.item()  # np.int64, np.bool_, np.float32, a bfloat16 scalar, ...
        if isinstance(item, (bool, int, float)):
            return _encode(item, arrays, index_of, where, allow_arrays)
    if _is_array(value):
        if not allow_arrays:
            raise TypeError(f"{where} is a {type(value).__name__}; expected JSON data "
                            "(numbers, str, bool, None, lists, tuples, dicts), no arrays")
        array = _array_of(value)
        if array.dtype.hasobject:
            raise TypeError(f"{where} is an array of Python objects (dtype object); only "
                            "numeric arrays can be saved")
        if id(array) not in index_of:
            index_of[id(array)] = len(arrays)
            arrays.append(value)
        return {_ARRAY: index_of[id(array)]}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(item, arrays, index_of, f"{where}[{i}]", allow_arrays)
                         for i, item in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(item, arrays, index_of, f"{where}[{i}]", allow_arrays)
                for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        if all(isinstance(key, str) for key in value) and not _TAGS.intersection(value):
            return {key: _encode(item, arrays, index_of, f"{where}[{key!r}]", allow_arrays)
                    for key, item in value.items()}
        pairs = []
        for key, item in value.items():
            _check_key(key, f"{where}: key {key!r}")
            pairs.append([_encode(key, arrays, index_of, where, allow_arrays=False),
                          _encode(item, arrays, index_of, f"{where}[{key!r}]", allow_arrays)])
        return {_DICT: pairs}
    raise TypeError(f"{where} is a {type(value).__name__}; expected a dict, list, tuple, str, "
                    "int, float, bool, None" + (", Tensor or array" if allow_arrays else ""))


def _check_key(key: Any, where: str) -> None:
    """TypeError unless ``key`` is a str, a number, a bool, None or a tuple of them."""
    if isinstance(key, tuple):
        for item in key:
            _check_key(item, where)
    elif not (key is None or isinstance(key, (str, int, float, bool, np.number, np.bool_))):
        raise TypeError(f"{where} is a {type(key).__name__}; expected a dict key that is a "
                        "str, a number, a bool, None or a tuple of them")


def _decode(node: Any, arrays: Sequence[Any], where: str) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(item, arrays, f"{where}[{i}]") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        raise ValueError(f"decode_tree: {where} is a {type(node).__name__}; expected JSON data")
    tags = _TAGS.intersection(node)
    if not tags:
        return {key: _decode(item, arrays, f"{where}[{key!r}]") for key, item in node.items()}
    if len(node) != 1:
        raise ValueError(f"decode_tree: {where} mixes the tag {sorted(tags)[0]!r} with other "
                         f"keys {sorted(node)}; expected the tag alone")
    (tag, body), = node.items()
    if tag == _ARRAY:
        if isinstance(body, bool) or not isinstance(body, int) or not 0 <= body < len(arrays):
            raise ValueError(f"decode_tree: {where}: expected an array index in "
                             f"[0, {len(arrays)}), got {body!r}")
        return arrays[body]
    if tag == _FLOAT:
        if not isinstance(body, str) or body not in _NON_FINITE:
            raise ValueError(f"decode_tree: {where}: expected one of {sorted(_NON_FINITE)}, "
                             f"got {body!r}")
        return _NON_FINITE[body]
    if not isinstance(body, list):
        raise ValueError(f"decode_tree: {where}: expected a list after {tag!r}, got "
                         f"{type(body).__name__}")
    if tag == _TUPLE:
        return tuple(_decode(item, arrays, f"{where}[{i}]") for i, item in enumerate(body))
    out = {}
    for i, pair in enumerate(body):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"decode_tree: {where}: item {i} of {_DICT!r}: expected a "
                             f"[key, value] pair, got {str(pair)[:80]}")
        key = _decode(pair[0], (), f"{where}: key {i}")
        try:
            hash(key)
        except TypeError:
            raise ValueError(f"decode_tree: {where}: key {i} is a {type(key).__name__}, "
                             "which can't be a dict key") from None
        out[key] = _decode(pair[1], arrays, f"{where}[{key!r}]")
    return out


# --- arrays in .npy members -------------------------------------------------------------------
def _npy_can_describe(dtype: np.dtype) -> bool:
    """Whether a .npy header describes ``dtype`` so that it reads back as the same dtype."""
    if dtype.kind not in _NPY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        return False
    try:
        return np.dtype(dtype.str) == dtype
    except TypeError:  # ml_dtypes' float8_e5m2 says '<f1', which NumPy doesn't read
        return False


def _npy_dtype(name: Any) -> Optional[np.dtype]:
    """The dtype a .npy-native dtype string ("<f4", "|b1") names, else None."""
    if not isinstance(name, str) or not re.fullmatch(r"[<>|=][biufc]\d{1,2}", name):
        return None
    try:
        dtype = np.dtype(name)
    except TypeError:  # "<f3", say
        return None
    return dtype if _npy_can_describe(dtype) else None


def _raw_dtype(name: Any) -> Optional[np.dtype]:
    """The ml_dtypes dtype called ``name`` (bfloat16, float8_e4m3fn, ...), else None."""
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        return None
    kind = getattr(ml_dtypes, name, None)
    try:
        dtype = np.dtype(kind) if isinstance(kind, type) else None
    except TypeError:
        return None
    return dtype if dtype is not None and dtype.name == name else None


def _stored_dtype(dtype: np.dtype, encoding: str) -> np.dtype:
    """The dtype the .npy member holds: ``dtype`` itself, or for "raw" the unsigned integer
    of its width."""
    return dtype if encoding == "npy" else np.dtype(f"u{dtype.itemsize}")


def _index_entry(value: Any, file: str, where: str) -> Dict[str, Any]:
    """The index record of one array: its member, true dtype, encoding and shape."""
    array = _array_of(value)
    dtype = np.dtype(array.dtype)
    if _npy_can_describe(dtype):
        return {"file": file, "dtype": dtype.str, "encoding": "npy",
                "shape": list(array.shape)}
    raw = _raw_dtype(dtype.name)
    if raw is None or raw != dtype or dtype.itemsize not in (1, 2, 4, 8):
        raise TypeError(f"save_checkpoint: {where} has dtype {dtype}, which can't be saved; "
                        "expected a bool, integer, float or complex dtype, or one of "
                        "ml_dtypes' (bfloat16, float8_*)")
    return {"file": file, "dtype": dtype.name, "encoding": "raw", "shape": list(array.shape)}


def _member_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16  # rw-r--r-- when someone unzips it
    return info


def _write_json(archive: zipfile.ZipFile, name: str, data: Any) -> None:
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    archive.writestr(_member_info(name), text.encode("utf-8"))


def _write_array(archive: zipfile.ZipFile, value: Any, entry: Dict[str, Any]) -> None:
    """Write one array (brought to the host now, one at a time) as the .npy member ``entry``
    names; "raw" dtypes as their unsigned view."""
    host = _to_host(value)
    if entry["encoding"] == "raw":  # same width, so any layout views (0-d arrays too)
        host = host.view(_stored_dtype(host.dtype, "raw"))
    big = host.nbytes + (1 << 16) >= zipfile.ZIP64_LIMIT  # a header of 64 KiB at most
    with archive.open(_member_info(entry["file"]), "w", force_zip64=big) as member:
        np.lib.format.write_array(member, host, allow_pickle=False)


def _read_npy_header(member: Any, info: zipfile.ZipInfo, entry: Dict[str, Any],
                     archive_size: int) -> Tuple[bool, int]:
    """Read the .npy header of ``member`` (open at its start) and check it against its
    index ``entry`` (ValueError if they disagree): (Fortran order, bytes of data)."""
    dtype, encoding, shape = entry["dtype"], entry["encoding"], entry["shape"]
    stored_dtype = _stored_dtype(dtype, encoding)
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        header_shape, fortran, header_dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        header_shape, fortran, header_dtype = np.lib.format.read_array_header_2_0(member)
    else:
        raise ValueError(f"{entry['file']}: .npy version {version}, expected 1.0 or 2.0")
    if header_dtype != stored_dtype or tuple(header_shape) != shape:
        raise ValueError(f"{entry['file']} holds {header_dtype} {tuple(header_shape)}, "
                         f"its index says {stored_dtype} {shape}")
    nbytes = math.prod(shape) * stored_dtype.itemsize
    data_bytes = info.file_size - member.tell()
    if data_bytes != nbytes or (info.compress_type == zipfile.ZIP_STORED
                                and nbytes > archive_size):
        raise ValueError(f"{entry['file']} holds {data_bytes} bytes of data, expected "
                         f"{nbytes}")
    return fortran, nbytes


def _read_array(archive: zipfile.ZipFile, entry: Dict[str, Any], archive_size: int
                ) -> np.ndarray:
    """Read and check one .npy member against its index ``entry`` (ValueError if they
    disagree); zipfile checks the CRC once the last byte is read."""
    dtype, encoding, shape = entry["dtype"], entry["encoding"], entry["shape"]
    stored_dtype = _stored_dtype(dtype, encoding)
    info = archive.getinfo(entry["file"])
    with archive.open(info) as member:
        fortran, nbytes = _read_npy_header(member, info, entry, archive_size)
        array = np.empty(shape[::-1] if fortran else shape, stored_dtype)
        buffer = memoryview(array.reshape(-1).view(np.uint8))
        done = 0
        while done < nbytes:
            count = member.readinto(buffer[done:done + _READ_CHUNK])
            if not count:
                raise EOFError(f"{entry['file']} ends after {done} of {nbytes} data bytes")
            done += count
        if member.read(1):
            raise ValueError(f"{entry['file']} has bytes after its data")
    array = array.T if fortran else array
    return array.view(dtype) if encoding == "raw" else array


def _parse_entry(entry: Any, where: str) -> Dict[str, Any]:
    """An index entry with ``dtype`` as a NumPy dtype and ``shape`` as a tuple; ValueError
    naming ``where`` if it is malformed."""
    keys = {"file", "dtype", "encoding", "shape"}
    if not isinstance(entry, dict) or not keys <= set(entry):
        raise ValueError(f"{where}: expected a dict with the keys {sorted(keys)}, got "
                         f"{str(entry)[:80]}")
    file, name, encoding, shape = (entry[key] for key in ("file", "dtype", "encoding", "shape"))
    if not isinstance(file, str):
        raise ValueError(f"{where}: expected a str 'file', got {type(file).__name__}")
    if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ValueError(f"{where}: expected 'shape' to be a list of sizes, got {shape!r}")
    if encoding == "npy":
        dtype = _npy_dtype(name)
    elif encoding == "raw":
        dtype = _raw_dtype(name)
    else:
        raise ValueError(f"{where}: expected encoding 'npy' or 'raw', got {encoding!r}")
    if dtype is None:
        raise ValueError(f"{where}: unknown dtype {name!r} for encoding {encoding!r}")
    return {**entry, "dtype": dtype, "shape": tuple(shape)}


# --- saving -----------------------------------------------------------------------------------
def save_checkpoint(path: PathLike, model_state: Mapping[str, Any],
                    optimizer_state: Optional[Mapping[str, Any]] = None,
                    meta: Optional[Mapping[str, Any]] = None) -> Path:
    """Write a checkpoint file atomically; returns its path.

    ``model_state`` maps names to Tensors or arrays (``model.state_dict()``),
    ``optimizer_state`` is ``optimizer.state_dict()`` (or any nested data with arrays, see
    ``encode_tree``), ``meta`` is JSON data (numbers, str, lists, tuples, dicts) and arrays
    (a CUDA generator's state from ``backend.get_rng_state()``), each array stored as a
    .npy member of its own.
    Everything is checked before the disk is touched. The file is written beside ``path``
    as ``.<name>.tmp-<pid>``, flushed to disk, then renamed over ``path``: a crash leaves
    either the old file or the new one, never a mix, and no temporary file on an error.
    Parent directories are made. (Two threads of one process must not save one path at
    once: they share the temporary name.)
    """
    path = Path(path)
    if not isinstance(model_state, Mapping):
        raise TypeError(f"save_checkpoint: expected model_state to be a dict of name -> "
                        f"tensor (model.state_dict()), got {type(model_state).__name__}")
    if meta is not None and not isinstance(meta, Mapping):
        raise TypeError(f"save_checkpoint: expected meta to be a dict, got "
                        f"{type(meta).__name__}")
    if optimizer_state is not None and not isinstance(optimizer_state, Mapping):
        raise TypeError(f"save_checkpoint: expected optimizer_state to be a dict "
                        f"(optimizer.state_dict()), got {type(optimizer_state).__name__}")
    meta_arrays: List[Any] = []
    meta_tree = _encode(dict(meta or {}), meta_arrays, {}, "save_checkpoint: meta")
    meta_index = [_index_entry(value, f"meta/{i}.npy", f"meta array {i}")
                  for i, value in enumerate(meta_arrays)]
    model_index, model_arrays = _model_plan(model_state)
    optimizer_tree, optimizer_arrays = None, []
    if optimizer_state is not None:
        optimizer_tree = _encode(optimizer_state, optimizer_arrays, {},
                                 "save_checkpoint: optimizer_state")
    optimizer_index = [_index_entry(value, f"optimizer/{i}.npy", f"optimizer array {i}")
                       for i, value in enumerate(optimizer_arrays)]
    if path.is_dir():
        raise IsADirectoryError(f"save_checkpoint: {str(path)!r} is a directory; expected "
                                f"a file path such as {str(path / 'last.ckpt')!r}")

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # mkdir says "File exists" when a file is where a folder must be
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocker is None:
            raise _write_error(path, exc) from None
        raise NotADirectoryError(errno.ENOTDIR, f"save_checkpoint: can't write {str(path)!r}: "
                                 f"{str(blocker)!r} is a file, not a folder") from None
    try:
        with atomic_write(path) as file:
            with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED) as archive:
                _write_json(archive, "format.json", {"format": FORMAT, "version": VERSION})
                _write_json(archive, "meta.json", {"tree": meta_tree, "arrays": meta_index})
                for entry, value in zip(meta_index, meta_arrays):
                    _write_array(archive, value, entry)
                _write_json(archive, "model.json", {"arrays": model_index})
                for entry, value in model_arrays:
                    _write_array(archive, value, entry)
                _write_json(archive, "optimizer.json",
                            {"tree": optimizer_tree, "arrays": optimizer_index})
                for entry, value in zip(optimizer_index, optimizer_arrays):
                    _write_array(archive, value, entry)
    except OSError as exc:
        raise _write_error(path, exc) from None
    return path


def _write_error(path: Path, exc: OSError) -> OSError:
    """``exc`` as the same OSError subclass, its message naming the checkpoint (not only
    the hidden temporary file) and saying the previous one is untouched."""
    detail = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename and os.fspath(exc.filename) != str(path):
        detail += f": {os.fspath(exc.filename)!r}"
    message = (f"save_checkpoint: can't write {str(path)!r} ({detail}); a checkpoint "
               f"already there is unchanged")
    return type(exc)(exc.errno, message) if exc.errno is not None else type(exc)(message)


def _model_plan(model_state: Mapping[str, Any]) -> Tuple[List[dict], List[Tuple[dict, Any]]]:
    """The model index (one entry per key) and the (entry, array) pairs to write: an array
    under several keys (tied weights) is written once and indexed under each."""
    index: List[dict] = []
    to_write: List[Tuple[dict, Any]] = []
    entry_of: Dict[int, dict] = {}
    for i, (key, value) in enumerate(model_state.items()):
        if not isinstance(key, str) or not key:
            raise TypeError(f"save_checkpoint: model_state key {key!r}: expected a non-empty "
                            "str")
        if not _is_array(value):
            raise TypeError(f"save_checkpoint: model_state[{key!r}] is a "
                            f"{type(value).__name__}; expected a Tensor or an array")
        array = _array_of(value)
        entry = entry_of.get(id(array))
        if entry is None:
            file = f"model/{key}.npy" if _SAFE_MEMBER.match(key) else f"model/#{i}.npy"
            entry = entry_of[id(array)] = _index_entry(value, file, f"model_state[{key!r}]")
            to_write.append((entry, value))
        index.append({"key": key, **entry})
    return index, to_write


# --- loading ----------------------------------------------------------------------------------
def load_checkpoint(path: PathLike, *, load_optimizer: bool = True,
                    check: Optional[TableCheck] = None) -> Checkpoint:
    """Read a checkpoint written by ``save_checkpoint``; no code in the file is run.

    Raises CheckpointError, a one-line message naming the file, when it is missing, a
    directory, empty, truncated, not a checkpoint, of a newer format version, or corrupt
    (a failed CRC, a damaged .npy or index, model arrays claiming more bytes than the
    file has). With ``load_optimizer=False`` the optimizer's arrays are not read and
    ``Checkpoint.optimizer`` is None.

    ``check(meta, table, file_size)``, when given, runs once the metadata and the headers
    of the model's .npy members are read and before any model or optimizer array is:
    ``table`` maps each state-dict key to the (dtype, shape) its member's header declares
    (checked against the index first). Whatever it raises is passed on unchanged: the
    caller refuses a file whose arrays are not what its metadata describes, or too large
    for this machine, before anything is allocated for them.
    """
    path = Path(path)

    def read(archive: zipfile.ZipFile, size: int, version: int) -> Checkpoint:
        meta, meta_entries = _read_meta(archive, size, version)
        model_index = _json_field(_read_json(archive, "model.json"), "model.json", "arrays",
                                  list)
        model_entries = [_parse_entry(entry, f"model.json entry {i}")
                         for i, entry in enumerate(model_index)]
        if not _has_member(archive, "optimizer.json"):
            raise ValueError("it has no optimizer.json member")
        tree, optimizer_entries = None, []
        if load_optimizer:
            saved = _read_json(archive, "optimizer.json")
            tree = _json_field(saved, "optimizer.json", "tree", (dict, type(None)))
            optimizer_entries = [_parse_entry(entry, f"optimizer.json array {i}") for i, entry
                                 in enumerate(_json_field(saved, "optimizer.json", "arrays",
                                                          list))]
        _check_members(archive, meta_entries + model_entries + optimizer_entries,
                       skipped="" if load_optimizer else "optimizer/")
        table = _model_table(archive, model_entries, size)
        if check is not None:
            try:
                check(meta, table, size)
            except Exception as exc:  # the caller's own refusal: not a damaged file
                raise _CallerRefusal(exc) from None

        model: Dict[str, np.ndarray] = {}
        read_files: Dict[str, np.ndarray] = {}  # tied entries share one member
        for i, entry in enumerate(model_entries):
            key = entry.get("key")
            if not isinstance(key, str) or key in model:
                raise ValueError(f"model.json entry {i}: expected a new str 'key', got "
                                 f"{key!r}")
            if entry["file"] not in read_files:
                read_files[entry["file"]] = _read_array(archive, entry, size)
            model[key] = read_files[entry["file"]]
        optimizer = decode_tree(tree, [_read_array(archive, entry, size)
                                       for entry in optimizer_entries])
        return Checkpoint(model=model, optimizer=optimizer, meta=meta, path=path)

    try:
        return _read_checkpoint(path, read)
    except _CallerRefusal as refusal:
        raise refusal.error from None


class _CallerRefusal(Exception):
    """Carries what a ``check`` given to ``load_checkpoint`` raised past the handlers that
    turn read errors into "corrupt" (its ValueError is the caller's verdict, not ours)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _model_table(archive: zipfile.ZipFile, entries: List[Dict[str, Any]], archive_size: int
                 ) -> Dict[str, Tuple[np.dtype, Tuple[int, ...]]]:
    """state-dict key -> (dtype, shape) of the model index ``entries``, each member's .npy
    header read and checked against its entry (no array data is read). ValueError when a
    key repeats or the members' data add up to more bytes than the whole file (members of
    a ZIP can overlap: each fits, their sum would not)."""
    table: Dict[str, Tuple[np.dtype, Tuple[int, ...]]] = {}
    total, counted = 0, set()
    for i, entry in enumerate(entries):
        key = entry.get("key")
        if not isinstance(key, str) or key in table:
            raise ValueError(f"model.json entry {i}: expected a new str 'key', got {key!r}")
        if entry["file"] not in counted:  # tied entries share one member
            counted.add(entry["file"])
            info = archive.getinfo(entry["file"])
            with archive.open(info) as member:
                total += _read_npy_header(member, info, entry, archive_size)[1]
            if total > archive_size:
                raise ValueError(f"its model arrays claim {total} bytes of data by "
                                 f"{entry['file']}, more than the whole file's "
                                 f"{archive_size}")
        table[key] = (entry["dtype"], entry["shape"])
    return table


def read_checkpoint_meta(path: PathLike) -> Dict[str, Any]:
    """The metadata of a checkpoint (with its own arrays, such as a CUDA generator's
    state), reading no model or optimizer array: cheap. Raises CheckpointError as
    ``load_checkpoint`` does."""
    path = Path(path)
    return _read_checkpoint(path, lambda archive, size, version:
                            _read_meta(archive, size, version)[0])


def _check_members(archive: zipfile.ZipFile, entries: List[Dict[str, Any]], skipped: str
                   ) -> None:
    """ValueError if the archive lists a member twice or one no index accounts for (a
    damaged name in the ZIP directory would otherwise hide a member, optimizer.json say).
    Names starting with ``skipped`` (a part not being read) are not checked."""
    expected = {"format.json", "meta.json", "model.json", "optimizer.json"}
    expected.update(entry["file"] for entry in entries)
    seen = set()
    for name in archive.namelist():
        if name in seen:
            raise ValueError(f"the member {name!r} appears twice")
        seen.add(name)
        if name not in expected and not (skipped and name.startswith(skipped)):
            raise ValueError(f"unexpected member {name[:80]!r}, which no index lists")


def _read_meta(archive: zipfile.ZipFile, size: int, version: int
               ) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """The metadata and the index entries of its arrays (none in a version 1 file, whose
    meta.json is the encoded metadata itself)."""
    saved = _read_json(archive, "meta.json")
    entries: List[Dict[str, Any]] = []
    if version == 1:
        tree = saved
    else:
        tree = _json_field(saved, "meta.json", "tree", dict)
        entries = [_parse_entry(entry, f"meta.json array {i}")
                   for i, entry in enumerate(_json_field(saved, "meta.json", "arrays", list))]
    meta = decode_tree(tree, [_read_array(archive, entry, size) for entry in entries])
    if not isinstance(meta, dict):
        raise ValueError(f"meta.json holds a {type(meta).__name__}, expected a dict")
    return meta, entries


def _has_member(archive: zipfile.ZipFile, name: str) -> bool:
    try:
        archive.getinfo(name)
    except KeyError:
        return False
    return True


def _read_json(archive: zipfile.ZipFile, name: str) -> Any:
    """Member ``name`` parsed as JSON; ValueError if there is none."""
    if not _has_member(archive, name):
        raise ValueError(f"it has no {name} member")
    return json.loads(archive.read(name).decode("utf-8"))


def _json_field(data: Any, name: str, key: str, kind: Union[type, Tuple[type, ...]]) -> Any:
    """``data[key]`` of JSON member ``name``, checked to be a ``kind``."""
    if not isinstance(data, dict) or key not in data:
        raise ValueError(f"{name} has no {key!r} key")
    if not isinstance(data[key], kind):
        expected = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ValueError(f"{name}[{key!r}] is a {type(data[key]).__name__}, expected a "
                         f"{expected}")
    return data[key]


def _read_checkpoint(path: Path, read: Callable[[zipfile.ZipFile, int, int], T]) -> T:
    """Open ``path`` as a checkpoint, check its format.json, and run ``read(archive, size,
    version)``; every failure becomes a one-line CheckpointError naming the file."""
    name = str(path)
    try:
        status = path.stat()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {name!r} does not exist") from None
    except OSError as exc:
        raise CheckpointError(f"checkpoint file {name!r} can't be read: "
                              f"{exc.strerror or exc}") from None
    if stat.S_ISDIR(status.st_mode):
        raise CheckpointError(f"checkpoint path {name!r} is a directory, not a checkpoint file")
    if status.st_size == 0:
        raise CheckpointError(f"checkpoint file {name!r} is empty (0 bytes)")
    try:
        file = open(path, "rb")
    except OSError as exc:
        raise CheckpointError(f"checkpoint file {name!r} can't be read: "
                              f"{exc.strerror or exc}") from None
    with file:
        try:
            archive = zipfile.ZipFile(file)
        except zipfile.BadZipFile:
            file.seek(0)
            head = file.read(_LOCAL_HEADER_SIZE + len("format.json"))
            if _begins_like_a_checkpoint(head):
                raise CheckpointError(
                    f"checkpoint file {name!r} is truncated or corrupt: it is not a complete "
                    "ZIP archive (was its write interrupted?)") from None
            raise CheckpointError(f"{name!r} is not a minitorch-gpu checkpoint: it is not a "
                                  "ZIP archive") from None
        except _READ_ERRORS as exc:
            raise CheckpointError(f"checkpoint file {name!r} is corrupt: "
                                  f"{_one_line(exc)}") from None
        with archive:
            try:
                version = _check_format(archive, name)
                return read(archive, status.st_size, version)
            except CheckpointError:
                raise
            except _READ_ERRORS as exc:
                raise CheckpointError(f"checkpoint file {name!r} is corrupt: "
                                      f"{_one_line(exc)}") from None


def _begins_like_a_checkpoint(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) could begin a checkpoint: a ZIP local header
    (or a prefix of one) whose member, when the name is there, is format.json."""
    signature = _LOCAL_HEADER[:len(head)]
    if not head.startswith(signature):
        return False
    if len(head) < _LOCAL_HEADER_SIZE:
        return True
    name_length = struct.unpack_from("<H", head, 26)[0]
    name = head[_LOCAL_HEADER_SIZE:]
    return name_length == len("format.json") and b"format.json".startswith(name)


def _check_format(archive: zipfile.ZipFile, name: str) -> int:
    """The format version; CheckpointError unless format.json says this is a checkpoint
    of a version we read."""
    if not _has_member(archive, "format.json"):
        raise CheckpointError(f"{name!r} is not a minitorch-gpu checkpoint: it is a ZIP "
                              "archive without format.json")
    marker = _read_json(archive, "format.json")
    found = marker.get("format") if isinstance(marker, dict) else None
    if found != FORMAT:
        raise CheckpointError(f"{name!r} is not a minitorch-gpu checkpoint: its format.json "
                              f"names format {str(found)[:60]!r}, expected {FORMAT!r}")
    version = marker.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"format.json: expected a version number >= 1, got {version!r}")
    if version > VERSION:
        raise CheckpointError(f"checkpoint file {name!r} has format version {version}, newer "
                              f"than this minitorch-gpu reads (up to {VERSION}); upgrade "
                              "minitorch-gpu to load it")
    return version


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, KeyError):  # KeyError's str is the repr of its key
        text = f"missing {text}"
    return text if len(text) <= 240 else text[:237] + "..."
