"""Backends, devices, dtypes, factories, conversions, seeds and random-number states."""
import base64
import contextlib
import json
import math
import types

import ml_dtypes
import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.backend import cupy_backend, parse_device
from minitorch_gpu.backend.cupy_backend import CupyBackend
from minitorch_gpu.backend.numpy_backend import _erf
from minitorch_gpu.checkpoint import decode_tree, encode_tree, read_checkpoint_meta, save_checkpoint


@pytest.mark.parametrize("text, expected", [
    ("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:0", "cuda:0"), ("cuda:3", "cuda:3")])
def test_device_strings(text, expected):
    device = parse_device(text)
    assert str(device) == expected
    assert device == expected and device == parse_device(expected)


def test_cpu_backend_basics():
    backend = mt.get_backend("cpu")
    assert backend.xp is np
    assert mt.zeros(2).device == "cpu"
    backend.synchronize()
    with backend.timer() as timer:
        sum(range(1000))
    assert timer.elapsed_ms >= 0
    assert backend.memory_stats()["peak_rss_bytes"] > 0


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool", "bfloat16",
                                   mt.float16, mt.bfloat16, float, int])
def test_dtypes_round_trip(device, dtype):
    x = mt.zeros(2, 3, dtype=dtype, device=device)
    expected = mt.backend.dtypes.as_dtype(dtype)
    assert x.dtype == expected
    assert x.to(mt.float64).dtype == mt.float64


def test_default_dtypes_follow_pytorch(device):
    assert mt.tensor([1.0, 2.0], device=device).dtype == mt.float32
    assert mt.tensor([1, 2], device=device).dtype == mt.int64
    assert mt.tensor([True], device=device).dtype == mt.bool
    assert mt.tensor(np.zeros(2, dtype=np.float64), device=device).dtype == mt.float64
    assert mt.arange(5, device=device).dtype == mt.int64
    assert mt.arange(0.0, 1.0, 0.25, device=device).dtype == mt.float32
    assert mt.randn(2, device=device).dtype == mt.float32


def test_bfloat16_is_real_storage_rounded_to_nearest_even(device):
    values = np.array([1.0, 1.00390625, 1.01171875, 3.14159], dtype=np.float32)
    x = mt.tensor(values, device=device).bfloat16()
    assert x.dtype == mt.bfloat16 and x.element_size() == 2
    expected = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(x.float().cpu().numpy(), expected)
    y = mt.randn(4, dtype="bf16", device=device)
    assert y.dtype == mt.bfloat16


def test_factories(device):
    assert mt.ones(2, 3, device=device).tolist() == [[1.0] * 3] * 2
    assert mt.full((2,), 7, device=device).tolist() == [7, 7]
    assert mt.full((2,), 0.5, device=device).dtype == mt.float32
    assert mt.arange(1, 7, 2, device=device).tolist() == [1, 3, 5]
    assert mt.empty(3, 1, device=device).shape == (3, 1)
    x = mt.randn(3, 4, dtype="float64", device=device)
    assert mt.zeros_like(x).dtype == mt.float64 and mt.ones_like(x).shape == (3, 4)
    assert mt.full_like(x, 2.0).tolist()[0] == [2.0] * 4
    r = mt.randint(0, 10, (1000,), device=device)
    assert r.dtype == mt.int64 and 0 <= r.min().item() and r.max().item() < 10
    u = mt.rand(1000, device=device)
    assert 0 <= u.min().item() and u.max().item() < 1
    w = mt.zeros(3, requires_grad=True, device=device)
    assert w.requires_grad and w.is_leaf


def test_tensor_copies_its_input_but_from_numpy_shares():
    array = np.zeros(3, dtype=np.float32)
    t = mt.tensor(array)
    t += 1
    assert array.tolist() == [0.0, 0.0, 0.0]
    shared = mt.from_numpy(array)
    shared += 1
    assert array.tolist() == [1.0, 1.0, 1.0]


