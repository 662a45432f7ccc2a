"""Checkpoint files: round trips of a GPT and AdamW, dtypes bit for bit, atomic writes, and
one-line CheckpointErrors for every damaged or foreign file."""
import base64
import errno
import io
import json
import math
import os
import zipfile

import ml_dtypes
import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu import nn
from minitorch_gpu.backend.cupy_backend import CupyBackend
from minitorch_gpu.checkpoint import (Checkpoint, CheckpointError, decode_tree, encode_tree,
                                      load_checkpoint, read_checkpoint_meta, save_checkpoint)

TINY = dict(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8)


def tiny_gpt(seed: int) -> nn.GPT:
    mt.manual_seed(seed)
    return nn.GPT(nn.GPTConfig(**TINY))


def train_steps(model: nn.GPT, optimizer, batch, steps: int) -> None:
    for _ in range(steps):
        _, loss = model(batch, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


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


# --- round trips --------------------------------------------------------------------------
def test_gpt_and_adamw_round_trip_give_identical_logits_and_next_step(tmp_path):
    model = tiny_gpt(0)
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
    batch = mt.randint(0, TINY["vocab_size"], (2, 8))
    train_steps(model, optimizer, batch, 2)
    path = save_checkpoint(tmp_path / "run" / "last.ckpt", model.state_dict(),
                           optimizer.state_dict(), {"iter_num": 2})
    assert path == tmp_path / "run" / "last.ckpt"

    ckpt = load_checkpoint(path)
    assert isinstance(ckpt, Checkpoint) and ckpt.path == path and ckpt.meta == {"iter_num": 2}
    assert list(ckpt.model) == list(model.state_dict())
    restored = tiny_gpt(1)  # different initial weights
    restored.load_state_dict(ckpt.model)
    restored_optimizer = restored.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
    restored_optimizer.load_state_dict(ckpt.optimizer)

    with mt.no_grad():
        expected = model(batch, all_logits=True)[0].numpy()
        got = restored(batch, all_logits=True)[0].numpy()
    assert_same_arrays(got, expected)
    train_steps(model, optimizer, batch, 1)
    train_steps(restored, restored_optimizer, batch, 1)
    for (name, p), (_, q) in zip(model.named_parameters(), restored.named_parameters()):
        assert_same_arrays(q.detach().numpy(), p.detach().numpy())
    state = optimizer.state_dict()["state"]
    restored_state = restored_optimizer.state_dict()["state"]
    assert sorted(state) == sorted(restored_state)
    for index in state:
        assert restored_state[index]["step"] == state[index]["step"] == 3
        assert_same_arrays(restored_state[index]["exp_avg"].numpy(),
                           state[index]["exp_avg"].numpy())


def test_optimizer_state_keeps_int_keys_tuples_and_numbers(tmp_path):
    model = tiny_gpt(0)
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-4,
                                           betas=(0.9, 0.95))
    train_steps(model, optimizer, mt.randint(0, 11, (2, 8)), 2)
    saved = optimizer.state_dict()
    loaded = load_checkpoint(save_checkpoint(tmp_path / "a.ckpt", {}, saved)).optimizer
    assert list(loaded["state"]) == list(saved["state"]) and all(
        isinstance(k, int) for k in loaded["state"])
    assert loaded["param_groups"] == saved["param_groups"]
    assert loaded["param_groups"][0]["betas"] == (0.9, 0.95)
    first = loaded["state"][0]
    assert first["step"] == 2 and isinstance(first["step"], int)
    assert isinstance(first["exp_avg_sq"], np.ndarray)


def test_tied_weights_are_stored_once_and_load_back_tied(tmp_path):
    model = tiny_gpt(0)
    state = model.state_dict()
    assert "lm_head.weight" in state and "transformer.wte.weight" in state
    path = save_checkpoint(tmp_path / "tied.ckpt", state)
    with zipfile.ZipFile(path) as archive:
        index = {e["key"]: e["file"] for e in json.loads(archive.read("model.json"))["arrays"]}
        assert index["lm_head.weight"] == index["transformer.wte.weight"]
        assert sum(name.startswith("model/") for name in archive.namelist()) == len(
            set(index.values()))
    ckpt = load_checkpoint(path)
    assert ckpt.model["lm_head.weight"] is ckpt.model["transformer.wte.weight"]
    restored = tiny_gpt(1)
    restored.load_state_dict(ckpt.model)
    assert restored.lm_head.weight is restored.transformer.wte.weight
    assert_same_arrays(restored.lm_head.weight.detach().numpy(),
                       model.transformer.wte.weight.detach().numpy())


