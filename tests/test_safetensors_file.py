"""The safetensors reader and writer: its own checks, and files that the reference library
(``safetensors``, with PyTorch for bf16) reads from us and writes for us. Those tests skip
where the library is absent."""
import io
import json

import ml_dtypes
import numpy as np
import pytest

from minitorch_gpu.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from minitorch_gpu.checkpoint.safetensors_file import (DTYPES, read_header, read_tensor,
                                                       write_safetensors)
from checkpoint_files import assert_same_arrays

ARRAYS = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3), "i64": np.array([-1, 2 ** 40]),
          "u8": np.arange(5, dtype=np.uint8), "flag": np.array([True, False]),
          "f16": np.array([0.5, -1.0], np.float16), "scalar": np.array(2.5),
          "empty": np.zeros((0, 4), np.int32)}


def read_all(path):
    with open(path, "rb") as file:
        header = read_header(file, path.stat().st_size)
        return header, {name: read_tensor(file, header, name) for name in header.tensors}


def test_write_then_read_round_trips_every_dtype(tmp_path):
    arrays = {name: np.zeros(3, dtype) for name, dtype in DTYPES.items()}
    arrays.update(ARRAYS)
    path = tmp_path / "x.safetensors"
    with open(path, "wb") as file:
        write_safetensors(file, list(arrays.items()), {"note": "hi"})
    header, loaded = read_all(path)
    assert header.metadata["note"] == "hi" and set(header.crc32) == set(arrays)
    for name, array in arrays.items():
        assert_same_arrays(loaded[name], array)
        assert loaded[name].flags.writeable


@pytest.mark.parametrize("tensors, metadata, error, match", [
    ([("a", np.zeros(1)), ("a", np.ones(1))], {}, ValueError, "tensor name 'a'"),
    ([("__metadata__", np.zeros(1))], {}, ValueError, "'__metadata__'"),
    ([("c", np.zeros(1, np.complex128))], {}, TypeError, "complex128, which can't be saved"),
    ([("a", np.zeros(1))], {"n": 1}, TypeError, "metadata 'n': expected str -> str"),
    ([], {"crc32": "0"}, TypeError, "metadata 'crc32'.*a name this writer fills in"),
    ([], {"big": "x" * 100_000_000}, ValueError, "over the format's limit of 100,000,000"),
])
def test_write_refuses_what_the_format_cannot_hold(tensors, metadata, error, match):
    file = io.BytesIO()
    with pytest.raises(error, match=match):
        write_safetensors(file, tensors, metadata)
    assert file.getvalue() == b""  # checked before anything is written


def test_the_reference_library_reads_our_checkpoints(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    saved = save_checkpoint(tmp_path / "x.ckpt", ARRAYS, None, {"iter": 3})
    with safetensors.safe_open(str(saved), framework="np") as file:
        assert sorted(file.keys()) == sorted(f"model.{key}" for key in ARRAYS)
        assert file.metadata()["format"] == "minitorch-gpu-checkpoint"
        for key, array in ARRAYS.items():
            assert_same_arrays(file.get_tensor(f"model.{key}"), array)


def test_we_read_the_reference_librarys_files(tmp_path):
    numpy_api = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "theirs.safetensors"
    numpy_api.save_file(ARRAYS, str(path), metadata={"source": "reference"})
    header, loaded = read_all(path)
    assert header.metadata == {"source": "reference"} and header.crc32 == {}
    for key, array in ARRAYS.items():
        assert_same_arrays(loaded[key], array)
    with pytest.raises(CheckpointError, match="is not a minitorch-gpu checkpoint: it is a "
                                              "safetensors file whose metadata names no format"):
        load_checkpoint(path)


def test_bf16_as_pytorch_writes_and_reads_it(tmp_path):
    torch = pytest.importorskip("torch")
    torch_api = pytest.importorskip("safetensors.torch")
    values = np.array([1.5, -2.0, np.inf, 3.0e38, 1e-30], np.float32)
    ours = values.astype(ml_dtypes.bfloat16)
    path = save_checkpoint(tmp_path / "ours.ckpt", {"w": ours})
    theirs = torch_api.load_file(str(path))["model.w"]
    assert theirs.dtype == torch.bfloat16
    assert theirs.view(torch.int16).numpy().tobytes() == ours.tobytes()

    path = tmp_path / "theirs.safetensors"
    torch_api.save_file({"w": torch.from_numpy(values).to(torch.bfloat16)}, str(path))
    assert_same_arrays(read_all(path)[1]["w"], ours)
    assert json.loads(path.read_bytes()[8:8 + int.from_bytes(path.read_bytes()[:8], "little")]
                      )["w"]["dtype"] == "BF16"