def test_conversions(device):
    x = mt.tensor([[1.5, -2.0]], device=device)
    assert x.tolist() == [[1.5, -2.0]]
    assert x[0, 0].item() == 1.5 and isinstance(x[0, 0].item(), float)
    assert float(x[0, 1]) == -2.0
    assert x.cpu().numpy().dtype == np.float32
    assert x.long().tolist() == [[1, -2]]
    assert x.to("cpu", "float64").dtype == mt.float64
    assert x.to(dtype=mt.float32) is x  # nothing to change: no copy
    assert x.clone().data_ptr() != x.data_ptr()
    assert np.asarray(x.cpu()).shape == (1, 2)
    assert "tensor([[ 1.5, -2. ]]" in repr(x.cpu())
    assert "requires_grad=True" in repr(mt.zeros(1, requires_grad=True))
    assert "dtype=float64" in repr(mt.zeros(1, dtype="float64"))


def test_to_device_is_differentiable(device):
    x = mt.randn(3, requires_grad=True)
    y = x.to(device)
    assert y.device == device
    (y * 2).sum().backward()
    assert x.grad.device == "cpu" and x.grad.tolist() == [2.0, 2.0, 2.0]


def test_cast_is_differentiable(device):
    x = mt.randn(3, dtype="float64", requires_grad=True, device=device)
    (x.float() * 3).sum().backward()
    assert x.grad.dtype == mt.float64 and x.grad.tolist() == [3.0, 3.0, 3.0]


def test_manual_seed_makes_random_draws_repeatable(device):
    def draw():
        x = mt.randn(5, device=device)
        u = mt.rand(5, device=device)
        i = mt.randint(0, 100, (5,), device=device)
        d = mt.functional.dropout(mt.ones(50, device=device), p=0.5)
        return x.tolist(), u.tolist(), i.tolist(), d.tolist()

    mt.manual_seed(1234)
    first = draw()
    mt.manual_seed(1234)
    assert draw() == first
    mt.manual_seed(4321)
    assert draw()[0] != first[0]


def test_normal_and_uniform_fill_in_place_under_no_grad(device):
    w = mt.empty(1000, requires_grad=True, device=device)
    with mt.no_grad():
        w.normal_(0.0, 0.02)
    assert abs(w.std().item() - 0.02) < 0.003
    with mt.no_grad():
        w.uniform_(-1.0, 1.0)
    assert -1.0 <= w.min().item() and w.max().item() < 1.0


def test_erf_matches_math_erf():
    x = np.concatenate([np.linspace(-7, 7, 20001), [0.0, -0.0, 2.5, -2.5, 1e-300, np.inf, -np.inf]])
    expected = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(_erf(x), expected, rtol=2e-15, atol=2e-15)
    assert _erf(np.float32(0.5).reshape(1)).dtype == np.float32


def test_deepcopy_and_pickle_keep_the_backend_and_copy_the_data(device):
    import copy
    import pickle

    x = mt.randn(3, device=device, requires_grad=True)
    (x * 2).sum().backward()
    for clone in (copy.deepcopy(x), pickle.loads(pickle.dumps(x))):
        assert clone.backend is x.backend  # one backend per device: ops can mix them
        assert clone.requires_grad and clone.is_leaf
        assert clone.data_ptr() != x.data_ptr()
        assert clone.tolist() == x.tolist()
        assert (clone + x).shape == (3,)
    assert copy.deepcopy(x).grad.tolist() == [2.0, 2.0, 2.0]
    assert copy.deepcopy(x.backend) is x.backend
    with pytest.raises(RuntimeError, match="only leaf tensors"):
        copy.deepcopy(x * 2)


@pytest.mark.parametrize("rows, index", [
    (5, [0, 3, 3, 1, 3, 0]),  # repeats, unsorted
    (5, [4]),
    (5, [-1, 4, 2, -5]),  # negative rows count from the end, and meet their positive twins
    (70, np.random.default_rng(0).integers(0, 70, 500)),
])
def test_scatter_add_of_rows_adds_every_repeat(rows, index):
    backend = mt.get_backend("cpu")
    index = np.asarray(index)
    values = np.random.default_rng(1).standard_normal((len(index), 3))
    expected = np.zeros((rows, 3))
    np.add.at(expected, index, values)
    target = np.zeros((rows, 3))
    backend.scatter_add(target, index, values)
    np.testing.assert_allclose(target, expected, rtol=1e-12, atol=1e-12)


