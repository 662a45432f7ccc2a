"""Data-parallel training on 2 CPU ranks, started by the real ``mpiexec`` (the mpich wheel's,
installed with the ``dist`` extra, which ``dev`` pulls in) as a user starts them.

Each test runs its ranks as subprocesses with one BLAS thread each; a script that has to
look inside the ranks (gradients, weights) prints its verdict from rank 0 as JSON.
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

from minitorch_gpu import distributed
from minitorch_gpu.checkpoint import read_checkpoint_meta
from conftest import corpus_text, single_thread_environment

MPIEXEC = Path(sys.executable).parent / "mpiexec"  # beside this Python: the venv's MPICH
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or not MPIEXEC.exists(),
    reason=f"needs mpi4py and {MPIEXEC} (pip install -e '.[dist]')")

CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: {dropout}}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, grad_accum_steps: {accum}, max_iters: {iters}, warmup_iters: 2,
        lr: 3.0e-3, log_interval: 2}}
eval: {{interval: {interval}, iters: 3}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7, threads: 1, dist_timeout_s: {timeout}}}
"""


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "corpus.txt").write_text(corpus_text())
    return tmp_path


def write_config(workdir: Path, *, iters: int = 8, interval: int = 4, accum: int = 1,
                 dropout: float = 0.0, timeout: float = 60) -> Path:
    path = workdir / "tiny.yaml"
    path.write_text(CONFIG.format(corpus=workdir / "corpus.txt", cache=workdir / "cache",
                                  ckpts=workdir / "ckpts", iters=iters, interval=interval,
                                  accum=accum, dropout=dropout, timeout=timeout))
    return path


def mpiexec(*args: str, workdir: Path, ranks: int = 2,
            timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, *map(str, args)],
                          cwd=workdir, env=single_thread_environment(workdir), capture_output=True,
                          text=True, timeout=timeout)


def rank0_verdict(run: subprocess.CompletedProcess) -> dict:
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, run.stdout  # rank 0 alone prints it
    return json.loads(lines[0])


# --- the gradient all-reduce --------------------------------------------------------------
GRADIENT_SCRIPT = """\
import json
import numpy as np
import minitorch_gpu as mt
from minitorch_gpu import distributed
from minitorch_gpu.nn import GPT, GPTConfig

group = distributed.world()
config = GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, dropout=0.0)

def fresh_model():
    mt.manual_seed(0)
    return GPT(config)

def loss_of(model, rows):  # rows: (B, T + 1) tokens
    _, loss = model(mt.tensor(rows[:, :-1]), mt.tensor(rows[:, 1:]))
    return loss

batches = np.random.default_rng(1).integers(0, 11, size=(2, 4, 9))  # rank r's: batches[r]
model = fresh_model()
if group.rank == 1:  # other weights on purpose: the broadcast must replace them
    for p in model.parameters():
        p.data += 0.5
group.broadcast_parameters(model.parameters())
loss_of(model, batches[group.rank]).backward()
group.allreduce_gradients(model.parameters())
grads = [p.grad.numpy() for p in model.parameters()]
weights = [p.detach().numpy() for p in model.parameters()]
every = group.gather_object({"grads": [g.tolist() for g in grads],
                             "weights": [w.tolist() for w in weights]})
if group.is_main:
    reference = fresh_model()  # one process, both ranks' batches as one batch of 8
    loss_of(reference, np.concatenate(list(batches))).backward()
    expected = [p.grad.numpy() for p in reference.parameters()]
    other = every[1]
    print(json.dumps({
        "dtype": str(grads[0].dtype),
        "ranks_agree": all(np.array_equal(g, np.asarray(o, dtype=g.dtype))
                           for g, o in zip(grads, other["grads"])),
        "weights_agree": all(np.array_equal(w, np.asarray(o, dtype=w.dtype))
                             for w, o in zip(weights, other["weights"])),
        "worst_relative_error": max(float(np.abs(g - e).max() / np.abs(e).max())
                                    for g, e in zip(grads, expected)),
    }))
"""


def test_the_averaged_gradient_is_the_gradient_of_both_batches_together(workdir):
    """Each rank's loss is the mean over its own 4 sequences; the mean of the two ranks'
    gradients is then the gradient of the mean over all 8, which one process computes."""
    script = workdir / "gradients.py"
    script.write_text(GRADIENT_SCRIPT)
    verdict = rank0_verdict(mpiexec(script, workdir=workdir))
    assert verdict["dtype"] == "float32"
    assert verdict["weights_agree"] and verdict["ranks_agree"]
    assert verdict["worst_relative_error"] <= 1e-6, verdict


