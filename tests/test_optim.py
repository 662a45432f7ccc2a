"""minitorch_gpu.optim: each update against its formula computed by hand in NumPy float64,
the state dict, gradient clipping, the learning-rate schedules, and the documented errors.

The formula tests run on every device of the ``device`` fixture ("cuda" skipped without a
GPU), in float64 to 1e-12 and in float32 to 1e-6, for three steps with a new gradient each.
"""
from __future__ import annotations

import copy
import math
import pickle
import tracemalloc

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.optim as optim

SHAPES = [(3, 5), (7,)]  # a matrix and a vector of odd sizes
STEPS = 3
TOLERANCE = {"float64": 1e-12, "float32": 1e-6}


# --- references: the update formulas, by hand, in float64 ----------------------------------
def adamw_reference(param, grads, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    p = param.astype(np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        p = p * (1 - lr * weight_decay)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        bc1, bc2 = 1 - beta1 ** t, 1 - beta2 ** t
        p = p - (lr / bc1) * m / (np.sqrt(v) / np.sqrt(bc2) + eps)
    return p


def sgd_reference(param, grads, lr, momentum, dampening, weight_decay, nesterov):
    p = param.astype(np.float64)
    buf = None
    for g in grads:
        d = g + weight_decay * p
        if momentum != 0:
            buf = d.copy() if buf is None else momentum * buf + (1 - dampening) * d
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
    return p


def host(t: mt.Tensor) -> np.ndarray:
    return np.asarray(t.detach().cpu().data, dtype=np.float64)


def make_problem(dtype: str, device: str, seed: int = 0):
    """Parameters of SHAPES and, for each, STEPS gradients (rounded to ``dtype``)."""
    rng = np.random.default_rng(seed)
    np_dtype = np.dtype(dtype)
    starts = [rng.standard_normal(shape).astype(np_dtype) for shape in SHAPES]
    grads = [[rng.standard_normal(shape).astype(np_dtype) for _ in range(STEPS)]
             for shape in SHAPES]
    params = [mt.tensor(x, dtype=dtype, device=device, requires_grad=True) for x in starts]
    return params, starts, grads


def run_steps(opt, params, grads, dtype, device, steps=range(STEPS)):
    for step in steps:
        for p, gs in zip(params, grads):
            p.grad = mt.tensor(gs[step], dtype=dtype, device=device)
        opt.step()


# --- SGD and AdamW against the formulas ------------------------------------------------------
SGD_CASES = [
    pytest.param(dict(lr=0.1), id="plain"),
    pytest.param(dict(lr=0.1, weight_decay=0.05), id="weight-decay"),
    pytest.param(dict(lr=0.05, momentum=0.9), id="momentum"),
    pytest.param(dict(lr=0.05, momentum=0.9, dampening=0.3), id="dampening"),
    pytest.param(dict(lr=0.05, momentum=0.9, nesterov=True), id="nesterov"),
    pytest.param(dict(lr=0.05, momentum=0.8, dampening=0.1, weight_decay=0.02),
                 id="momentum-dampening-decay"),
    pytest.param(dict(lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True),
                 id="nesterov-decay"),
]

ADAMW_CASES = [
    pytest.param(dict(), id="defaults"),
    pytest.param(dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1), id="nanogpt"),
    pytest.param(dict(lr=0.02, betas=(0.5, 0.9), eps=1e-3, weight_decay=0.0), id="no-decay"),
    pytest.param(dict(lr=0.1, betas=(0.0, 0.0), weight_decay=0.5), id="zero-betas"),
]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("settings", SGD_CASES)
def test_sgd_matches_formula(settings, dtype, device):
    params, starts, grads = make_problem(dtype, device)
    run_steps(optim.SGD(params, **settings), params, grads, dtype, device)
    full = {**dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False), **settings}
    for p, start, gs in zip(params, starts, grads):
        np.testing.assert_allclose(host(p), sgd_reference(start, gs, **full),
                                   rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("settings", ADAMW_CASES)
def test_adamw_matches_formula(settings, dtype, device):
    params, starts, grads = make_problem(dtype, device)
    opt = optim.AdamW(params, **settings)
    run_steps(opt, params, grads, dtype, device)
    full = {**dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2), **settings}
    for p, start, gs in zip(params, starts, grads):
        np.testing.assert_allclose(host(p), adamw_reference(start, gs, **full),
                                   rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
        state = opt.state[p]
        assert state["step"] == STEPS and isinstance(state["step"], int)
        for key in ("exp_avg", "exp_avg_sq"):
            assert isinstance(state[key], mt.Tensor)
            assert state[key].shape == p.shape and state[key].dtype == p.dtype
            assert state[key].device == p.device


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_two_param_groups_use_their_own_settings(name, device):
    params, starts, grads = make_problem("float64", device)
    groups = [{"params": [params[0]], "lr": 0.1, "weight_decay": 0.1},
              {"params": [params[1]], "weight_decay": 0.0}]
    if name == "SGD":
        opt = optim.SGD(groups, lr=0.01, momentum=0.9)
        settings = [dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.1, nesterov=False),
                    dict(lr=0.01, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False)]
        reference = sgd_reference
    else:
        opt = optim.AdamW(groups, lr=0.01, betas=(0.9, 0.95))
        settings = [dict(lr=0.1, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
                    dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)]
        reference = adamw_reference
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01]
    run_steps(opt, params, grads, "float64", device)
    for p, start, gs, kwargs in zip(params, starts, grads, settings):
        np.testing.assert_allclose(host(p), reference(start, gs, **kwargs), rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: optim.AdamW(ps, lr=0.1)], ids=["SGD", "AdamW"])
