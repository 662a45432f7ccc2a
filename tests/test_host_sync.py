"""A training step reads nothing back from the device between log points.

Every value Python reads from a backend goes through ``Backend.to_numpy``, which counts it
in ``backend.host_reads``, on the CPU as on a GPU. On the CPU a read costs nothing, so the
backend takes two shortcuts there (a value check at once, no clipping multiply by 1); with
``reads_are_free`` switched off the CPU backend takes the GPU's branches instead, and
these tests then show on any machine that the GPU's path has no read where it would wait.
"""
from __future__ import annotations

import contextlib
import math
import traceback
import warnings

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu import optim
from minitorch_gpu.backend import get_backend
from minitorch_gpu.backend.transfers import DeferredChecks
from minitorch_gpu.train.config import load_config
from minitorch_gpu.data import BatchSampler
from minitorch_gpu.train.trainer import Trainer, TrainingDiverged
from conftest import corpus_text

F = mt.functional

CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: 0.1}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, grad_accum_steps: 2, max_iters: 11, warmup_iters: 2, lr: 3.0e-3,
        log_interval: 3, grad_clip: 0.5}}
eval: {{interval: 4, iters: 2}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7, device: {device}}}
"""


def _cpu_backend(monkeypatch, reads_are_free):
    """The CPU backend, with its free reads on or off and checks of its own: a check a
    test leaves pending goes with it, not on to the next test."""
    backend = get_backend("cpu")
    monkeypatch.setattr(backend, "reads_are_free", reads_are_free)
    monkeypatch.setattr(backend, "_deferred_checks", DeferredChecks())
    return backend


@pytest.fixture(params=[True, False], ids=["cpu-as-is", "cpu-as-a-gpu"])
def cpu(request, monkeypatch):
    """The CPU backend as it is, and as a GPU behaves: no free reads, so value checks are
    deferred and clipping always multiplies."""
    return _cpu_backend(monkeypatch, request.param)


@pytest.fixture
def gpu_like(monkeypatch):
    """The CPU backend taking the GPU's branches."""
    return _cpu_backend(monkeypatch, False)


# --- the counter ----------------------------------------------------------------------------
@pytest.mark.parametrize("read", [
    lambda t: t.item(), lambda t: t.tolist(), lambda t: float(t), lambda t: int(t),
    lambda t: bool(t), lambda t: repr(t), lambda t: np.asarray(t),
    lambda t: t._backend.to_numpy(t.data), lambda t: f"{t.item():.2f}",
])
def test_every_way_of_reading_a_value_is_one_counted_host_read(read, device):
    t = mt.tensor(1.5, device=device) if device == "cpu" else mt.tensor(1.5).to(device)
    backend = get_backend(device)
    with backend.count_host_reads() as reads:
        read(t)
    assert reads.count == 1


def test_arithmetic_reads_nothing_and_moving_to_the_cpu_reads_once(device):
    backend = get_backend(device)
    x = mt.randn(4, 3, device=device, requires_grad=True)
    with backend.count_host_reads() as reads:
        loss = ((x * 2).sum(dim=1) ** 2).mean()
        loss.backward()
        assert reads.count == 0
        x.grad.to("cpu")
    assert reads.count == (1 if device != "cpu" else 0)


# --- deferred range checks ------------------------------------------------------------------
def test_an_embedding_index_out_of_range_is_raised_at_once_on_the_cpu_uncounted():
    backend = get_backend("cpu")
    weight = mt.randn(5, 3)
    with backend.count_host_reads() as reads:
        F.embedding(mt.tensor([0, 4]), weight)
        with pytest.raises(ValueError, match=r"^embedding: index 5 is out of range for 5 "
                                             r"embeddings \(expected 0 <= index < 5\)$"):
            F.embedding(mt.tensor([0, 5]), weight)
    assert reads.count == 0  # a GPU defers this check: it is not a read there


