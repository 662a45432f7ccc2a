"""Helpers of the checkpoint tests: a small checkpoint, comparisons, a header rewriter and
a writer of the ZIP checkpoints of formats 1 and 2 (as minitorch-gpu wrote them then)."""
import base64
import io
import json
import struct
import zipfile
import zlib

import ml_dtypes
import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from minitorch_gpu.checkpoint.safetensors_file import _header_crc


def small_checkpoint(path) -> bytes:
    """A small but complete checkpoint (model, optimizer, meta); returns its bytes."""
    model = {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
             "h": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)}
    optimizer = {"state": {0: {"step": 3, "exp_avg": np.ones(3)}},
                 "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0]}]}
    save_checkpoint(path, model, optimizer, {"iter": 3})
    return path.read_bytes()


def assert_same_arrays(a: np.ndarray, b: np.ndarray) -> None:
    """Same dtype, shape and bytes (NaN payloads and -0.0 included)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def assert_same_tree(got, expected, where: str = "tree") -> None:
    """``got == expected`` for nested data that may hold NumPy arrays (compared with
    assert_same_arrays; ``==`` on a dict holding arrays raises)."""
    if isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray), where
        assert_same_arrays(got, expected)
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected), where
        for key in expected:
            assert_same_tree(got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(got) is type(expected) and len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same_tree(g, e, f"{where}[{i}]")
    else:
        assert got is expected or got == expected, where  # the same NaN object is equal


def assert_one_line_error(path, *fragments: str) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message
    error = info.value  # shown alone: no chained traceback of zipfile's or json's
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    return error


# --- a GPU's generator state, as the trainer saves it ----------------------------------------
RAW_CUDA_STATE = bytes(range(256)) * 3  # 16 cuRAND XORWOW states of 48 bytes


def cuda_rng_state(encoding: str) -> dict:
    """A CUDA backend's generator state as get_rng_state gives it (encoding "array"), or
    as checkpoints before meta arrays held it (base64 text). test_backend checks that a
    backend on a stand-in for CuPy makes and takes such states."""
    state = {"kind": "cupy", "bit_generator": "XORWOW", "mode": "exact", "size": 16,
             "nbytes": len(RAW_CUDA_STATE)}
    if encoding == "array":
        return dict(state, encoding="array", data=np.frombuffer(RAW_CUDA_STATE, np.uint8).copy())
    return dict(state, encoding="base64", data=base64.b64encode(RAW_CUDA_STATE).decode("ascii"))


def rng_with_cuda(encoding: str) -> dict:
    """mt.backend.get_rng_state()'s form, with this CPU's stream and a GPU's."""
    return {"format": "minitorch-gpu-rng-state", "version": 1, "seed": 0,
            "backends": {"cpu": mt.get_backend("cpu").get_rng_state(),
                         "cuda:0": cuda_rng_state(encoding)}}


# --- the safetensors header -----------------------------------------------------------------
def split_file(data: bytes):
    """``(header, tensor data)`` of a safetensors file's bytes."""
    length = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + length]), data[8 + length:]


def header_of(path) -> dict:
    return split_file(path.read_bytes())[0]


def join_file(header: dict, data: bytes, checksums: bool = True) -> bytes:
    """A safetensors file of ``header`` and ``data``; with ``checksums`` the CRCs in its
    metadata are made right again for the tensors whose offsets lie in ``data``."""
    if checksums and "crc32" in header.get("__metadata__", {}):
        crcs = {name: f"{zlib.crc32(data[e['data_offsets'][0]:e['data_offsets'][1]]):08x}"
                for name, e in header.items() if name != "__metadata__"}
        header["__metadata__"]["crc32"] = json.dumps(crcs, separators=(",", ":"))
    if checksums and "header_crc32" in header.get("__metadata__", {}):
        header["__metadata__"]["header_crc32"] = f"{_header_crc(header):08x}"
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def rewrite(path, edit, data_edit=None, checksums: bool = True) -> None:
    """Rewrite the checkpoint at ``path``: ``edit(header)`` changes its header in place (its
    metadata entries given as parsed JSON under "__layout__"), ``data_edit(data)`` returns
    new tensor data; the checksums are made right again unless ``checksums`` is False."""
    header, data = split_file(path.read_bytes())
    metadata = header["__metadata__"]
    layout = {key: json.loads(metadata[key]) for key in ("meta", "model", "optimizer")
              if key in metadata}
    header["__layout__"] = layout
    edit(header)
    for key, value in header.pop("__layout__").items():
        metadata[key] = json.dumps(value)
    path.write_bytes(join_file(header, data_edit(data) if data_edit else data, checksums))


# --- the ZIP formats 1 and 2 ----------------------------------------------------------------
def npy_bytes(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def write_zip(path, members: dict) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)


def _legacy_entry(array: np.ndarray, file: str) -> dict:
    if array.dtype.kind not in "biufc":  # bfloat16, float8_*: .npy can't describe them
        return {"file": file, "dtype": array.dtype.name, "encoding": "raw",
                "shape": list(array.shape)}
    return {"file": file, "dtype": array.dtype.str, "encoding": "npy", "shape": list(array.shape)}


def _legacy_npy(array: np.ndarray, entry: dict) -> bytes:
    if entry["encoding"] == "raw":
        array = array.view(f"u{array.dtype.itemsize}")
    return npy_bytes(array)


def write_legacy_checkpoint(path, model: dict, optimizer=None, meta=None,
                            version: int = 2) -> None:
    """``model`` (NumPy arrays), ``optimizer`` and ``meta`` as a ZIP checkpoint of
    ``version`` 1 (no arrays in ``meta``) or 2, member for member as it was written."""
    from minitorch_gpu.checkpoint import encode_tree
    members = {"format.json": json.dumps({"format": "minitorch-gpu-checkpoint",
                                          "version": version})}
    meta_tree, meta_arrays = encode_tree(dict(meta or {}))
    meta_index = [_legacy_entry(a, f"meta/{i}.npy") for i, a in enumerate(meta_arrays)]
    if version == 1:
        assert not meta_arrays
        members["meta.json"] = json.dumps(meta_tree)
    else:
        members["meta.json"] = json.dumps({"tree": meta_tree, "arrays": meta_index})
    for entry, array in zip(meta_index, meta_arrays):
        members[entry["file"]] = _legacy_npy(array, entry)
    index, file_of = [], {}
    for key, array in model.items():
        if id(array) not in file_of:
            file_of[id(array)] = _legacy_entry(array, f"model/{key}.npy")
            members[file_of[id(array)]["file"]] = _legacy_npy(array, file_of[id(array)])
        index.append({"key": key, **file_of[id(array)]})
    members["model.json"] = json.dumps({"arrays": index})
    tree, arrays = (None, []) if optimizer is None else encode_tree(optimizer)
    optimizer_index = [_legacy_entry(a, f"optimizer/{i}.npy") for i, a in enumerate(arrays)]
    members["optimizer.json"] = json.dumps({"tree": tree, "arrays": optimizer_index})
    for entry, array in zip(optimizer_index, arrays):
        members[entry["file"]] = _legacy_npy(array, entry)
    write_zip(path, members)
