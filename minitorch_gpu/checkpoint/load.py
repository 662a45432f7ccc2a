"""load_checkpoint and read_checkpoint_meta: a checkpoint file read back, every failure one
line of CheckpointError naming the file."""
from __future__ import annotations

import os
import stat
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Optional, Tuple, TypeVar, Union

import numpy as np

from .errors import CheckpointError, one_line
from .layout import FORMAT, VERSION, Layout, TreePart, parse_layout, read_version
from .legacy_zip import ZIP_SIGNATURE, read_legacy
from .safetensors_file import (Header, NotSafetensorsError, TruncatedError, read_header,
                               read_tensor)
from .tree import decode_tree

__all__ = ["Checkpoint", "TableCheck", "load_checkpoint", "read_checkpoint_meta"]

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")
# load_checkpoint's check: (meta, {state-dict key: (dtype, shape)}, file size in bytes)
TableCheck = Callable[[Dict[str, Any], Dict[str, Tuple[np.dtype, Tuple[int, ...]]], int], None]

# what reading a damaged file can raise, from json, zipfile, numpy and this package's checks
# (RuntimeError covers zipfile's "encrypted" and a RecursionError from absurdly nested JSON;
# MemoryError a damaged legacy .npy header asking for an absurd array)
_READ_ERRORS = (ValueError, KeyError, OSError, EOFError, struct.error, zipfile.BadZipFile,
                zipfile.LargeZipFile, NotImplementedError, RuntimeError, OverflowError,
                MemoryError, TypeError)


@dataclass
class Checkpoint:
    """What ``load_checkpoint`` read: NumPy arrays, ready for ``load_state_dict``."""

    model: Dict[str, np.ndarray] = field(repr=False)  # for Module.load_state_dict
    # for Optimizer.load_state_dict; None when none was saved or load_optimizer=False
    optimizer: Optional[Dict[str, Any]] = field(repr=False)
    meta: Dict[str, Any]  # the metadata given to save_checkpoint
    path: Path  # the file it was read from


def load_checkpoint(path: PathLike, *, load_optimizer: bool = True,
                    check: Optional[TableCheck] = None) -> Checkpoint:
    """Read a checkpoint written by ``save_checkpoint`` (or a ZIP one of formats 1 and 2);
    no code in the file is run.

    Raises CheckpointError, a one-line message naming the file, when it is missing, a
    directory, empty, truncated, not a checkpoint, of a newer format version, or corrupt
    (a failed CRC, a damaged header, tensors claiming more bytes than the file has). With
    ``load_optimizer=False`` the optimizer's arrays are not read and
    ``Checkpoint.optimizer`` is None.

    ``check(meta, table, file_size)``, when given, runs once the metadata and the header
    are read and before any model or optimizer array is: ``table`` maps each state-dict
    key to the (dtype, shape) the header declares. Whatever it raises is passed on
    unchanged: the caller refuses a file whose arrays are not what its metadata describes,
    or too large for this machine, before anything is allocated for them.
    """
    path = Path(path)

    def read(file: BinaryIO, size: int, name: str) -> Checkpoint:
        if _is_zip(file):
            meta, model, optimizer = read_legacy(file, size, name, load_optimizer=load_optimizer,
                                                 check=_refusing(check) if check else None)
            return Checkpoint(model=model, optimizer=optimizer, meta=meta, path=path)
        header = read_header(file, size)
        layout = _layout(header, name)
        meta = _read_tree(file, header, layout.meta)
        table = {key: _info(header, layout, key) for key in layout.model_keys}
        if check is not None:
            _refusing(check)(meta, table, size)
        model: Dict[str, np.ndarray] = {}
        for key in layout.model_keys:  # a tied key gets the array of the key it shares
            stored = layout.tied.get(key, key)
            model[key] = model[stored] if stored in model else \
                read_tensor(file, header, f"model.{stored}")
        optimizer = _read_tree(file, header, layout.optimizer) if load_optimizer else None
        return Checkpoint(model=model, optimizer=optimizer, meta=meta, path=path)

    try:
        return _read_checkpoint(path, read)
    except _CallerRefusal as refusal:
        raise refusal.error from None