def test_step_updates_in_place_and_bumps_the_version(make):
    params, _, grads = make_problem("float32", "cpu")
    arrays = [p.data for p in params]
    opt = make(params)
    y = params[0] * params[0]  # saves params[0] for backward
    run_steps(opt, params, grads, "float32", "cpu", steps=[0])
    assert all(p.data is array for p, array in zip(params, arrays))
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.sum().backward()


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.1),
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.5, weight_decay=0.1),
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
    lambda ps: optim.AdamW(ps, lr=0.1),
], ids=["SGD", "SGD-dampening-decay", "SGD-nesterov-decay", "AdamW"])
def test_step_allocates_no_parameter_sized_temporaries(make):
    p = mt.tensor(np.ones((250, 400)), dtype=mt.float64, requires_grad=True)  # 800 kB
    p.grad = mt.tensor(np.full((250, 400), 0.5), dtype=mt.float64)
    opt = make([p])
    opt.step()  # the first step makes the state and the scratch buffer
    tracemalloc.start()
    try:
        opt.step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < p.nbytes // 4, f"a step allocated {peak} bytes; the parameter is {p.nbytes}"


def test_adamw_keeps_float32_state_for_bfloat16_params():
    rng = np.random.default_rng(1)
    start = rng.standard_normal((4, 6)).astype(mt.bfloat16)
    grads = [rng.standard_normal((4, 6)).astype(mt.bfloat16) for _ in range(STEPS)]
    p = mt.tensor(start, dtype=mt.bfloat16, requires_grad=True)
    opt = optim.AdamW([p], lr=0.01, weight_decay=0.0)
    for g in grads:
        p.grad = mt.tensor(g, dtype=mt.bfloat16)
        opt.step()
    assert p.dtype == mt.bfloat16
    assert opt.state[p]["exp_avg"].dtype == mt.float32
    assert opt.state[p]["exp_avg_sq"].dtype == mt.float32
    expected = adamw_reference(start.astype(np.float64),
                               [g.astype(np.float64) for g in grads], lr=0.01,
                               betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    np.testing.assert_allclose(host(p), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: optim.AdamW(ps, lr=0.1)], ids=["SGD", "AdamW"])
def test_param_without_grad_is_left_alone(make):
    params, starts, grads = make_problem("float64", "cpu")
    opt = make(params)
    params[0].grad = mt.tensor(grads[0][0], dtype=mt.float64)  # params[1].grad stays None
    opt.step()
    np.testing.assert_array_equal(host(params[1]), starts[1])
    assert params[1] not in opt.state
    assert not np.array_equal(host(params[0]), starts[0])


