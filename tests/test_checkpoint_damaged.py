"""Damaged and foreign checkpoint files: every one a one-line CheckpointError naming the file,
raised before anything is read that the damage could make absurd."""
import numpy as np
import pytest

from minitorch_gpu.checkpoint import CheckpointError, load_checkpoint, read_checkpoint_meta
from minitorch_gpu.checkpoint import load as checkpoint_load
from checkpoint_files import (assert_one_line_error, join_file, npy_bytes, rewrite,
                              small_checkpoint, split_file, write_zip)


def test_every_truncation_is_a_checkpoint_error(tmp_path):
    data = small_checkpoint(tmp_path / "whole.ckpt")
    path = tmp_path / "cut.ckpt"
    for length in range(len(data)):  # every prefix: a few kilobytes, a few hundred ms
        path.write_bytes(data[:length])
        message = str(assert_one_line_error(path))
        if length == 0:
            assert "is empty" in message
        else:
            assert "truncated or corrupt" in message, (length, message)


def test_byte_flips_give_a_checkpoint_error(tmp_path):
    """Header and data are both covered by CRCs, the padding by the JSON parser."""
    data = small_checkpoint(tmp_path / "whole.ckpt")
    path = tmp_path / "flipped.ckpt"
    positions = np.random.default_rng(0).choice(len(data), size=min(len(data), 400),
                                                replace=False)
    for position in positions:
        damaged = bytearray(data)
        damaged[position] ^= 0x5A
        path.write_bytes(bytes(damaged))
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(path)
        assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_a_damaged_array_is_reported_as_corrupt(tmp_path):
    path = tmp_path / "crc.ckpt"
    data = bytearray(small_checkpoint(path))
    header, _ = split_file(bytes(data))
    data_start = len(data) - max(e["data_offsets"][1] for k, e in header.items()
                                 if k != "__metadata__")
    data[data_start + header["model.w"]["data_offsets"][1] - 1] ^= 0xFF  # w's last byte
    path.write_bytes(bytes(data))
    assert_one_line_error(path, "is corrupt", "CRC", "'model.w'")


def test_a_damaged_header_is_reported_as_corrupt(tmp_path):
    """A flip in the metadata that leaves valid JSON (iter 3 -> 7): the header's CRC."""
    path = tmp_path / "meta.ckpt"
    data = small_checkpoint(path)
    path.write_bytes(data.replace(b'\\"iter\\":3', b'\\"iter\\":7'))
    assert path.read_bytes() != data
    assert_one_line_error(path, "is corrupt", "header fails its CRC check")


def edit(function):
    """A ``make`` that saves a small checkpoint and rewrites its header with ``function``
    (the checksums made right again, so that the check under test is the one that fires)."""
    def make(path):
        small_checkpoint(path)
        rewrite(path, function)
    return make


def entry(header, name, **changes):
    header[name].update(changes)


def dropped(name):
    def drop(header):
        header["__metadata__"].pop(name)
        header["__layout__"].pop(name, None)
    return drop


def header_crc_of(value):
    """A ``make``: a small checkpoint whose header_crc32 is ``value``."""
    def make(path):
        header, data = split_file(small_checkpoint(path))
        header["__metadata__"]["header_crc32"] = value
        path.write_bytes(join_file(header, data, checksums=False))
    return make


def layout_change(part, key, value):
    return lambda header: header["__layout__"][part].__setitem__(key, value)


def safetensors_file(path, tensors, metadata=None, data=b"") -> None:
    """A safetensors file of the header entries ``tensors`` by hand, no checksums."""
    header = dict(tensors)
    if metadata is not None:
        header["__metadata__"] = metadata
    path.write_bytes(join_file(header, data, checksums=False))


F64 = {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}