SPECIAL = [0.0, -0.0, 1.0, -2.5, math.inf, -math.inf, math.nan, 1e-30, 3.0e38]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16,
                                   ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.int64,
                                   np.int32, np.uint8, np.bool_, np.complex64, ">f8"])
def test_arrays_round_trip_bit_for_bit(tmp_path, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        values = np.array([True, False, True])
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = np.array([info.min, 0, 1, info.max], dtype=dtype)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            values = np.array(SPECIAL, dtype=np.float64).astype(dtype)
    arrays = {"vector": values,
              "matrix_transposed": np.resize(values, (4, 3)).T,  # Fortran order
              "strided": np.resize(values, 12)[::3],  # neither C nor Fortran contiguous
              "scalar": values[:1].reshape(()),
              "empty": values[:0].reshape(0, 2)}
    path = save_checkpoint(tmp_path / "x.ckpt", arrays)
    loaded = load_checkpoint(path).model
    for key, array in arrays.items():
        assert_same_arrays(loaded[key], array)


def test_tensors_of_every_floating_dtype_round_trip(tmp_path):
    source = mt.randn(3, 4, dtype="float64")
    tensors = {name: source.to(dtype=name) for name in ("float64", "float32", "bf16", "fp16")}
    tensors["grad_leaf"] = mt.randn(2, requires_grad=True)
    loaded = load_checkpoint(save_checkpoint(tmp_path / "t.ckpt", tensors)).model
    for key, tensor in tensors.items():
        assert_same_arrays(loaded[key], tensor.detach().numpy())


def test_meta_round_trips_big_ints_rng_states_and_json_edge_cases(tmp_path):
    rng_state = mt.backend.get_rng_state()
    meta = {"iter_num": 5000, "best_val_loss": 2.5, "not_yet": math.inf, "nan": math.nan,
            "rng": rng_state, "big": 2**200 + 1, "negative": -(2**130),
            "config": {"betas": (0.9, 0.95), "name": "gpt-ünïcode", "dropout": 0.0,
                       "layers": [1, 2, None, True]},
            "tokenizer": json.dumps({"vocab": {"a": 0, "__array__": 1}}),
            "by_int": {1: "one", (2, 3): "pair"}, "__array__": "a key that is a tag",
            "numpy_numbers": [np.int64(7), np.float32(0.5), np.bool_(True)]}
    path = save_checkpoint(tmp_path / "m.ckpt", {}, meta=meta)
    loaded = read_checkpoint_meta(path)
    assert_same_tree(load_checkpoint(path).meta, loaded)
    assert math.isnan(loaded.pop("nan")) and math.isnan(meta.pop("nan"))
    expected = dict(meta, numpy_numbers=[7, 0.5, True])
    assert_same_tree(loaded, expected)  # with a GPU's generator state (an array) if any
    assert type(loaded["config"]["betas"]) is tuple and loaded["big"] == 2**200 + 1
    assert loaded["rng"]["backends"]["cpu"]["state"] == rng_state["backends"]["cpu"]["state"]
    with zipfile.ZipFile(path) as archive:  # strict JSON: no NaN/Infinity literals
        json.loads(archive.read("meta.json"),
                   parse_constant=lambda c: pytest.fail(f"meta.json holds {c}"))


def test_rng_state_saved_in_meta_resumes_the_stream(tmp_path):
    mt.manual_seed(7)
    mt.randn(5)
    path = save_checkpoint(tmp_path / "r.ckpt", {}, meta={"rng": mt.backend.get_rng_state()})
    expected = [mt.randn(4).tolist(), mt.functional.dropout(mt.ones(16), 0.5).tolist()]
    mt.manual_seed(123)
    mt.backend.set_rng_state(read_checkpoint_meta(path)["rng"])
    assert [mt.randn(4).tolist(), mt.functional.dropout(mt.ones(16), 0.5).tolist()] == expected


def test_meta_arrays_are_npy_members_that_meta_json_indexes(tmp_path):
    shared = np.arange(10, dtype=np.uint8)
    meta = {"iter_num": 3, "a": shared, "b": [shared, np.array(2.5)],
            "c": {0: np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)}}
    path = save_checkpoint(tmp_path / "m.ckpt", {"w": np.zeros(2)}, meta=meta)
    for loaded in (read_checkpoint_meta(path), load_checkpoint(path).meta):
        assert_same_tree(loaded, meta)
        assert loaded["a"] is loaded["b"][0]  # one array, one member
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist()[:5] == ["format.json", "meta.json", "meta/0.npy",
                                          "meta/1.npy", "meta/2.npy"]
        saved = json.loads(archive.read("meta.json"))
    assert saved["tree"]["b"] == [{"__array__": 0}, {"__array__": 1}]
    assert saved["arrays"][2] == {"file": "meta/2.npy", "dtype": "bfloat16",
                                  "encoding": "raw", "shape": [2]}


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


