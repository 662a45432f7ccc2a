"""mt.amp.GradScaler against torch.amp.GradScaler's rules, step by step, on each device:
the scale and the growth count after every update (growth after growth_interval good
steps, backoff on a bad one), gradients divided exactly, a skipped step leaving the
weights and the optimizer's state as they were, the refusals of a misordered step, the
state dict, and one host read per step."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.amp import GradScaler

# what each step's gradients hold: all finite, or one element inf / -inf / NaN
INJECTED = {"finite": None, "inf": np.inf, "-inf": -np.inf, "nan": np.nan}


def reference_updates(init_scale, growth_factor, backoff_factor, growth_interval, steps):
    """PyTorch's _amp_update_scale_ by hand: (scale, growth tracker, skipped) after each
    step of ``steps`` (names of INJECTED), in float32 as the device computes them."""
    scale, tracker, out = np.float32(init_scale), 0, []
    for kind in steps:
        bad = kind != "finite"
        if bad:
            scale, tracker = np.float32(scale * np.float32(backoff_factor)), 0
        elif tracker + 1 >= growth_interval:
            grown = np.float32(scale * np.float32(growth_factor))
            scale, tracker = (grown if np.isfinite(grown) else scale), 0
        else:
            tracker += 1
        out.append((float(scale), tracker, bad))
    return out


class TinyProblem:
    """A weight w (4,) whose loss is (w * x).sum(): its gradient is x, so a step's
    gradients are whatever x is made to hold."""

    def __init__(self, device, optimizer="adamw"):
        self.device = device
        self.w = mt.tensor([0.5, -1.0, 2.0, 0.25], device=device, requires_grad=True)
        self.b = mt.tensor([1.0, 3.0], device=device, requires_grad=True)
        params = [self.w, self.b]
        self.optimizer = (mt.optim.AdamW(params, lr=0.1) if optimizer == "adamw"
                          else mt.optim.SGD(params, lr=0.1, momentum=0.9))

    def gradient(self, kind):
        x = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
        if INJECTED[kind] is not None:
            x[2] = INJECTED[kind]
        return x

    def loss(self, kind):
        x = mt.tensor(self.gradient(kind), device=self.device)
        return (self.w * x).sum() + (self.b * self.b).sum()

    def weights(self):
        return [p.detach().cpu().numpy().copy() for p in (self.w, self.b)]


def optimizer_state(optimizer):
    """The optimizer's state dict with every array on the host, to compare."""
    state = copy.deepcopy(optimizer.state_dict())
    for entry in state["state"].values():
        for key, value in entry.items():
            if hasattr(value, "cpu"):
                entry[key] = value.cpu().numpy()
    return state


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for index in a["state"]:
        for key in a["state"][index]:
            np.testing.assert_array_equal(np.asarray(a["state"][index][key]),
                                          np.asarray(b["state"][index][key]))


SEQUENCES = {
    # growth_interval 3: grows after three good steps in a row, the count restarting
    "growth": ("finite",) * 7,
    "backoff then growth": ("inf", "finite", "finite", "finite", "finite"),
    "a bad step restarts the count": ("finite", "finite", "nan", "finite", "finite",
                                      "finite"),
    "every kind of bad value": ("-inf", "nan", "inf", "finite", "nan"),
}


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("name", SEQUENCES)
def test_the_scale_follows_pytorchs_rule_step_by_step(device, name, optimizer):
    steps = SEQUENCES[name]
    settings = dict(init_scale=8.0, growth_factor=2.0, backoff_factor=0.25, growth_interval=3)
    expected = reference_updates(**settings, steps=steps)
    problem = TinyProblem(device, optimizer)
    scaler = GradScaler(**settings)
    for i, (kind, (scale, tracker, skipped)) in enumerate(zip(steps, expected)):
        scale_before = scaler.get_scale()
        scaled = scaler.scale(problem.loss(kind))
        scaled.backward()
        # the gradients arrive scaled: x times the scale (exact, a power of two)
        if kind == "finite":
            np.testing.assert_array_equal(problem.w.grad.cpu().numpy(),
                                          problem.gradient(kind) * scale_before)
        scaler.unscale_(problem.optimizer)
        if kind == "finite":  # divided back exactly
            np.testing.assert_array_equal(problem.w.grad.cpu().numpy(), problem.gradient(kind))
        weights, state = problem.weights(), optimizer_state(problem.optimizer)
        result = scaler.step(problem.optimizer)
        assert result is None
        if skipped:  # the weights and the optimizer's state (moments, step count) kept
            for before, after in zip(weights, problem.weights()):
                np.testing.assert_array_equal(after, before)
            assert_same_state(optimizer_state(problem.optimizer), state)
        else:
            assert not np.array_equal(problem.weights()[0], weights[0]), f"step {i}"
        scaler.update()
        problem.optimizer.zero_grad()
        assert scaler.get_scale() == scale, f"step {i} ({kind})"
        assert scaler.state_dict()["_growth_tracker"] == tracker, f"step {i} ({kind})"
    assert scaler.skipped_steps == sum(skipped for _, _, skipped in expected)