# (NumPy's own indexing refuses indices past the end where CuPy's wraps them, so on the
# CPU playing a GPU the ops get negative bad ids, which NumPy takes as Python does)
def test_a_deferred_embedding_check_raises_at_the_next_read_naming_op_range_and_value(
        gpu_like):
    weight = mt.randn(5, 3, requires_grad=True)
    with gpu_like.count_host_reads() as reads:
        out = F.embedding(mt.tensor([[0, -2], [1, 2]]), weight)  # no error yet
        out.sum().backward()
        F.embedding(mt.tensor([3]), weight)
        assert reads.count == 0
        with pytest.raises(ValueError, match=r"^embedding: index -2 is out of range for 5 "
                                             r"embeddings \(expected 0 <= index < 5\) "
                                             r"\[checked on cpu without waiting"):
            mt.tensor(2.0).item()  # any read brings the pending checks back with it
    assert reads.count == 1
    mt.tensor(2.0).item()  # reported once, then forgotten
    gpu_like.raise_deferred_errors()


def test_deferred_checks_accumulate_over_calls_and_report_the_extreme_value(gpu_like):
    ids = mt.tensor([0, 9, 2, 3])
    for values in ([0, 9], [2, 3], [1, 12], [4]):
        gpu_like.check_in_range(mt.tensor(values).data, 5, "embedding: index", "is bad")
    gpu_like.check_in_range(ids.data, 10, "other: id", "is bad")  # in range: no error
    with gpu_like.count_host_reads() as reads:
        with pytest.raises(ValueError, match=r"^embedding: index 12 is bad \[checked"):
            gpu_like.raise_deferred_errors()  # the max over every call
        gpu_like.raise_deferred_errors()  # nothing pending: no read
    assert reads.count == 1
    for values in ([3, 9], [-1, 2]):
        gpu_like.check_in_range(mt.tensor(values).data, 5, "embedding: index", "is bad")
    with pytest.raises(ValueError, match=r"^embedding: index -1 is bad"):  # the min first,
        gpu_like.raise_deferred_errors()  # as the CPU's immediate check reports


@pytest.mark.parametrize("targets, bad", [([0, -100, -4], -4), ([-3, 1, -100], -3)])
def test_a_deferred_cross_entropy_check_skips_ignored_targets_and_names_the_bad_one(
        gpu_like, targets, bad):
    logits = mt.randn(3, 4, requires_grad=True)
    with gpu_like.count_host_reads() as reads:
        loss = F.cross_entropy(logits, mt.tensor(targets))
        loss.backward()
        assert reads.count == 0
    with pytest.raises(ValueError, match=rf"^cross_entropy: target id {bad} is out of range "
                                         rf"for 4 classes \(expected 0 <= id < 4 or "
                                         rf"ignore_index -100\)"):
        gpu_like.raise_deferred_errors()


def test_ignored_targets_out_of_range_are_no_error_either_way(cpu):
    loss = F.cross_entropy(mt.randn(3, 4), mt.tensor([-1, 2, -1]), ignore_index=-1)
    cpu.raise_deferred_errors()
    assert math.isfinite(loss.item())


# --- cross-entropy's count of targets on the device -------------------------------------------
@pytest.mark.parametrize("targets", [[0, -100, 3, 1], [-100, -100, -100, -100], [2, 2, 0, 1]])
def test_cross_entropy_mean_over_counted_targets_without_a_read(cpu, targets):
    logits = np.random.default_rng(0).standard_normal((4, 5))
    x = mt.tensor(logits, dtype=mt.float64, requires_grad=True)
    with cpu.count_host_reads() as reads:
        loss = F.cross_entropy(x, mt.tensor(targets))
        loss.backward()
    assert reads.count == 0
    t = np.array(targets)
    valid = t != -100
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    if not valid.any():  # no target counts: nan, as PyTorch; gradients zero
        assert math.isnan(loss.item()) and not x.grad.numpy().any()
        return
    expected = -log_p[valid, t[valid]].mean()
    np.testing.assert_allclose(loss.item(), expected, rtol=1e-12)
    grad = np.exp(log_p)
    grad[np.arange(4), np.where(valid, t, 0)] -= 1
    np.testing.assert_allclose(x.grad.numpy(), grad * valid[:, None] / valid.sum(),
                               rtol=1e-10, atol=1e-15)


