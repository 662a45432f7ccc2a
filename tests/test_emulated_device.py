"""The ``cuda`` device end to end on the emulated GPU, through the CLI as a user runs it:
real processes, a real checkpoint on disk, read back on the CPU. And what a machine
without a GPU says when ``cuda`` is asked for: "install CuPy" where CuPy is absent, one
line naming the cause where CuPy is present but no GPU is.

These run in the default suite (README's ``python -m pytest -q``): each process sets
``MINITORCH_EMULATE_CUDA=1`` itself, so nothing here depends on how pytest was started.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import corpus_text, single_thread_environment
from minitorch_gpu.backend.emulated_cuda import unavailable_reason
from minitorch_gpu.backend.emulated_cuda.stand_in import reference

CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, dropout: 0.0}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, max_iters: 3, warmup_iters: 1, lr: 3.0e-3, log_interval: 1,
        grad_clip: 1.0}}
eval: {{interval: 3, iters: 1}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7, device: cpu}}
"""
EMULATED_LINE = "the GPU is emulated on the CPU (MINITORCH_EMULATE_CUDA=1)"

needs_emulator = pytest.mark.skipif(unavailable_reason() is not None,
                                    reason=f"no emulated GPU here: {unavailable_reason()}")


def _cli(args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "minitorch_gpu", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "corpus.txt").write_text(corpus_text(200))
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.format(corpus=tmp_path / "corpus.txt", cache=tmp_path / "cache",
                                    ckpts=tmp_path / "ckpts"))
    return tmp_path, config


@pytest.mark.cuda
@needs_emulator
def test_the_cli_trains_on_the_emulated_gpu_and_the_cpu_samples_its_checkpoint(run_dir):
    """bf16 autocast with float32 master weights, the fused kernels, AdamW, clipping, an
    evaluation and a checkpoint, all on the emulated device; then generate and profile."""
    workdir, config = run_dir
    env = single_thread_environment(workdir)
    env.pop("MINITORCH_EMULATE_CUDA", None)  # the CPU's processes: without the switch
    env["MINITORCH_GPU_CACHE"] = os.environ["MINITORCH_GPU_CACHE"]  # the session's: the
    # emulated kernels compiled once, not in every process
    emulated = {**env, "MINITORCH_EMULATE_CUDA": "1"}
    train = _cli(["train", str(config), "--set", "system.device=cuda", "--set",
                  "system.dtype=bf16"], emulated)
    assert train.returncode == 0, train.stderr
    assert EMULATED_LINE in train.stderr
    run = workdir / "ckpts" / "tiny"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if m["type"] == "train"]
    evals = [m["val_loss"] for m in metrics if m["type"] == "eval"]
    assert len(losses) == 3 and all(0 < loss < 10 for loss in losses), metrics
    assert len(evals) == 2 and evals[-1] < evals[0], metrics  # it learned something
    checkpoint = run / "last.ckpt"
    assert checkpoint.is_file()

    # the checkpoint written from device arrays, sampled on the CPU without the switch
    generate = _cli(["generate", str(run), "--device", "cpu", "--prompt", "the king",
                     "--max-new-tokens", "12", "--seed", "3"], env)
    assert generate.returncode == 0, generate.stderr
    assert generate.stdout.startswith("the king") and len(generate.stdout) >= 20
    assert EMULATED_LINE not in generate.stderr

    # and on the emulated GPU: the same greedy tokens as on the CPU
    greedy = ["generate", str(run), "--prompt", "the king", "--max-new-tokens", "8",
              "--temperature", "0"]
    on_cpu = _cli(greedy + ["--device", "cpu"], env)
    on_gpu = _cli(greedy + ["--device", "cuda"], emulated)
    assert on_gpu.returncode == 0, on_gpu.stderr
    assert on_gpu.stdout == on_cpu.stdout

    profile = _cli(["profile", str(config), "--set", "system.device=cuda"], emulated)
    assert profile.returncode == 0, profile.stderr
    assert EMULATED_LINE in profile.stderr
    assert "tokens on cuda:0" in profile.stdout and "FLOPs counted" in profile.stdout


def _ask_for_cuda(env):
    code = ("import minitorch_gpu as mt\n"
            "try:\n    mt.zeros(2, device='cuda')\n"
            "except RuntimeError as exc:\n    print(exc)\n")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_without_cupy_cuda_says_to_install_it():
    env = {k: v for k, v in os.environ.items() if k != "MINITORCH_EMULATE_CUDA"}
    probe = subprocess.run([sys.executable, "-c", "import cupy"], env=env,
                           capture_output=True, timeout=120)
    if probe.returncode == 0:
        pytest.skip("CuPy is importable in this environment")
    asked = _ask_for_cuda(env)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.startswith("device 'cuda:0' is not available: CuPy is not importable")
    assert "pip install -e '.[cuda12]'" in asked.stdout and asked.stdout.count("\n") == 1


def test_with_cupy_and_no_gpu_cuda_is_one_line_naming_the_cause():
    folder = reference.reference_folder()
    if not (folder / "cupy").is_dir():
        pytest.skip(f"no reference CuPy in {folder}: {reference.INSTALL}")
    env = {k: v for k, v in os.environ.items() if k != "MINITORCH_EMULATE_CUDA"}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env.get("PYTHONPATH", "")])
    env["PYTHONWARNINGS"] = "ignore"  # CuPy warns that NCCL is missing: not the point
    asked = _ask_for_cuda(env)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.count("\n") == 1, asked.stdout
    assert asked.stdout.startswith("device 'cuda:0' is not available: CuPy is installed but "
                                   "no CUDA GPU is usable")