def test_zero_grad_sets_none_or_zeros():
    params, _, grads = make_problem("float64", "cpu")
    opt = optim.SGD(params, lr=0.1)
    for p, gs in zip(params, grads):
        p.grad = mt.tensor(gs[0], dtype=mt.float64)
    grad_arrays = [p.grad.data for p in params]
    opt.zero_grad(set_to_none=False)
    for p, array in zip(params, grad_arrays):
        assert p.grad.data is array and not host(p.grad).any()
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_step_with_closure_returns_the_loss():
    p = mt.tensor(np.array([1.0, -2.0]), dtype=mt.float64, requires_grad=True)
    opt = optim.SGD([p], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() == 5.0
    np.testing.assert_allclose(host(p), [0.5, -1.0])  # p - 0.25 * 2p


def test_grad_of_the_wrong_shape_is_an_error():
    p = mt.tensor(np.ones(3), dtype=mt.float64, requires_grad=True)
    p.grad = mt.tensor(np.ones((3, 3)), dtype=mt.float64)
    with pytest.raises(RuntimeError, match=r"AdamW.step: a parameter of shape \(3,\) has a "
                                           r"grad of shape \(3, 3\)"):
        optim.AdamW([p]).step()


# --- state dict ----------------------------------------------------------------------------
def clones(params):
    return [mt.tensor(host(p), dtype=p.dtype, requires_grad=True) for p in params]


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD([{"params": ps[:1], "lr": 0.2}, {"params": ps[1:]}], lr=0.1,
                         momentum=0.9, dampening=0.1),
    lambda ps: optim.AdamW([{"params": ps[:1], "weight_decay": 0.1},
                            {"params": ps[1:], "weight_decay": 0.0}], lr=0.05),
], ids=["SGD", "AdamW"])
@pytest.mark.parametrize("via_pickle", [False, True], ids=["dict", "pickled"])
def test_state_dict_round_trip_continues_exactly(make, via_pickle):
    params, _, grads = make_problem("float64", "cpu")
    grads = [gs + gs[:1] for gs in grads]  # 4 steps: 2 before saving, 2 after
    original = make(params)
    run_steps(original, params, grads, "float64", "cpu", steps=[0, 1])
    saved = original.state_dict()
    assert sorted(saved) == ["param_groups", "state"]
    assert [g["params"] for g in saved["param_groups"]] == [[0], [1]]
    # the tensors in a state dict are the optimizer's own (as torch's): load from a copy
    saved = pickle.loads(pickle.dumps(saved)) if via_pickle else copy.deepcopy(saved)

    restored_params = clones(params)
    restored = make(restored_params)
    restored.load_state_dict(saved)
    for key in saved["state"][0]:  # the loaded state is a copy, not the given arrays
        value = saved["state"][0][key]
        if isinstance(value, mt.Tensor):
            assert restored.state[restored_params[0]][key].data is not value.data
            value.data[...] = 1e9  # spoiling the dict must not reach the optimizer
    run_steps(original, params, grads, "float64", "cpu", steps=[2, 3])
    run_steps(restored, restored_params, grads, "float64", "cpu", steps=[2, 3])
    for p, q in zip(params, restored_params):
        np.testing.assert_array_equal(host(p), host(q))
    assert [g["lr"] for g in restored.param_groups] == [g["lr"] for g in original.param_groups]


def test_load_state_dict_casts_state_to_the_parameter_dtype():
    params, _, grads = make_problem("float64", "cpu")
    opt = optim.AdamW(params)
    run_steps(opt, params, grads, "float64", "cpu", steps=[0])
    params32 = [mt.tensor(host(p), dtype=mt.float32, requires_grad=True) for p in params]
    opt32 = optim.AdamW(params32)
    opt32.load_state_dict(opt.state_dict())
    assert opt32.state[params32[0]]["exp_avg"].dtype == mt.float32
    assert opt32.state[params32[0]]["step"] == 1


def _saved_adamw():
    params, _, grads = make_problem("float64", "cpu")
    opt = optim.AdamW(params)
    run_steps(opt, params, grads, "float64", "cpu", steps=[0])
    return opt.state_dict()


