"""Runs as pictures and as TensorBoard events: ``minitorch-gpu plot`` on real runs trained
through the CLI, its one-line errors, the metrics reader on a hand-written file, and the
event files that ``logging.tensorboard: true`` writes, read back record by record."""
from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitorch_gpu.cli import main
from minitorch_gpu.train.config import ConfigError, config_from_dict
from minitorch_gpu.train.plot_runs import MetricsError, read_run, read_runs
from conftest import corpus_text

CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, max_iters: {iters}, warmup_iters: 2, lr: {lr}, log_interval: 2}}
eval: {{interval: 4, iters: 2}}
checkpoint: {{dir: {ckpts}}}
logging: {{tensorboard: {tensorboard}}}
"""

HAS_TENSORBOARDX = importlib.util.find_spec("tensorboardX") is not None


def cli(*args, cwd: Path, python_code: str = "") -> subprocess.CompletedProcess:
    """``python -m minitorch_gpu ARGS``; with ``python_code``, that code runs first in the
    same process (to make an import fail, as where a package is not installed)."""
    env = {**os.environ, "MINITORCH_GPU_CACHE": str(cwd / "cache")}
    command = ([sys.executable, "-c", f"{python_code}\nimport sys\n"
                "from minitorch_gpu.cli import entry_point\nsys.argv[0] = 'minitorch-gpu'\n"
                "entry_point()"] if python_code else [sys.executable, "-m", "minitorch_gpu"])
    return subprocess.run([*command, *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=240, env=env)


def train(workdir: Path, name: str, *, lr: float = 3e-3, iters: int = 8,
          tensorboard: bool = False, extra=()) -> Path:
    if not (workdir / "corpus.txt").exists():
        (workdir / "corpus.txt").write_text(corpus_text())
    config = workdir / f"{name}.yaml"
    config.write_text(CONFIG.format(corpus=workdir / "corpus.txt", cache=workdir / "cache",
                                    ckpts=workdir / "ckpts", iters=iters, lr=lr,
                                    tensorboard=str(tensorboard).lower()))
    run = cli("train", config, "--progress", "lines", *extra, cwd=workdir)
    assert run.returncode == 0, run.stderr
    return workdir / "ckpts" / name


def png_size(path: Path) -> tuple:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def one_error_line(run: subprocess.CompletedProcess, command: str = "plot") -> str:
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"minitorch-gpu {command}: error: ")
    return lines[0]


# --- plot ---------------------------------------------------------------------------------
def test_plot_draws_two_real_runs_into_one_png(tmp_path, monkeypatch):
    slow = train(tmp_path, "lr_1e-3", lr=1e-3)
    fast = train(tmp_path, "lr_3e-3", lr=3e-3)
    run = cli("plot", slow, fast, "--out", tmp_path / "both.png", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"wrote {tmp_path / 'both.png'}"
    assert png_size(tmp_path / "both.png") == (1500, 840)  # 15 x 8.4 inches at 100 dpi
    assert 20_000 < (tmp_path / "both.png").stat().st_size < 400_000

    # without --out (in this process: the same main): one run's picture goes into the run
    # directory, several runs' into metrics.png in the current directory
    monkeypatch.chdir(tmp_path)
    assert main(["plot", str(slow)]) == 0
    assert png_size(slow / "metrics.png") == (1500, 840)
    assert main(["plot", str(slow), str(fast)]) == 0
    assert png_size(tmp_path / "metrics.png") == (1500, 840)
    assert main(["plot", str(slow), "--out", "runs.xyz"]) == 2  # no writer for .xyz

    # the series the picture was drawn from
    runs = read_runs([slow, fast])
    assert [r.name for r in runs] == ["lr_1e-3", "lr_3e-3"]
    assert runs[0].tokens_per_iter == 4 * 16 and runs[0].world_size == 1
    assert list(runs[0].eval["iter"]) == [0, 4, 8]
    assert list(runs[0].train["iter"]) == [2, 4, 6, 8]
    assert list(runs[0].eval["tokens"]) == [0, 4 * 64, 8 * 64]
    assert np.all(np.diff(runs[0].train["seconds"]) > 0)


def test_plot_of_a_directory_without_metrics_is_one_line_with_exit_code_2(tmp_path):
    (tmp_path / "run").mkdir()
    run = cli("plot", tmp_path / "run", cwd=tmp_path)
    assert run.returncode == 2
    assert one_error_line(run) == (f"minitorch-gpu plot: error: {tmp_path / 'run'} has no "
                                   f"metrics.jsonl: not a run directory, or its run wrote "
                                   f"nothing yet (train writes "
                                   f"checkpoint.dir/run_name/metrics.jsonl)")
    assert not list(tmp_path.rglob("*.png"))


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "nowhere", "does not exist"),
    (lambda d: _write(d / "metrics.jsonl", ""), "metrics.jsonl is empty"),
    (lambda d: _write(d / "metrics.jsonl", '{"type": "eval", "iter": 0, "train_loss": 4.2, '
                      '"val_loss": 4.2}\n{"type": "train", "iter": 2, "loss": \n'),
     "metrics.jsonl line 2: not JSON"),
    (lambda d: _write(d / "metrics.jsonl", '{"type": "train", "iter": 2, "loss": "low", '
                      '"lr": 1, "step_ms": 1, "tokens_per_s": 1, "mfu": 0.1}\n'),
     "line 1: a train line needs a number 'loss', got 'low'"),
    (lambda d: _write(d / "metrics.jsonl", '[1, 2]\n'), "line 1: expected a JSON object"),
    (lambda d: _write(d / "metrics.jsonl", '{"type": "error", "iter": 3, "error": "nan"}\n'),
     "has no train or eval lines"),
])
def test_bad_metrics_are_one_line_naming_the_line(tmp_path, capsys, make, message):
    """The same main as the command (in this process: a start-up per case is slow)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert main(["plot", str(make(run_dir))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("minitorch-gpu plot: error: ")
    assert message in err[0]
    assert not list(tmp_path.rglob("*.png"))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path.parent


def test_plot_without_matplotlib_names_the_extra(tmp_path):
    run = cli("plot", tmp_path, cwd=tmp_path,
              python_code="import sys; sys.modules['matplotlib'] = None  # not installed")
    assert run.returncode == 2
    assert "pip install -e '.[plot]'" in one_error_line(run)


def test_the_reader_separates_train_and_eval_lines_and_counts_tokens(tmp_path):
    run_dir = tmp_path / "two_ranks"
    run_dir.mkdir()
    # 4 sequences x 2 micro-batches x 16 tokens = 128 per rank; 2 ranks: 256 per iteration
    (run_dir / "config.yaml").write_text(
        "model: {block_size: 16}\ntrain: {batch_size: 4, grad_accum_steps: 2}\n")
    records = [
        {"type": "eval", "iter": 0, "train_loss": 4.0, "val_loss": 4.1, "lr": 1e-4},
        {"type": "train", "iter": 2, "loss": 3.5, "lr": 2e-4, "step_ms": 10.0,
         "tokens_per_s": 25600.0, "mfu": 0.25},
        {"type": "train", "iter": 4, "loss": 3.0, "lr": 3e-4, "step_ms": 20.0,
         "tokens_per_s": 12800.0, "mfu": 0.125},
        {"type": "eval", "iter": 3, "train_loss": 3.1, "val_loss": 3.2},  # between log points
        {"type": "error", "iter": 5, "error": "loss is nan"},
        {"type": "memory", "iter": 5, "peak_mb": 100},  # a kind this reader does not know
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = read_run(run_dir)
    assert run.name == "two_ranks" and run.world_size == 2 and run.tokens_per_iter == 256
    assert list(run.train["iter"]) == [2, 4] and list(run.eval["iter"]) == [0, 3]
    assert list(run.train["loss"]) == [3.5, 3.0] and list(run.eval["val_loss"]) == [4.1, 3.2]
    assert list(run.train["tokens"]) == [512, 1024] and list(run.eval["tokens"]) == [0, 768]
    # training time: 2 steps of 10 ms, then 2 of 20 ms; iteration 3 halfway through those
    np.testing.assert_allclose(run.train["seconds"], [0.02, 0.06])
    np.testing.assert_allclose(run.eval["seconds"], [0.0, 0.04])
    np.testing.assert_allclose(run.train["mfu"], [0.25, 0.125])

    (run_dir / "config.yaml").unlink()
    with pytest.raises(MetricsError, match="has no config.yaml"):
        read_run(run_dir)


# --- TensorBoard --------------------------------------------------------------------------
def read_events(path: Path) -> list:
    """The Event records of a TensorBoard event file: TFRecord framing (length, masked
    CRC-32C of the length, data, masked CRC-32C of the data), each record checked."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c
    data, pos, events = path.read_bytes(), 0, []
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[pos + 8:pos + 12])[0] == masked_crc32c(header)
        body = data[pos + 12:pos + 12 + length]
        assert struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])[0] == \
            masked_crc32c(body)
        events.append(Event.FromString(body))
        pos += 16 + length
    return events


def scalars(events: list) -> dict:
    """{tag: [(step, value), ...]} of the events' scalar summaries."""
    found = {}
    for event in events:
        for value in event.summary.value:
            found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


@pytest.mark.skipif(not HAS_TENSORBOARDX, reason="tensorboardX is not installed "
                                                 "(pip install -e '.[tensorboard]')")
def test_tensorboard_events_mirror_the_metrics_log(tmp_path):
    run_dir = train(tmp_path, "tb", tensorboard=True)
    files = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    found = scalars(read_events(files[0]))
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for kind, keys in (("train", ("loss", "lr", "tokens_per_s", "mfu")),
                       ("eval", ("train_loss", "val_loss"))):
        for key in keys:
            expected = [(r["iter"], r[key]) for r in lines if r["type"] == kind]
            got = found[f"{kind}/{key}"]
            assert [step for step, _ in got] == [step for step, _ in expected]
            np.testing.assert_allclose([v for _, v in got], [v for _, v in expected],
                                       rtol=1e-6)  # stored as float32
    assert [step for step, _ in found["eval/val_loss"]] == [0, 4, 8]

    # resumed: a second file whose first event tells TensorBoard to drop steps after 8
    train(tmp_path, "tb", iters=12, tensorboard=True, extra=("--resume",))
    files = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 2
    resumed = read_events(max(files, key=lambda f: f.stat().st_mtime))
    assert resumed[1].step == 9 and resumed[1].file_version == "brain.Event:2"
    assert [step for step, _ in scalars(resumed)["eval/val_loss"]] == [12]

    # started over: the earlier run's event files go
    train(tmp_path, "tb", tensorboard=True, extra=("--overwrite",))
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_tensorboard_without_its_library_is_one_line_at_the_start(tmp_path):
    (tmp_path / "corpus.txt").write_text("the king said good night.\n" * 200)
    config = tmp_path / "tb.yaml"
    config.write_text(CONFIG.format(corpus=tmp_path / "corpus.txt", cache=tmp_path / "cache",
                                    ckpts=tmp_path / "ckpts", iters=4, lr=1e-3,
                                    tensorboard="true"))
    run = cli("train", config, cwd=tmp_path,
              python_code="import sys; sys.modules['tensorboardX'] = None  # not installed")
    assert run.returncode == 2
    assert "pip install -e '.[tensorboard]'" in one_error_line(run, "train")
    assert not (tmp_path / "ckpts").exists() and not (tmp_path / "cache").exists()


def test_the_logging_section_is_typed_and_off_by_default():
    assert config_from_dict({}).logging.tensorboard is False
    assert config_from_dict({"logging": {"tensorboard": True}}).logging.tensorboard is True
    with pytest.raises(ConfigError, match="'logging.tensorboard': expected true or false"):
        config_from_dict({"logging": {"tensorboard": "yes please"}})
    with pytest.raises(ConfigError, match="did you mean 'logging.tensorboard'"):
        config_from_dict({"logging": {"tensorbord": True}})
