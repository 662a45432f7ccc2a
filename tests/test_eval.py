"""``minitorch-gpu eval`` end to end, and HellaSwag during training: a tiny run trained
through the CLI, then scored as a subprocess exactly as a user types it."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.data import consecutive_windows, prepare
from minitorch_gpu.pretrained.inference import load_for_inference
from minitorch_gpu.train.config import config_from_dict, load_config
from minitorch_gpu.train.plot_runs import plot_runs, read_run
from minitorch_gpu.train.run_lock import lock_run_directory
from minitorch_gpu.train.trainer import Trainer, TrainingError
from conftest import corpus_text

CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: 0.0}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, max_iters: {iters}, warmup_iters: 2, lr: 3.0e-3, log_interval: 2}}
eval: {{interval: 4, iters: 2{extra}}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7}}
"""
# the corpus's words only: a character tokenizer knows nothing else
SAMPLE = [{"ind": i, "ctx": ctx, "label": label, "endings": endings}
          for i, (ctx, label, endings) in enumerate([
              ("the king said", 1, ["good night.", "to the queen.", "my lord", "and"]),
              ("my lord", 0, ["said good night.", "the", "queen and king.", "to"]),
              ("the queen said good", 2, ["king", "lord and the queen.", "night.", "my"]),
              ("and to my", 3, ["the", "king", "queen", "lord."]),
          ])]


def cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MINITORCH_GPU_CACHE": str(cwd / "cache"), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "minitorch_gpu", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=240, env=env)


def write_config(workdir: Path, name: str, iters: int = 8, extra: str = "") -> Path:
    if not (workdir / "corpus.txt").exists():
        (workdir / "corpus.txt").write_text(corpus_text())
    path = workdir / f"{name}.yaml"
    path.write_text(CONFIG.format(corpus=workdir / "corpus.txt", cache=workdir / "cache",
                                  ckpts=workdir / "ckpts", iters=iters, extra=extra))
    return path


def write_sample(path: Path, records=SAMPLE) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