def _bad_shape(sd):
    sd["state"][1]["exp_avg"] = mt.zeros(8, dtype=mt.float64)
    return sd


def _sgd_state(sd):  # momentum state where AdamW's belongs
    sd["state"][0] = {"momentum_buffer": sd["state"][0]["exp_avg"]}
    return sd


@pytest.mark.parametrize("make_target, spoil, message", [
    (lambda ps: optim.AdamW([{"params": ps[:1]}, {"params": ps[1:]}]), lambda sd: sd,
     r"expected 2 parameter groups \(the optimizer's\), got 1 in the state dict"),
    (lambda ps: optim.AdamW(ps[:1]), lambda sd: sd,
     r"parameter group 0: expected 1 parameters \(the optimizer's\), got 2 in the state dict"),
    (lambda ps: optim.AdamW(ps), _bad_shape,
     r"state 'exp_avg' of parameter 1: expected shape \(7,\) \(the parameter's\), got \(8,\)"),
    (lambda ps: optim.AdamW(ps), lambda sd: {"state": sd["state"]},
     r"expected a dict with keys \['param_groups', 'state'\]"),
    (lambda ps: optim.AdamW(ps), _sgd_state,
     r"the state of parameter 0 must have the keys \['exp_avg', 'exp_avg_sq', 'step'\] "
     r"\(AdamW's\), got \['momentum_buffer'\]"),
], ids=["group-count", "group-size", "state-shape", "keys", "state-keys"])
def test_load_state_dict_rejects_a_mismatch(make_target, spoil, message):
    params, _, _ = make_problem("float64", "cpu")
    target = make_target(params)
    with pytest.raises(ValueError, match="AdamW.load_state_dict: " + message):
        target.load_state_dict(spoil(_saved_adamw()))
    assert target.state == {}  # a rejected dict changes nothing


def test_frozen_parameters_are_accepted_and_left_alone():
    frozen = mt.tensor(np.ones(3), dtype=mt.float64)  # requires_grad=False, as PyTorch allows
    trained = _param()
    opt = optim.AdamW([frozen, trained], lr=0.1)
    trained.grad = mt.ones(3, dtype=mt.float64)
    opt.step()
    np.testing.assert_array_equal(host(frozen), np.ones(3))
    assert not np.array_equal(host(trained), np.ones(3))


# --- errors --------------------------------------------------------------------------------
def _param():
    return mt.tensor(np.ones(3), dtype=mt.float64, requires_grad=True)


def _add_existing_param():
    p = _param()
    optim.SGD([p]).add_param_group({"params": [p], "lr": 0.5})