def test_a_gpu_generator_state_is_stored_as_bytes_not_base64_text(tmp_path):
    """The trainer's meta: rank 0's state, and every other rank's in other_ranks."""
    ranks = [rng_with_cuda("array") for _ in range(3)]
    meta = {"iter_num": 4, "rng": ranks[0], "other_ranks": [{"rng": r} for r in ranks[1:]]}
    path = save_checkpoint(tmp_path / "gpu.ckpt", {}, meta=meta)
    with zipfile.ZipFile(path) as archive:
        index = json.loads(archive.read("meta.json"))["arrays"]
        assert index == [{"file": f"meta/{i}.npy", "dtype": "|u1", "encoding": "npy",
                          "shape": [len(RAW_CUDA_STATE)]} for i in range(3)]
        for entry in index:  # the bytes and a .npy header of 128
            assert archive.getinfo(entry["file"]).file_size == len(RAW_CUDA_STATE) + 128
        assert len(archive.read("meta.json")) < 3000  # the JSON holds no state, only its place
    loaded = read_checkpoint_meta(path)
    assert_same_tree(loaded, meta)
    for state in [loaded["rng"]] + [rank["rng"] for rank in loaded["other_ranks"]]:
        assert CupyBackend.parse_rng_state(state["backends"]["cuda:0"]) == \
            ("exact", 16, RAW_CUDA_STATE)