# --- random-number states ------------------------------------------------------------------
def draw_everything(device):
    """One of each kind of draw: normal, uniform, 64- and 32-bit integers, a dropout mask."""
    return (mt.randn(5, device=device).tolist(),
            mt.rand(3, dtype="float64", device=device).tolist(),
            mt.randint(0, 1000, (6,), device=device).tolist(),
            mt.randint(0, 1000, (3,), dtype="int32", device=device).tolist(),
            mt.functional.dropout(mt.ones(40, device=device), p=0.5).tolist())


def same_state(a, b) -> bool:
    """Whether two random-number states are equal: JSON data alike and their arrays (a
    CUDA generator's bytes) of one dtype and content (``==`` on a dict of arrays raises)."""
    (tree_a, arrays_a), (tree_b, arrays_b) = encode_tree(a), encode_tree(b)
    return tree_a == tree_b and len(arrays_a) == len(arrays_b) and all(
        x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(arrays_a, arrays_b))


def test_rng_state_continues_the_stream(device):
    mt.randint(0, 10, (1,), dtype="int32", device=device)  # leaves half a 64-bit draw cached
    state = mt.backend.get_rng_state()
    # plain JSON data, but for a CUDA generator's state: a uint8 array of its bytes
    tree, arrays = encode_tree(state)
    assert json.loads(json.dumps(tree, allow_nan=False)) == tree
    assert all(array.dtype == np.uint8 and array.ndim == 1 for array in arrays)
    assert str(parse_device(device)) in state["backends"] and state["seed"] == 0
    expected = [draw_everything(device) for _ in range(3)]
    stored = decode_tree(json.loads(json.dumps(tree)), [array.copy() for array in arrays])
    for restored in (state, stored):
        mt.manual_seed(99)
        mt.backend.set_rng_state(restored)
        assert [draw_everything(device) for _ in range(3)] == expected


def test_backend_rng_state_continues_the_stream(device):
    backend = mt.get_backend(device)
    backend.randn((3,), mt.float32)
    state = backend.get_rng_state()
    expected = (backend.randn((4,), mt.float32).tolist(),
                backend.randint(0, 50, (4,), mt.int64).tolist())
    backend.seed(5)
    if device == "cpu":  # plain JSON; a GPU's holds its generator's bytes as an array
        state = json.loads(json.dumps(state))
    backend.set_rng_state(state)
    assert (backend.randn((4,), mt.float32).tolist(),
            backend.randint(0, 50, (4,), mt.int64).tolist()) == expected


def test_set_rng_state_restores_the_seed_of_backends_made_later():
    mt.manual_seed(1234)
    state = mt.backend.get_rng_state()
    mt.manual_seed(1)
    mt.backend.set_rng_state(state)
    assert mt.backend.get_rng_state()["seed"] == 1234


@pytest.mark.parametrize("change, match", [
    (lambda s: [s], "expected a dict from NumpyBackend.get_rng_state"),
    (lambda s: dict(s, kind="cupy"), "kind 'numpy'.*got kind 'cupy'"),
    (lambda s: {k: v for k, v in s.items() if k != "inc"}, "expected the keys"),
    (lambda s: dict(s, extra=1), "expected the keys"),
    (lambda s: dict(s, bit_generator="MT19937"), "expected bit_generator 'PCG64'"),
    (lambda s: dict(s, state=-1), r"'state' to be an int in \[0, "),
    (lambda s: dict(s, state=1 << 128), "'state' to be an int"),
    (lambda s: dict(s, state=str(s["state"])), "got str"),
    (lambda s: dict(s, has_uint32=True), "'has_uint32'.*got bool"),
    (lambda s: dict(s, uinteger=1 << 32), "'uinteger'"),
    (lambda s: dict(s, inc=s["inc"] + 1), "odd 'inc'"),
])
def test_backend_set_rng_state_rejects_malformed_states(change, match):
    backend = mt.get_backend("cpu")
    state = backend.get_rng_state()
    expected = backend.randn((4,), mt.float32).tolist()
    backend.set_rng_state(state)
    with pytest.raises(ValueError, match=match):
        backend.set_rng_state(change(state))
    assert backend.randn((4,), mt.float32).tolist() == expected  # the stream is unchanged