# --- clipping on the device --------------------------------------------------------------------
@pytest.mark.parametrize("max_norm", [0.5, 1e6], ids=["clips", "leaves"])
def test_clip_grad_norm_reads_nothing_and_clips_the_same(max_norm, monkeypatch):
    backend = _cpu_backend(monkeypatch, True)
    grads = [np.array([[3.0, -4.0], [1.0, 2.0]], dtype=np.float32),
             np.array([-12.0, 0.5, 6.0], dtype=np.float32)]
    results = {}
    for free in (True, False):
        monkeypatch.setattr(backend, "reads_are_free", free)
        params = [mt.zeros(*g.shape, requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = mt.tensor(g)
        with backend.count_host_reads() as reads:
            total = optim.clip_grad_norm_(params, max_norm)
        assert reads.count == 0
        results[free] = [total.item()] + [p.grad.numpy().copy() for p in params]
    np.testing.assert_allclose(results[False][0], 14.5, rtol=1e-6)
    for got, want in zip(results[False], results[True]):
        np.testing.assert_array_equal(got, want)


# --- batches: a lookahead that keeps the stream --------------------------------------------------
def test_host_to_device_async_copies_at_the_call(device):
    backend = get_backend(device)
    source = np.arange(12, dtype=np.uint16).reshape(3, 4)
    upload = backend.host_to_device_async((source, source[:, 1:]), np.int64)
    source[...] = 0  # the caller may reuse its arrays at once
    first, second = upload.result()
    assert first.dtype == second.dtype == np.int64 and first.shape == (3, 4)
    assert backend.to_numpy(first).tolist() == np.arange(12).reshape(3, 4).tolist()
    assert backend.to_numpy(second).tolist() == np.arange(12).reshape(3, 4)[:, 1:].tolist()


def test_many_uploads_in_flight_each_deliver_their_own_batch(device):
    """More uploads than pinned buffers before any is used: each keeps its values."""
    backend = get_backend(device)
    uploads = [backend.host_to_device_async([np.full((2, 8), i)], np.int64) for i in range(9)]
    for i, upload in enumerate(uploads):
        (array,) = upload.result()
        assert (backend.to_numpy(array) == i).all()


def test_the_sampler_state_is_before_the_batch_it_drew_ahead(device):
    tokens = np.arange(1000, dtype=np.uint16) % 977
    straight = BatchSampler(tokens, 8, 4, seed=5, device=device)
    want = [[t.tolist() for t in straight.next_batch()] for _ in range(5)]
    first = BatchSampler(tokens, 8, 4, seed=5, device=device)
    first.next_batch(), first.next_batch()  # the third is drawn and on its way
    state = first.state_dict()
    assert [t.tolist() for t in first.next_batch()] == want[2]
    resumed = BatchSampler(tokens, 8, 4, seed=1, device=device)
    resumed.next_batch()  # a batch drawn ahead from the old position is dropped
    resumed.load_state_dict(state)
    assert [[t.tolist() for t in resumed.next_batch()] for _ in range(3)] == want[2:]


# --- the training loop ---------------------------------------------------------------------------
@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "corpus.txt").write_text(corpus_text(300))
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "cache"))
    return tmp_path


def write_config(workdir, device="cpu"):
    path = workdir / "tiny.yaml"
    path.write_text(CONFIG.format(corpus=workdir / "corpus.txt", cache=workdir / "cache",
                                  ckpts=workdir / "ckpts", device=device))
    return path


# where a read may happen: the log points' one read of the steps' losses, evaluations,
# checkpoints (their weights, optimizer state and random streams)
ALLOWED = {"_read_steps", "evaluate", "_save", "_meta"}


class _CountingTrainer(Trainer):
    """Records the host reads of every step (none allowed) and where every other read of
    the run's backend came from."""

    def _build(self):
        super()._build()
        self.step_reads, self.reads = [], []
        backend, original = self.backend, self.backend.to_numpy

        def to_numpy(array):
            callers = {frame.name for frame in traceback.extract_stack()}
            self.reads.append((self.iter_num, callers & ALLOWED))
            return original(array)

        backend.to_numpy = to_numpy  # an instance attribute: removed after the run

    def _step(self):
        with self.backend.count_host_reads() as reads, _no_cuda_sync(self.backend):
            record = super()._step()
        self.step_reads.append(reads.count)
        return record


