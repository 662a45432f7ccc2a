"""fp16 training end to end: ``system.dtype: fp16`` through the CLI as a process on the CPU
and on the emulated GPU (a T4's compute capability too, where bf16 is refused in one line
naming fp16), the loss scale and skipped steps in the log and metrics.jsonl, the scaler's
state in the checkpoint, and a resumed run that reproduces the uninterrupted one while
the scaler is skipping steps and growing its scale."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import corpus_text, single_thread_environment
from minitorch_gpu.backend.emulated_cuda import unavailable_reason
from minitorch_gpu.checkpoint import load_checkpoint
from minitorch_gpu.train.config import load_config
from minitorch_gpu.train.trainer import Trainer

CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, dropout: {dropout}}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, max_iters: {iters}, warmup_iters: 1, lr: 3.0e-3, log_interval: 2,
        grad_clip: 1.0, grad_accum_steps: {accum}}}
eval: {{interval: {interval}, iters: 1}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7, device: cpu}}
"""

needs_emulator = pytest.mark.skipif(unavailable_reason() is not None,
                                    reason=f"no emulated GPU here: {unavailable_reason()}")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "corpus.txt").write_text(corpus_text(200))
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "cache"))
    return tmp_path


def write_config(workdir, *, iters=4, interval=4, dropout=0.0, accum=1):
    path = workdir / "tiny.yaml"
    path.write_text(CONFIG.format(corpus=workdir / "corpus.txt", cache=workdir / "cache",
                                  ckpts=workdir / "ckpts", iters=iters, interval=interval,
                                  dropout=dropout, accum=accum))
    return path


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def cli(args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "minitorch_gpu", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def environment(workdir, emulated=False, arch=None):
    """A training process's environment; the emulated GPU (and its compute capability,
    which the stand-in reads when it is imported) only where asked for."""
    env = single_thread_environment(workdir)
    env.pop("MINITORCH_EMULATE_CUDA", None)
    env.pop("MINITORCH_EMULATE_CUDA_ARCH", None)
    if emulated:
        env["MINITORCH_EMULATE_CUDA"] = "1"
        env["MINITORCH_GPU_CACHE"] = os.environ["MINITORCH_GPU_CACHE"]  # kernels built once
    if arch is not None:
        env["MINITORCH_EMULATE_CUDA_ARCH"] = arch
    return env


DEVICES = [
    pytest.param("cpu", None, id="cpu"),
    pytest.param("cuda", None, id="cuda", marks=[pytest.mark.cuda, needs_emulator]),
    # a T4 (sm_75): no bf16, and fp16 is how it trains in mixed precision
    pytest.param("cuda", "75", id="cuda-sm75", marks=[pytest.mark.cuda, needs_emulator]),
]


@pytest.mark.parametrize("device, arch", DEVICES)
def test_an_fp16_run_through_the_cli(workdir, device, arch):
    config = write_config(workdir)
    env = environment(workdir, emulated=device == "cuda", arch=arch)
    run = cli(["train", config, "--set", "system.dtype=fp16", "--set",
               f"system.device={device}", "--progress", "lines"], env)
    assert run.returncode == 0, run.stderr
    run_dir = workdir / "ckpts" / "tiny"
    train = [r for r in metrics(run_dir) if r["type"] == "train"]
    assert [r["iter"] for r in train] == [2, 4]
    for record in train:  # the loss scale and the steps skipped since the last log point
        assert record["scale"] == 2.0 ** 16 and record["skipped_steps"] == 0, record
        assert 0 < record["loss"] < 10
    assert "iter 2: loss" in run.stdout and "loss scale 65536, 0 steps skipped" in run.stdout
    assert f"fp16 on {device}" in run.stdout
    ckpt = load_checkpoint(run_dir / "last.ckpt")
    assert ckpt.meta["dtype"] == "fp16"
    assert ckpt.meta["grad_scaler"] == {"scale": 2.0 ** 16, "growth_factor": 2.0,
                                        "backoff_factor": 0.5, "growth_interval": 2000,
                                        "_growth_tracker": 4}
    assert all(np.asarray(w).dtype == np.float32 for w in ckpt.model.values())  # master


@pytest.mark.cuda
@needs_emulator
def test_bf16_on_a_gpu_without_it_is_one_line_naming_fp16(workdir):
    config = write_config(workdir)
    env = environment(workdir, emulated=True, arch="75")
    run = cli(["train", config, "--set", "system.dtype=bf16", "--set", "system.device=cuda"],
              env)
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert errors == [
        "minitorch-gpu train: error: system.dtype: bf16 needs a GPU of compute capability 8.0 "
        "or newer (Ampere), and cuda:0 has 7.5, which has no bf16; use system.dtype: fp16 "
        "(float16 with dynamic loss scaling) instead"], run.stderr
    assert not (workdir / "ckpts" / "tiny" / "last.ckpt").exists()


def quiet(*_):
    pass


class _HighScaleTrainer(Trainer):
    """Starts its scaler at 2^30 with a growth interval of 3: its first steps overflow fp16
    in backward and are skipped until the scale has backed off, after which it grows every
    third step and overflows again now and then, so the scaler's whole state matters."""

    def _build(self):
        super()._build()
        self.scaler.load_state_dict({"scale": 2.0 ** 30, "growth_factor": 2.0,
                                     "backoff_factor": 0.5, "growth_interval": 3,
                                     "_growth_tracker": 0})


def test_skipped_steps_are_logged_and_do_not_stop_the_run(workdir):
    config = write_config(workdir, iters=12, interval=12)
    lines = []
    result = _HighScaleTrainer(load_config(config, ["system.dtype=fp16"]), log=lines.append,
                               progress=False).fit()
    assert result.status == "finished" and result.iterations == 12
    train = [r for r in metrics(result.run_dir) if r["type"] == "train"]
    skipped = [r["skipped_steps"] for r in train]
    assert skipped[0] == 2 and sum(skipped) >= 2, train  # the first steps overflowed
    assert train[0]["scale"] < 2.0 ** 30
    assert any("2 steps skipped" in line for line in lines), lines
    ckpt = load_checkpoint(result.last_checkpoint)
    assert ckpt.meta["grad_scaler"]["scale"] == train[-1]["scale"]
    for weight in ckpt.model.values():
        assert np.isfinite(weight).all()


@pytest.mark.parametrize("accum", [1, 2])
def test_an_fp16_resume_reproduces_the_uninterrupted_run(workdir, accum):
    """12 iterations straight vs 6, then --resume for 6, with dropout on and the scaler
    skipping and growing: the same losses, scales, skipped steps and weights, which needs
    the scaler's state from the checkpoint (a fresh scaler would skip other steps)."""
    config = write_config(workdir, iters=12, interval=3, dropout=0.1, accum=accum)
    fp16 = ["system.dtype=fp16", "train.lr_decay_iters=12"]
    straight = _HighScaleTrainer(load_config(config, fp16 + ["checkpoint.run_name=straight"]),
                                 log=quiet, progress=False).fit()
    half = fp16 + ["checkpoint.run_name=halves"]
    _HighScaleTrainer(load_config(config, half + ["train.max_iters=6"]), log=quiet,
                      progress=False).fit()
    resumed = Trainer(load_config(config, half + ["train.resume=true"]), log=quiet,
                      progress=False).fit()
    assert resumed.iterations == straight.iterations == 12
    a = [r for r in metrics(straight.run_dir) if r["type"] == "train"]
    b = [r for r in metrics(resumed.run_dir) if r["type"] == "train"]
    assert [r["iter"] for r in a] == [r["iter"] for r in b] == [2, 4, 6, 8, 10, 12]
    assert [r["scale"] for r in b] == [r["scale"] for r in a]
    assert [r["skipped_steps"] for r in b] == [r["skipped_steps"] for r in a]
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=1e-6)
    np.testing.assert_allclose(resumed.val_loss, straight.val_loss, rtol=1e-6)
    final_a = load_checkpoint(straight.last_checkpoint)
    final_b = load_checkpoint(resumed.last_checkpoint)
    assert final_b.meta["grad_scaler"] == final_a.meta["grad_scaler"]
    for key in final_a.model:
        np.testing.assert_allclose(final_b.model[key], final_a.model[key], rtol=1e-6,
                                   atol=1e-7)