CUDA_RESEED = {"kind": "cupy", "bit_generator": "XORWOW", "mode": "reseed", "seed": 5}


@pytest.mark.parametrize("change, match", [
    (lambda s: None, "expected a dict from get_rng_state"),
    (lambda s: dict(s, format="x"), "expected format 'minitorch-gpu-rng-state'"),
    (lambda s: dict(s, version=2), "expected version 1"),
    (lambda s: dict(s, version=True), "expected version 1"),
    (lambda s: dict(s, seed="0"), "expected an int 'seed'"),
    (lambda s: dict(s, backends=[]), "'backends' to be a dict"),
    (lambda s: dict(s, backends={"gpu": CUDA_RESEED}), "'backends' key 'gpu'"),
    (lambda s: dict(s, backends={"cuda": CUDA_RESEED}), "'cuda:0'"),
    (lambda s: dict(s, backends={"cpu": CUDA_RESEED}), "the state of 'cpu'.*got kind 'cupy'"),
    (lambda s: dict(s, backends={"cuda:5": s["backends"]["cpu"]}),
     "the state of 'cuda:5'.*got kind 'numpy'"),
    (lambda s: dict(s, backends={"cuda:5": dict(CUDA_RESEED, seed=-1)}), "'seed'"),
])
def test_set_rng_state_rejects_malformed_states_and_changes_nothing(change, match):
    state = mt.backend.get_rng_state()
    expected = mt.randn(4).tolist()
    mt.backend.set_rng_state(state)
    with pytest.raises(ValueError, match=match):
        mt.backend.set_rng_state(change(state))
    assert mt.randn(4).tolist() == expected
    assert same_state(mt.backend.get_rng_state(), mt.backend.get_rng_state()) and \
        mt.backend.get_rng_state()["seed"] == state["seed"]


def test_a_state_for_a_device_not_made_yet_waits_for_it():
    state = mt.backend.get_rng_state()
    state["backends"]["cuda:7"] = CUDA_RESEED  # no backend for cuda:7 in this process
    mt.backend.set_rng_state(state)
    assert mt.backend.get_rng_state()["backends"]["cuda:7"] == CUDA_RESEED  # carried along
    mt.manual_seed(1)  # a new seed replaces every saved stream
    assert "cuda:7" not in mt.backend.get_rng_state()["backends"]


# CuPy's states can be checked on any machine; restoring them is exercised below against a
# stand-in for CuPy with the layout cupy_backend relies on, and on a GPU by the tests above.
def exact_cupy_state(raw: bytes, size: int, **changes) -> dict:
    """An exact state as checkpoints before meta arrays hold it: base64 text."""
    state = {"kind": "cupy", "bit_generator": "XORWOW", "mode": "exact", "size": size,
             "nbytes": len(raw), "encoding": "base64",
             "data": base64.b64encode(raw).decode("ascii")}
    state.update(changes)
    return state


def array_cupy_state(raw: bytes, size: int, **changes) -> dict:
    """An exact state as get_rng_state gives it: the bytes as a uint8 array."""
    return exact_cupy_state(raw, size, **{"encoding": "array",
                                          "data": np.frombuffer(raw, np.uint8).copy(),
                                          **changes})


RAW = bytes(range(256)) * 3  # 16 states of 48 bytes


def test_cupy_rng_states_are_checked_without_a_gpu():
    assert CupyBackend.parse_rng_state(array_cupy_state(RAW, 16)) == ("exact", 16, RAW)
    assert CupyBackend.parse_rng_state(exact_cupy_state(RAW, 16)) == ("exact", 16, RAW)
    assert CupyBackend.parse_rng_state(CUDA_RESEED) == ("reseed", 5)