def _no_cuda_sync(backend):
    """On a GPU, CuPy's own detector too: a step that synchronises raises."""
    if backend.device.type != "cuda":
        return contextlib.nullcontext()
    from minitorch_gpu.backend._cupy import cupyx  # CuPy's, or the emulated GPU's stand-in
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")  # allow_synchronize is deprecated, and still works
    stack.enter_context(cupyx.allow_synchronize(False))
    return stack


@contextlib.contextmanager
def _uncounted_copies(monkeypatch, device):
    """The host reads the emulated GPU made outside the backend's counted ones (``to_numpy``,
    ``raise_deferred_errors``): copies back and the sizes or values CuPy reads itself
    (nonzero, boolean masks...), each named with the engine's line that caused it; a list
    that must stay empty. Off the emulated GPU, nothing to watch (an empty list)."""
    found = []
    if device != "cuda" or not mt.cuda.is_emulated():
        yield found
        return
    from minitorch_gpu.backend.base import Backend
    from minitorch_gpu.backend.emulated_cuda.stand_in import array as device_arrays
    inside = [0]

    def counted(method):
        def run(self, *args):
            inside[0] += 1
            try:
                return method(self, *args)
            finally:
                inside[0] -= 1
        return run

    def watch(what):
        if not inside[0]:
            frame = next(f for f in reversed(traceback.extract_stack()[:-1])
                         if "emulated_cuda" not in f.filename)
            found.append(f"{what} at {frame.filename}:{frame.lineno} ({frame.name})")

    monkeypatch.setattr(Backend, "to_numpy", counted(Backend.to_numpy))
    monkeypatch.setattr(Backend, "raise_deferred_errors",
                        counted(Backend.raise_deferred_errors))
    monkeypatch.setattr(device_arrays, "read_watchers", [watch])
    yield found


def _train(config, device):
    trainer = _CountingTrainer(load_config(config), log=lambda line: None, progress=False)
    try:
        result = trainer.fit()
    finally:
        trainer.backend.__dict__.pop("to_numpy", None)
    return trainer, result


def test_a_training_run_reads_the_device_only_at_log_points_evaluations_and_checkpoints(
        workdir, device, monkeypatch):
    if device == "cpu":  # the GPU's branches: checks deferred, clipping always multiplies
        _cpu_backend(monkeypatch, False)
    with _uncounted_copies(monkeypatch, device) as uncounted:
        trainer, result = _train(write_config(workdir, device), device)
    assert result.status == "finished" and result.iterations == 11
    assert uncounted == []  # every copy to the host went through the engine's counter
    assert trainer.step_reads == [0] * 11  # two micro-batches each, clipped, AdamW
    assert all(where for _, where in trainer.reads), [r for r in trainer.reads if not r[1]]
    loss_reads = [it for it, where in trainer.reads if where == {"_read_steps"}]
    log_points, evaluations = {3, 6, 9, 11}, {4, 8}  # 0 and 11: nothing to read before
    assert loss_reads == sorted(log_points | evaluations)  # one read each
    logged = [line for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
              if '"train"' in line]
    assert len(logged) == 4


class _NanAt(_CountingTrainer):
    at = 2  # the step at this iteration makes a NaN loss

    def _step(self):
        if self.iter_num == self.at:
            self.model.transformer.h[0].mlp.c_fc.weight.data[0, 0] = np.nan
        return super()._step()


def test_a_nan_between_log_points_stops_the_run_there_naming_its_step(workdir, gpu_like):
    config = load_config(write_config(workdir), ["eval.interval=100", "train.log_interval=5"])
    trainer = _NanAt(config, log=lambda line: None, progress=False)
    with pytest.raises(TrainingDiverged, match=r"the loss became nan at iteration 2: training "
                                               r"stopped and no checkpoint had been written "
                                               r"yet \(losses are read from the device every "
                                               r"train.log_interval iterations; this one was "
                                               r"read at iteration 5\)"):
        trainer.fit()
    trainer.backend.__dict__.pop("to_numpy", None)
    assert trainer.step_reads == [0] * 5 and trainer.iter_num == 5