def records(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny run trained through the CLI: (workdir, run directory)."""
    workdir = tmp_path_factory.mktemp("eval")
    trained = cli("train", write_config(workdir, "tiny"), "--progress", "lines", cwd=workdir)
    assert trained.returncode == 0, trained.stderr
    return workdir, workdir / "ckpts" / "tiny"


def test_loss_over_the_whole_val_split_matches_the_windows_by_hand(run, monkeypatch):
    workdir, run_dir = run
    done = cli("eval", run_dir, "--json", "--batch-size", "5", cwd=workdir)
    assert done.returncode == 0, done.stderr
    summary, line = done.stdout.splitlines()
    result = json.loads(line)
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(workdir / "cache"))
    model, _, meta = load_for_inference(run_dir, keep_padding=True)
    tokens = prepare(config_from_dict(meta["config"]).data, log=lambda _: None).val_tokens()
    inputs, targets = consecutive_windows(tokens, 16)
    with mt.no_grad():
        logits, _ = model(mt.tensor(inputs), mt.tensor(targets))
    logits = np.asarray(logits, dtype=np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, targets[..., None], -1).mean()
    assert result["loss"] == pytest.approx(expected, rel=1e-5)
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
    assert (result["tokens"], result["windows"]) == (inputs.size, len(inputs))
    assert summary.startswith(f"loss: {result['loss']:.4f} perplexity ")
    assert f"over {inputs.size:,} tokens ({len(inputs)} windows of 16)" in summary
    logged = [r for r in records(run_dir / "metrics.jsonl") if r["type"] == "eval_task"
              and r["task"] == "loss" and "data" not in r]
    assert logged[-1]["iter"] == 8 and logged[-1]["loss"] == result["loss"]


def test_loss_over_a_text_file(run):
    workdir, run_dir = run
    text = "the king said good night to my lord.\n" * 20
    (workdir / "notes.txt").write_text(text)
    done = cli("eval", run_dir, "--data", workdir / "notes.txt", "--json", cwd=workdir)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[1])
    assert result["windows"] == (len(text) - 1) // 16 and result["data"].endswith("notes.txt")


def test_hellaswag_through_the_cli_with_output_and_metrics(run):
    workdir, run_dir = run
    data = write_sample(workdir / "sample.jsonl")
    out = workdir / "scores.jsonl"
    done = cli("eval", run_dir, "--task", "hellaswag", "--data", data, "--output", out,
               "--json", cwd=workdir)
    assert done.returncode == 0, done.stderr
    summary, line = done.stdout.splitlines()
    result = json.loads(line)
    scored = records(out)
    assert [r["ind"] for r in scored] == [0, 1, 2, 3]
    assert all(len(r["sum_logprob"]) == len(r["mean_logprob"]) == 4 for r in scored)
    assert result["acc"] == np.mean([r["pred"] == r["label"] for r in scored])
    assert result["acc_norm"] == np.mean([r["pred_norm"] == r["label"] for r in scored])
    # characters are tokens: past 16 + 1 of them, an example is cropped to the block size
    cropped = sum(any(len(e["ctx"]) + 1 + len(end) > 17 for end in e["endings"])
                  for e in SAMPLE)
    assert result["examples"] == 4 and result["cropped"] == cropped == 3
    assert summary.startswith(f"hellaswag: acc {result['acc']:.4f} acc_norm "
                              f"{result['acc_norm']:.4f} over 4 examples (3 contexts cropped)")
    logged = [r for r in records(run_dir / "metrics.jsonl") if r.get("task") == "hellaswag"]
    assert logged[-1]["type"] == "eval_task" and logged[-1]["iter"] == 8
    assert logged[-1]["acc_norm"] == result["acc_norm"]
    assert len(read_run(run_dir).eval["iter"]) == 3  # plot reads past eval_task records
    limited = cli("eval", run_dir, "--task", "hellaswag", "--data", data, "--limit", "2",
                  "--json", cwd=workdir)
    assert json.loads(limited.stdout.splitlines()[1])["examples"] == 2


@pytest.mark.parametrize("lines, message", [
    ([json.dumps(SAMPLE[0]), "{oops"], "sample.jsonl line 2: not valid JSON"),
    ([json.dumps({**SAMPLE[0], "endings": ["a", "b", "c"]})],
     "line 1: endings must be a list of 4 strings, got 3 of them"),
    ([json.dumps({**SAMPLE[0], "label": 7})], "line 1: label must be an int in 0..3, got 7"),
])
def test_bad_hellaswag_input_is_one_line_and_writes_no_output(run, lines, message):
    workdir, run_dir = run
    out = workdir / "bad_scores.jsonl"
    done = cli("eval", run_dir, "--task", "hellaswag", "--output", out, "--data",
               write_sample(workdir / "sample.jsonl", lines), cwd=workdir)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr
    assert not out.exists() and not list(workdir.glob(".bad_scores.jsonl.tmp-*"))


@pytest.mark.parametrize("args, message", [
    (("--limit", "0", "--task", "hellaswag"), "--limit must be >= 1"),
    (("--output", "x.jsonl"), "--output is for --task hellaswag"),
    (("--task", "hellaswag", "--data", "missing.jsonl"), "missing.jsonl: no such file"),
])
def test_bad_options_are_one_line(run, args, message):
    workdir, run_dir = run
    done = cli("eval", run_dir, *args, cwd=workdir)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1


def test_a_hugging_face_model_needs_data_for_its_loss(run):
    workdir, run_dir = run
    exported = cli("export", run_dir, workdir / "hf", cwd=workdir)
    assert exported.returncode == 0, exported.stderr
    done = cli("eval", workdir / "hf", cwd=workdir)
    assert done.returncode == 2 and "pass --data FILE" in done.stderr
    scored = cli("eval", workdir / "hf", "--task", "hellaswag", "--data",
                 write_sample(workdir / "sample.jsonl"), cwd=workdir)
    assert scored.returncode == 0 and "over 4 examples" in scored.stdout, scored.stderr


def test_a_run_being_trained_is_not_written_to(run):
    workdir, run_dir = run
    before = (run_dir / "metrics.jsonl").read_text()
    lock = lock_run_directory(run_dir)  # as a trainer holds it
    try:
        done = cli("eval", run_dir, cwd=workdir)
    finally:
        lock.release()
    assert done.returncode == 0 and done.stdout.startswith("loss: ")
    assert "note: not written to" in done.stderr and "in use by another trainer" in done.stderr
    assert (run_dir / "metrics.jsonl").read_text() == before


def quiet(*_):
    pass


def test_hellaswag_every_interval_during_training(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "cache"))
    data = write_sample(tmp_path / "sample.jsonl")
    config = write_config(tmp_path, "periodic", iters=7,
                          extra=f", hellaswag_interval: 3, hellaswag_data: {data}, "
                                f"hellaswag_limit: 3")
    result = Trainer(load_config(config), log=quiet, progress=False).fit()
    scored = [r for r in records(result.run_dir / "metrics.jsonl") if r["type"] == "hellaswag"]
    assert [r["iter"] for r in scored] == [3, 6, 7]  # every 3, and at the end; not at 0
    assert all(r["examples"] == 3 and 0 <= r["acc"] <= 1 and 0 <= r["acc_norm"] <= 1
               for r in scored)
    drawn = read_run(result.run_dir)
    assert drawn.hellaswag["iter"].tolist() == [3, 6, 7]
    assert drawn.hellaswag["acc_norm"].tolist() == [r["acc_norm"] for r in scored]
    # resumed at 7 and trained on to 9: 7 is not scored again
    resumed = load_config(config, ["train.max_iters=9", "train.resume=true"])
    result = Trainer(resumed, log=quiet, progress=False).fit()
    scored = [r for r in records(result.run_dir / "metrics.jsonl") if r["type"] == "hellaswag"]
    assert [r["iter"] for r in scored] == [3, 6, 7, 9]
    pytest.importorskip("matplotlib")
    assert plot_runs([drawn], tmp_path / "runs.png").stat().st_size > 0


def test_a_bad_hellaswag_file_stops_the_run_before_it_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "cache"))
    data = write_sample(tmp_path / "sample.jsonl", [json.dumps(SAMPLE[0]),
                                                    json.dumps({**SAMPLE[1], "ctx": "XYZ"})])
    config = write_config(tmp_path, "bad", extra=f", hellaswag_interval: 3, "
                                                 f"hellaswag_data: {data}")
    with pytest.raises(TrainingError, match="eval.hellaswag_data: line 2 .*cannot encode"):
        Trainer(load_config(config), log=quiet, progress=False).fit()
    assert not (tmp_path / "ckpts" / "bad" / "last.ckpt").exists()