@pytest.mark.parametrize("make, fragments", [
    (lambda p: None, ["does not exist"]),
    (lambda p: p.mkdir(), ["is a directory"]),
    (lambda p: p.write_bytes(b""), ["is empty"]),
    (lambda p: p.write_bytes(np.random.default_rng(0).bytes(5000)),
     ["is not a minitorch-gpu checkpoint", "neither a safetensors file nor a ZIP archive"]),
    (lambda p: p.write_text("step,loss\n1,2.5\n"), ["is not a minitorch-gpu checkpoint"]),
    (lambda p: p.write_bytes(npy_bytes(np.zeros(3))), ["is not a minitorch-gpu checkpoint"]),
    (lambda p: write_zip(p, {"data.txt": "hello"}),
     ["is not a minitorch-gpu checkpoint", "without format.json"]),
    (lambda p: safetensors_file(p, {"w": F64}, {"format": "other"}, bytes(16)),
     ["is not a minitorch-gpu checkpoint", "'other'"]),
    (lambda p: safetensors_file(p, {"w": F64}, None, bytes(16)),
     ["is not a minitorch-gpu checkpoint", "names no format"]),
    (edit(lambda h: h["__metadata__"].update(version="4")),
     ["format version 4, newer than this minitorch-gpu reads (up to 3)", "upgrade"]),
    (edit(lambda h: h["__metadata__"].update(version="three")), ["is corrupt", "version"]),
    (lambda p: p.write_bytes(small_checkpoint(p).replace(b'"__metadata__":', b'"__metadata__" ')),
     ["is corrupt", "not JSON"]),
    (edit(dropped("meta")), ["is corrupt", "no 'meta' entry"]),
    (edit(dropped("model")), ["is corrupt", "no 'model' entry"]),
    (edit(dropped("optimizer")), ["is corrupt", "no 'optimizer' entry"]),
    (edit(dropped("crc32")), ["is corrupt", "no 'crc32'"]),
    (edit(layout_change("meta", "tree", [])), ["is corrupt", "'meta' tree is a list"]),
    (edit(layout_change("optimizer", "tree", [])),
     ["is corrupt", "'optimizer' tree is a list"]),
    (edit(lambda h: h.update(extra={"dtype": "U8", "shape": [0], "data_offsets": [0, 0]})),
     ["is corrupt", "unexpected tensor 'extra'"]),
    (edit(layout_change("model", "keys", ["w", "h", "v"])),
     ["is corrupt", "the tensor 'model.v' that the file lacks"]),
    (edit(lambda h: entry(h, "model.w", dtype="object")),
     ["is corrupt", "unknown dtype 'object'"]),
    (edit(lambda h: entry(h, "model.w", shape=[-1])), ["is corrupt", "list of sizes"]),
    (edit(lambda h: entry(h, "model.w", shape=[3, 3])),
     ["is corrupt", "F32 (3, 3) is 36 bytes, its data_offsets"]),
    (lambda p: safetensors_file(p, {"w": F64}, {}, bytes(15)),
     ["truncated or corrupt", "places 16 bytes of tensor data"]),
    (lambda p: safetensors_file(p, {"w": F64}, {}, bytes(17)),
     ["is corrupt", "1 bytes after its tensors' data"]),
    (lambda p: safetensors_file(p, {"w": F64, "v": dict(F64, data_offsets=[8, 24])}, {},
                                bytes(24)), ["is corrupt", "'w' and 'v' overlap"]),
    (lambda p: safetensors_file(p, {"w": F64, "v": dict(F64, data_offsets=[24, 40])}, {},
                                bytes(40)), ["is corrupt", "no tensor holds bytes [16, 24)"]),
    (lambda p: safetensors_file(p, {"w": dict(F64, data_offsets=[0, 2 ** 62])}, {},
                                bytes(16)), ["is corrupt", "data_offsets"]),
    (header_crc_of("zz"), ["is corrupt", "header_crc32 is 'zz', expected 8 hex digits"]),
    (header_crc_of("00000000"), ["is corrupt", "header fails its CRC check"]),
    (edit(layout_change("meta", "tree", {"x": {"__array__": 0}})),
     ["is corrupt", "expected an array index in [0, 0)"]),
], ids=["missing", "directory", "empty", "random-bytes", "text", "npy", "zip-without-format",
        "other-format", "safetensors-without-metadata", "newer-version", "version-not-a-number",
        "header-not-json", "no-meta", "no-model", "no-optimizer", "no-checksums",
        "meta-not-a-dict", "optimizer-tree-not-a-dict", "unknown-tensor", "missing-array",
        "object-dtype", "negative-shape", "shape-disagrees-with-offsets",
        "more-data-than-the-file", "bytes-after-the-data", "overlapping-offsets", "gap",
        "absurd-offsets", "bad-header-crc", "wrong-header-crc", "meta-array-index-out-of-range"])
def test_foreign_and_damaged_files_raise_one_line_checkpoint_errors(tmp_path, make, fragments):
    path = tmp_path / "x.ckpt"
    make(path)
    assert_one_line_error(path, *fragments)


@pytest.mark.parametrize("content, fragment", [
    (None, "does not exist"), (b"", "is empty"), (b"PK\x03\x04\x14", "truncated"),
    (b"\x10\x01\x00\x00", "truncated"), (b"plain text", "is not a minitorch-gpu checkpoint"),
])
def test_read_checkpoint_meta_raises_the_same_errors(tmp_path, content, fragment):
    path = tmp_path / "x.ckpt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=fragment):
        read_checkpoint_meta(path)


def test_read_checkpoint_meta_reads_no_arrays(tmp_path, monkeypatch):
    path = tmp_path / "m.ckpt"
    small_checkpoint(path)
    monkeypatch.setattr(checkpoint_load, "read_tensor",
                        lambda *a: pytest.fail("read_checkpoint_meta read an array"))
    assert read_checkpoint_meta(path) == {"iter": 3}


def test_the_table_check_runs_before_any_array_is_read(tmp_path, monkeypatch):
    """check gets each key's (dtype, shape) from the header alone; what it raises passes
    through as it is (a ValueError of the caller's is not "corrupt")."""
    path = tmp_path / "t.ckpt"
    small_checkpoint(path)
    read = []
    real = checkpoint_load.read_tensor
    monkeypatch.setattr(checkpoint_load, "read_tensor",
                        lambda file, header, name: read.append(name) or
                        real(file, header, name))
    seen = {}

    def check(meta, table, size):
        assert not [name for name in read if not name.startswith("meta.")]
        seen.update(meta=meta, table=table, size=size)
        raise ValueError("not this model")

    with pytest.raises(ValueError, match="^not this model$"):
        load_checkpoint(path, check=check)
    assert seen["meta"] == {"iter": 3} and seen["size"] == path.stat().st_size
    assert {key: (str(dtype), shape) for key, (dtype, shape) in seen["table"].items()} == {
        "w": ("float32", (2, 3)), "h": ("bfloat16", (2,))}
    assert read == []


def test_a_listed_tensor_named_twice_is_corrupt(tmp_path):
    path = tmp_path / "twice.ckpt"
    small_checkpoint(path)
    rewrite(path, lambda h: h["__layout__"]["optimizer"]["arrays"].append(
        "optimizer.state.0.exp_avg"))
    assert_one_line_error(path, "is corrupt", "'optimizer.state.0.exp_avg' twice")
