"""Work for a tensor runs on the tensor's GPU, whichever GPU is current.

CuPy allocates and launches kernels on the *current* device, not on the device of the
arrays it is handed: without ``backend.on_device()`` around them, ``--device cuda:1`` in
one process computes on GPU 0, or fails with "Peer access is unavailable". On the CPU the
mechanism is shown with a recording device context in place of a GPU's: every call of
the array module made by the factories, an op's forward and backward, gradient clipping
and the range checks must happen inside it.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu import optim
from minitorch_gpu.backend import get_backend

F = mt.functional


class _RecordingDevice:
    """The backend's own device context (a no-op on the CPU), counting how deep it is
    entered now."""

    def __init__(self, inner):
        self.inner, self.depth = inner, 0

    def __enter__(self):
        self.inner.__enter__()
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        return self.inner.__exit__(*exc)


class _WatchedArrayModule:
    """The backend's ``xp``, noting each function called while the device was not current."""

    def __init__(self, xp, device):
        self._xp, self._device, self.outside = xp, device, []

    def __getattr__(self, name):
        value = getattr(self._xp, name)
        if not callable(value) or isinstance(value, type) or inspect.ismodule(value):
            return value

        @functools.wraps(value)
        def watched(*args, **kwargs):
            if not self._device.depth:
                self.outside.append(name)
            return value(*args, **kwargs)
        return watched


@pytest.fixture
def watched(device, monkeypatch):
    """The device's backend with a recording device context and a watched ``xp``."""
    backend = get_backend(device)
    recorder = _RecordingDevice(backend.on_device())
    monkeypatch.setattr(backend, "_cuda_device", recorder)
    xp = _WatchedArrayModule(backend.xp, recorder)
    monkeypatch.setattr(backend, "xp", xp)
    return backend, xp


def _train_step(device):
    w = mt.randn(3, 4, device=device, requires_grad=True)
    loss = ((w * 2.0).exp() * mt.ones(3, 4, device=device)).sum()
    loss.backward()
    optim.clip_grad_norm_([w], 0.5)


WORK = [  # (name, work on a device), each only through paths that make the device current
    ("zeros", lambda d: mt.zeros(2, 3, device=d)),
    ("ones", lambda d: mt.ones(2, 3, device=d)),
    ("empty", lambda d: mt.empty(2, 3, device=d)),
    ("full", lambda d: mt.full((2, 3), 1.5, device=d)),
    ("arange", lambda d: mt.arange(5, device=d)),
    ("arange-int32", lambda d: mt.arange(5, dtype=mt.int32, device=d)),
    ("eye", lambda d: mt.eye(3, device=d)),
    ("linspace", lambda d: mt.linspace(0, 1, 5, device=d)),
    ("forward-backward-clip", _train_step),
    ("gather-range-check", lambda d: mt.gather(mt.ones(2, 3, device=d), 1,
                                               mt.tensor([[0, 2]], device=d))),
    ("index-tensor", lambda d: mt.ones(3, 2, device=d)[mt.tensor([0, -1], device=d)]),
    ("bool-mask", lambda d: mt.ones(3, device=d)[mt.tensor([True, False, True], device=d)]),
    ("one_hot", lambda d: F.one_hot(mt.tensor([0, 2], device=d), 3)),
    ("one_hot-inferred", lambda d: F.one_hot(mt.tensor([0, 2], device=d))),
    ("nonzero", lambda d: mt.nonzero(mt.tensor([[0, 1], [2, 0]], device=d))),
    ("repeat_interleave", lambda d: mt.repeat_interleave(mt.tensor([1, 2], device=d), 2)),
    ("repeat_interleave-counts",
     lambda d: mt.repeat_interleave(mt.tensor([1, 2], device=d), mt.tensor([2, 1], device=d))),
    ("scatter_reduce-amax",
     lambda d: mt.zeros(3, device=d).scatter_reduce(0, mt.tensor([0, 0, 2], device=d),
                                                    mt.ones(3, device=d), "amax")),
]


@pytest.mark.parametrize("name, work", WORK, ids=[name for name, _ in WORK])
def test_allocations_and_launches_happen_with_the_tensors_device_current(
        watched, device, name, work):
    backend, xp = watched
    work(device)
    backend.raise_deferred_errors()
    assert xp.outside == [], f"{name}: called outside backend.on_device(): {xp.outside}"


def test_on_device_is_a_reusable_no_op_on_the_cpu_and_makes_a_gpu_current(device):
    backend = get_backend(device)
    with backend.on_device():
        with backend.on_device():  # nests
            if device != "cpu":
                assert backend.xp.cuda.Device().id == backend.device.index
    assert backend.on_device() is backend.on_device()  # no object made per call


@pytest.mark.cuda
@pytest.mark.skipif(not mt.cuda.is_available() or mt.cuda.device_count() < 2,
                    reason="needs two GPUs (or the emulated machine's two)")
def test_work_on_the_second_gpu_stays_there_while_the_first_is_current():
    backend = get_backend("cuda:1")
    with backend.xp.cuda.Device(0):
        w = mt.randn(3, 4, device="cuda:1", requires_grad=True)
        loss = (w[mt.tensor([0, 2], device="cuda:1")] * mt.ones(4, device="cuda:1")).sum()
        loss.backward()
        total = optim.clip_grad_norm_([w], 0.5)
        assert w.grad.data.device.id == 1 and total.data.device.id == 1
        assert np.isfinite(total.item())