@pytest.mark.parametrize("call, error, message", [
    (lambda: optim.SGD([_param()], lr=-0.1), ValueError,
     r"SGD: invalid lr: expected 0.0 <= lr, got -0.1"),
    (lambda: optim.AdamW([_param()], lr="0.1"), TypeError,
     r"AdamW: lr must be a real number, got str '0.1'"),
    (lambda: optim.SGD([_param()], momentum=-0.5), ValueError,
     r"SGD: invalid momentum: expected 0.0 <= momentum, got -0.5"),
    (lambda: optim.SGD([_param()], weight_decay=-1e-4), ValueError,
     r"SGD: invalid weight_decay: expected 0.0 <= weight_decay, got -0.0001"),
    (lambda: optim.SGD([_param()], nesterov=True), ValueError,
     r"SGD: nesterov=True expects momentum > 0 and dampening = 0, got momentum=0.0"),
    (lambda: optim.SGD([_param()], momentum=0.9, dampening=0.1, nesterov=True), ValueError,
     r"nesterov=True expects momentum > 0 and dampening = 0, got momentum=0.9, dampening=0.1"),
    (lambda: optim.AdamW([_param()], betas=(1.0, 0.999)), ValueError,
     r"AdamW: invalid betas\[0\]: expected 0.0 <= betas\[0\] < 1.0, got 1.0"),
    (lambda: optim.AdamW([_param()], betas=(0.9, -0.1)), ValueError,
     r"AdamW: invalid betas\[1\]: expected 0.0 <= betas\[1\] < 1.0, got -0.1"),
    (lambda: optim.AdamW([_param()], betas=0.9), TypeError,
     r"AdamW: betas must be a pair \(beta1, beta2\), got 0.9"),
    (lambda: optim.AdamW([_param()], eps=-1e-8), ValueError,
     r"AdamW: invalid eps: expected 0.0 <= eps, got -1e-08"),
    (lambda: optim.AdamW([_param()], weight_decay=-0.1), ValueError,
     r"AdamW: invalid weight_decay: expected 0.0 <= weight_decay, got -0.1"),
    (lambda: optim.AdamW([{"params": [_param()], "weight_decay": -1.0}]), ValueError,
     r"AdamW: parameter group 0: invalid weight_decay: expected 0.0 <= weight_decay, got -1.0"),
    (lambda: optim.AdamW(_param()), TypeError,
     r"AdamW: params must be an iterable of Tensors or of dicts .* got a single Tensor"),
    (lambda: optim.AdamW([]), ValueError, r"AdamW: got an empty parameter list"),
    (lambda: optim.AdamW([_param(), 1.0]), TypeError,
     r"AdamW: parameter group 0: parameter 1 is a float; expected a Tensor"),
    (lambda: optim.AdamW([_param() * 2]), ValueError,
     r"parameter 0 \(shape \(3,\)\) is not a leaf"),
    (lambda: (lambda p: optim.AdamW([p, p]))(_param()), ValueError,
     r"parameter group 0: parameter 1 \(shape \(3,\)\) was already given as parameter 0 of "
     r"group 0; each parameter may appear only once"),
    (_add_existing_param, ValueError,
     r"SGD: parameter group 1: parameter 0 \(shape \(3,\)\) was already given as parameter 0 "
     r"of group 0"),
    (lambda: optim.SGD([{"lr": 0.1}]), ValueError,
     r"SGD: parameter group 0: expected a 'params' key, got keys \['lr'\]"),
    (lambda: optim.clip_grad_norm_([_param()], -1.0), ValueError,
     r"clip_grad_norm_: invalid max_norm: expected 0.0 <= max_norm, got -1.0"),
    (lambda: optim.clip_grad_norm_([_param()], 1.0, norm_type=0), ValueError,
     r"clip_grad_norm_: invalid norm_type: expected a positive number or inf, got 0.0"),
    (lambda: optim.cosine_lr(0, 1.0, 0.1, warmup_iters=10, lr_decay_iters=5), ValueError,
     r"cosine_lr: expected warmup_iters <= lr_decay_iters, got warmup_iters=10, "
     r"lr_decay_iters=5"),
    (lambda: optim.cosine_lr(-1, 1.0, 0.1, 10, 100), ValueError,
     r"cosine_lr: invalid it: expected it >= 0, got -1"),
    (lambda: optim.cosine_lr(1.5, 1.0, 0.1, 10, 100), TypeError,
     r"cosine_lr: it must be an int, got float 1.5"),
    (lambda: optim.cosine_lr(0, 1.0, -0.1, 10, 100), ValueError,
     r"cosine_lr: invalid min_lr: expected 0.0 <= min_lr, got -0.1"),
    (lambda: optim.constant_lr(0, -1.0), ValueError,
     r"constant_lr: invalid lr: expected 0.0 <= lr, got -1.0"),
    (lambda: optim.WarmupCosineLR(optim.SGD([_param()]), 10, 5, 0.0), ValueError,
     r"WarmupCosineLR: expected warmup_iters <= lr_decay_iters"),
    (lambda: optim.WarmupCosineLR([_param()], 1, 5, 0.0), TypeError,
     r"WarmupCosineLR: expected an optimizer \(with param_groups\), got list"),
    (lambda: optim.weight_decay_groups([("w", 1.0)], 0.1), TypeError,
     r"weight_decay_groups: expected a module or \(name, Tensor\) pairs, got an item of "
     r"type tuple"),
], ids=lambda v: None if callable(v) or isinstance(v, type) else v[:40])
def test_bad_arguments_raise_the_documented_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --- clip_grad_norm_ -----------------------------------------------------------------------
def _params_with_grads(grads, dtype=mt.float64, device="cpu"):
    params = []
    for g in grads:
        p = mt.zeros(*np.shape(g), dtype=dtype, device=device, requires_grad=True)
        p.grad = mt.tensor(g, dtype=dtype, device=device)
        params.append(p)
    return params