def read_checkpoint_meta(path: PathLike) -> Dict[str, Any]:
    """The metadata of a checkpoint (with its own arrays, such as a CUDA generator's
    state), reading no model or optimizer array: cheap. Raises CheckpointError as
    ``load_checkpoint`` does."""
    def read(file: BinaryIO, size: int, name: str) -> Dict[str, Any]:
        if _is_zip(file):
            return read_legacy(file, size, name, meta_only=True)[0]
        header = read_header(file, size)
        return _read_tree(file, header, _layout(header, name).meta)

    return _read_checkpoint(Path(path), read)


class _CallerRefusal(Exception):
    """Carries what a ``check`` given to ``load_checkpoint`` raised past the handlers that
    turn read errors into "corrupt" (its ValueError is the caller's verdict, not ours)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _refusing(check: TableCheck) -> TableCheck:
    """``check`` with whatever it raises wrapped in _CallerRefusal."""
    def checked(meta: Dict[str, Any], table: Dict[str, Any], size: int) -> None:
        try:
            check(meta, table, size)
        except Exception as exc:  # the caller's own refusal: not a damaged file
            raise _CallerRefusal(exc) from None
    return checked


def _is_zip(file: BinaryIO) -> bool:
    """Whether ``file`` begins as a ZIP archive (a checkpoint of format 1 or 2) does."""
    file.seek(0)
    return file.read(len(ZIP_SIGNATURE)) == ZIP_SIGNATURE


def _layout(header: Header, name: str) -> Layout:
    """The checkpoint layout of ``header``: CheckpointError for a foreign or newer file,
    ValueError for a damaged one (tensors its metadata doesn't account for, or missing)."""
    version = read_version(header.metadata)
    if version is None:
        found = header.metadata.get("format")
        raise CheckpointError(
            f"{name!r} is not a minitorch-gpu checkpoint: it is a safetensors file whose "
            f"metadata names " + (f"format {found[:60]!r}" if found is not None else
                                  "no format") + f", expected {FORMAT!r}")
    if version > VERSION:
        raise CheckpointError(f"checkpoint file {name!r} has format version {version}, newer "
                              f"than this minitorch-gpu reads (up to {VERSION}); upgrade "
                              "minitorch-gpu to load it")
    if version != VERSION:
        raise ValueError(f"version {version} is a ZIP format, but the file is safetensors")
    for entry in ("crc32", "header_crc32"):
        if entry not in header.metadata:
            raise ValueError(f"its metadata has no {entry!r}: its data can't be checked")
    layout = parse_layout(header.metadata)
    listed = layout.meta.arrays + [f"model.{key}" for key in layout.model_keys
                                   if key not in layout.tied] + layout.optimizer.arrays
    seen = set()
    for tensor in listed:
        if tensor in seen or tensor not in header.tensors:
            raise ValueError(f"its metadata lists the tensor {tensor[:80]!r} "
                             + ("twice" if tensor in seen else "that the file lacks"))
        seen.add(tensor)
    extra = next((tensor for tensor in header.tensors if tensor not in seen), None)
    if extra is not None:
        raise ValueError(f"unexpected tensor {extra[:80]!r}, which no part of its metadata "
                         "lists")
    return layout


def _info(header: Header, layout: Layout, key: str) -> Tuple[np.dtype, Tuple[int, ...]]:
    info = header.tensors[f"model.{layout.tied.get(key, key)}"]
    return info.dtype, info.shape


def _read_tree(file: BinaryIO, header: Header, part: TreePart) -> Any:
    """A part's tree decoded with its tensors read (each listed once: ``_layout`` checks)."""
    return decode_tree(part.tree, [read_tensor(file, header, t) for t in part.arrays])


def _read_checkpoint(path: Path, read: Callable[[BinaryIO, int, str], T]) -> T:
    """Open ``path`` and run ``read(file, size, name)``; every failure becomes a one-line
    CheckpointError naming the file."""
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
            return read(file, status.st_size, name)
        except (CheckpointError, _CallerRefusal):
            raise
        except NotSafetensorsError as exc:
            raise CheckpointError(f"{name!r} is not a minitorch-gpu checkpoint: it is neither "
                                  f"a safetensors file nor a ZIP archive ({one_line(exc)})"
                                  ) from None
        except TruncatedError as exc:
            raise CheckpointError(f"checkpoint file {name!r} is truncated or corrupt: "
                                  f"{one_line(exc)} (was its write interrupted?)") from None
        except _READ_ERRORS as exc:
            raise CheckpointError(f"checkpoint file {name!r} is corrupt: "
                                  f"{one_line(exc)}") from None
