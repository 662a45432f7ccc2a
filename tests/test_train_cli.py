"""End to end: the trainer and the CLI on a tiny corpus, with real files and real processes.

The CLI runs as a subprocess (``python -m minitorch_gpu``) exactly as a user types it; the
trainer's finer guarantees (resume equivalence, NaN stop, a crash while saving) are checked
in-process where they need a hand inside the loop.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minitorch_gpu.checkpoint import load_checkpoint
from minitorch_gpu.train.config import load_config
from minitorch_gpu.train.trainer import Trainer, TrainingDiverged, TrainingError
from conftest import corpus_text

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: {dropout}}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, max_iters: {iters}, warmup_iters: 2, lr: 3.0e-3, log_interval: 2}}
eval: {{interval: {interval}, iters: 2}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7, dtype: {dtype}}}
"""


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


LLAMA_CONFIG = """\
model: {{arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 16, block_size: 16,
        ffn_hidden: 32, pad_vocab_to: 64, dropout: {dropout}}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, max_iters: {iters}, warmup_iters: 2, lr: 3.0e-3, log_interval: 2}}
eval: {{interval: 3, iters: 2}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7, dtype: {dtype}}}
"""


def write_llama_config(workdir: Path, iters: int = 6, dropout: float = 0.0,
                       dtype: str = "float32") -> Path:
    path = workdir / "llama.yaml"
    path.write_text(LLAMA_CONFIG.format(corpus=workdir / "corpus.txt", cache=workdir / "cache",
                                        ckpts=workdir / "ckpts", iters=iters, dropout=dropout,
                                        dtype=dtype))
    return path