@pytest.mark.parametrize("state, match", [
    (exact_cupy_state(RAW, 16, nbytes=769), "multiple of 'size'"),
    (exact_cupy_state(RAW, 16, nbytes=784), "decode to 784 bytes"),
    (exact_cupy_state(RAW + b"x", 16, nbytes=768), "decode to 768 bytes.*got 769"),
    (exact_cupy_state(RAW, 16, data="not base64!"), "'data' is not base64"),
    (exact_cupy_state(RAW, 16, data=7), "'data' to be a str"),
    (exact_cupy_state(RAW, 16, encoding="zlib+base64"), "encoding 'base64'"),
    (array_cupy_state(RAW, 16, nbytes=784), "decode to 784 bytes.*got 768"),
    (array_cupy_state(RAW, 16, data=np.frombuffer(RAW, np.int8)), "uint8.*got a int8 array"),
    (array_cupy_state(RAW, 16, data=np.frombuffer(RAW, np.uint8).reshape(16, 48)),
     r"1-D uint8.*shape \(16, 48\)"),
    (array_cupy_state(RAW, 16, data=list(RAW)), "NumPy array.*got a list"),
    (array_cupy_state(RAW, 16, data=exact_cupy_state(RAW, 16)["data"]), "got a str"),
    (exact_cupy_state(RAW, 16, mode="fast"), "mode 'exact' or 'reseed'"),
    (exact_cupy_state(RAW, 16, mode=["exact"]), "mode 'exact' or 'reseed'"),
    (exact_cupy_state(RAW, 16, bit_generator="Philox4x3210"), "XORWOW"),
    (dict(exact_cupy_state(RAW, 16), size=0), "'size' to be an int"),
    (dict(CUDA_RESEED, seed=1 << 63), "'seed' to be an int"),
    (dict(CUDA_RESEED, kind="numpy"), "got kind 'numpy'"),
    (dict(CUDA_RESEED, size=3), "expected the keys"),
    ("cupy", "expected a dict from CupyBackend.get_rng_state"),
])
def test_cupy_rng_state_errors_name_what_was_expected(state, match):
    with pytest.raises(ValueError, match=match):
        CupyBackend.parse_rng_state(state)


class _FakeDeviceArray(np.ndarray):
    """Stands in for cupy.ndarray: ``get`` copies to the host, ``set`` copies from it."""

    def get(self) -> np.ndarray:
        return np.array(self)

    def set(self, host: np.ndarray) -> None:
        self[...] = host


class _FakeXORWOW:
    """cupy.random.XORWOW as cupy_backend relies on it: the whole state is the int8 device
    buffer ``_state`` of ``_size`` 48-byte records."""

    def __init__(self, seed=None, *, size=-1):
        self._size = 32 if size < 0 else size
        raw = np.random.default_rng(seed).integers(-128, 128, self._size * 48, dtype=np.int8)
        self._state = raw.view(_FakeDeviceArray)


class _FakeGenerator:
    """cupy.random.Generator: every draw reads and advances the bit generator's state."""

    def __init__(self, bit_generator):
        self.bit_generator = bit_generator

    def _stream(self) -> np.random.Generator:
        state = self.bit_generator._state
        rng = np.random.default_rng(np.frombuffer(np.asarray(state).tobytes(), np.uint32))
        state[...] = rng.integers(-128, 128, state.size, dtype=np.int8)
        return rng

    def standard_normal(self, shape, dtype):
        return self._stream().standard_normal(shape, dtype=dtype)

    def random(self, shape, dtype):
        return self._stream().random(shape, dtype=dtype)

    def integers(self, low, high, size, dtype):
        return self._stream().integers(low, high, size=size, dtype=dtype)


class _FakeOpaqueXORWOW:
    """A CuPy whose XORWOW keeps its state out of reach: get_rng_state must reseed."""

    def __init__(self, seed=None, *, size=-1):
        self._hidden = np.random.default_rng(seed)


class _FakeOpaqueGenerator(_FakeGenerator):
    def _stream(self) -> np.random.Generator:
        return self.bit_generator._hidden