def as_version_1(path) -> None:
    """Rewrite a checkpoint whose metadata holds no arrays in the layout of format version
    1, as minitorch-gpu wrote it before meta arrays: meta.json is the encoded metadata."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    saved = json.loads(members["meta.json"])
    assert saved["arrays"] == []
    members["format.json"] = json.dumps({"format": "minitorch-gpu-checkpoint", "version": 1})
    members["meta.json"] = json.dumps(saved["tree"])
    write_zip(path, members)


def test_a_version_1_checkpoint_with_a_base64_gpu_state_still_loads(tmp_path):
    model = tiny_gpt(0)
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
    train_steps(model, optimizer, mt.randint(0, TINY["vocab_size"], (2, 8)), 1)
    path = save_checkpoint(tmp_path / "old.ckpt", model.state_dict(), optimizer.state_dict(),
                           {"iter_num": 1, "rng": rng_with_cuda("base64")})
    new = load_checkpoint(path)
    as_version_1(path)
    old = load_checkpoint(path)
    assert_same_tree(old.model, new.model)
    assert_same_tree(old.optimizer, new.optimizer)
    assert_same_tree(old.meta, new.meta)
    assert_same_tree(read_checkpoint_meta(path), new.meta)
    assert CupyBackend.parse_rng_state(old.meta["rng"]["backends"]["cuda:0"]) == \
        ("exact", 16, RAW_CUDA_STATE)


def test_load_optimizer_false_and_checkpoints_without_optimizer(tmp_path):
    path = tmp_path / "s.ckpt"
    small_checkpoint(path)
    ckpt = load_checkpoint(path, load_optimizer=False)
    assert ckpt.optimizer is None and set(ckpt.model) == {"w", "h"}
    assert load_checkpoint(path).optimizer["state"][0]["step"] == 3
    bare = save_checkpoint(tmp_path / "bare.ckpt", {"w": np.zeros(2)})
    assert load_checkpoint(bare).optimizer is None and load_checkpoint(bare).meta == {}


def test_keys_that_are_not_file_names_and_the_member_layout(tmp_path):
    arrays = {"a/b": np.zeros(1), "..": np.ones(1), "x" * 300: np.full(1, 2.0),
              "sp ace\u00e9": np.full(1, 3.0), "plain.weight": np.full(1, 4.0)}
    path = save_checkpoint(tmp_path / "k.ckpt", arrays)
    loaded = load_checkpoint(path).model
    assert list(loaded) == list(arrays)
    for key in arrays:
        assert_same_arrays(loaded[key], arrays[key])
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        assert names[:3] == ["format.json", "meta.json", "model.json"]
        assert json.loads(archive.read("format.json")) == {
            "format": "minitorch-gpu-checkpoint", "version": 2}
        assert "model/plain.weight.npy" in names and "model/...npy" in names
        assert all(info.compress_type == zipfile.ZIP_STORED for info in archive.infolist())


def test_same_content_gives_the_same_bytes(tmp_path):
    first = small_checkpoint(tmp_path / "a.ckpt")
    assert small_checkpoint(tmp_path / "b.ckpt") == first


# --- saving: checks first, then an atomic write ---------------------------------------------
@pytest.mark.parametrize("args, error, match", [
    (([1, 2],), TypeError, "model_state to be a dict"),
    (({"w": [1.0]},), TypeError, r"model_state\['w'\] is a list"),
    (({3: np.zeros(1)},), TypeError, "key 3"),
    (({"w": np.array([object()])},), TypeError, "dtype object"),
    (({"w": np.zeros(1, dtype=[("a", "f4")])},), TypeError, "can't be saved"),
    (({}, None, {"x": [np.array([object()])]}), TypeError,
     r"meta\['x'\]\[0\] is an array of Python objects"),
    (({}, None, {"x": np.zeros(1, dtype=[("a", "f4")])}), TypeError,
     "meta array 0 has dtype .* can't be saved"),
    (({}, None, {"x": {1, 2}}), TypeError, r"meta\['x'\] is a set"),
    (({}, {"state": {0: {"f": lambda: 0}}}), TypeError, "is a function"),
    (({}, {"state": {np.zeros(1).tobytes(): 1}}), TypeError, "is a bytes"),
    (({}, None, "meta"), TypeError, "meta to be a dict"),
])
def test_save_refuses_bad_values_before_touching_the_disk(tmp_path, args, error, match):
    path = tmp_path / "sub" / "bad.ckpt"
    with pytest.raises(error, match=match):
        save_checkpoint(path, *args)
    assert not (tmp_path / "sub").exists()


def test_save_to_a_directory_is_refused(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        save_checkpoint(tmp_path, {"w": np.zeros(1)})


@pytest.mark.parametrize("interruption", [OSError("disk full"), KeyboardInterrupt()])
def test_a_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, interruption):
    path = tmp_path / "last.ckpt"
    before = small_checkpoint(path)
    write_array = np.lib.format.write_array
    calls = []

    def fail_after_the_first_array(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise interruption
        return write_array(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", fail_after_the_first_array)
    with pytest.raises(type(interruption)):
        save_checkpoint(path, {"a": np.zeros(3), "b": np.ones(3)}, meta={"iter": 99})
    monkeypatch.undo()
    assert len(calls) == 2
    assert path.read_bytes() == before
    assert load_checkpoint(path).meta == {"iter": 3}
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]  # no temporary file left


def test_a_failed_rename_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    before = small_checkpoint(path)

    def refuse(*args):
        raise PermissionError("read-only")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError):
        save_checkpoint(path, {"a": np.zeros(3)})
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["last.ckpt"]


def test_save_under_a_file_names_the_file_in_the_way(tmp_path):
    # mkdir's "[Errno 17] File exists: '.../runs'" said neither what was being written nor why
    (tmp_path / "runs").write_text("not a folder")
    for path in (tmp_path / "runs" / "last.ckpt", tmp_path / "runs" / "deep" / "last.ckpt"):
        with pytest.raises(NotADirectoryError) as info:
            save_checkpoint(path, {"w": np.zeros(1)})
        message = str(info.value)
        assert str(path) in message and f"{str(tmp_path / 'runs')!r} is a file" in message


def test_a_failed_write_names_the_checkpoint_and_keeps_the_old_one(tmp_path, monkeypatch):
    # a read-only folder or a full disk gave "[Errno 13] Permission denied:
    # '.../.last.ckpt.tmp-1234'": a hidden file the user never asked for
    path = tmp_path / "last.ckpt"
    before = small_checkpoint(path)

    def refuse(source, target):
        raise PermissionError(errno.EACCES, "Permission denied", str(source))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError) as info:
        save_checkpoint(path, {"a": np.zeros(3)})
    monkeypatch.undo()
    message = str(info.value)
    assert f"can't write {str(path)!r}" in message and "Permission denied" in message
    assert "unchanged" in message and info.value.errno == errno.EACCES
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["last.ckpt"]


def test_save_writes_a_temporary_file_beside_the_target_and_syncs_it(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "er" / "last.ckpt"
    seen = []
    replace, fsync = os.replace, os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: seen.append("fsync") or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: seen.append(("replace", a, b))
                        or replace(a, b))
    save_checkpoint(path, {"a": np.zeros(3)})
    temporary = path.with_name(f".last.ckpt.tmp-{os.getpid()}")
    assert seen[0] == "fsync" and seen[1] == ("replace", temporary, path)
    assert seen[2:] == ["fsync"] * (os.name == "posix")  # the directory, after the rename
    assert load_checkpoint(path).model["a"].tolist() == [0.0, 0.0, 0.0]


# --- loading damaged and foreign files ------------------------------------------------------
def test_every_truncation_is_a_checkpoint_error(tmp_path):
    data = small_checkpoint(tmp_path / "whole.ckpt")
    path = tmp_path / "cut.ckpt"
    for length in range(len(data)):  # every prefix: a few kilobytes, a few hundred ms
        path.write_bytes(data[:length])
        message = str(assert_one_line_error(path))
        if length == 0:
            assert "is empty" in message
        elif length < len(data) - 22:  # before the end-of-archive record starts
            assert "truncated or corrupt" in message, (length, message)


def test_byte_flips_give_a_checkpoint_error_or_the_same_contents(tmp_path):
    data = small_checkpoint(tmp_path / "whole.ckpt")
    good = load_checkpoint(tmp_path / "whole.ckpt")
    path = tmp_path / "flipped.ckpt"
    positions = np.random.default_rng(0).choice(len(data), size=min(len(data), 400),
                                                replace=False)
    errors = 0
    for position in positions:
        damaged = bytearray(data)
        damaged[position] ^= 0x5A
        path.write_bytes(bytes(damaged))
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc)
            errors += 1
            continue
        # a flip the format ignores (a timestamp, the "made by" byte): contents unchanged
        assert ckpt.meta == good.meta and list(ckpt.model) == list(good.model)
        for key in good.model:
            assert_same_arrays(ckpt.model[key], good.model[key])
        assert ckpt.optimizer["param_groups"] == good.optimizer["param_groups"]
    assert errors > len(positions) // 2


def test_a_damaged_array_is_reported_as_corrupt(tmp_path):
    path = tmp_path / "crc.ckpt"
    data = bytearray(small_checkpoint(path))
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        info = archive.getinfo("model/w.npy")
    data_end = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size
    data[data_end - 1] ^= 0xFF  # the last byte of the array data
    path.write_bytes(bytes(data))
    assert_one_line_error(path, "is corrupt", "CRC")


def write_zip(path, members: dict) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)


FORMAT_JSON = json.dumps({"format": "minitorch-gpu-checkpoint", "version": 1})


def fake_checkpoint(path, entry=None, **replaced) -> None:
    """A hand-made checkpoint: every member a valid empty one unless ``replaced`` (a member
    name with "." and "/" as "_", None to leave it out); ``entry`` is one model.json entry
    for "w" (its .npy given as ``model_w_npy``; a meta array's as ``meta_0_npy``)."""
    members = {"format.json": FORMAT_JSON, "meta.json": "{}",
               "model.json": json.dumps({"arrays": [dict(key="w", **entry)] if entry else []}),
               "optimizer.json": '{"tree": null, "arrays": []}'}
    for name, content in replaced.items():
        member = ({"model_w_npy": "model/w.npy", "meta_0_npy": "meta/0.npy"}.get(name)
                  or name.replace("_", "."))
        members[member] = content
    write_zip(path, {name: content for name, content in members.items() if content is not None})


W_F8 = {"file": "model/w.npy", "dtype": "<f8", "encoding": "npy", "shape": [2]}
FORMAT_2_JSON = json.dumps({"format": "minitorch-gpu-checkpoint", "version": 2})
META_U1 = {"file": "meta/0.npy", "dtype": "|u1", "encoding": "npy", "shape": [3]}


@pytest.mark.parametrize("make, fragments", [
    (lambda p: None, ["does not exist"]),
    (lambda p: p.mkdir(), ["is a directory"]),
    (lambda p: p.write_bytes(b""), ["is empty"]),
    (lambda p: p.write_bytes(np.random.default_rng(0).bytes(5000)),
     ["is not a minitorch-gpu checkpoint", "not a ZIP archive"]),
    (lambda p: p.write_text("step,loss\n1,2.5\n"), ["is not a minitorch-gpu checkpoint"]),
    (lambda p: p.write_bytes(_npy_bytes(np.zeros(3))), ["is not a minitorch-gpu checkpoint"]),
    (lambda p: write_zip(p, {"data.txt": "hello"}),
     ["is not a minitorch-gpu checkpoint", "without format.json"]),
    (lambda p: fake_checkpoint(p, format_json='{"format": "other"}'),
     ["is not a minitorch-gpu checkpoint", "'other'"]),
    (lambda p: fake_checkpoint(p, format_json="[1, 2]"), ["is not a minitorch-gpu checkpoint"]),
    (lambda p: fake_checkpoint(p, format_json=json.dumps(
        {"format": "minitorch-gpu-checkpoint", "version": 3})),
     ["format version 3, newer than this minitorch-gpu reads (up to 2)", "upgrade"]),
    (lambda p: fake_checkpoint(p, format_json=json.dumps(
        {"format": "minitorch-gpu-checkpoint", "version": "1"})), ["is corrupt", "version"]),
    (lambda p: fake_checkpoint(p, format_json="{not json"), ["is corrupt"]),
    (lambda p: fake_checkpoint(p, meta_json=None), ["is corrupt", "no meta.json"]),
    (lambda p: fake_checkpoint(p, model_json=None), ["is corrupt", "no model.json"]),
    (lambda p: fake_checkpoint(p, meta_json="[]"), ["is corrupt", "meta.json holds a list"]),
    (lambda p: fake_checkpoint(p, optimizer_json=None), ["is corrupt", "no optimizer.json"]),
    (lambda p: fake_checkpoint(p, optimizer_json='{"tree": []}'),
     ["is corrupt", "optimizer.json['tree'] is a list"]),
    (lambda p: fake_checkpoint(p, extra_npy=""), ["is corrupt", "unexpected member 'extra.npy'"]),
    (lambda p: fake_checkpoint(p, W_F8), ["is corrupt", "model/w.npy"]),
    (lambda p: fake_checkpoint(p, dict(W_F8, dtype="object")),
     ["is corrupt", "unknown dtype 'object'"]),
    (lambda p: fake_checkpoint(p, dict(W_F8, shape=[-1])), ["is corrupt", "list of sizes"]),
    (lambda p: fake_checkpoint(p, W_F8, model_w_npy=_npy_bytes(np.zeros(3))),
     ["is corrupt", "its index says float64 (2,)"]),
    (lambda p: fake_checkpoint(p, W_F8, model_w_npy=_npy_bytes(np.zeros(2))[:-1]),
     ["is corrupt", "holds 15 bytes of data, expected 16"]),
    (lambda p: fake_checkpoint(p, dict(W_F8, shape=[1]),
                               model_w_npy=_npy_bytes(np.array([None]), allow_pickle=True)),
     ["is corrupt", "holds object (1,)"]),  # the pickle is never loaded
    (lambda p: fake_checkpoint(p, format_json=FORMAT_2_JSON),
     ["is corrupt", "meta.json has no 'tree' key"]),
    (lambda p: fake_checkpoint(p, format_json=FORMAT_2_JSON, meta_json=json.dumps(
        {"tree": {"x": {"__array__": 0}}, "arrays": [META_U1]})), ["is corrupt", "meta/0.npy"]),
    (lambda p: fake_checkpoint(p, format_json=FORMAT_2_JSON, meta_json=json.dumps(
        {"tree": {"x": {"__array__": 1}}, "arrays": [META_U1]}), meta_0_npy=_npy_bytes(
            np.zeros(3, np.uint8))), ["is corrupt", "expected an array index in [0, 1)"]),
], ids=["missing", "directory", "empty", "random-bytes", "text", "npy", "zip-without-format",
        "other-format", "format-not-a-dict", "newer-version", "version-not-an-int",
        "format-not-json", "no-meta", "no-model", "meta-not-a-dict", "no-optimizer",
        "optimizer-tree-not-a-dict", "unknown-member", "missing-array", "object-dtype-index",
        "negative-shape", "array-disagrees-with-index", "short-array", "pickled-array",
        "v2-meta-without-tree", "missing-meta-array", "meta-array-index-out-of-range"])
def test_foreign_and_damaged_files_raise_one_line_checkpoint_errors(tmp_path, make, fragments):
    path = tmp_path / "x.ckpt"
    make(path)
    assert_one_line_error(path, *fragments)


@pytest.mark.parametrize("content, fragment", [
    (None, "does not exist"), (b"", "is empty"), (b"PK\x03\x04\x14", "truncated"),
    (b"plain text", "is not a minitorch-gpu checkpoint"),
])
def test_read_checkpoint_meta_raises_the_same_errors(tmp_path, content, fragment):
    path = tmp_path / "x.ckpt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=fragment):
        read_checkpoint_meta(path)


def _npy_bytes(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def test_read_checkpoint_meta_reads_no_arrays(tmp_path, monkeypatch):
    path = tmp_path / "m.ckpt"
    small_checkpoint(path)
    monkeypatch.setattr(np.lib.format, "read_magic",
                        lambda *a: pytest.fail("read_checkpoint_meta read an array"))
    assert read_checkpoint_meta(path) == {"iter": 3}


# --- the tree encoding ----------------------------------------------------------------------
def test_encode_tree_round_trips_nested_values_and_shares_repeated_arrays():
    shared = np.arange(3.0)
    value = {"state": {0: {"step": 2, "exp_avg": shared, "again": shared},
                       1: {"t": mt.ones(2, dtype="bf16")}},
             "groups": [{"betas": (0.9, 0.95), "params": [0, 1], "nested": ((1, 2), [])}],
             "misc": [None, True, False, "s", -(2**100), 1.5, math.inf, -math.inf],
             "__tuple__": "a key that is a tag", (1, "a"): {2.5: None}}
    tree, arrays = encode_tree(value)
    assert json.loads(json.dumps(tree, allow_nan=False)) == tree
    assert len(arrays) == 2 and all(isinstance(a, np.ndarray) for a in arrays)
    decoded = decode_tree(tree, arrays)
    assert decoded["state"][0]["exp_avg"] is decoded["state"][0]["again"]
    assert decoded["state"][1]["t"].dtype == mt.bfloat16
    decoded["state"][0].pop("exp_avg"), decoded["state"][0].pop("again")
    decoded["state"][1].pop("t")
    assert decoded == {"state": {0: {"step": 2}, 1: {}}, "groups": value["groups"],
                       "misc": value["misc"], "__tuple__": "a key that is a tag",
                       (1, "a"): {2.5: None}}
    assert math.isnan(decode_tree(encode_tree(math.nan)[0]))


@pytest.mark.parametrize("tree, arrays, match", [
    ({"__array__": 1}, [np.zeros(1)], r"array index in \[0, 1\)"),
    ({"__array__": True}, [np.zeros(1)], "array index"),
    ({"__float__": "NaN"}, [], "expected one of"),
    ({"__tuple__": 3}, [], "expected a list"),
    ({"__tuple__": [], "x": 1}, [], "mixes the tag"),
    ({"__dict__": [[1]]}, [], r"\[key, value\] pair"),
    ({"__dict__": [[[1, 2], 3]]}, [], "can't be a dict key"),
    ({"__dict__": [[{"__array__": 0}, 3]]}, [np.zeros(1)], "array index"),
])
def test_decode_tree_rejects_malformed_trees(tree, arrays, match):
    with pytest.raises(ValueError, match=match):
        decode_tree(tree, arrays)