CLIP_GRADS = [np.array([[3.0, -4.0], [1.0, 2.0]]), np.array([-12.0, 0.5, 6.0])]


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [1.0, 1e6], ids=["clips", "leaves"])
def test_clip_grad_norm_returns_the_norm_and_clips_above_max(norm_type, max_norm, device):
    params = _params_with_grads(CLIP_GRADS, device=device)
    flat = np.concatenate([g.ravel() for g in CLIP_GRADS])
    expected = np.linalg.norm(flat, ord=norm_type) if norm_type != 3.0 else \
        np.sum(np.abs(flat) ** 3) ** (1 / 3)

    total = optim.clip_grad_norm_(params, max_norm, norm_type=norm_type)

    assert total.shape == () and total.dtype == mt.float32 and total.device == device
    np.testing.assert_allclose(total.item(), expected, rtol=1e-6)
    scale = max_norm / (expected + 1e-6) if expected > max_norm else 1.0
    for p, g in zip(params, CLIP_GRADS):
        np.testing.assert_allclose(host(p.grad), g * scale, rtol=1e-12)


def test_clip_grad_norm_skips_missing_grads_and_handles_none_at_all():
    params = _params_with_grads(CLIP_GRADS) + [_param()]  # the last has no grad
    np.testing.assert_allclose(optim.clip_grad_norm_(params, 1e6).item(), 14.5, rtol=1e-6)
    total = optim.clip_grad_norm_([_param(), _param()], 1.0)
    assert total.item() == 0.0 and total.dtype == mt.float32
    assert optim.clip_grad_norm_([], 1.0).item() == 0.0


def test_clip_grad_norm_of_a_single_tensor_and_of_float16_grads():
    # 300^2 overflows float16; the squares are summed in float32
    p, = _params_with_grads([np.full(4, 300.0)], dtype=mt.float16)
    total = optim.clip_grad_norm_(p, 60.0)
    np.testing.assert_allclose(total.item(), 600.0, rtol=1e-6)
    np.testing.assert_allclose(host(p.grad), np.full(4, 30.0), rtol=1e-3)


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply")  # inf * 0
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_clip_grad_norm_nonfinite(bad):
    params = _params_with_grads([np.array([1.0, bad])])
    with pytest.raises(RuntimeError, match=r"clip_grad_norm_: the total norm of order 2.0 of "
                                           r"the gradients is (nan|inf)"):
        optim.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    total = optim.clip_grad_norm_(params, 1.0)  # as torch: no error, the grads turn nan
    assert not math.isfinite(total.item())
    assert np.isnan(host(params[0].grad)).any()


# --- learning-rate schedules ---------------------------------------------------------------
LR, MIN_LR, WARMUP, DECAY = 6e-4, 6e-5, 10, 110


@pytest.mark.parametrize("it, expected", [
    (0, LR * 1 / 11),
    (WARMUP - 1, LR * 10 / 11),
    (WARMUP, LR),                                          # the peak: decay ratio 0
    (60, MIN_LR + 0.5 * (LR - MIN_LR)),                    # halfway: cos(pi / 2) = 0
    (35, MIN_LR + 0.5 * (1 + math.cos(math.pi / 4)) * (LR - MIN_LR)),
    (DECAY, MIN_LR),                                       # decay ratio 1
    (DECAY + 1, MIN_LR),
    (10 ** 6, MIN_LR),
])
def test_cosine_lr_is_nanogpts_get_lr(it, expected):
    assert math.isclose(optim.cosine_lr(it, LR, MIN_LR, WARMUP, DECAY), expected,
                        rel_tol=1e-12)


def test_cosine_lr_without_warmup_or_decay_length():
    assert optim.cosine_lr(0, LR, MIN_LR, 0, 100) == LR
    assert optim.cosine_lr(5, LR, MIN_LR, 5, 5) == LR  # a decay of no length
    assert optim.cosine_lr(6, LR, MIN_LR, 5, 5) == MIN_LR
    assert optim.constant_lr(123, LR) == LR


