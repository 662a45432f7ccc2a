"""Capture and replay (capturing.py): a replay computes what the eager call computes, bit for
bit on the CPU; what a replay could not repeat is refused at capture, naming it; a new
shape, dtype, mode or parameter array captures again; random ops draw fresh numbers on
every replay; what a capture holds is bounded."""
import tracemalloc

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.nn as nn
from minitorch_gpu import autograd
from minitorch_gpu.capturing import CapturedFunction


def _mlp():
    mt.manual_seed(3)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


# --- replay equals eager ------------------------------------------------------------------
def _softmax_row(x):
    return mt.softmax(x * 2.0 - x.amax(-1, keepdim=True), dim=-1)


def _sorted_top(x):
    values, indices = mt.topk(x, 3, dim=-1)
    return values.cumsum(-1), indices, mt.argmax(x, -1)


def _masked(x):
    return x.masked_fill(x < 0.0, 0.0).sum(0), (x > 0.5).float()


def _indexed(x):  # index tensors computed in the capture: bound, not frozen
    rows = mt.argmax(x, 0)  # (8,) ids in [0, 4)
    return x[rows, mt.arange(8)], x[:, rows[:3]], x.index_select(0, rows[:2])


REPLAYED = [  # (name, function of one (4, 8) float32 tensor)
    ("elementwise", lambda x: (x.tanh() * 3.0 + 1.0).exp()),
    ("softmax", _softmax_row),
    ("sort, topk, argmax", _sorted_top),
    ("comparisons, masked_fill", _masked),
    ("views", lambda x: x.t().reshape(2, 16)[:, ::2].contiguous()),
    ("tensor indices", _indexed),
]


@pytest.mark.parametrize("name, fn", REPLAYED, ids=[r[0] for r in REPLAYED])
def test_replay_equals_eager_bit_for_bit(name, fn):
    step = mt.capture(fn)
    with mt.no_grad():
        step(mt.randn(4, 8))  # the capture
        for _ in range(3):
            x = mt.randn(4, 8)
            eager, replayed = fn(x), step(x)
            eager = eager if isinstance(eager, tuple) else (eager,)
            replayed = replayed if isinstance(replayed, tuple) else (replayed,)
            for e, r in zip(eager, replayed):
                assert e.dtype == r.dtype and e.shape == r.shape
                assert np.array_equal(e.numpy(), r.numpy())
    assert step.captures == 1 and step.replays == 3


def test_a_module_replays_with_its_parameters_read_where_they_are():
    model = _mlp()
    step = mt.capture(lambda x: model(x))
    with mt.no_grad():
        x = mt.randn(5, 8)
        first = step(x)
        assert np.array_equal(step(x).numpy(), first.numpy())
        model[0].weight.mul_(2.0)  # values change in place: the replay reads them
        assert np.array_equal(step(x).numpy(), model(x).numpy())
        assert not np.array_equal(step(x).numpy(), first.numpy())
    assert step.captures == 1


def test_a_replay_builds_no_tensor_node_or_graph(monkeypatch):
    model = _mlp()
    step = mt.capture(lambda x: model(x))
    with mt.no_grad():
        step(mt.randn(2, 8))
        applied = []
        original = autograd.Function.apply.__func__
        monkeypatch.setattr(autograd.Function, "apply", classmethod(
            lambda cls, *a, **k: applied.append(cls) or original(cls, *a, **k)))
        made = []
        original_make = mt.Tensor._make.__func__
        monkeypatch.setattr(mt.Tensor, "_make", classmethod(
            lambda cls, *a: made.append(1) or original_make(cls, *a)))
        out = step(mt.randn(2, 8))
    assert applied == [] and out.grad_fn is None
    assert len(made) == 2  # the input's randn and the one output


# --- refusals -----------------------------------------------------------------------------
def _reads_item(x):
    return x * x.sum().item()


def _branches(x):
    return x * 2 if x.sum() > 0 else x * 3