# --- the trainer --------------------------------------------------------------------------
TRAINER_SCRIPT = """\
import json, sys
from minitorch_gpu.train.config import load_config
from minitorch_gpu.train.trainer import Trainer

trainer = Trainer(load_config(sys.argv[1]), progress=False)
trainer.fit()
params = list(trainer.model.parameters())
moments = [trainer.optimizer.state[p][key] for p in params for key in ("exp_avg", "exp_avg_sq")]
mine = {"weights": [p.detach().numpy().tolist() for p in params],
        "moments": [m.numpy().tolist() for m in moments],
        "sampler_seed": trainer.sampler.seed}
every = trainer.group.gather_object(mine)
if trainer.group.is_main:
    first, second = every
    print(json.dumps({
        "iterations": trainer.iter_num,
        "weights_identical": first["weights"] == second["weights"],
        "moments_identical": first["moments"] == second["moments"],
        "sampler_seeds": [first["sampler_seed"], second["sampler_seed"]],
    }))
"""


def test_weights_stay_identical_across_ranks_for_20_steps(workdir):
    """With dropout (each rank its own masks) and gradient accumulation, after 20 steps
    every weight and every AdamW moment is bit for bit the same on both ranks, though each
    rank trained on its own batches."""
    config = write_config(workdir, iters=20, interval=1000, accum=2, dropout=0.1)
    script = workdir / "train_and_compare.py"
    script.write_text(TRAINER_SCRIPT)
    verdict = rank0_verdict(mpiexec(script, config, workdir=workdir))
    assert verdict["iterations"] == 20
    assert verdict["weights_identical"] and verdict["moments_identical"]
    seeds = verdict["sampler_seeds"]
    assert seeds[0] == 7 and seeds[1] != 7  # rank 0 keeps system.seed; rank 1 its own


def test_a_two_rank_cli_run_writes_one_run_directory_and_resumes_on_two_ranks(workdir):
    config = write_config(workdir)
    run = mpiexec("-m", "minitorch_gpu", "train", config, "--progress", "lines",
                  workdir=workdir)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("finished: 8 iterations") == 1  # rank 0 reports, alone
    assert "x 2 ranks" in run.stdout
    run_dir = workdir / "ckpts" / "tiny"
    assert {p.name for p in run_dir.iterdir()} == {"best.ckpt", "last.ckpt", "config.yaml",
                                                   "metrics.jsonl", "tokenizer.json"}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records if r["type"] == "eval"] == [0, 4, 8]
    assert [r["iter"] for r in records if r["type"] == "train"] == [2, 4, 6, 8]
    meta = read_checkpoint_meta(run_dir / "last.ckpt")
    assert meta["world_size"] == 2 and len(meta["other_ranks"]) == 1
    assert meta["other_ranks"][0]["sampler"] != meta["sampler"]

    one = mpiexec("-m", "minitorch_gpu", "train", config, "--resume", workdir=workdir,
                  ranks=1)
    assert one.returncode == 2
    assert "saved by a run of 2 rank(s), and this one has 1" in one.stderr
    assert "Traceback" not in one.stderr

    more = mpiexec("-m", "minitorch_gpu", "train", config, "--resume", "--set",
                   "train.max_iters=10", "--progress", "lines", workdir=workdir)
    assert more.returncode == 0, more.stderr
    assert "resumed" in more.stdout and "finished: 10 iterations" in more.stdout
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records if r["type"] == "eval"] == [0, 4, 8, 10]


# --- a rank that dies or hangs ------------------------------------------------------------
LAUNCHER = """\
import os, sys
from pathlib import Path
rank = os.environ.get("PMI_RANK") or os.environ["OMPI_COMM_WORLD_RANK"]
Path(sys.argv[1], f"rank{rank}.pid").write_text(str(os.getpid()))
sys.argv = ["minitorch-gpu", *sys.argv[2:]]
from minitorch_gpu.cli import entry_point
entry_point()
"""