def _two_group_optimizer():
    a, b = _param(), _param()
    return optim.AdamW([{"params": [a]}, {"params": [b], "lr": 0.1, "min_lr": 0.0}], lr=1.0)


def test_warmup_cosine_lr_sets_each_group_step_by_step():
    opt = _two_group_optimizer()
    scheduler = optim.WarmupCosineLR(opt, warmup_iters=3, lr_decay_iters=8, min_lr=0.01)
    assert [g["initial_lr"] for g in opt.param_groups] == [1.0, 0.1]
    for it in range(12):
        expected = [optim.cosine_lr(it, 1.0, 0.01, 3, 8), optim.cosine_lr(it, 0.1, 0.0, 3, 8)]
        assert scheduler.last_iter == it
        assert scheduler.get_last_lr() == expected
        assert [g["lr"] for g in opt.param_groups] == expected
        scheduler.step()
    assert scheduler.get_last_lr() == [0.01, 0.0]


def test_scheduler_state_dict_round_trip():
    opt = _two_group_optimizer()
    scheduler = optim.WarmupCosineLR(opt, warmup_iters=3, lr_decay_iters=8, min_lr=0.01)
    for _ in range(5):
        scheduler.step()
    saved = copy.deepcopy(scheduler.state_dict())
    assert saved == {"last_iter": 5, "warmup_iters": 3, "lr_decay_iters": 8, "min_lr": 0.01}

    fresh_opt = _two_group_optimizer()
    fresh = optim.WarmupCosineLR(fresh_opt, warmup_iters=1, lr_decay_iters=2, min_lr=0.5)
    fresh.load_state_dict(saved)
    assert fresh.last_iter == 5 and fresh.get_last_lr() == scheduler.get_last_lr()
    assert [g["lr"] for g in fresh_opt.param_groups] == scheduler.get_last_lr()
    scheduler.step()
    fresh.step()
    assert fresh.get_last_lr() == scheduler.get_last_lr()

    with pytest.raises(ValueError, match=r"unknown key 'min_lrr'.*did you mean 'min_lr'\?"):
        fresh.load_state_dict({**saved, "min_lrr": 0.0})
    with pytest.raises(ValueError, match=r"missing keys \['warmup_iters'\]"):
        fresh.load_state_dict({k: v for k, v in saved.items() if k != "warmup_iters"})


def test_constant_lr_restores_the_initial_lr():
    opt = _two_group_optimizer()
    scheduler = optim.ConstantLR(opt, factor=1.0)
    opt.param_groups[0]["lr"] = 123.0
    scheduler.step()
    assert scheduler.last_iter == 1 and scheduler.get_last_lr() == [1.0, 0.1]
    assert scheduler.state_dict() == {"last_iter": 1, "factor": 1.0, "total_iters": 5}


def test_constant_lr_scales_the_first_iterations_as_pytorch():
    opt = _two_group_optimizer()
    scheduler = optim.ConstantLR(opt)  # PyTorch's defaults: factor 1/3 for 5 iterations
    rates = [scheduler.get_last_lr()]
    for _ in range(6):
        scheduler.step()
        rates.append(scheduler.get_last_lr())
    assert rates[:5] == [[1.0 / 3, 0.1 / 3]] * 5 and rates[5:] == [[1.0, 0.1]] * 2
    with pytest.raises(ValueError, match="ConstantLR: invalid factor: expected 0 <= factor <= 1"):
        optim.ConstantLR(opt, factor=2.0)


# --- nanoGPT's parameter groups ------------------------------------------------------------
class TinyModel:
    """Duck-typed module: named_parameters() lists the tied embedding under two names."""

    def __init__(self):
        self.wte = mt.randn(11, 4, requires_grad=True)
        self.ln_gain = mt.ones(4, requires_grad=True)
        self.fc = mt.randn(4, 4, requires_grad=True)
        self.bias = mt.zeros(4, requires_grad=True)
        self.frozen = mt.randn(4, 4)  # does not require grad

    def named_parameters(self):
        return iter([("wte.weight", self.wte), ("ln.weight", self.ln_gain),
                     ("fc.weight", self.fc), ("fc.bias", self.bias),
                     ("lm_head.weight", self.wte), ("frozen", self.frozen)])