def _draws(x):
    return x + mt.randn(*x.shape)


def _updates_in_place(x):
    y = x * 1.0
    y.add_(1.0)
    return y


def _sets_item(x):
    y = x * 1.0
    y[0] = 5.0
    return y


def _reads_numpy(x):
    return x * float(x.numpy()[0, 0])


def _unrecorded(x):  # an array made outside an op from a value of the call
    return x + mt.Tensor._make(x.data * 2, x._backend, False)


def _copies(x):  # a factory's copy of a value of the call
    return mt.tensor(x) * 2


def _backward(x):
    w = mt.ones(3, requires_grad=True)
    with mt.enable_grad():
        (x * w).sum().backward()
    return x * 1


REFUSED = [  # (function, words the error must contain)
    (_reads_item, ["_reads_item", "reads a value back"]),
    (_branches, ["_branches", "reads a value back"]),
    (_reads_numpy, ["_reads_numpy", "reads a value back"]),
    (_draws, ["randn", "draws random numbers"]),
    (_updates_in_place, ["add_", "in place"]),
    (_sets_item, ["__setitem__", "in place"]),
    (_unrecorded, ["_unrecorded", "outside an op"]),
    (_copies, ["_copies", "copies a value of the capture"]),
    (lambda x: 3, ["returned int"]),
]


@pytest.mark.parametrize("fn, words", REFUSED, ids=[w[0] for _, w in REFUSED])
def test_what_a_replay_could_not_repeat_is_refused_at_capture(fn, words):
    step = mt.capture(fn)
    with mt.no_grad(), pytest.raises(mt.CaptureError) as err:
        step(mt.randn(2, 3))
    for word in words:
        assert word in str(err.value)
    assert step.captures == 0
    # the hooks are gone: the same calls work eagerly afterwards
    assert autograd._recorder is None and mt.Tensor(1.0).item() == 1.0


def test_a_backward_inside_a_capture_is_refused():
    with mt.no_grad(), pytest.raises(RuntimeError, match="records forward ops only"):
        mt.capture(_backward)(mt.ones(3))
    assert autograd._recorder is None


def test_a_module_switched_between_train_and_eval_captures_again():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train()
    step = mt.capture(lambda x: model(x))
    x = mt.ones(4, 8)
    with mt.no_grad():
        step(x)  # dropout on
        model.eval()
        assert np.array_equal(step(x).numpy(), model(x).numpy())  # no dropout now
        assert step.captures == 2
        step(x)
    assert step.replays == 1


def test_bad_calls_are_refused_naming_the_problem():
    with pytest.raises(TypeError, match="argument 1 is int"):
        mt.capture(lambda x, n: x * n)(mt.ones(2), 3)
    with pytest.raises(TypeError, match="expected a function"):
        mt.capture(3)
    with pytest.raises(ValueError, match="max_captures"):
        mt.capture(lambda x: x, max_captures=0)
    w = mt.ones(2, requires_grad=True)
    with pytest.raises(mt.CaptureError, match="no_grad"):
        mt.capture(lambda x: x * w)(mt.ones(2))
    inner = mt.capture(lambda x: x * 2)
    with mt.no_grad(), pytest.raises(mt.CaptureError, match="another function"):
        mt.capture(lambda x: inner(x))(mt.ones(2))


# --- capturing again ----------------------------------------------------------------------
def test_a_new_shape_dtype_or_mode_captures_again_and_old_ones_are_kept():
    step = mt.capture(lambda x: (x * 2).sum(-1), max_captures=2)
    with mt.no_grad():
        for shape, dtype in [((2, 3), mt.float32), ((4, 3), mt.float32),
                             ((2, 3), mt.float64), ((2, 3), mt.float32)]:
            x = mt.randn(*shape, dtype=dtype)
            assert np.array_equal(step(x).numpy(), (x * 2).sum(-1).numpy())
        assert step.captures == 4  # the third pushed out the first, which came back
        with mt.autocast():  # a mode the ops read: another capture
            step(mt.randn(2, 3))
        assert step.captures == 5
    assert step.replays == 0 and len(step._captures) == 2


