"""One trainer at a time in a run directory, through the real CLI and real processes.

The first trainer is ``python -m minitorch_gpu train`` started through a small launcher that
holds it after its checkpoints of iteration 4 until the test opens a gate: it then certainly
holds the lock (and the directory a run to resume or overwrite) while the second one starts,
and finishes as any run does once the gate opens.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minitorch_gpu.system.atomic import TEMPORARY_NAME, atomic_write, remove_leftover_temporaries
from minitorch_gpu.checkpoint import load_checkpoint
from minitorch_gpu.train.config import load_config
from minitorch_gpu.train.run_lock import LOCK_NAME, RunDirectoryInUse, lock_run_directory
from conftest import corpus_text, single_thread_environment

CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: 0.0}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, max_iters: 8, warmup_iters: 2, lr: 3.0e-3, log_interval: 2}}
eval: {{interval: 4, iters: 2}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7, threads: 1}}
"""

# the CLI, held at iteration 4's step (after its evaluation and checkpoints) until GATE exists
GATED = """\
import sys, time
from pathlib import Path
from minitorch_gpu.train.trainer import Trainer
gate, step = Path(sys.argv[1]), Trainer._step

def gated_step(self):
    while self.iter_num == 4 and not gate.exists():
        time.sleep(0.01)
    return step(self)

Trainer._step = gated_step
sys.argv = ["minitorch-gpu", *sys.argv[2:]]
from minitorch_gpu.cli import entry_point
entry_point()
"""

# the CLI, killed (SIGKILL) in the middle of writing its first checkpoint
KILLED_IN_A_SAVE = """\
import os, signal, sys
from minitorch_gpu.checkpoint import safetensors_file
real_write, written = safetensors_file._write_tensor, [0]

def dying_write(*args, **kwargs):
    written[0] += 1
    if written[0] > 3:  # three arrays are in the temporary file: die mid-file
        os.kill(os.getpid(), signal.SIGKILL)
    return real_write(*args, **kwargs)

safetensors_file._write_tensor = dying_write
sys.argv = ["minitorch-gpu", *sys.argv[1:]]
from minitorch_gpu.cli import entry_point
entry_point()
"""

MPIEXEC = Path(sys.executable).parent / "mpiexec"  # the venv's MPICH (the dist extra)


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "corpus.txt").write_text(corpus_text())
    (tmp_path / "tiny.yaml").write_text(CONFIG.format(
        corpus=tmp_path / "corpus.txt", cache=tmp_path / "cache", ckpts=tmp_path / "ckpts"))
    (tmp_path / "gated.py").write_text(GATED)
    (tmp_path / "killed.py").write_text(KILLED_IN_A_SAVE)
    return tmp_path


def start(workdir: Path, *args: str, launcher: tuple = ("-m", "minitorch_gpu"),
          prefix: tuple = ()) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, *launcher, *map(str, args)],
                            cwd=workdir, env=single_thread_environment(workdir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple:
    """(exit code, stdout, stderr) of a started process."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def start_holder(workdir: Path) -> subprocess.Popen:
    """The first trainer, once it holds the lock and has saved iteration 4."""
    proc = start(workdir, workdir / "gate", "train", "tiny.yaml", "--progress", "lines",
                 launcher=(str(workdir / "gated.py"),))
    run_dir = workdir / "ckpts" / "tiny"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "last.ckpt").exists():  # written last before the gate
            assert (run_dir / LOCK_NAME).exists()
            return proc
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"the first trainer did not start training: {proc.communicate()}")


def snapshot(directory: Path) -> dict:
    """Every file's name, size and modification time: what "nothing touched" compares."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}


def assert_refused_naming(run: tuple, pid: int) -> None:
    code, out, err = run
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err  # one line
    assert f"is in use by another trainer (PID {pid} on host" in err, err
    assert "data:" not in out  # refused before preparing anything


def assert_whole_run(run_dir: Path) -> None:
    """A finished 8-iteration run: its files, each iteration logged once, the checkpoint."""
    assert {p.name for p in run_dir.iterdir()} == {"best.ckpt", "last.ckpt", "config.yaml",
                                                   "metrics.jsonl", "tokenizer.json"}
    assert load_config(run_dir / "config.yaml").train.max_iters == 8
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["iter"] for r in records if r["type"] == "eval"] == [0, 4, 8]
    assert [r["iter"] for r in records if r["type"] == "train"] == [2, 4, 6, 8]
    assert load_checkpoint(run_dir / "last.ckpt").meta["iter_num"] == 8


# --- a second trainer while one runs ------------------------------------------------------
def test_a_second_trainer_resume_or_overwrite_refuses_while_one_runs(workdir):
    first = start_holder(workdir)
    run_dir = workdir / "ckpts" / "tiny"
    try:
        before = snapshot(run_dir)
        # all three at once: the lock, not luck of timing, keeps them out
        others = [start(workdir, "train", "tiny.yaml", *extra)
                  for extra in ([], ["--resume"], ["--overwrite"])]
        for other in others:
            assert_refused_naming(finish(other), first.pid)
        assert snapshot(run_dir) == before  # --overwrite deleted nothing, none wrote
        (workdir / "gate").touch()
        code, out, err = finish(first)
    finally:
        if first.poll() is None:
            first.kill()
    assert code == 0, err
    assert "finished: 8 iterations" in out
    assert_whole_run(run_dir)  # .lock went with its holder


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or not MPIEXEC.exists(),
                    reason=f"needs mpi4py and {MPIEXEC} (pip install -e '.[dist]')")
