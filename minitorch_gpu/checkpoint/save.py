"""save_checkpoint: a model's state dict, an optimizer's state and metadata, written
atomically as one safetensors file (layout.py says where each part goes)."""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, List, Mapping, Optional, Tuple, Union

from ..system.atomic import atomic_write
from .layout import TreePart, array_names, layout_metadata, model_tensors
from .safetensors_file import dtype_name, write_safetensors
from .tree import array_of, encode_keeping_arrays, to_host

__all__ = ["save_checkpoint"]

PathLike = Union[str, "os.PathLike[str]"]


def save_checkpoint(path: PathLike, model_state: Mapping[str, Any],
                    optimizer_state: Optional[Mapping[str, Any]] = None,
                    meta: Optional[Mapping[str, Any]] = None) -> Path:
    """Write a checkpoint file atomically; returns its path.

    ``model_state`` maps names to Tensors or arrays (``model.state_dict()``),
    ``optimizer_state`` is ``optimizer.state_dict()`` (or any nested data with arrays, see
    ``encode_tree``), ``meta`` is JSON data (numbers, str, lists, tuples, dicts) and arrays
    (a CUDA generator's state from ``backend.get_rng_state()``), each array stored as a
    tensor of its own.
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
    meta_part, meta_arrays = _tree_part(dict(meta or {}), "meta", "meta")
    tied, tensors = model_tensors(model_state)
    for (name, value), key in zip(tensors, (k for k in model_state if k not in tied)):
        dtype_name(array_of(value).dtype, f"save_checkpoint: model_state[{key!r}]")
    optimizer_part, optimizer_arrays = TreePart(None, []), []
    if optimizer_state is not None:
        optimizer_part, optimizer_arrays = _tree_part(optimizer_state, "optimizer",
                                                      "optimizer_state")
    tensors += list(zip(meta_part.arrays, meta_arrays))
    tensors += list(zip(optimizer_part.arrays, optimizer_arrays))
    metadata = layout_metadata(meta_part, list(model_state), tied, optimizer_part)
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
            write_safetensors(file, [(name, array_of(value)) for name, value in tensors],
                              metadata, to_host)
    except OSError as exc:
        raise _write_error(path, exc) from None
    return path


def _tree_part(value: Mapping[str, Any], part: str, where: str) -> Tuple[TreePart, List[Any]]:
    """``(TreePart, arrays)`` of ``value`` encoded (tree.py), each array's dtype checked."""
    tree, arrays = encode_keeping_arrays(value, f"save_checkpoint: {where}")
    for i, array in enumerate(arrays):
        dtype_name(array_of(array).dtype, f"{part} array {i}")
    return TreePart(tree, array_names(tree, len(arrays), part)), arrays


def _write_error(path: Path, exc: OSError) -> OSError:
    """``exc`` as the same OSError subclass, its message naming the checkpoint (not only
    the hidden temporary file) and saying the previous one is untouched."""
    detail = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename and os.fspath(exc.filename) != str(path):
        detail += f": {os.fspath(exc.filename)!r}"
    message = (f"save_checkpoint: can't write {str(path)!r} ({detail}); a checkpoint "
               f"already there is unchanged")
    return type(exc)(exc.errno, message) if exc.errno is not None else type(exc)(message)