def test_a_parameter_given_a_new_array_captures_again():
    model = _mlp()
    step = mt.capture(lambda x: model(x))
    x = mt.randn(3, 8)
    with mt.no_grad():
        step(x)
        other = _mlp()
        for p in other.parameters():
            p.mul_(3.0)
        model[2].weight.set_(other[2].weight.detach().clone())  # a new array, not new values
        assert np.array_equal(step(x).numpy(), model(x).numpy())
    assert step.captures == 2


# --- random ops ---------------------------------------------------------------------------
def test_dropout_and_sampling_draw_fresh_numbers_on_every_replay_as_eager_calls_do():
    drop = nn.Dropout(0.5).train()

    def fn(x):
        return drop(x), mt.multinomial(mt.softmax(x, -1), 1)
    step = mt.capture(fn)
    x = mt.ones(4, 64)
    with mt.no_grad():
        step(x)
        replays = []
        for seed in (1, 2, 1):
            mt.manual_seed(seed)
            eager = fn(x)
            mt.manual_seed(seed)
            replay = step(x)
            for e, r in zip(eager, replay):
                assert np.array_equal(e.numpy(), r.numpy())
            replays.append(replay[0].numpy())
    assert not np.array_equal(replays[0], replays[1])
    assert np.array_equal(replays[0], replays[2])


# --- bounded ------------------------------------------------------------------------------
def test_what_a_capture_holds_is_counted_and_replays_do_not_accumulate_memory():
    step = mt.capture(lambda x: (x * 2.0 + 1.0).sum())
    with mt.no_grad():
        x = mt.randn(1000)
        step(x)
        assert step.nbytes == 4000 + 4000 + 4  # two (1000,) float32 results and the sum
        assert step.ops == 3 and step.op_names() == ["Mul", "Add", "Sum"]
        for _ in range(50):
            step(x)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(500):
            step(x)
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    assert grown < 20_000, f"500 replays kept {grown} bytes"


def test_the_engine_runs_as_before_once_a_capture_failed_midway():
    step = CapturedFunction(_reads_item)
    with mt.no_grad():
        with pytest.raises(mt.CaptureError):
            step(mt.ones(3))
        assert float(mt.ones(3).sum()) == 3.0  # host reads allowed again
        assert mt.randn(2).shape == (2,)  # and random draws


# --- on a GPU: a CUDA Graph -----------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not mt.cuda.is_available(), reason="no CUDA here")
def test_on_a_gpu_each_replay_is_a_graph_launch_whose_results_stay_the_callers():
    model = _mlp().to("cuda")
    drop = nn.Dropout(0.5).train()

    def fn(x):
        return drop(model(x)), mt.argmax(x, -1)
    step = mt.capture(fn)
    with mt.no_grad():
        x = mt.randn(3, 8).to("cuda")
        step(x)
        held = next(iter(step._captures.values()))
        assert type(held).__name__ == "_GraphCapture"
        # a new seed replaces the random stream, which a graph reads: captured again
        mt.manual_seed(4)
        eager = [fn(x) for _ in range(2)]
        mt.manual_seed(4)
        replays_before = step.replays
        first = step(x)  # captured again (the stream changed) and launched
        kept = first[0].cpu().numpy().copy()
        second = step(x)  # a launch of that graph: fresh dropout, the eager call's draws
        assert step.replays == replays_before + 1
        for e, r in zip(eager[0] + eager[1], first + second):
            assert np.array_equal(e.cpu().numpy(), r.cpu().numpy())
        assert not np.array_equal(kept, second[0].cpu().numpy())
        # the first result is the caller's: the second launch did not overwrite it
        assert np.array_equal(kept, first[0].cpu().numpy())
        with pytest.raises(mt.CaptureError, match="reads a value back"):
            mt.capture(_reads_item)(x)