def test_a_two_rank_job_on_a_held_directory_ends_with_rank_0s_one_line(workdir):
    """Rank 0 holds the lock for the job; its refusal reaches every rank, so the job ends
    with exit code 2 and that line alone (no MPI_Abort and its own message)."""
    first = start_holder(workdir)
    try:
        before = snapshot(workdir / "ckpts" / "tiny")
        job = finish(start(workdir, "-m", "minitorch_gpu", "train", "tiny.yaml",
                           "--overwrite", launcher=(), prefix=(str(MPIEXEC), "-n", "2")))
        assert_refused_naming(job, first.pid)
        assert snapshot(workdir / "ckpts" / "tiny") == before
        (workdir / "gate").touch()
        assert finish(first)[0] == 0
    finally:
        if first.poll() is None:
            first.kill()


# --- a trainer killed outright ------------------------------------------------------------
def test_a_trainer_killed_mid_save_blocks_nothing_and_its_temporary_file_goes(workdir):
    """SIGKILL in the middle of writing best.ckpt: the lock file and the temporary file
    stay. The next trainer is not blocked (the kernel dropped the lock) and removes the
    temporary file, only it."""
    killed = finish(start(workdir, "train", "tiny.yaml", "--progress", "lines",
                          launcher=(str(workdir / "killed.py"),)))
    assert killed[0] == -signal.SIGKILL, killed[2]
    run_dir = workdir / "ckpts" / "tiny"
    assert (run_dir / LOCK_NAME).exists()
    leftovers = [p for p in run_dir.iterdir() if p.name.startswith(".best.ckpt.tmp-")]
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0  # mid-file
    size = leftovers[0].stat().st_size
    unrelated = {"notes.txt": "mine", ".notes.tmp-draft": "not a PID",
                 "best.ckpt.tmp-123": "not hidden", ".best.ckpt.tmp-123.bak": "a suffix",
                 # the pattern, but its writer is alive: a save under way elsewhere
                 TEMPORARY_NAME.format(target="plot.png", pid=os.getpid()): "live"}
    for name, text in unrelated.items():
        (run_dir / name).write_text(text)
    (run_dir / ".stale.tmp-999999999").mkdir()  # a folder, whatever its name

    code, out, err = finish(start(workdir, "train", "tiny.yaml", "--progress", "lines"))
    assert code == 0, err
    assert f"removed 1 temporary file(s) of killed saves from {run_dir} ({size:,} bytes)" \
        in out.splitlines()
    assert not leftovers[0].exists()
    for name, text in unrelated.items():
        assert (run_dir / name).read_text() == text
    assert (run_dir / ".stale.tmp-999999999").is_dir()
    for name in unrelated:  # what remains is the new run's alone
        (run_dir / name).unlink()
    (run_dir / ".stale.tmp-999999999").rmdir()
    assert_whole_run(run_dir)  # and the killed run's lock file went with the new holder


def test_the_cleanup_knows_the_name_atomic_write_writes_under(tmp_path):
    """TEMPORARY_NAME names the file and the clean-up matches by it: a writer killed
    mid-write leaves a file it removes; a live writer's is left alone."""
    with atomic_write(tmp_path / "config.yaml") as file:
        file.write(b"partial")
        (temporary,) = tmp_path.iterdir()
        assert temporary.name == TEMPORARY_NAME.format(target="config.yaml", pid=os.getpid())
        assert remove_leftover_temporaries(tmp_path) == (0, 0)  # its writer is this process
    killed = subprocess.Popen(
        [sys.executable, "-c", "import os, signal\n"
                               "from minitorch_gpu.system.atomic import atomic_write\n"
                               "with atomic_write('last.ckpt') as file:\n"
                               "    file.write(b'partial'); file.flush()\n"
                               "    os.kill(os.getpid(), signal.SIGKILL)"],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    assert killed.wait(timeout=60) == -signal.SIGKILL, killed.stderr.read()
    assert {p.name for p in tmp_path.iterdir()} == {
        "config.yaml", TEMPORARY_NAME.format(target="last.ckpt", pid=killed.pid)}
    assert remove_leftover_temporaries(tmp_path) == (1, len(b"partial"))
    assert {p.name for p in tmp_path.iterdir()} == {"config.yaml"}


def test_a_lock_names_its_holder_and_its_release_removes_the_file(tmp_path):
    held = lock_run_directory(tmp_path)
    assert held.held and held.warning is None
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    with pytest.raises(RunDirectoryInUse, match=rf"in use by another trainer \(PID "
                                                rf"{os.getpid()} on host "):
        lock_run_directory(tmp_path)  # a second open file: flock refuses it too
    held.release()
    held.release()  # twice is harmless
    assert not (tmp_path / LOCK_NAME).exists()
    lock_run_directory(tmp_path).release()