def test_a_step_returns_what_the_optimizers_step_returns(device):
    problem = TinyProblem(device)

    class Returns:
        param_groups = problem.optimizer.param_groups

        def step(self):
            return "stepped"

    scaler = GradScaler()
    scaler.scale(problem.loss("finite")).backward()
    assert scaler.step(Returns()) == "stepped"  # unscale_ ran inside step
    scaler.update()


def test_growth_that_would_overflow_float32_keeps_the_scale(device):
    problem = TinyProblem(device)
    big = float(np.finfo(np.float32).max) / 1.5
    scaler = GradScaler(init_scale=big, growth_interval=1)
    problem.b.requires_grad_(False)
    problem.w.data[...] = 0.0  # w * x stays finite at this scale: (w * x) * scale = 0
    scaler.scale((problem.w * mt.tensor(np.zeros(4, np.float32), device=device)).sum()
                 ).backward()
    scaler.step(problem.optimizer)
    scaler.update()
    assert scaler.get_scale() == np.float32(big)
    assert scaler.state_dict()["_growth_tracker"] == 0


@pytest.mark.parametrize("new_scale", [1024.0, 3, "tensor"])
def test_update_with_a_new_scale_sets_it(device, new_scale):
    problem = TinyProblem(device)
    scaler = GradScaler(init_scale=16.0)
    scaler.scale(problem.loss("finite")).backward()
    scaler.step(problem.optimizer)
    if new_scale == "tensor":
        new_scale = mt.tensor([512.0], device=device)
    scaler.update(new_scale)
    expected = float(new_scale.item()) if isinstance(new_scale, mt.Tensor) else new_scale
    assert scaler.get_scale() == expected


def test_one_host_read_per_step(device):
    problem = TinyProblem(device)
    scaler = GradScaler()
    backend = mt.get_backend(device)
    scaler.scale(problem.loss("finite")).backward()  # the scale is made here, once
    scaler.step(problem.optimizer)
    scaler.update()
    problem.optimizer.zero_grad()
    for kind in ("finite", "inf", "finite"):
        with backend.count_host_reads() as reads, np.errstate(invalid="ignore"):
            scaler.scale(problem.loss(kind)).backward()
            scaler.unscale_(problem.optimizer)
            mt.optim.clip_grad_norm_([problem.w, problem.b], 1.0)
            scaler.step(problem.optimizer)
            scaler.update()
            problem.optimizer.zero_grad()
        assert reads.count == 1, kind  # the inf/NaN flag, nothing else


def _scaled_backward(scaler, problem):
    scaler.scale(problem.loss("finite")).backward()


MISORDERED = [
    ("unscale_ twice", lambda s, p: (_scaled_backward(s, p), s.unscale_(p.optimizer),
                                     s.unscale_(p.optimizer)),
     r"GradScaler.unscale_: already called on this optimizer since the last update\(\)"),
    ("unscale_ after step", lambda s, p: (_scaled_backward(s, p), s.step(p.optimizer),
                                          s.unscale_(p.optimizer)),
     r"GradScaler.unscale_: called after step\(\)"),
    ("step twice", lambda s, p: (_scaled_backward(s, p), s.step(p.optimizer),
                                 s.step(p.optimizer)),
     r"GradScaler.step: already called since the last update\(\)"),
    ("update before any check", lambda s, p: (_scaled_backward(s, p), s.update()),
     r"GradScaler.update: no inf/NaN check was recorded"),
    ("unscale_ before scale", lambda s, p: s.unscale_(p.optimizer),
     r"GradScaler.unscale_: the scale was never made"),
    ("a closure", lambda s, p: (_scaled_backward(s, p), s.step(p.optimizer, closure=print)),
     r"GradScaler.step: a closure is not supported"),
]


@pytest.mark.parametrize("name, calls, message", MISORDERED, ids=[m[0] for m in MISORDERED])
def test_a_misordered_step_is_refused(device, name, calls, message):
    problem = TinyProblem(device)
    with pytest.raises(RuntimeError, match=message):
        calls(GradScaler(), problem)


def test_after_update_the_next_step_may_unscale_again(device):
    problem = TinyProblem(device)
    scaler = GradScaler()
    for _ in range(2):
        _scaled_backward(scaler, problem)
        scaler.unscale_(problem.optimizer)
        scaler.step(problem.optimizer)
        scaler.update()
        problem.optimizer.zero_grad()
    assert scaler.state_dict()["_growth_tracker"] == 2