MPIEXEC = Path(sys.executable).parent / "mpiexec"  # the venv's MPICH, as test_distributed's
INF_ON_RANK_1 = """\
import json, sys
import numpy as np
from minitorch_gpu.train.config import load_config
from minitorch_gpu.train.trainer import Trainer


class InfOnRank1(Trainer):
    # rank 1's gradient gets an inf at iteration 3, before the all-reduce: the sum
    # carries it to rank 0, so both ranks must skip that step and stay identical
    def _build(self):
        super()._build()
        reduce = self.group.allreduce_gradients

        def poisoned(params):
            params = list(params)
            if self.group.rank == 1 and self.iter_num == 3:
                params[0].grad.data[0, 0] = np.inf
            reduce(params)
        self.group.allreduce_gradients = poisoned


trainer = InfOnRank1(load_config(sys.argv[1], ["system.dtype=fp16"]), progress=False)
trainer.fit()
params = list(trainer.model.parameters())
mine = {"weights": [p.detach().numpy().tolist() for p in params],
        "moments": [trainer.optimizer.state[p][key].numpy().tolist() for p in params
                    for key in ("exp_avg", "exp_avg_sq")],
        "skipped": trainer.scaler.skipped_steps, "scale": trainer.scaler.get_scale()}
every = trainer.group.gather_object(mine)
if trainer.group.is_main:
    first, second = every
    print(json.dumps({"identical": first["weights"] == second["weights"]
                      and first["moments"] == second["moments"],
                      "skipped": [first["skipped"], second["skipped"]],
                      "scales": [first["scale"], second["scale"]]}))
"""


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or not MPIEXEC.exists(),
                    reason=f"needs mpi4py and {MPIEXEC} (pip install -e '.[dist]')")
def test_an_inf_on_one_rank_skips_the_step_on_every_rank(workdir):
    """Two ranks with gradient accumulation: the scaler unscales after the all-reduce, so
    an inf in one rank's gradient reaches both and both skip the same step, keeping every
    weight and AdamW moment bit for bit the same."""
    config = write_config(workdir, iters=8, interval=1000, accum=2)
    script = workdir / "inf_on_rank_1.py"
    script.write_text(INF_ON_RANK_1)
    run = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(script), str(config)],
                         cwd=workdir, env=environment(workdir), capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    verdict = json.loads([line for line in run.stdout.splitlines() if line.startswith("{")][0])
    assert verdict == {"identical": True, "skipped": [1, 1], "scales": [2.0 ** 15] * 2}
