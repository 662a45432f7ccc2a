"""End to end: the trainer and the CLI on a tiny corpus, with real files and real processes.

The CLI runs as a subprocess (``python -m minitorch_gpu``) exactly as a user types it; the
trainer's finer guarantees (resume equivalence, NaN stop, a crash while saving) are checked
in-process where they need a hand inside the loop.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minitorch_gpu.checkpoint import load_checkpoint
from minitorch_gpu.config import load_config
from minitorch_gpu.trainer import Trainer, TrainingDiverged, TrainingError

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: {dropout}}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, max_iters: {iters}, warmup_iters: 2, lr: 3.0e-3, log_interval: 2}}
eval: {{interval: {interval}, iters: 2}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7, dtype: {dtype}}}
"""


def corpus_text(n_lines: int = 400) -> str:
    rng = np.random.default_rng(0)
    words = ["the", "king", "queen", "said", "and", "to", "my", "lord", "good", "night"]
    return "".join(" ".join(rng.choice(words, 8)) + ".\n" for _ in range(n_lines))


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A tmp dir holding a corpus, with the caches pointed inside it."""
    (tmp_path / "corpus.txt").write_text(corpus_text())
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "cache"))
    return tmp_path


def write_config(workdir: Path, name: str = "tiny", *, iters: int = 8, interval: int = 4,
                 dropout: float = 0.0, dtype: str = "float32") -> Path:
    path = workdir / f"{name}.yaml"
    path.write_text(CONFIG.format(corpus=workdir / "corpus.txt", cache=workdir / "cache",
                                  ckpts=workdir / "ckpts", iters=iters, interval=interval,
                                  dropout=dropout, dtype=dtype))
    return path


def cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "MINITORCH_GPU_CACHE": str(cwd / "cache"), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "minitorch_gpu", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=env)


def metrics(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --- the CLI ------------------------------------------------------------------------------
def test_train_then_generate_through_the_cli(workdir):
    config = write_config(workdir)
    run = cli("train", config, "--progress", "lines", cwd=workdir)
    assert run.returncode == 0, run.stderr
    run_dir = workdir / "ckpts" / "tiny"
    assert {p.name for p in run_dir.iterdir()} == {"best.ckpt", "last.ckpt", "config.yaml",
                                                   "metrics.jsonl", "tokenizer.json"}
    records = metrics(run_dir)
    assert [r["iter"] for r in records if r["type"] == "eval"] == [0, 4, 8]
    assert [r["iter"] for r in records if r["type"] == "train"] == [2, 4, 6, 8]
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] for r in records if r["type"] == "train")
    ckpt = load_checkpoint(run_dir / "last.ckpt")
    assert ckpt.meta["iter_num"] == 8 and ckpt.meta["config"]["train"]["max_iters"] == 8
    resolved = load_config(run_dir / "config.yaml")  # the resolved config is a config
    assert resolved.model.n_embd == 16 and resolved.checkpoint.run_name == "tiny"
    assert "minitorch-gpu generate" in run.stdout and "iter 8: loss" in run.stdout

    gen = cli("generate", run_dir, "--prompt", "the king", "--max-new-tokens", "40",
              "--seed", "3", cwd=workdir)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("the king") and len(gen.stdout) == len("the king") + 40 + 1
    again = cli("generate", run_dir / "best.ckpt", "--prompt", "the king",
                "--max-new-tokens", "40", "--seed", "3", cwd=workdir)
    assert again.stdout == gen.stdout  # a directory means its best.ckpt; same seed, same text
    two = cli("generate", run_dir, "--prompt", "a", "--max-new-tokens", "5",
              "--num-samples", "2", "--temperature", "0", cwd=workdir)
    assert two.returncode == 0 and two.stdout.count("---------------") == 1


def test_prepare_runs_once_and_is_skipped_when_nothing_changed(workdir):
    config = write_config(workdir)
    first = cli("prepare", config, cwd=workdir)
    assert first.returncode == 0 and "wrote" in first.stdout
    second = cli("prepare", config, cwd=workdir)
    assert second.returncode == 0 and "using prepared tokens" in second.stdout


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.ckpt", "does not exist"),
    (lambda d: d, "no best.ckpt or last.ckpt"),
    (lambda d: _write(d / "notes.ckpt", b"just some text\n"), "not a minitorch-gpu checkpoint"),
    (lambda d: _write(d / "cut.ckpt", (d / "ckpts" / "tiny" / "last.ckpt").read_bytes()[:5000]),
     "truncated"),
])
def test_bad_checkpoints_give_one_line_and_exit_code_2(workdir, make, message):
    assert cli("train", write_config(workdir, iters=4), cwd=workdir).returncode == 0
    run = cli("generate", make(workdir), "--prompt", "a", cwd=workdir)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minitorch-gpu generate: error: ")
    assert message in lines[0] and "Traceback" not in run.stderr


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_generate_rejects_a_prompt_outside_the_vocabulary(workdir):
    assert cli("train", write_config(workdir, iters=2, interval=2), cwd=workdir).returncode == 0
    run = cli("generate", workdir / "ckpts" / "tiny", "--prompt", "Zebra", cwd=workdir)
    assert run.returncode == 2 and "'Z'" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("args, message", [
    (["--set", "train.lrr=1"], "unknown config key 'train.lrr'; did you mean 'train.lr'?"),
    (["--set", "model.n_embd=15"], "n_embd (15) must be divisible by model.n_head (2)"),
    (["--set", "train.batch_size=0"], "'train.batch_size': expected an int >= 1, got 0"),
    (["--set", "model.block_size=5000"], "fewer than model.block_size + 1"),
    (["--resume"], "no checkpoint to resume"),
    pytest.param(["--device", "cuda:7"], "system.device: device 'cuda:7' is not available",
                 id="a missing GPU"),
])
def test_bad_training_input_gives_one_line_and_exit_code_2(workdir, args, message):
    run = cli("train", write_config(workdir), *args, cwd=workdir)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr and "Traceback" not in run.stderr


def test_a_missing_config_file_is_named(workdir):
    run = cli("train", workdir / "nope.yaml", cwd=workdir)
    assert run.returncode == 2 and "nope.yaml' does not exist" in run.stderr


def test_a_finished_run_is_not_overwritten_without_asking(workdir):
    config = write_config(workdir, iters=2, interval=2)
    assert cli("train", config, cwd=workdir).returncode == 0
    before = (workdir / "ckpts" / "tiny" / "last.ckpt").read_bytes()
    again = cli("train", config, cwd=workdir)
    assert again.returncode == 2 and "--resume" in again.stderr and "--overwrite" in again.stderr
    assert (workdir / "ckpts" / "tiny" / "last.ckpt").read_bytes() == before
    assert cli("train", config, "--overwrite", cwd=workdir).returncode == 0


@pytest.mark.parametrize("command, options", [
    ("train", ["--set", "--resume", "--overwrite", "--device", "--progress"]),
    ("prepare", ["--set", "--force", "--device"]),
    ("generate", ["--prompt", "--prompt-file", "--max-new-tokens", "--temperature", "--top-k",
                  "--top-p", "--num-samples", "--seed", "--device"]),
])
def test_help_documents_every_option(workdir, command, options):
    run = cli(command, "--help", cwd=workdir)
    assert run.returncode == 0
    for option in options:
        assert option in run.stdout


def test_ctrl_c_saves_a_checkpoint_that_resumes(workdir):
    config = write_config(workdir, iters=100000, interval=100000)
    env = {**os.environ, "MINITORCH_GPU_CACHE": str(workdir / "cache"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "minitorch_gpu", "train", str(config),
                             "--progress", "lines"], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics_file = workdir / "ckpts" / "tiny" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until it is training
        if metrics_file.exists() and '"type": "train"' in metrics_file.read_text():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted at iteration" in out
    ckpt = load_checkpoint(workdir / "ckpts" / "tiny" / "last.ckpt")
    stopped = ckpt.meta["iter_num"]
    assert stopped >= 2
    resumed = cli("train", config, "--resume", "--set", f"train.max_iters={stopped + 2}",
                  "--set", "train.lr_decay_iters=100000", "--progress", "lines", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed" in resumed.stdout and f"at iteration {stopped}" in resumed.stdout
    assert load_checkpoint(workdir / "ckpts" / "tiny" / "last.ckpt").meta["iter_num"] == \
        stopped + 2
    logged = [r["iter"] for r in metrics(workdir / "ckpts" / "tiny") if r["type"] == "train"]
    assert logged == sorted(set(logged)) and logged[-1] == stopped + 2  # each step once


# --- the trainer, in process ---------------------------------------------------------------
def quiet(*_):
    pass


@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-6), ("float32", 1e-5)])
def test_resume_reproduces_the_uninterrupted_loss_curve(workdir, dtype, tolerance):
    """N iterations straight vs N/2, then resume for N/2: the same losses (dropout on, so
    the random streams must be restored too)."""
    config = write_config(workdir, iters=12, interval=3, dropout=0.1, dtype=dtype)
    straight = Trainer(load_config(config, ["checkpoint.run_name=straight"]), log=quiet,
                       progress=False).fit()
    half = ["checkpoint.run_name=halves", "train.lr_decay_iters=12"]
    Trainer(load_config(config, half + ["train.max_iters=6"]), log=quiet, progress=False).fit()
    resumed = Trainer(load_config(config, half + ["train.resume=true"]), log=quiet,
                      progress=False).fit()
    assert resumed.iterations == straight.iterations == 12
    assert [r["iter"] for r in metrics(resumed.run_dir) if r["type"] == "eval"] == \
        [0, 3, 6, 9, 12]  # the first half's evaluations, then the second's, none twice
    a = [r for r in metrics(straight.run_dir) if r["type"] == "train"]
    b = [r for r in metrics(resumed.run_dir) if r["type"] == "train"]
    assert [r["iter"] for r in a] == [r["iter"] for r in b]
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=tolerance)
    np.testing.assert_allclose(resumed.val_loss, straight.val_loss, rtol=tolerance)
    final_a = load_checkpoint(straight.last_checkpoint).model
    final_b = load_checkpoint(resumed.last_checkpoint).model
    for key in final_a:
        np.testing.assert_allclose(final_b[key], final_a[key], rtol=tolerance, atol=1e-7)


def test_gradient_accumulation_equals_the_large_batch(workdir):
    """Two micro-batches of 2 sequences make the same update as one batch of 4: the sampler
    draws the same offsets either way, and the loss is scaled by 1 / grad_accum_steps."""
    config = write_config(workdir, iters=4, interval=4, dtype="float64")
    runs = {}
    for name, batch, accum in (("large", 4, 1), ("accumulated", 2, 2)):
        runs[name] = Trainer(load_config(config, [f"checkpoint.run_name={name}",
                                                  f"train.batch_size={batch}",
                                                  f"train.grad_accum_steps={accum}"]),
                             log=quiet, progress=False).fit()
    a = load_checkpoint(runs["large"].last_checkpoint)
    b = load_checkpoint(runs["accumulated"].last_checkpoint)
    for key in a.model:
        np.testing.assert_allclose(b.model[key], a.model[key], rtol=1e-10, atol=1e-13)
    losses = [[r["loss"] for r in metrics(run.run_dir) if r["type"] == "train"]
              for run in runs.values()]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-12)


class _PoisonedTrainer(Trainer):
    """Sets a weight to NaN before the step after iteration ``at``."""

    at = 5

    def _step(self) -> float:
        if self.iter_num == self.at:
            self.model.transformer.h[0].mlp.c_fc.weight.data[0, 0] = np.nan
        return super()._step()


def test_a_nan_loss_stops_training_and_leaves_the_last_good_checkpoint(workdir):
    config = write_config(workdir, iters=10, interval=4)
    trainer = _PoisonedTrainer(load_config(config), log=quiet, progress=False)
    with pytest.raises(TrainingDiverged, match=r"loss became nan at iteration 5: training "
                                               r"stopped and the last good checkpoint, .*"
                                               r"last.ckpt, is intact"):
        trainer.fit()
    ckpt = load_checkpoint(workdir / "ckpts" / "tiny" / "last.ckpt")
    assert ckpt.meta["iter_num"] == 4
    assert all(np.isfinite(v).all() for v in ckpt.model.values())
    assert metrics(workdir / "ckpts" / "tiny")[-1] == {"type": "error", "iter": 5,
                                                       "error": "loss is nan"}
    # with the cause gone, the run resumes from iteration 4 and the error leaves the log
    resumed = Trainer(load_config(config, ["train.resume=true"]), log=quiet,
                      progress=False).fit()
    assert resumed.status == "finished" and resumed.iterations == 10
    records = metrics(workdir / "ckpts" / "tiny")
    assert all(r["type"] != "error" for r in records)
    assert [r["iter"] for r in records if r["type"] == "train"] == [2, 4, 6, 8, 10]


def test_a_crash_while_saving_leaves_the_previous_checkpoint_loadable(workdir, monkeypatch):
    """The saves at iteration 4 go through; at iteration 8 the writer dies after three
    arrays, mid-file: last.ckpt must still be iteration 4's, whole."""
    import minitorch_gpu.checkpoint as checkpoint_module
    import minitorch_gpu.trainer as trainer_module
    real_save, real_write = trainer_module.save_checkpoint, np.lib.format.write_array
    written = {"n": 0}

    def dying_write(*args, **kwargs):
        written["n"] += 1
        if written["n"] > 3:
            raise OSError("disk on fire")
        return real_write(*args, **kwargs)

    def save(path, model_state, optimizer_state=None, meta=None):
        if meta["iter_num"] == 8:
            monkeypatch.setattr(checkpoint_module.np.lib.format, "write_array", dying_write)
        return real_save(path, model_state, optimizer_state, meta)

    monkeypatch.setattr(trainer_module, "save_checkpoint", save)
    config = write_config(workdir, iters=8, interval=4)
    with pytest.raises(OSError, match="disk on fire"):
        Trainer(load_config(config), log=quiet, progress=False).fit()
    assert written["n"] == 4  # it really died inside the write
    monkeypatch.setattr(checkpoint_module.np.lib.format, "write_array", real_write)
    run_dir = workdir / "ckpts" / "tiny"
    for name in ("last.ckpt", "best.ckpt"):
        assert load_checkpoint(run_dir / name).meta["iter_num"] == 4
    assert not [p.name for p in run_dir.iterdir() if ".tmp" in p.name]


def test_a_run_needs_enough_validation_tokens(workdir):
    config = write_config(workdir)
    with pytest.raises(TrainingError, match=r"the val split has \d+ tokens, fewer than "
                                            r"model.block_size \+ 1 = 5001"):
        Trainer(load_config(config, ["model.block_size=5000"]), log=quiet,
                progress=False).fit()


def test_bf16_training_says_it_is_not_available_yet(workdir):
    with pytest.raises(TrainingError, match="bf16"):
        Trainer(load_config(write_config(workdir), ["system.dtype=bf16"]), log=quiet,
                progress=False).fit()