def fake_cupy(opaque: bool) -> types.SimpleNamespace:
    bit_generator, generator = ((_FakeOpaqueXORWOW, _FakeOpaqueGenerator) if opaque
                                else (_FakeXORWOW, _FakeGenerator))
    bit_generator = type("XORWOW", (bit_generator,), {})  # the name get_rng_state records
    return types.SimpleNamespace(
        ndarray=_FakeDeviceArray, __version__="stand-in", asnumpy=lambda a: a.get(),
        random=types.SimpleNamespace(default_rng=lambda seed: generator(bit_generator(seed))),
        cuda=types.SimpleNamespace(Device=lambda index: contextlib.nullcontext()))


@pytest.mark.parametrize("opaque", [False, True], ids=["exact", "reseed"])
def test_cupy_rng_state_round_trip_against_a_stand_in_for_cupy(monkeypatch, tmp_path, opaque):
    monkeypatch.setattr(cupy_backend, "cupy", fake_cupy(opaque))

    def draws(backend):
        return (backend.randn((5,), mt.float32).tolist(),
                backend.randint(0, 100, (4,), mt.int64).tolist(),
                backend.rand((3,), mt.float64).tolist())

    backend = CupyBackend(0, seed=3)
    backend.randn((2,), mt.float32)
    taken = backend.get_rng_state()
    if not opaque:  # the stand-in's 32 threads of 48 bytes, as bytes rather than text
        assert taken["encoding"] == "array" and taken["nbytes"] == 32 * 48
        assert taken["data"].dtype == np.uint8 and taken["data"].shape == (32 * 48,)
    # as another process finds it: in a checkpoint, the bytes a tensor of it
    path = save_checkpoint(tmp_path / "rng.ckpt", {}, meta={"rng": taken})
    state = read_checkpoint_meta(path)["rng"]
    assert state["mode"] == ("reseed" if opaque else "exact")
    expected = [draws(backend) for _ in range(2)]
    resumed = CupyBackend(0, seed=4)  # another process's backend
    resumed.set_rng_state(state)
    assert [draws(resumed) for _ in range(2)] == expected
    if not opaque:  # the same bytes as base64 text, as older checkpoints hold them
        older = dict(state, encoding="base64",
                     data=base64.b64encode(state["data"].tobytes()).decode("ascii"))
        resumed.set_rng_state(older)
        assert [draws(resumed) for _ in range(2)] == expected
    untouched = CupyBackend(0, seed=3)
    untouched.randn((2,), mt.float32)
    # an exact snapshot leaves the stream alone; a reseed snapshot moves it (documented)
    assert ([draws(untouched) for _ in range(2)] == expected) is not opaque


def test_a_cupy_state_of_another_layout_is_refused(monkeypatch):
    monkeypatch.setattr(cupy_backend, "cupy", fake_cupy(False))
    backend = CupyBackend(0, seed=3)
    before = backend.get_rng_state()
    for state in (array_cupy_state(bytes(16 * 40), 16), exact_cupy_state(bytes(16 * 40), 16)):
        with pytest.raises(ValueError, match="40 per thread"):
            backend.set_rng_state(state)
    assert same_state(backend.get_rng_state(), before)


# --- moves between GPUs --------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(mt.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_a_move_from_one_gpu_to_another_copies_the_data():
    base = mt.arange(24, dtype="float32", device="cuda:0").reshape(2, 3, 4)
    source = base.permute(2, 0, 1)  # neither C- nor F-contiguous, as a head view
    moved = source.to("cuda:1")
    assert moved.device == parse_device("cuda:1") and moved.data.device.id == 1
    expected = np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(2, 0, 1)
    assert moved.tolist() == expected.tolist()
    base.data[...] = -1  # writing one leaves the other as it was, both ways
    assert moved.tolist() == expected.tolist()
    with moved.data.device:  # a raw write runs on the current GPU: the array's, in CuPy
        moved.data[...] = 7
    assert (base.cpu().numpy() == -1).all() and (moved.cpu().numpy() == 7).all()
    back = moved.to("cuda:0")
    assert back.data.device.id == 0 and (back.cpu().numpy() == 7).all()
    x = mt.randn(3, 4, device="cuda:0", requires_grad=True)
    (x.to("cuda:1") * 2).sum().backward()  # the gradient moves back
    assert x.grad.device == parse_device("cuda:0") and (x.grad.cpu().numpy() == 2).all()


