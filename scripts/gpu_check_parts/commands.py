"""Each step's command: on a GPU, and in the dry run on the emulated GPU (each step's
environment sets MINITORCH_EMULATE_CUDA=1 there, so "cuda" is the CuPy stand-in on the CPU:
the same commands at tiny sizes; only compute-sanitizer stays an echo)."""
from __future__ import annotations

import glob
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from .definitions import (CORE_TEST_FILES, EMULATED_REST_DESELECTED, EMULATED_REST_IGNORED,
                          EMULATED_TESTS_DESELECTED, GPT2, MEMCHECK_SELECTION,
                          POOL_OFF_PYTEST, RACECHECK_SELECTION, REPO, SCRIPT, TINY, TOP_K,
                          Command, Run)


def pytest_command(run: Run, targets: List[str], *, parallel: bool,
                   python: Optional[List[str]] = None, extra: Sequence[str] = ()) -> List[str]:
    """pytest of the cuda-marked tests in ``targets``: one line per test (so a run cut short
    still says what passed), short tracebacks, failures and errors listed at the end, the
    15 slowest timed; in parallel where pytest-xdist is importable and it helps."""
    command = (python or [run.python, "-m", "pytest"]) + [
        "-p", "no:cacheprovider", "-v", "--color=no", "--tb=short", "-rfE", "--durations=15",
        "-m", "cuda", *extra]
    if run.dry:  # hypothesis's plugin alone would double the time of a small selection
        command += ["-p", "no:hypothesispytest"]
    if parallel and run.xdist:
        command += ["-n", "auto"]
    return command + targets


def env_command(run: Run) -> Command:
    return [run.python, str(SCRIPT), "--env-record"] + \
        (["--dry-run"] if run.dry else [])


def tests_command(run: Run) -> Command:
    extra = ["-k", EMULATED_TESTS_DESELECTED] if run.dry else []
    return pytest_command(run, CORE_TEST_FILES, parallel=True, extra=extra)


def rest_command(run: Run) -> Command:
    ignored = [f"--ignore={path}" for path in CORE_TEST_FILES]
    extra: List[str] = []
    if run.dry:
        ignored += [f"--ignore={Path(path).relative_to(REPO)}"
                    for path in sorted(glob.glob(str(REPO / EMULATED_REST_IGNORED)))]
        extra = ["-k", EMULATED_REST_DESELECTED]
    return pytest_command(run, ["tests/", *ignored], parallel=True, extra=extra)


def bench_command(run: Run) -> Command:
    # the dry run: the smallest case, one timed step (~5 s emulated), on the emulated GPU:
    # its speed means nothing, its records and the bench's path on "cuda" are what count
    case = ["--case", "baby", "--steps", "1", "--warmup", "0"] if run.dry else \
        ["--case", "gpt2", "--steps", "10", "--warmup", "3"]
    return [run.python, "-m", "minitorch_gpu", "bench", *case, "--device", "cuda", "--bf16",
            "--no-generate"]


def decode_command(run: Run) -> Command:
    """Generation's per-token time, eager against the captured step's CUDA Graph."""
    sizes = ["--cases", "baby", "--tokens", "6", "--repeats", "1"] if run.dry else \
        ["--cases", "baby,small,gpt2", "--tokens", "100", "--repeats", "2"]
    return [run.python, "scripts/bench_decode.py", "--device", "cuda", *sizes]


def topk_decode_command(run: Run) -> Command:
    """decode_command with top-k sampling (TOP_K) inside the captured step: whether it
    replays from a CUDA Graph. bench_decode.py runs the captured generation first and
    exits with the error when the capture fails or is no graph. On a GPU GPT-2 124M's
    vocabulary (50,304), where top-k is a partition of a real row; 50 tokens fit its
    limit beside the model's set-up (per-token times compare with decode's, the cache's
    shape being the same at every position)."""
    sizes = ["--cases", "baby", "--tokens", "6", "--repeats", "1"] if run.dry else \
        ["--cases", "gpt2", "--tokens", "50", "--repeats", "2"]
    return [run.python, "scripts/bench_decode.py", "--device", "cuda", "--top-k", str(TOP_K),
            *sizes]


def train_corpus(chars: int = 3_000_000) -> tuple:
    """(--set overrides, a line saying which corpus): $TINYSHAKESPEARE, else
    $MINITORCH_GPU_CORPUS, else the first ``chars`` characters of the standard
    library (on every machine)."""
    notes = []
    for variable, source in (("TINYSHAKESPEARE", "tinyshakespeare"),
                             ("MINITORCH_GPU_CORPUS", "text_files")):
        path = os.environ.get(variable)
        if path and Path(path).is_file():
            return ([f"data.source={source}", f"data.path={Path(path).resolve()}"],
                    f"${variable}: {path} (data source {source})")
        if path:
            notes.append(f"${variable}={path} is not a file")
    note = f" ({'; '.join(notes)})" if notes else ""
    return (["data.source=python_stdlib", f"data.max_chars={chars}"],
            f"python_stdlib: the first {chars:,} characters of this interpreter's "
            f"standard library{note}")