def test_narrow_gradients_are_refused_by_name(device):
    w = mt.tensor([1.0, 2.0], device=device, dtype=mt.float16, requires_grad=True)
    optimizer = mt.optim.SGD([w], lr=0.1)
    scaler = GradScaler(init_scale=1.0)
    scaler.scale((w * w).sum().float()).backward()
    with pytest.raises(ValueError, match=r"parameter 0 of group 0 \(shape \(2,\)\) has a "
                                         r"float16 gradient; expected float32 or float64"):
        scaler.unscale_(optimizer)


def test_state_dict_round_trip_continues_the_same_scales(device):
    settings = dict(init_scale=4.0, growth_factor=3.0, backoff_factor=0.5, growth_interval=2)
    steps = ("finite", "nan", "finite", "finite", "finite", "inf", "finite")
    expected = reference_updates(**settings, steps=steps)
    problem = TinyProblem(device)
    first = GradScaler(**settings)

    def run(scaler, kinds):
        scales = []
        for kind in kinds:
            scaler.scale(problem.loss(kind)).backward()
            scaler.step(problem.optimizer)
            scaler.update()
            problem.optimizer.zero_grad()
            scales.append(scaler.get_scale())
        return scales

    run(first, steps[:3])
    state = first.state_dict()
    assert state == {"scale": expected[2][0], "growth_factor": 3.0, "backoff_factor": 0.5,
                     "growth_interval": 2, "_growth_tracker": expected[2][1]}
    second = GradScaler()  # other settings: the state dict's win
    second.load_state_dict(state)
    assert second.get_scale() == expected[2][0]  # before any scale() was made
    assert run(second, steps[3:]) == [scale for scale, _, _ in expected[3:]]
    third = GradScaler(**settings)  # loaded after its scale was made on the device
    run(third, ["finite"])
    third.load_state_dict(state)
    assert third.state_dict() == state


def test_a_disabled_scaler_passes_everything_through(device):
    problem = TinyProblem(device)
    scaler = GradScaler(enabled=False)
    loss = problem.loss("finite")
    assert scaler.scale(loss) is loss and not scaler.is_enabled()
    loss.backward()
    weights = problem.weights()
    scaler.unscale_(problem.optimizer)
    np.testing.assert_array_equal(problem.w.grad.cpu().numpy(), problem.gradient("finite"))
    scaler.step(problem.optimizer)
    scaler.update()
    assert not np.array_equal(problem.weights()[0], weights[0])
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    scaler.load_state_dict({})  # nothing to load, nothing refused


def test_scale_takes_lists_and_tuples_of_losses(device):
    problem = TinyProblem(device)
    scaler = GradScaler(init_scale=4.0)
    a, b = problem.loss("finite"), problem.loss("finite")
    scaled = scaler.scale([a, (b,)])
    assert isinstance(scaled, list) and isinstance(scaled[1], tuple)
    assert scaled[0].item() == 4.0 * a.item() and scaled[1][0].item() == 4.0 * b.item()
    with pytest.raises(TypeError, match="GradScaler.scale: expected a Tensor or a list/tuple "
                                        "of Tensors, got float"):
        scaler.scale(1.0)


@pytest.mark.parametrize("settings, message", [
    (dict(init_scale=0.0), r"init_scale must be a finite number > 0.0, got 0.0"),
    (dict(init_scale=float("inf")), r"init_scale must be a finite number > 0.0, got inf"),
    (dict(growth_factor=1.0), r"growth_factor must be a finite number > 1.0, got 1.0"),
    (dict(backoff_factor=1.0), r"backoff_factor must be a finite number in \(0.0, 1.0\), "
                               r"got 1.0"),
    (dict(growth_interval=0), r"growth_interval must be a positive int, got 0"),
    (dict(growth_interval=2.5), r"growth_interval must be a positive int, got 2.5"),
])
def test_bad_settings_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        GradScaler(**settings)


@pytest.mark.parametrize("state, error, message", [
    ({}, RuntimeError, r"the state dict is empty, which a disabled GradScaler saves"),
    ({"scale": 2.0}, ValueError, r"missing \['growth_factor', 'backoff_factor', "
                                 r"'growth_interval', '_growth_tracker'\]"),
    ({"scale": -1.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1,
      "_growth_tracker": 0}, ValueError, r"scale must be a finite number > 0.0, got -1.0"),
])
def test_a_bad_state_dict_is_refused_by_name(state, error, message):
    with pytest.raises(error, match=message):
        GradScaler().load_state_dict(state)