def test_weight_decay_groups_split_by_dim_and_dedupe_tied_params():
    model = TinyModel()
    decay, no_decay = optim.weight_decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [id(p) for p in decay["params"]] == [id(model.wte), id(model.fc)]
    assert [id(p) for p in no_decay["params"]] == [id(model.ln_gain), id(model.bias)]
    pairs = list(model.named_parameters())  # (name, tensor) pairs work as well
    assert len(optim.weight_decay_groups(pairs, 0.1)) == 2
    only_biases = optim.weight_decay_groups([("b", model.bias)], 0.1)
    assert len(only_biases) == 1 and only_biases[0]["weight_decay"] == 0.0


def test_configure_adamw_builds_nanogpts_optimizer():
    model = TinyModel()
    opt = optim.configure_adamw(model, weight_decay=0.1, lr=6e-4, betas=(0.9, 0.95))
    assert isinstance(opt, optim.AdamW)
    assert [(len(g["params"]), g["weight_decay"]) for g in opt.param_groups] == \
        [(2, 0.1), (2, 0.0)]
    assert all(g["lr"] == 6e-4 and g["betas"] == (0.9, 0.95) and g["eps"] == 1e-8
               for g in opt.param_groups)


# --- AdamW over flat arrays (optim/flat.py) ---------------------------------------------------
@pytest.mark.parametrize("split_from", [1 << 30, 1], ids=["one-piece", "split-over-threads"])
def test_adamw_flat_group_matches_the_formula(monkeypatch, split_from):
    """A group whose parameters all have grads runs as one flat chain (split over the
    cores when long): the same numbers as the formula, parameters keep their storage, and
    the state tensors are views of the group's flat moments."""
    from minitorch_gpu.optim import adamw
    monkeypatch.setattr(adamw, "SPLIT_FROM", split_from)
    params, starts, grads = make_problem("float64", "cpu")
    arrays = [p.data for p in params]
    opt = optim.AdamW(params, lr=0.05, betas=(0.9, 0.95), weight_decay=0.1)
    run_steps(opt, params, grads, "float64", "cpu")
    assert opt._flat and all(p.data is a for p, a in zip(params, arrays))
    flat = opt._flat[0]
    assert all(np.shares_memory(opt.state[p]["exp_avg"].data, flat.exp_avg) for p in params)
    for p, start, gs in zip(params, starts, grads):
        np.testing.assert_allclose(host(p), adamw_reference(start, gs, 0.05, (0.9, 0.95), 1e-8,
                                                            0.1), rtol=1e-12, atol=1e-12)


def test_adamw_flat_group_survives_load_state_dict_and_a_missing_grad():
    """Replacing the state (load_state_dict) lays the flat arrays out again from it; a step
    where one parameter has no grad updates the others one by one. Either way the result
    equals an optimizer that was never interrupted, to the last bit."""
    params_a, starts, grads = make_problem("float64", "cpu")
    params_b = [mt.tensor(x, requires_grad=True) for x in starts]
    opt_a = optim.AdamW(params_a, lr=0.05)
    opt_b = optim.AdamW(params_b, lr=0.05)
    run_steps(opt_a, params_a, grads, "float64", "cpu", steps=[0])
    run_steps(opt_b, params_b, grads, "float64", "cpu", steps=[0])
    opt_b.load_state_dict(copy.deepcopy(opt_b.state_dict()))  # new state tensors
    for opt, params in ((opt_a, params_a), (opt_b, params_b)):
        run_steps(opt, params, grads, "float64", "cpu", steps=[1])
        params[0].grad = None  # only the others move at this step
        for p, gs in zip(params[1:], grads[1:]):
            p.grad = mt.tensor(gs[2])
        opt.step()
    for a, b in zip(params_a, params_b):
        np.testing.assert_array_equal(host(a), host(b))
    expected_first = adamw_reference(starts[0], grads[0][:2], 0.05, (0.9, 0.999), 1e-8, 1e-2)
    np.testing.assert_allclose(host(params_b[0]), expected_first, rtol=1e-12, atol=1e-12)