class _FakeGpu:
    """Stands in for the CuPy calls CupyBackend.asarray makes, on several devices: each
    array knows its device, and every call that queues work is logged with the device
    current then, so the order of the copy's events can be checked without a GPU."""

    def __init__(self) -> None:
        self.current, self.log = 0, []
        gpu = self

        class Device:
            def __init__(self, index: int) -> None:
                self.id = index

            def __enter__(self):
                self.previous, gpu.current = gpu.current, self.id

            def __exit__(self, *exc) -> None:
                gpu.current = self.previous

        class Stream:
            def __init__(self, device: int) -> None:
                self.device = device

            def record(self) -> str:
                assert gpu.current == self.device  # an event belongs to its stream's GPU
                gpu.log.append(("record", self.device))
                return f"event on {self.device}"

            def wait_event(self, event: str) -> None:
                gpu.log.append(("wait", self.device, event))

        class Pointer:
            def __init__(self, array) -> None:
                self.array = array

            def copy_from_device_async(self, source, nbytes: int, stream) -> None:
                assert nbytes == source.array.host.nbytes == self.array.host.nbytes
                gpu.log.append(("copy", stream.device, source.array.device.id,
                                self.array.device.id))
                self.array.host[...] = source.array.host

        class ndarray:
            def __init__(self, host: np.ndarray) -> None:
                self.host, self.device, self.data = host, Device(gpu.current), Pointer(self)
                self.shape, self.dtype, self.nbytes = host.shape, host.dtype, host.nbytes

            def astype(self, dtype, copy=True):
                return ndarray(self.host.astype(dtype))

        def ascontiguousarray(array):
            assert array.device.id == gpu.current  # made on the source's own GPU
            gpu.log.append(("contiguous", gpu.current))
            return ndarray(np.ascontiguousarray(array.host))

        streams = {}
        self.module = types.SimpleNamespace(
            ndarray=ndarray, ascontiguousarray=ascontiguousarray,
            empty=lambda shape, dtype: ndarray(np.empty(shape, dtype)),
            asarray=lambda data, dtype=None: data if isinstance(data, ndarray) else
            ndarray(np.array(data, dtype=dtype)),  # an array of its device as it is
            random=types.SimpleNamespace(default_rng=lambda seed: None),
            cuda=types.SimpleNamespace(
                Device=Device,
                get_current_stream=lambda: streams.setdefault(gpu.current,
                                                              Stream(gpu.current))))

    def array_on(self, device: int, host: np.ndarray):
        previous, self.current = self.current, device
        array = self.module.ndarray(host)
        self.current = previous
        return array


def test_asarray_copies_another_gpus_array_in_stream_order_without_a_gpu(monkeypatch):
    gpu = _FakeGpu()
    monkeypatch.setattr(cupy_backend, "cupy", gpu.module)
    host = np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(2, 0, 1)
    source = gpu.array_on(0, host)
    moved = CupyBackend(1, seed=0).asarray(source)
    assert moved.device.id == 1 and moved.host is not source.host
    np.testing.assert_array_equal(moved.host, host)
    assert gpu.log == [("contiguous", 0), ("record", 0), ("wait", 1, "event on 0"),
                       ("copy", 1, 0, 1), ("record", 1), ("wait", 0, "event on 1")]
    assert gpu.current == 0  # the caller's device is as it was
    widened = CupyBackend(1, seed=0).asarray(source, dtype=np.float64)
    assert widened.device.id == 1 and widened.dtype == np.float64
    gpu.log.clear()
    here = gpu.array_on(1, host)  # already on cuda:1: no copy between devices
    assert CupyBackend(1, seed=0).asarray(here) is here and gpu.log == []
