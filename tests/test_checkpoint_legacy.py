"""Checkpoints of the ZIP formats 1 and 2, as minitorch-gpu wrote them before safetensors:
they load as they did, and a damaged one is a one-line CheckpointError."""
import io
import json
import zipfile

import ml_dtypes
import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu import nn
from minitorch_gpu.backend.cupy_backend import CupyBackend
from minitorch_gpu.checkpoint import load_checkpoint, read_checkpoint_meta, save_checkpoint
from checkpoint_files import (RAW_CUDA_STATE, assert_one_line_error, assert_same_tree,
                              npy_bytes, rng_with_cuda, write_legacy_checkpoint, write_zip)


def trained_gpt():
    """A tiny GPT after one AdamW step: (state dict, optimizer state), as NumPy arrays."""
    mt.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8))
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
    batch = mt.randint(0, 11, (2, 8))
    _, loss = model(batch, batch)
    loss.backward()
    optimizer.step()
    state = {key: value.numpy() for key, value in model.state_dict().items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]  # tied: one member
    return state, optimizer.state_dict()


def test_a_version_2_checkpoint_loads_as_the_same_contents(tmp_path):
    model, optimizer = trained_gpt()
    meta = {"iter_num": 1, "rng": rng_with_cuda("array"),
            "h": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)}
    new = load_checkpoint(save_checkpoint(tmp_path / "new.ckpt", model, optimizer, meta))
    write_legacy_checkpoint(tmp_path / "old.ckpt", model, optimizer, meta, version=2)
    old = load_checkpoint(tmp_path / "old.ckpt")
    assert_same_tree(old.model, new.model)
    assert old.model["lm_head.weight"] is old.model["transformer.wte.weight"]
    assert_same_tree(old.optimizer, new.optimizer)
    assert_same_tree(old.meta, new.meta)
    assert_same_tree(read_checkpoint_meta(tmp_path / "old.ckpt"), new.meta)
    assert load_checkpoint(tmp_path / "old.ckpt", load_optimizer=False).optimizer is None


def test_a_version_1_checkpoint_with_a_base64_gpu_state_still_loads(tmp_path):
    model, optimizer = trained_gpt()
    meta = {"iter_num": 1, "rng": rng_with_cuda("base64")}
    new = load_checkpoint(save_checkpoint(tmp_path / "new.ckpt", model, optimizer, meta))
    write_legacy_checkpoint(tmp_path / "old.ckpt", model, optimizer, meta, version=1)
    old = load_checkpoint(tmp_path / "old.ckpt")
    assert_same_tree(old.model, new.model)
    assert_same_tree(old.optimizer, new.optimizer)
    assert_same_tree(old.meta, new.meta)
    assert CupyBackend.parse_rng_state(old.meta["rng"]["backends"]["cuda:0"]) == \
        ("exact", 16, RAW_CUDA_STATE)


def test_the_table_check_of_a_zip_checkpoint_runs_on_its_index(tmp_path):
    write_legacy_checkpoint(tmp_path / "old.ckpt", {"w": np.zeros((2, 3), np.float32)})
    seen = {}

    def check(meta, table, size):
        seen.update(table=table, size=size)
        raise ValueError("refused")

    with pytest.raises(ValueError, match="^refused$"):
        load_checkpoint(tmp_path / "old.ckpt", check=check)
    assert seen == {"table": {"w": (np.dtype(np.float32), (2, 3))},
                    "size": (tmp_path / "old.ckpt").stat().st_size}


def damaged_member(path, name: str, content: bytes) -> None:
    """A small version 2 checkpoint with member ``name`` replaced."""
    write_legacy_checkpoint(path, {"w": np.zeros(2)}, None, {"iter": 1})
    with zipfile.ZipFile(path) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    members[name] = content
    write_zip(path, members)


def flip_last_data_byte(path) -> None:
    write_legacy_checkpoint(path, {"w": np.zeros(2)})
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        info = archive.getinfo("model/w.npy")
    data[info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size - 1] \
        ^= 0xFF
    path.write_bytes(bytes(data))


def compressed_zeros(path) -> None:
    """A member that inflates past the file's size (a ZIP bomb's trick)."""
    write_legacy_checkpoint(path, {"w": np.zeros(2)})
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("model/big.npy", npy_bytes(np.zeros(1 << 20)))


@pytest.mark.parametrize("make, fragments", [
    (lambda p: p.write_bytes(b"PK\x03\x04\x14"), ["truncated or corrupt"]),
    (flip_last_data_byte, ["is corrupt", "CRC"]),
    (lambda p: damaged_member(p, "model/w.npy", npy_bytes(np.array([None, None]), True)),
     ["is corrupt", "allow_pickle"]),  # the pickle is never loaded
    (lambda p: damaged_member(p, "model/w.npy", npy_bytes(np.zeros(3))),
     ["is corrupt", "its index says float64 (2,)"]),
    (lambda p: damaged_member(p, "format.json", json.dumps(
        {"format": "minitorch-gpu-checkpoint", "version": 3})),
     ["is corrupt", "expected version 1 or 2 in a ZIP checkpoint"]),
    (lambda p: damaged_member(p, "format.json", '{"format": "other"}'),
     ["is not a minitorch-gpu checkpoint", "'other'"]),
    (lambda p: damaged_member(p, "model.json", json.dumps({"arrays": [
        {"key": "w", "file": "model/w.npy", "dtype": "object", "encoding": "npy",
         "shape": [2]}]})), ["is corrupt", "unknown dtype 'object'"]),
    (compressed_zeros, ["is corrupt", "more than the whole file's"]),
], ids=["truncated", "crc", "pickled-array", "array-disagrees-with-index", "zip-version-3",
        "other-format", "object-dtype-index", "inflates-past-the-file"])
def test_damaged_zip_checkpoints_raise_one_line_checkpoint_errors(tmp_path, make, fragments):
    path = tmp_path / "old.ckpt"
    make(path)
    assert_one_line_error(path, *fragments)