def stdlib_chars(run: Run) -> int:
    return 20_000 if run.dry else 3_000_000


def train_command(config: str, iters: int, folder: str,
                  dtype: Optional[str] = None) -> Callable[[Run], Command]:
    """The command of a step that trains ``config`` for ``iters`` iterations in its own
    dtype (bf16) or in ``dtype``, writing under run.work / ``folder``."""

    def command(run: Run) -> Command:
        # built just before the step runs: a rerun's figure must not read the metrics an
        # earlier run left there (append_metrics) when this one fails before writing its own
        shutil.rmtree(run.work / folder, ignore_errors=True)
        corpus, _ = train_corpus(stdlib_chars(run))
        sets = corpus + [f"checkpoint.dir={run.work / folder}"]
        if dtype is not None:
            sets.append(f"system.dtype={dtype}")
        if run.dry:  # the config's own device (cuda) and bf16, two iterations at tiny sizes
            sets += ["model.n_layer=1", "model.n_head=2", "model.n_embd=32",
                     "model.block_size=16", "train.batch_size=2", "train.max_iters=2",
                     "train.warmup_iters=1", "train.lr_decay_iters=2",
                     "train.log_interval=1", "eval.interval=2", "eval.iters=1"]
            if "llama" in config:
                sets += ["model.n_kv_head=1", "model.ffn_hidden=64"]
        else:  # the warm-up and the decay must fit in the iterations run (config validation)
            sets += [f"train.max_iters={iters}", f"train.warmup_iters={iters // 10}",
                     f"train.lr_decay_iters={iters}", f"eval.interval={iters // 3}",
                     "eval.iters=20"]
        command = [run.python, "-m", "minitorch_gpu", "train", config, "--progress", "lines",
                   "--overwrite"]
        for item in sets:
            command += ["--set", item]
        return command

    return command


def profile_command(run: Run) -> Command:
    # model.vocab_size set: a fresh model of the shape, no data to prepare
    command = [run.python, "-m", "minitorch_gpu", "profile", "configs/gpt2_124m.yaml",
               "--backward", "--sort", "time", "--device", "cuda"]
    if run.dry:
        command += ["--batch-size", "2", "--warmup", "0", "--iters", "1"]
        command += [arg for key, value in TINY.items() for arg in ("--set", f"model.{key}={value}")]
    else:
        command += ["--set", f"model.vocab_size={GPT2['vocab_size']}", "--batch-size", "8",
                    "--warmup", "1", "--iters", "3"]
    return command


def find_sanitizer() -> Optional[str]:
    """compute-sanitizer on PATH, in a CUDA toolkit under /usr/local or /opt, or in a pip
    wheel of NVIDIA's (site-packages/nvidia/...)."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    patterns = ["/usr/local/cuda*/bin/compute-sanitizer",
                "/usr/local/cuda*/compute-sanitizer/compute-sanitizer",
                "/opt/nvidia/*/bin/compute-sanitizer", "/opt/cuda*/bin/compute-sanitizer"]
    patterns += [os.path.join(entry, "nvidia", "*", "**", "compute-sanitizer")
                 for entry in sys.path if entry.endswith("-packages")]
    for pattern in patterns:
        for path in sorted(glob.glob(pattern, recursive=True), reverse=True):
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


def sanitizer_command(run: Run, tool: str, extra: List[str]) -> Command:
    pytest_in_python = [run.python, "-c", POOL_OFF_PYTEST]
    tests = pytest_command(run, ["tests/test_kernels.py"], parallel=False,
                           python=pytest_in_python, extra=extra)
    if run.dry:  # GPU-only: an echo in place of the sanitizer, then the same tests emulated
        return ["sh", "-c", 'echo "(dry run: compute-sanitizer --tool $0 is GPU-only; its '
                            'tests run on the emulated GPU without it)"; "$@"', tool, *tests]
    if run.sanitizer is None:
        return ("compute-sanitizer not found (looked on PATH, in /usr/local/cuda*/bin and in "
                "NVIDIA's pip wheels)")
    return [run.sanitizer, "--tool", tool, "--error-exitcode", "1", "--print-limit", "100",
            "--target-processes", "all", *tests]


def memcheck_command(run: Run) -> Command:
    return sanitizer_command(run, "memcheck", ["-k", MEMCHECK_SELECTION])


def racecheck_command(run: Run) -> Command:
    return sanitizer_command(run, "racecheck", ["-k", RACECHECK_SELECTION])