def start_training(workdir: Path, timeout: float) -> tuple:
    """A long 2-rank run, once it is training: (the mpiexec process, rank 1's pid)."""
    config = write_config(workdir, iters=100000, interval=100000, timeout=timeout)
    launcher = workdir / "launch.py"
    launcher.write_text(LAUNCHER)
    proc = subprocess.Popen([str(MPIEXEC), "-n", "2", sys.executable, str(launcher),
                             str(workdir), "train", str(config), "--progress", "lines"],
                            cwd=workdir, env=single_thread_environment(workdir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics = workdir / "ckpts" / "tiny" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and '"type": "train"' in metrics.read_text():
            return proc, int((workdir / "rank1.pid").read_text())
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the run did not start training: {proc.communicate()}")


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_rank_that_dies_or_hangs_ends_the_job_with_an_error(workdir, how):
    """SIGKILL: mpiexec sees the rank go and ends the others. SIGSTOP: nothing tells
    mpiexec, so rank 0's next all-reduce runs past system.dist_timeout_s (2 s here) and
    rank 0 ends the job."""
    proc, rank1 = start_training(workdir, timeout=2)
    try:
        os.kill(rank1, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        # the job must end by itself: a hang is the subprocess timeout's failure
        # (TimeoutExpired), not a measured duration compared with a bound
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.kill(rank1, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode != 0
    if how == "hung":
        assert "rank 0 of 2" in err and "waited 2 s for the other ranks" in err


NAN_ON_RANK_1 = """\
import os, sys
rank = int(os.environ.get("PMI_RANK") or os.environ["OMPI_COMM_WORLD_RANK"])
from minitorch_gpu.nn import GPT
forward = GPT.forward
calls = [0]

def forward_going_bad_on_rank_1(self, idx, targets=None, **kwargs):
    logits, loss = forward(self, idx, targets, **kwargs)
    if self.training:
        calls[0] += 1
        if rank == 1 and calls[0] >= 4 and loss is not None:
            loss = loss * float("nan")
    return logits, loss

GPT.forward = forward_going_bad_on_rank_1
sys.argv = ["minitorch-gpu", *sys.argv[1:]]
from minitorch_gpu.cli import entry_point
entry_point()
"""


def test_a_nan_on_one_rank_stops_every_rank_and_rank_0_records_it(workdir):
    config = write_config(workdir, iters=50, interval=100000)
    launcher = workdir / "nan.py"
    launcher.write_text(NAN_ON_RANK_1)
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(launcher), "train",
                           str(config), "--progress", "lines"], cwd=workdir,
                          env=single_thread_environment(workdir), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "the loss became nan at iteration 3" in done.stderr
    records = [json.loads(line) for line in
               (workdir / "ckpts" / "tiny" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1] == {"type": "error", "iter": 3, "error": "loss is nan"}


# --- without MPI --------------------------------------------------------------------------
def test_a_process_no_launcher_started_is_a_group_of_one_without_mpi(monkeypatch):
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.launched_world_size() == 1
    code = ("import sys; from minitorch_gpu import distributed; g = distributed.world(); "
            "print(type(g).__name__, g.rank, g.world_size, 'mpi4py' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)  # in the environment just cleared of launcher variables
    assert run.stdout.split() == ["ProcessGroup", "0", "1", "False"], run.stderr
    monkeypatch.setenv("PMI_SIZE", "4")
    assert distributed.launched_world_size() == 4


def test_rank_seeds_keep_rank_0s_and_differ_from_the_evaluation_seeds():
    assert distributed.rank_seed(7, 0) == 7
    seeds = {distributed.rank_seed(7, rank) for rank in range(1, 64)}
    assert len(seeds) == 63 and not seeds & {7, 8, 9}


# --- placing ranks on GPUs ----------------------------------------------------------------
def test_one_gpu_for_every_rank_of_a_machine_is_a_one_line_error(workdir):
    run = mpiexec("-m", "minitorch_gpu", "train", write_config(workdir), "--device", "cuda:0",
                  workdir=workdir)
    assert run.returncode == 2
    assert "system.device: 'cuda:0' would put all 2 ranks of this machine on one GPU; use " \
           "'cuda'" in run.stderr
    assert "Traceback" not in run.stderr


def test_more_ranks_on_a_machine_than_gpus_is_refused(monkeypatch):
    group = object.__new__(distributed.MPIProcessGroup)  # placement only: no MPI needed
    group.rank = group.local_rank = 2
    group.world_size = group.local_size = 3
    monkeypatch.setattr("minitorch_gpu.cuda.device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"3 ranks run on this machine but it has 2 CUDA "
                                         r"device\(s\); start at most 2 ranks per machine"):
        group.rank_device("cuda")
    assert group.rank_device("cpu") == "cpu"