def test_a_llama_trains_samples_and_resumes_through_the_cli(workdir):
    """model.arch llama: train as a process, a checkpoint of Hugging Face's names on disk,
    generate from it as a process, then --resume continues the run where it stopped."""
    config = write_llama_config(workdir)
    run = cli("train", config, "--progress", "lines", cwd=workdir)
    assert run.returncode == 0, run.stderr
    assert "model: Llama with" in run.stdout and "n_kv_head 2" in run.stdout
    run_dir = workdir / "ckpts" / "llama"
    ckpt = load_checkpoint(run_dir / "last.ckpt")
    assert ckpt.meta["iter_num"] == 6 and ckpt.meta["model_config"]["arch"] == "llama"
    assert ckpt.model["model.layers.1.self_attn.k_proj.weight"].shape == (8, 16)  # 2 of 4 heads
    assert ckpt.model["lm_head.weight"].shape == (64, 16)  # padded, untied
    assert "transformer.wte.weight" not in ckpt.model
    assert [r["iter"] for r in metrics(run_dir) if r["type"] == "eval"] == [0, 3, 6]

    gen = cli("generate", run_dir, "--prompt", "the king", "--max-new-tokens", "30",
              "--seed", "3", cwd=workdir)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("the king") and len(gen.stdout) == len("the king") + 30 + 1
    assert set(gen.stdout) <= set(corpus_text())  # padding ids were cut, never drawn

    resumed = cli("train", config, "--resume", "--set", "train.max_iters=9", "--progress",
                  "lines", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert load_checkpoint(run_dir / "last.ckpt").meta["iter_num"] == 9
    records = metrics(run_dir)
    assert [r["iter"] for r in records if r["type"] == "eval"] == [0, 3, 6, 9]
    assert [r["iter"] for r in records if r["type"] == "train"] == [2, 4, 6, 8, 9]  # and the last

    other = cli("train", config, "--resume", "--set", "model.n_kv_head=4",
                "--set", "train.max_iters=12", cwd=workdir)
    assert other.returncode == 2 and "n_kv_head 2" in other.stderr and \
        "n_kv_head 4" in other.stderr, other.stderr


def test_prepare_runs_once_and_is_skipped_when_nothing_changed(workdir):
    config = write_config(workdir)
    first = cli("prepare", config, cwd=workdir)
    assert first.returncode == 0 and "wrote" in first.stdout
    second = cli("prepare", config, cwd=workdir)
    assert second.returncode == 0 and "using prepared tokens" in second.stdout


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.ckpt", "no such file or folder"),
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
    (["--set", "model.n_embd=15"], "'model.n_embd': n_embd (15) must be divisible by n_head (2)"),
    (["--set", "train.batch_size=0"], "'train.batch_size': expected an int >= 1, got 0"),
    (["--set", "model.block_size=5000"], "fewer than model.block_size + 1"),
    (["--resume"], "no checkpoint to resume"),
    (["--set", "checkpoint.dir=corpus.txt"], "checkpoint.dir: cannot make the run directory "
                                             "corpus.txt/tiny: Not a directory"),
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
    assert "resumed" in resumed.stdout and f"at iteration {stopped}" in resumed.stdout
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


def test_a_resumed_llama_reproduces_the_uninterrupted_loss_curve(workdir):
    """As for the GPT: a Llama's run in two halves is the run in one (float64, dropout on,
    so the random streams are restored too)."""
    config = write_llama_config(workdir, iters=12, dropout=0.1, dtype="float64")
    straight = Trainer(load_config(config, ["checkpoint.run_name=straight"]), log=quiet,
                       progress=False).fit()
    half = ["checkpoint.run_name=halves", "train.lr_decay_iters=12"]
    Trainer(load_config(config, half + ["train.max_iters=6"]), log=quiet, progress=False).fit()
    resumed = Trainer(load_config(config, half + ["train.resume=true"]), log=quiet,
                      progress=False).fit()
    assert resumed.iterations == straight.iterations == 12
    a = [r["loss"] for r in metrics(straight.run_dir) if r["type"] == "train"]
    b = [r["loss"] for r in metrics(resumed.run_dir) if r["type"] == "train"]
    np.testing.assert_allclose(b, a, rtol=1e-6)
    np.testing.assert_allclose(resumed.val_loss, straight.val_loss, rtol=1e-6)


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


def test_resume_keeps_a_best_checkpoint_newer_than_last(workdir):
    """With checkpoint.always_save false, last.ckpt is written at the first evaluation and
    then only at the end: a run that dies in between resumes from it, and must still know
    the best val loss of the newer best.ckpt, or a worse model would replace it."""
    config = write_config(workdir, iters=8, interval=2)
    settings = ["checkpoint.always_save=false"]
    trainer = _PoisonedTrainer(load_config(config, settings), log=quiet, progress=False)
    trainer.at = 7
    with pytest.raises(TrainingDiverged):
        trainer.fit()
    run_dir = workdir / "ckpts" / "tiny"
    assert load_checkpoint(run_dir / "last.ckpt").meta["iter_num"] == 2
    best = load_checkpoint(run_dir / "best.ckpt").meta
    assert best["iter_num"] == 6
    Trainer(load_config(config, settings + ["train.resume=true"]), log=quiet,
            progress=False).fit()
    at_4 = [r for r in metrics(run_dir) if r["type"] == "eval" and r["iter"] == 4][-1]
    assert at_4["best_val_loss"] <= best["best_val_loss"]  # not iteration 2's, from last.ckpt


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
    import minitorch_gpu.checkpoint.safetensors_file as checkpoint_file
    import minitorch_gpu.train.trainer as trainer_module
    real_save, real_write = trainer_module.save_checkpoint, checkpoint_file._write_tensor
    written = {"n": 0}

    def dying_write(*args, **kwargs):
        written["n"] += 1
        if written["n"] > 3:
            raise OSError("disk on fire")
        return real_write(*args, **kwargs)

    def save(path, model_state, optimizer_state=None, meta=None):
        if meta["iter_num"] == 8:
            monkeypatch.setattr(checkpoint_file, "_write_tensor", dying_write)
        return real_save(path, model_state, optimizer_state, meta)

    monkeypatch.setattr(trainer_module, "save_checkpoint", save)
    config = write_config(workdir, iters=8, interval=4)
    with pytest.raises(OSError, match="disk on fire"):
        Trainer(load_config(config), log=quiet, progress=False).fit()
    assert written["n"] == 4  # it really died inside the write
    monkeypatch.setattr(checkpoint_file, "_write_tensor", real_write)
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


def test_bf16_training_tracks_float32(workdir):
    """200 steps of the Shakespeare model's shape (4 layers x 128, context 64) in bf16 mixed
    precision, emulated on the CPU, end within 2% of the float32 run's loss; the weights,
    the optimizer state and the checkpoint stay float32."""
    shape = ["model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=64",
             "train.batch_size=4", "train.max_iters=200", "train.lr=1.0e-3",
             "train.warmup_iters=20", "train.log_interval=50", "eval.interval=100",
             "eval.iters=4"]
    losses = {}
    for dtype in ("float32", "bf16"):
        cfg = load_config(write_config(workdir, f"run_{dtype}"), shape + [f"system.dtype={dtype}"])
        result = Trainer(cfg, log=quiet, progress=False).fit()
        losses[dtype] = [r["val_loss"] for r in metrics(result.run_dir) if r["type"] == "eval"]
        ckpt = load_checkpoint(result.last_checkpoint)
        assert ckpt.meta["dtype"] == dtype
        assert all(np.asarray(w).dtype == np.float32 for w in ckpt.model.values())
    assert len(losses["bf16"]) == len(losses["float32"]) == 3  # iterations 0, 100, 200
    assert losses["float32"][-1] < 0.8 * losses["float32"][0]  # it learned something
    assert losses["bf16"][-1] == pytest.approx(losses["float32"][-1], rel=0.02), losses


# --- what a nanoGPT / PyTorch user runs into ------------------------------------------------
@pytest.fixture(scope="module")
def padded_run(tmp_path_factory):
    """One short run shared by the generate tests below: the lowercase corpus (so no 'T' in
    its character vocabulary) and a vocabulary padded to 64, as nanoGPT pads GPT-2's to
    50304. Returns (workdir, run_dir, the training's CompletedProcess)."""
    workdir = tmp_path_factory.mktemp("padded")
    (workdir / "corpus.txt").write_text(corpus_text())
    config = write_config(workdir, iters=4, interval=4)
    run = cli("train", config, "--set", "model.pad_vocab_to=64", "--progress", "lines",
              cwd=workdir)
    assert run.returncode == 0, run.stderr
    return workdir, workdir / "ckpts" / "tiny", run


def test_generate_draws_only_tokens_the_tokenizer_has_from_a_padded_vocabulary(padded_run):
    """The padding ids (20..63 here) decode to nothing: at a high temperature they were
    drawn and generation died on 'id 56 is outside the vocabulary'."""
    workdir, run_dir, _ = padded_run
    gen = cli("generate", run_dir, "--prompt", "the", "--temperature", "5", "--top-k", "0",
              "--max-new-tokens", "200", "--seed", "3", cwd=workdir)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("the") and len(gen.stdout) == len("the") + 200 + 1


def test_the_generate_command_printed_after_training_runs_as_printed(padded_run):
    """It suggested --prompt 'The ' for any text_files corpus, whose character vocabulary
    may have no 'T'."""
    workdir, _, train = padded_run
    line = next(line for line in train.stdout.splitlines()
                if line.strip().startswith("minitorch-gpu generate"))
    args = shlex.split(line)[1:]
    args[args.index("--max-new-tokens") + 1] = "5"
    gen = cli(*args, cwd=workdir)
    assert gen.returncode == 0, gen.stderr


def test_generate_into_a_closed_pipe_stops_quietly(padded_run):
    """`minitorch-gpu generate ... | head -c 10`: no BrokenPipeError traceback, and the exit
    code a shell gives a tool ended by SIGPIPE."""
    workdir, run_dir, _ = padded_run
    env = {**os.environ, "MINITORCH_GPU_CACHE": str(workdir / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "minitorch_gpu", "generate", str(run_dir),
                             "--max-new-tokens", "100000"], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()  # what head does once it has its bytes
    code = proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert code == 141 and err == "", err


@pytest.mark.parametrize("args, message", [
    (["--device", "gpu"], "unknown device 'gpu'"),
    (["--prompt-file", "latin1.txt"], "--prompt-file 'latin1.txt' is not UTF-8 text (byte "
                                      "0xe9 at offset 3)"),
    (["--prompt", "The king"], "character 'T'"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
])
def test_bad_generate_input_is_one_line_and_prints_no_text(padded_run, args, message):
    """A prompt the vocabulary can't encode used to be printed before the error."""
    workdir, run_dir, _ = padded_run
    (workdir / "latin1.txt").write_bytes("caf\u00e9".encode("latin-1"))
    gen = cli("generate", run_dir, *args, cwd=workdir)
    assert gen.returncode == 2 and gen.stdout == ""
    lines = gen.stderr.strip().splitlines()
    assert message in gen.stderr and "Traceback" not in gen.stderr
    assert len(lines) == 1


def test_resume_refuses_data_that_gives_another_tokenizer(workdir):
    """The corpus changed under the run (same vocabulary size, other characters): the
    weights would have gone on learning under a reshuffled token table, silently."""
    config = write_config(workdir, iters=2, interval=2)
    Trainer(load_config(config), log=quiet, progress=False).fit()
    corpus = workdir / "corpus.txt"
    corpus.write_text(corpus.read_text().upper())
    with pytest.raises(TrainingError, match=r"train.resume: .*last.ckpt was trained with "
                                            r"another tokenizer than the data gives now"):
        Trainer(load_config(config, ["train.resume=true", "train.max_iters=4"]), log=quiet,
                progress=False).fit()


def test_resume_may_change_dropout_and_names_only_the_shape_that_differs(workdir):
    config = write_config(workdir, iters=2, interval=2)
    Trainer(load_config(config), log=quiet, progress=False).fit()
    with pytest.raises(TrainingError, match=r"holds a model with n_layer 1; the config asks "
                                            r"for n_layer 2$"):
        Trainer(load_config(config, ["train.resume=true", "model.n_layer=2"]), log=quiet,
                progress=False).fit()
    resumed = Trainer(load_config(config, ["train.resume=true", "model.dropout=0.1",
                                           "train.max_iters=4"]), log=quiet,
                      progress=False).fit()  # nanoGPT lets a resumed run change dropout
    assert resumed.status == "finished" and resumed.iterations == 4


class _BrokenByTheStep(Trainer):
    """The step that ends at iteration ``at`` leaves a NaN weight (as a huge update with
    clipping off can): its own loss was finite, the next evaluation's is not."""

    at = 8

    def _step(self) -> float:
        loss = super()._step()
        if self.iter_num + 1 == self.at:
            self.model.transformer.h[0].mlp.c_fc.weight.data[0, 0] = np.nan
        return loss


def test_a_nan_at_evaluation_stops_training_before_any_checkpoint_is_written(workdir):
    config = write_config(workdir, iters=12, interval=4)
    with pytest.raises(TrainingDiverged, match=r"the train loss at evaluation became nan at "
                                               r"iteration 8: .*/last.ckpt, is intact"):
        _BrokenByTheStep(load_config(config), log=quiet, progress=False).fit()
    for name in ("last.ckpt", "best.ckpt"):
        ckpt = load_checkpoint(workdir / "ckpts" / "tiny" / name)
        assert ckpt.meta["iter_num"] == 4
        assert all(np.isfinite(v).all() for v in ckpt.model.values())


def test_resume_and_overwrite_together_are_refused(workdir):
    config = write_config(workdir, iters=2, interval=2)
    Trainer(load_config(config), log=quiet, progress=False).fit()
    before = (workdir / "ckpts" / "tiny" / "last.ckpt").read_bytes()
    with pytest.raises(TrainingError, match="train.resume and --overwrite contradict"):
        Trainer(load_config(config, ["train.resume=true"]), log=quiet, progress=False,
                overwrite=True).fit()
    assert (workdir / "ckpts" / "tiny" / "last.ckpt").read_bytes() == before


def test_a_checkpoint_dir_under_home_is_expanded(workdir, monkeypatch):
    """`--set checkpoint.dir=~/runs`: no shell expands a ~ after `=` in an argument."""
    monkeypatch.setenv("HOME", str(workdir / "home"))
    monkeypatch.chdir(workdir)
    result = Trainer(load_config(write_config(workdir, iters=2, interval=2),
                                 ["checkpoint.dir=~/runs"]), log=quiet, progress=False).fit()
    assert result.run_dir == workdir / "home" / "runs" / "tiny"
    assert (result.run_dir / "last.ckpt").is_file() and not (workdir / "~").exists()


def test_ctrl_c_before_training_starts_is_one_line_and_exit_code_130(workdir, monkeypatch,
                                                                     capsys):
    """Ctrl-C while a corpus is being tokenized (minutes for a big BPE) printed a
    KeyboardInterrupt traceback."""
    import minitorch_gpu.data
    from minitorch_gpu.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(minitorch_gpu.data, "prepare", interrupted)
    assert main(["prepare", str(write_config(workdir))]) == 130
    assert capsys.readouterr().err == "minitorch-gpu prepare: interrupted\n"


def test_a_disk_error_while_training_is_one_line_and_exit_code_1(workdir, monkeypatch,
                                                                 capsys):
    """A full disk while a checkpoint is written: the message, not a traceback (the
    checkpoint writer leaves the previous file whole; see the crash test above)."""
    from minitorch_gpu.cli import main

    def full_disk(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Trainer, "fit", full_disk)
    assert main(["train", str(write_config(workdir))]) == 1
    assert capsys.readouterr().err == ("minitorch-gpu train: [Errno 28] No space left on "
                                       "device; the checkpoints on disk are as they were\n")


def test_a_resumed_run_uses_the_configs_optimizer_settings_not_the_checkpoints(workdir):
    """Optimizer.load_state_dict restores the saved hyperparameters (as PyTorch's does), so
    `--resume --set train.weight_decay=0.5` trained on with 0.1 while config.yaml said 0.5."""
    config = write_config(workdir, iters=2, interval=2)
    Trainer(load_config(config), log=quiet, progress=False).fit()
    trainer = Trainer(load_config(config, ["train.resume=true", "train.max_iters=4",
                                           "train.weight_decay=0.5", "train.beta2=0.9",
                                           "train.eps=1e-6"]), log=quiet, progress=False)
    trainer.fit()
    groups = trainer.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0]  # decay on 2-D weights only
    assert all(g["betas"] == (0.9, 0.9) and g["eps"] == 1e-6 for g in groups)


# a GPU that fails mid-run, as CuPy reports it: an exception class of its own (CuPy's
# CUDARuntimeError is a RuntimeError) raised from deep inside the model
FAILING_GPU = """\
import sys
from minitorch_gpu.nn import GPT


class CUDARuntimeError(RuntimeError):
    pass


def forward_on_a_failing_gpu(self, idx, targets=None, **kwargs):
    raise CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")


GPT.forward = forward_on_a_failing_gpu
sys.argv = ["minitorch-gpu", *sys.argv[1:]]
from minitorch_gpu.cli import entry_point
entry_point()
"""


@pytest.mark.parametrize("command", ["train", "profile"])
def test_an_unexpected_error_is_summed_up_then_shown_with_its_whole_traceback(workdir,
                                                                             command):
    """A CUDA failure used to be cut to one line (profile) or printed without a line that
    said which command failed (train): one log must be enough to find where it came from."""
    launcher = workdir / "failing_gpu.py"
    launcher.write_text(FAILING_GPU)
    env = {**os.environ, "MINITORCH_GPU_CACHE": str(workdir / "cache")}
    run = subprocess.run([sys.executable, str(launcher), command, str(write_config(workdir))],
                         cwd=workdir, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 1, run.stderr
    error = "cudaErrorIllegalAddress: an illegal memory access was encountered"
    summary = f"minitorch-gpu {command}: unexpected error: CUDARuntimeError: {error}"
    assert summary in run.stderr.splitlines(), run.stderr
    shown = run.stderr[run.stderr.index(summary) + len(summary):].strip().splitlines()
    assert shown[0] == "Traceback (most recent call last):"
    # every frame, from the command's handler in the CLI down to the one that raised
    frames = "\n".join(shown)
    assert f"in _{command}" in frames and "in forward_on_a_failing_gpu" in frames
    assert shown[-1].endswith(f"CUDARuntimeError: {error}")
