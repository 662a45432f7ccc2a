"""Checkpoint files: round trips of a GPT and AdamW, dtypes bit for bit, the tensor names
and metadata of the safetensors layout, and atomic writes."""
import errno
import json
import math
import os

import ml_dtypes
import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu import nn
from minitorch_gpu.backend.cupy_backend import CupyBackend
from minitorch_gpu.checkpoint import (Checkpoint, decode_tree, encode_tree, load_checkpoint,
                                      read_checkpoint_meta, save_checkpoint)
from minitorch_gpu.checkpoint import safetensors_file
from checkpoint_files import (RAW_CUDA_STATE, assert_same_arrays, assert_same_tree,
                              header_of, rng_with_cuda, small_checkpoint)

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


def layout_of(path) -> dict:
    """The checkpoint's __metadata__ with its JSON entries parsed."""
    metadata = header_of(path)["__metadata__"]
    return {key: json.loads(value) if key in ("meta", "model", "optimizer", "crc32") else value
            for key, value in metadata.items()}


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
    header = header_of(path)
    assert "model.transformer.wte.weight" in header and "model.lm_head.weight" not in header
    assert layout_of(path)["model"] == {"keys": list(state),
                                        "tied": {"lm_head.weight": "transformer.wte.weight"}}
    assert len(header) - 1 == len(state) - 1  # one tensor per array, beside __metadata__
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
    for key, array in arrays.items():  # stored little-endian: ">f8" loads as "<f8"
        assert_same_arrays(loaded[key], array.astype(dtype.newbyteorder("<")))


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
    # strict JSON: no NaN/Infinity literals
    json.loads(header_of(path)["__metadata__"]["meta"],
               parse_constant=lambda c: pytest.fail(f"the metadata holds {c}"))


def test_rng_state_saved_in_meta_resumes_the_stream(tmp_path):
    mt.manual_seed(7)
    mt.randn(5)
    path = save_checkpoint(tmp_path / "r.ckpt", {}, meta={"rng": mt.backend.get_rng_state()})
    expected = [mt.randn(4).tolist(), mt.functional.dropout(mt.ones(16), 0.5).tolist()]
    mt.manual_seed(123)
    mt.backend.set_rng_state(read_checkpoint_meta(path)["rng"])
    assert [mt.randn(4).tolist(), mt.functional.dropout(mt.ones(16), 0.5).tolist()] == expected


def test_meta_arrays_are_tensors_named_by_their_place(tmp_path):
    shared = np.arange(10, dtype=np.uint8)
    meta = {"iter_num": 3, "a": shared, "b": [shared, np.array(2.5)],
            "c": {0: np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)}}
    path = save_checkpoint(tmp_path / "m.ckpt", {"w": np.zeros(2)}, meta=meta)
    for loaded in (read_checkpoint_meta(path), load_checkpoint(path).meta):
        assert_same_tree(loaded, meta)
        assert loaded["a"] is loaded["b"][0]  # one array, one tensor
    saved = layout_of(path)["meta"]
    assert saved["arrays"] == ["meta.a", "meta.b.1", "meta.c.0"]
    assert saved["tree"]["b"] == [{"__array__": 0}, {"__array__": 1}]
    header = header_of(path)
    assert header["meta.c.0"]["dtype"] == "BF16" and header["meta.c.0"]["shape"] == [2]
    assert header["meta.a"]["dtype"] == "U8" and header["meta.b.1"]["shape"] == []


def test_optimizer_arrays_are_named_by_parameter_and_moment(tmp_path):
    model = tiny_gpt(0)
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2)
    train_steps(model, optimizer, mt.randint(0, TINY["vocab_size"], (2, 8)), 1)
    path = save_checkpoint(tmp_path / "o.ckpt", {}, optimizer.state_dict())
    names = layout_of(path)["optimizer"]["arrays"]
    count = len(optimizer.state_dict()["state"])
    assert names == [f"optimizer.state.{i}.{moment}" for i in range(count)
                     for moment in ("exp_avg", "exp_avg_sq")]


def test_a_gpu_generator_state_is_stored_as_bytes_not_base64_text(tmp_path):
    """The trainer's meta: rank 0's state, and every other rank's in other_ranks."""
    ranks = [rng_with_cuda("array") for _ in range(3)]
    meta = {"iter_num": 4, "rng": ranks[0], "other_ranks": [{"rng": r} for r in ranks[1:]]}
    path = save_checkpoint(tmp_path / "gpu.ckpt", {}, meta=meta)
    header = header_of(path)
    names = layout_of(path)["meta"]["arrays"]
    assert names == ["meta.rng.backends.cuda:0.data"] + [
        f"meta.other_ranks.{i}.rng.backends.cuda:0.data" for i in range(2)]
    for name in names:  # the bytes, no more
        begin, end = header[name]["data_offsets"]
        assert header[name]["dtype"] == "U8" and end - begin == len(RAW_CUDA_STATE)
    assert len(header["__metadata__"]["meta"]) < 3000  # the JSON holds no state, its place
    loaded = read_checkpoint_meta(path)
    assert_same_tree(loaded, meta)
    for state in [loaded["rng"]] + [rank["rng"] for rank in loaded["other_ranks"]]:
        assert CupyBackend.parse_rng_state(state["backends"]["cuda:0"]) == \
            ("exact", 16, RAW_CUDA_STATE)


def test_the_file_is_safetensors_with_its_data_aligned(tmp_path):
    arrays = {"flag": np.array([True]), "half": np.ones(3, np.float16), "w": np.ones(3),
              "b": np.ones(5, np.int8), "x": np.ones(3, np.float32)}
    path = save_checkpoint(tmp_path / "a.ckpt", arrays)
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    assert (8 + length) % 8 == 0 and data[8:9] == b"{"
    header = header_of(path)
    for name, entry in header.items():
        if name != "__metadata__":
            size = safetensors_file.DTYPES[entry["dtype"]].itemsize
            assert entry["data_offsets"][0] % size == 0, name  # largest itemsize first
    assert layout_of(path)["format"] == "minitorch-gpu-checkpoint"
    assert layout_of(path)["version"] == "3"


def test_load_optimizer_false_and_checkpoints_without_optimizer(tmp_path):
    path = tmp_path / "s.ckpt"
    small_checkpoint(path)
    ckpt = load_checkpoint(path, load_optimizer=False)
    assert ckpt.optimizer is None and set(ckpt.model) == {"w", "h"}
    assert load_checkpoint(path).optimizer["state"][0]["step"] == 3
    bare = save_checkpoint(tmp_path / "bare.ckpt", {"w": np.zeros(2)})
    assert load_checkpoint(bare).optimizer is None and load_checkpoint(bare).meta == {}


def test_keys_of_any_text_are_tensor_names(tmp_path):
    arrays = {"a/b": np.zeros(1), "..": np.ones(1), "x" * 300: np.full(1, 2.0),
              "sp ace\u00e9": np.full(1, 3.0), "plain.weight": np.full(1, 4.0)}
    path = save_checkpoint(tmp_path / "k.ckpt", arrays)
    loaded = load_checkpoint(path).model
    assert list(loaded) == list(arrays)
    for key in arrays:
        assert_same_arrays(loaded[key], arrays[key])
    assert set(header_of(path)) == {"__metadata__"} | {f"model.{key}" for key in arrays}


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
    write_tensor = safetensors_file._write_tensor
    calls = []

    def fail_after_the_first_array(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise interruption
        return write_tensor(*args, **kwargs)

    monkeypatch.setattr(safetensors_file, "_write_tensor", fail_after_the_first_array)
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
