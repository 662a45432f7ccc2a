#!/usr/bin/env python3
"""The GPU check: one prepared run on a GPU machine that shows every failure at once.

A GPU machine comes for minutes, so each step runs as its own process group under its own
time limit (all limits together at most 360 s), the most informative first, and a step
that fails or runs out of time never stops the next:

  env        nvidia-smi, CuPy's config, versions; whether minitorch_gpu sees the GPU and
             bf16 round-trips through CuPy
  tests      the kernel, amp, backend and kernel-dispatch tests on cuda (pytest -m cuda)
  bench      minitorch-gpu bench --case gpt2 --bf16: the GPT-2 124M training step in bf16,
             ms/step, tokens/s, MFU against the bf16 matmul peak measured in the same run
  train      configs/shakespeare_char_gpu.yaml in bf16, cut to 220 iterations
  llama      configs/llama_small.yaml in bf16, cut to 120 iterations: rms_norm, rotary,
             swiglu and grouped-query attention on the GPU in a real run
  profile    minitorch-gpu profile --backward of the GPT-2 124M shape
  memcheck   compute-sanitizer --tool memcheck over the kernel tests
  rest       the rest of the cuda op table (pytest -m cuda over every other test file)
  racecheck  compute-sanitizer --tool racecheck over a few kernel tests

It needs nothing beside the checkout: the training corpus is this interpreter's standard
library (data source python_stdlib) unless $TINYSHAKESPEARE or $MINITORCH_GPU_CORPUS names
a text file. Caches and checkpoints go under --work (/tmp); at most 8 files come out under
$OUT (or --out), each cut to its head and its informative end, the summary table last.

    python scripts/gpu_check.py                     # the whole check (exit 0: none failed)
    python scripts/gpu_check.py --only bench,train  # rerun the steps that failed
    python scripts/gpu_check.py --only rest --limit rest=200
    python scripts/gpu_check.py --list              # the steps, their limits and the total
    python scripts/gpu_check.py --dry-run           # the plumbing on the CPU, in seconds

The dry run starts every step as a real subprocess under its limit with the device work
replaced by a stand-in (pytest of one skipped test, tiny CPU shapes, echo for nvidia-smi
and compute-sanitizer); tests/test_gpu_check.py runs it.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

REPO = Path(__file__).resolve().parent.parent
TOTAL_LIMIT_S = 360  # what one run of the check may spend in its steps
MAX_FILES = 8  # what comes back from the GPU machine: 8 files ...
FILE_CAP = 16 << 20  # ... of at most 16 MiB each
SECTION_CAP = 4 << 20  # one step's log in its file: the first HEAD_BYTES and the last rest
HEAD_BYTES = 512 << 10
TEST_TIMEOUT_ENV = "MINITORCH_GPU_TEST_TIMEOUT"  # read by tests/conftest.py
# a test hook, honoured only with --dry-run: "STEP=fail,STEP=timeout" replaces those steps'
# stand-ins with a command that fails, or one that hangs (with a child ignoring SIGINT) under
# a limit of INJECTED_TIMEOUT_S
INJECT_ENV = "MINITORCH_GPU_CHECK_INJECT"
INJECTED_TIMEOUT_S = 3

CORE_TEST_FILES = ["tests/test_kernels.py", "tests/test_amp.py", "tests/test_backend.py",
                   "tests/test_kernel_dispatch.py"]
# the dry run's pytest stand-in: a cuda-marked test that skips on the CPU
STAND_IN_TESTS = ["tests/test_gpu_check.py"]
# racecheck is slow: kernels with shared-memory reductions and tiles, one case each
RACECHECK_SELECTION = ("flash_attention_kernel_on_gpt_head_views or "
                       "cross_entropy_kernel_matches_its_twin or "
                       "(layer_norm_kernel and both and shape0) or "
                       "(attention_softmax_kernel_matches_its_twin and bf16 and shape0)")
# memcheck slows a kernel down ~100x: one or a few cases per kernel (every .cu file, both
# probability types of the attention softmax, bf16 flash on head views, a cuBLAS call on
# them), the rest left to the tests step
MEMCHECK_SELECTION = ("(layer_norm_kernel and both and shape0) or (gelu_kernel and shape1) or "
                      "cross_entropy_kernel_matches_its_twin or adamw_kernel or "
                      "flash_attention_kernel_on_gpt_head_views or "
                      "(reads_gpt_heads_as_stored and bf16) or "
                      "(attention_softmax_kernel_matches_its_twin and shape0) or "
                      "(bf16_products_through_cublas and heads)")
# under compute-sanitizer, CuPy's memory pool is turned off first: memcheck only sees
# accesses outside whole allocations, and a pool makes one allocation of many arrays
POOL_OFF_PYTEST = ("import sys\n"
                   "try:\n"
                   "    import cupy\n"
                   "    cupy.cuda.set_allocator(None)\n"
                   "    cupy.cuda.set_pinned_memory_allocator(None)\n"
                   "    print('CuPy memory pools off', flush=True)\n"
                   "except ImportError as exc:\n"
                   "    print(f'no CuPy here ({exc})', flush=True)\n"
                   "import pytest\n"
                   "sys.exit(pytest.main(sys.argv[1:]))\n")
GPT2 = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 50304}
TINY = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 64}


@dataclass
class Run:
    """What every step's command is built from."""

    dry: bool
    out: Path  # the files that come back
    work: Path  # caches, checkpoints and the full logs
    python: str = sys.executable
    xdist: bool = False  # pytest-xdist importable: tests run with -n auto
    sanitizer: Optional[str] = None  # compute-sanitizer's path
    inject: Dict[str, str] = field(default_factory=dict)


Command = Union[List[str], str]  # a str: why the step is skipped


@dataclass
class Step:
    name: str
    limit_s: int
    file: str  # its log's file under $OUT (two steps may share one)
    what: str
    command: Callable[[Run], Command]
    figure: Callable[[str, Run], str]  # the key figure, from the step's whole log
    test_timeout_s: Optional[int] = None  # per-test limit for the pytest steps
    after: Optional[Callable[[Run, Path], None]] = None  # adds to the log when it has ended
    note: Optional[Callable[[Run], str]] = None  # a line for the head of its log


@dataclass
class Result:
    step: Step
    status: str  # ok | FAILED rc N | TIMEOUT | skipped
    seconds: float
    limit_s: int
    figure: str
    log: Path


# --- the commands ---------------------------------------------------------------------------
def pytest_command(run: Run, targets: List[str], *, parallel: bool,
                   python: Optional[List[str]] = None, extra: Sequence[str] = ()) -> List[str]:
    """pytest of the cuda-marked tests in ``targets``: one line per test (so a run cut short
    still says what passed), short tracebacks, failures and errors listed at the end, the
    15 slowest timed; in parallel where pytest-xdist is importable and it helps."""
    command = (python or [run.python, "-m", "pytest"]) + [
        "-p", "no:cacheprovider", "-v", "--color=no", "--tb=short", "-rfE", "--durations=15",
        "-m", "cuda", *extra]
    if run.dry:  # one skipped test; hypothesis's plugin alone would double its time
        return command + ["-p", "no:hypothesispytest"] + STAND_IN_TESTS
    if parallel and run.xdist:
        command += ["-n", "auto"]
    return command + targets


def env_command(run: Run) -> Command:
    return [run.python, str(Path(__file__).resolve()), "--env-record"] + \
        (["--dry-run"] if run.dry else [])


def tests_command(run: Run) -> Command:
    return pytest_command(run, CORE_TEST_FILES, parallel=True)


def rest_command(run: Run) -> Command:
    ignored = [f"--ignore={path}" for path in CORE_TEST_FILES]
    return pytest_command(run, ["tests/", *ignored], parallel=True)


def bench_command(run: Run) -> Command:
    # the dry run: the smallest case, a handful of steps (--quick), on the CPU
    case = ["--case", "baby", "--quick", "--device", "cpu"] if run.dry else \
        ["--case", "gpt2", "--device", "cuda", "--steps", "10", "--warmup", "3"]
    return [run.python, "-m", "minitorch_gpu", "bench", *case, "--bf16", "--no-generate"]


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


def train_command(config: str, iters: int, folder: str) -> Callable[[Run], Command]:
    """The command of a step that trains ``config`` in bf16 for ``iters`` iterations,
    writing under run.work / ``folder``."""

    def command(run: Run) -> Command:
        # built just before the step runs: a rerun's figure must not read the metrics an
        # earlier run left there (append_metrics) when this one fails before writing its own
        shutil.rmtree(run.work / folder, ignore_errors=True)
        corpus, _ = train_corpus(stdlib_chars(run))
        sets = corpus + [f"checkpoint.dir={run.work / folder}"]
        if run.dry:
            sets += ["model.n_layer=1", "model.n_head=2", "model.n_embd=32",
                     "model.block_size=32", "train.batch_size=4", "train.max_iters=4",
                     "train.warmup_iters=1", "train.lr_decay_iters=4",
                     "train.log_interval=1", "eval.interval=2", "eval.iters=2"]
            if "llama" in config:
                sets += ["model.n_kv_head=1", "model.ffn_hidden=64"]
        else:  # the warm-up and the decay must fit in the iterations run (config validation)
            sets += [f"train.max_iters={iters}", f"train.warmup_iters={iters // 10}",
                     f"train.lr_decay_iters={iters}", f"eval.interval={iters // 3}",
                     "eval.iters=20"]
        command = [run.python, "-m", "minitorch_gpu", "train", config, "--progress", "lines",
                   "--overwrite"] + (["--device", "cpu"] if run.dry else [])
        for item in sets:
            command += ["--set", item]
        return command

    return command


def profile_command(run: Run) -> Command:
    # model.vocab_size set: a fresh model of the shape, no data to prepare
    command = [run.python, "-m", "minitorch_gpu", "profile", "configs/gpt2_124m.yaml",
               "--backward", "--sort", "time"]
    if run.dry:
        command += ["--device", "cpu", "--batch-size", "2", "--warmup", "0", "--iters", "1"]
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
    if run.dry:  # echo in place of the sanitizer, then the same pytest
        return ["sh", "-c", 'echo "(dry run, in place of compute-sanitizer --tool $0)"; '
                            '"$@"; rc=$?; echo "========= ERROR SUMMARY: 0 errors"; exit $rc',
                tool, *tests]
    if run.sanitizer is None:
        return ("compute-sanitizer not found (looked on PATH, in /usr/local/cuda*/bin and in "
                "NVIDIA's pip wheels)")
    return [run.sanitizer, "--tool", tool, "--error-exitcode", "1", "--print-limit", "100",
            "--target-processes", "all", *tests]


def memcheck_command(run: Run) -> Command:
    return sanitizer_command(run, "memcheck", [] if run.dry else ["-k", MEMCHECK_SELECTION])


def racecheck_command(run: Run) -> Command:
    return sanitizer_command(run, "racecheck", [] if run.dry else ["-k", RACECHECK_SELECTION])


# --- the key figures --------------------------------------------------------------------------
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")
PYTEST_LINE = re.compile(r"(?:^\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) )"
                         r"|(?: (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+\[\s*\d+%\]$)",
                         re.M)


def pytest_figure(text: str, run: Run) -> str:
    """"79 passed, 3 failed, 2 skipped" from pytest's last line, else counted from the
    one-line-per-test output of a run cut short ("so far: ...")."""
    finals = re.findall(r"^=+ (.*\d+(?:\.\d+)?s(?: \(.*\))?) =+$", text, re.M)
    finals = [line for line in finals if PYTEST_COUNT.search(line)]
    if finals:
        counts = PYTEST_COUNT.findall(finals[-1])
        return ", ".join(f"{n} {word}" for n, word in counts)
    seen: Dict[str, int] = {}
    for match in PYTEST_LINE.finditer(text):
        word = (match.group(1) or match.group(2)).lower()
        seen[word] = seen.get(word, 0) + 1
    if not seen:
        return "no test result"
    return "so far: " + ", ".join(f"{n} {word}" for word, n in seen.items())


def json_lines(text: str) -> List[dict]:
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return records


def bench_figure(text: str, run: Run) -> str:
    records = json_lines(text)
    peaks = [r["gflop_per_s"] for r in records if r.get("case") == "matmul_peak"]
    parts = []
    for r in records:
        if "step_ms" not in r or not peaks:
            continue
        peak = max(peaks)  # the larger of the two, as the bench's table has it
        mfu = r["flops_per_step"] / (r["step_ms"]["median"] / 1e3) / (peak * 1e9)
        peak = f"{peak / 1e3:.0f} TFLOP/s" if peak >= 1e4 else f"{peak:.0f} GFLOP/s"
        parts.append(f"{r['step_ms']['median']:.1f} ms/step, {r['train_tokens_per_s']:,.0f} "
                     f"tok/s, MFU {100 * mfu:.1f}% of {peak} {r['dtype']} (batch "
                     f"{r['batch_size']} x {r['block_size']})")
        if "bf16_max_abs_logit_diff" in r:
            parts.append(f"max |bf16 - fp32| logit {r['bf16_max_abs_logit_diff']:.3g}")
    return "; ".join(parts) or "no measurement"


def train_figure(text: str, run: Run) -> str:
    records = json_lines(text)
    evals = [r for r in records if r.get("type") == "eval"]
    steps = [r for r in records if r.get("type") == "train"]
    parts = [train_corpus()[1].split(":")[0]]
    if evals:
        parts.append(f"val loss {evals[-1]['val_loss']:.4f} at iter {evals[-1]['iter']}")
    elif steps:
        parts.append(f"train loss {steps[-1]['loss']:.4f} at iter {steps[-1]['iter']}")
    timed = steps[1:] or steps  # the first iteration compiles
    if timed:
        parts.append(f"{statistics.median(r['step_ms'] for r in timed):.1f} ms/iter, "
                     f"MFU {100 * statistics.median(r['mfu'] for r in timed):.1f}%")
    return ", ".join(parts) if len(parts) > 1 else f"{parts[0]}, no metrics"


def profile_figure(text: str, run: Run) -> str:
    passes = re.findall(r"^(forward|backward): ([\d.]+) ms per pass", text, re.M)
    return ", ".join(f"{name} {ms} ms" for name, ms in passes) or "no profile"


def sanitizer_figure(text: str, run: Run) -> str:
    found = re.findall(r"(ERROR SUMMARY: \d+ errors?|RACECHECK SUMMARY: .*)$", text, re.M)
    return "; ".join(found[-1:] + [pytest_figure(text, run)])


def env_figure(text: str, run: Run) -> str:
    keys = re.findall(r"^key: (.*)$", text, re.M)
    return keys[-1] if keys else "no record"


def append_metrics(folder: str) -> Callable[[Run, Path], None]:
    """What a training step does when it has ended: the run's metrics.jsonl (under
    run.work / ``folder``), after the trainer's own lines (the figure reads it)."""

    def after(run: Run, log: Path) -> None:
        for path in sorted((run.work / folder).glob("*/metrics.jsonl")):
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"\n== {path}\n{path.read_text(encoding='utf-8', errors='replace')}")

    return after


STEPS = [
    Step("env", 20, "env.txt", "nvidia-smi, CuPy's config, versions, the GPU as minitorch_gpu "
         "sees it", env_command, env_figure),
    Step("tests", 70, "tests.log", "kernel, amp, backend and kernel-dispatch tests on cuda",
         tests_command, pytest_figure, test_timeout_s=40),
    Step("bench", 55, "bench.log", "GPT-2 124M training step, bf16, batch 16 x 1024",
         bench_command, bench_figure),
    Step("train", 55, "train.log", "shakespeare_char_gpu.yaml in bf16, 220 iterations",
         train_command("configs/shakespeare_char_gpu.yaml", 220, "checkpoints"), train_figure,
         after=append_metrics("checkpoints"),
         note=lambda run: f"corpus: {train_corpus(stdlib_chars(run))[1]}"),
    Step("llama", 30, "train.log", "llama_small.yaml in bf16, 120 iterations (the Llama "
         "kernels and grouped-query attention in training)",
         train_command("configs/llama_small.yaml", 120, "checkpoints_llama"), train_figure,
         after=append_metrics("checkpoints_llama"),
         note=lambda run: f"corpus: {train_corpus(stdlib_chars(run))[1]}"),
    Step("profile", 25, "profile.txt", "profile --backward of the GPT-2 124M shape, batch 8",
         profile_command, profile_figure),
    Step("memcheck", 45, "sanitizer.log", "compute-sanitizer memcheck over the kernel tests",
         memcheck_command, sanitizer_figure, test_timeout_s=120),
    Step("rest", 40, "tests_rest.log", "the rest of the cuda op table (pytest -m cuda)",
         rest_command, pytest_figure, test_timeout_s=30),
    Step("racecheck", 20, "sanitizer.log", "compute-sanitizer racecheck over four kernel "
         "tests", racecheck_command, sanitizer_figure, test_timeout_s=120),
]


# --- running a step -------------------------------------------------------------------------
def kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def step_env(run: Run, step: Step) -> Dict[str, str]:
    env = dict(os.environ)
    devdeps = REPO / ".devdeps"  # pure-Python test tools carried beside the checkout
    paths = [str(devdeps)] if devdeps.is_dir() else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [str(REPO)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(PYTHONUNBUFFERED="1", MPLBACKEND="Agg",
               MINITORCH_GPU_CACHE=str(run.work / "cache"),
               CUPY_CACHE_DIR=str(run.work / "cupy_cache"))
    if step.test_timeout_s:
        env[TEST_TIMEOUT_ENV] = str(step.test_timeout_s)
    return env


def run_step(step: Step, run: Run, limit_s: int) -> Result:
    """Runs the step's command in a process group of its own: at the limit less a grace it
    gets SIGINT (pytest then prints what it has, the trainer saves), at the limit the whole
    group is killed."""
    log = run.work / "logs" / f"{step.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = step.command(run)
    injected = run.inject.get(step.name)
    if injected == "fail":
        command = [run.python, "-c", "print('injected failure'); raise SystemExit(3)"]
    elif injected == "timeout":
        limit_s = INJECTED_TIMEOUT_S
        command = [run.python, "-c",
                   "import signal, subprocess, time\n"
                   "signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the child\n"
                   "child = subprocess.Popen(['sleep', '300'])\n"
                   "print('injected hang; child', child.pid, flush=True)\n"
                   "time.sleep(300)\n"]
    if isinstance(command, str):
        log.write_text(f"skipped: {command}\n", encoding="utf-8")
        return Result(step, "skipped", 0.0, limit_s, command, log)
    with open(log, "w", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(command)}\n# limit {limit_s} s\n")
        if step.note is not None:
            f.write(f"# {step.note(run)}\n")
    grace = min(10.0, max(1.0, limit_s / 6))
    start = time.monotonic()
    timed_out = False
    with open(log, "ab") as f:
        process = subprocess.Popen(command, cwd=REPO, env=step_env(run, step), stdout=f,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        try:
            try:
                process.wait(timeout=limit_s - grace)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    pass
        finally:  # whatever is left of the group, the step's children included
            kill_group(process.pid, signal.SIGKILL)
            process.wait()
    seconds = time.monotonic() - start
    if step.after is not None:
        step.after(run, log)
    try:
        figure = step.figure(log.read_text(encoding="utf-8", errors="replace"), run)
    except Exception as exc:  # a figure is a courtesy; its parser must not end the check
        figure = f"(figure unreadable: {type(exc).__name__}: {exc})"
    if timed_out:
        status = "TIMEOUT"
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"\n# TIMEOUT: SIGINT after {limit_s - grace:.0f} s, then SIGKILL to the "
                    f"process group at {limit_s} s\n")
    else:
        status = "ok" if process.returncode == 0 else f"FAILED rc {process.returncode}"
    return Result(step, status, seconds, limit_s, figure, log)


# --- what comes back ------------------------------------------------------------------------
def trim(data: bytes, cap: int = SECTION_CAP, head: int = HEAD_BYTES) -> bytes:
    """At most ``cap`` bytes: the first ``head`` and the end, cut at line breaks."""
    if len(data) <= cap:
        return data
    first = data[:head]
    first = first[:first.rfind(b"\n") + 1] or first
    marker = b"\n[... %d bytes cut ...]\n\n"
    room = cap - len(first) - len(marker % len(data))
    last = data[len(data) - room:]
    newline = last.find(b"\n")
    last = last[newline + 1:] if 0 <= newline < len(last) - 1 else last
    return first + marker % (len(data) - len(first) - len(last)) + last


def write_outputs(results: List[Result], run: Run) -> None:
    """Each step's log, trimmed, into its file (steps sharing a file as sections)."""
    by_file: Dict[str, List[Result]] = {}
    for result in results:
        by_file.setdefault(result.step.file, []).append(result)
    for name, group in by_file.items():
        parts = []
        for result in group:
            title = (f"#### {result.step.name}: {result.status}, {result.seconds:.1f} s of "
                     f"{result.limit_s} s\n")
            parts.append(title.encode() + trim(result.log.read_bytes()))
        (run.out / name).write_bytes(b"\n".join(parts)[:FILE_CAP])


def summary_table(results: List[Result], steps: List[Step], run: Run,
                  limits: Dict[str, int]) -> str:
    mode = " (dry run: CPU stand-ins for the device work)" if run.dry else ""
    lines = [f"GPU check{mode}: {len(steps)} steps, limits {sum(limits.values())} s; "
             f"files in {run.out}",
             f"{'step':<10} {'status':<12} {'seconds':>7} {'limit':>5}  key figure"]
    for result in results:
        lines.append(f"{result.step.name:<10} {result.status:<12} {result.seconds:>7.1f} "
                     f"{result.limit_s:>5}  {result.figure}")
    ran = {r.step.name for r in results}
    for step in steps:
        if step.name not in ran:
            lines.append(f"{step.name:<10} {'not run':<12} {'':>7} {limits[step.name]:>5}")
    bad = [r.step.name for r in results if r.status not in ("ok", "skipped")]
    tally = (f"{sum(r.status == 'ok' for r in results)} ok, {len(bad)} failed, "
             f"{sum(r.status == 'skipped' for r in results)} skipped")
    lines.append(f"{'total':<10} {'':<12} {sum(r.seconds for r in results):>7.1f} "
                 f"{sum(limits.values()):>5}  {tally}")
    if bad:
        lines.append(f"rerun the failed steps: bash scripts/gpu_check.sh --only {','.join(bad)}")
    return "\n".join(lines)


def plan(steps: List[Step], run: Run, limits: Dict[str, int]) -> str:
    lines = [f"{'step':<10} {'limit':>5}  {'file':<15} what"]
    lines += [f"{s.name:<10} {limits[s.name]:>5}  {s.file:<15} {s.what}" for s in steps]
    lines.append(f"{'total':<10} {sum(limits.values()):>5}  (at most {TOTAL_LIMIT_S} s in a "
                 f"whole run)")
    return "\n".join(lines)


# --- the environment record (the env step runs this file with --env-record) ------------------
GPU_PROBE = r"""
import numpy as np
import minitorch_gpu as mt
if not mt.cuda.is_available():
    print(f"cuda: NOT available: {mt.cuda.unavailable_reason()}")
    raise SystemExit(1)
import cupy
props = cupy.cuda.runtime.getDeviceProperties(0)
name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
print(f"cuda: {mt.cuda.device_count()} device(s)")
print(f"gpu: {name}, sm_{props['major']}{props['minor']}, "
      f"{props['totalGlobalMem'] / 2**30:.0f} GiB, {props['multiProcessorCount']} SMs")
print(f"cupy: {cupy.__version__} (CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, "
      f"driver {cupy.cuda.runtime.driverGetVersion()})")
try:  # CuPy registers bfloat16 only with NumPy >= 2.1.2 and ml_dtypes at import
    x = np.array([1.0, -2.5, 1.00390625, 3.0e38, np.nan], np.float32).astype(mt.bfloat16)
    back = cupy.asnumpy(cupy.asarray(x).astype(cupy.float32))
    same = np.array_equal(back, x.astype(np.float32), equal_nan=True)
    print(f"bf16: {'ok' if same else 'WRONG values'} (ml_dtypes bfloat16 through CuPy)")
except Exception as exc:
    same = False
    print(f"bf16: FAILED: {type(exc).__name__}: {exc} (NumPy {np.__version__})")
raise SystemExit(0 if same else 1)
"""
PACKAGES = ("numpy", "ml_dtypes", "cupy", "torch", "pytest", "pytest-xdist", "hypothesis",
            "pyyaml", "tokenizers", "minitorch-gpu")


def env_record(dry: bool) -> int:
    """Prints the machine, the software and what minitorch_gpu sees; 1 if no usable GPU."""
    from importlib import metadata

    def show(title: str, command: List[str], timeout: int) -> None:
        print(f"\n== {title}: {shlex.join(command)}", flush=True)
        try:
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                  timeout=timeout)
            print((done.stdout + done.stderr).rstrip(), flush=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"({type(exc).__name__}: {exc})", flush=True)

    print(f"python {platform.python_version()} ({sys.executable}) on "
          f"{platform.platform()}, {os.cpu_count()} CPUs")
    installed = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        for wanted in PACKAGES:
            if name == wanted.replace("_", "-") or (wanted == "cupy" and name.startswith("cupy")):
                installed[name] = dist.version
    print("packages: " + ", ".join(f"{n} {v}" for n, v in sorted(installed.items())))
    missing = [p for p in PACKAGES
               if not any(n == p.replace("_", "-") or (p == "cupy" and n.startswith("cupy"))
                          for n in installed)]
    print("not installed: " + (", ".join(missing) or "none"))
    tools = {t: shutil.which(t) for t in ("nvidia-smi", "nvcc")}
    tools["compute-sanitizer"] = find_sanitizer()
    print("tools: " + ", ".join(f"{t} {p or 'not found'}" for t, p in tools.items()))
    show("checkout", ["git", "log", "-1", "--format=%H %cd %s"], timeout=4)
    # the probe first: it is what the later steps depend on
    print("\n== the GPU as minitorch_gpu sees it", flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH")])))
    try:
        probe = subprocess.run([sys.executable, "-c", GPU_PROBE], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=12)
        rc, lines = probe.returncode, (probe.stdout + probe.stderr).rstrip()
    except subprocess.TimeoutExpired:
        rc, lines = -1, "cuda: the probe timed out after 12 s"
    print(lines, flush=True)
    echo = ["echo", "(dry run: stand-in)"]
    show("CuPy's config", echo if dry else
         [sys.executable, "-c", "import cupy; cupy.show_config()"], timeout=6)
    show("nvidia-smi", echo if dry else ["nvidia-smi"], timeout=4)
    show("nvidia-smi query", echo if dry else [
        "nvidia-smi", "--format=csv", "--query-gpu=name,driver_version,memory.total,"
        "clocks.max.sm,clocks.max.memory,power.limit,compute_cap,persistence_mode"], timeout=4)
    found = dict(re.findall(r"^(gpu|cupy|bf16|cuda): (.*)$", lines, re.M))
    if "gpu" in found:
        key = [found["gpu"], f"CuPy {found.get('cupy', '?')}",
               f"bf16 {found.get('bf16', 'untested').split(' ')[0]}"]
    else:
        why = found.get("cuda", lines.splitlines()[-1] if lines else "?")
        key = [f"no GPU: {why.replace('NOT available: ', '')[:90]}"]
    print("\nkey: " + "; ".join(key) + (" (dry run)" if dry else ""))
    return 0 if dry else (0 if rc == 0 else 1)


# --- the driver -----------------------------------------------------------------------------
def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="steps: " + ", ".join(f"{s.name} ({s.limit_s} s)" for s in STEPS))
    parser.add_argument("--only", metavar="STEP[,STEP]",
                        help="run only these steps (e.g. the ones that failed)")
    parser.add_argument("--limit", action="append", default=[], metavar="STEP=SECONDS",
                        help="another time limit for a step (repeatable)")
    parser.add_argument("--list", action="store_true",
                        help="print the steps, their limits and the total, and stop")
    parser.add_argument("--dry-run", action="store_true",
                        help="the whole plumbing on the CPU, device work replaced by stand-ins")
    parser.add_argument("--out", help="where the files that come back go (default $OUT, "
                                      "else a new temporary folder)")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(),
                                                       "minitorch_gpu_check"),
                        help="caches, checkpoints and full logs (default %(default)s)")
    parser.add_argument("--env-record", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.env_record:
        return env_record(args.dry_run)
    names = [s.name for s in STEPS]
    files = {s.file for s in STEPS} | {"summary.txt"}
    if len(files) > MAX_FILES or sum(s.limit_s for s in STEPS) > TOTAL_LIMIT_S:
        raise RuntimeError(f"gpu_check: the steps write {len(files)} files (at most "
                           f"{MAX_FILES} come back) and their limits add up to "
                           f"{sum(s.limit_s for s in STEPS)} s (at most {TOTAL_LIMIT_S})")
    steps = list(STEPS)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            print(f"gpu_check: --only: no step {', '.join(unknown)}; the steps are "
                  f"{', '.join(names)}", file=sys.stderr)
            return 2
        steps = [s for s in STEPS if s.name in wanted]
    limits = {s.name: s.limit_s for s in steps}
    for item in args.limit:
        name, _, seconds = item.partition("=")
        if name not in names or not seconds.isdigit() or int(seconds) < 2:
            print(f"gpu_check: --limit {item!r}: expected STEP=SECONDS (>= 2) with STEP one "
                  f"of {', '.join(names)}", file=sys.stderr)
            return 2
        if name in limits:
            limits[name] = int(seconds)
    inject = {}
    if args.dry_run and os.environ.get(INJECT_ENV):
        inject = dict(item.split("=", 1) for item in os.environ[INJECT_ENV].split(",")
                      if "=" in item)
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_check_"))
    run = Run(dry=args.dry_run, out=out, work=Path(args.work).resolve(), inject=inject,
              xdist=importlib.util.find_spec("xdist") is not None
              or (REPO / ".devdeps" / "xdist").is_dir(),
              sanitizer=find_sanitizer())
    print(plan(steps, run, limits), flush=True)
    if args.list:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    run.work.mkdir(parents=True, exist_ok=True)
    print(f"\ntrain corpus: {train_corpus(stdlib_chars(run))[1]}")
    print(f"pytest in parallel: {'yes (pytest-xdist)' if run.xdist else 'no (no pytest-xdist)'}"
          f"; compute-sanitizer: {run.sanitizer or 'not found'}", flush=True)
    results: List[Result] = []
    interrupted = False
    for number, step in enumerate(steps, 1):
        print(f"\n== [{number}/{len(steps)}] {step.name} (limit {limits[step.name]} s): "
              f"{step.what}", flush=True)
        try:
            result = run_step(step, run, limits[step.name])
        except KeyboardInterrupt:  # the step's group is already killed; keep what ran
            print("   interrupted: the steps after it are not run", flush=True)
            interrupted = True
            break
        results.append(result)
        print(f"   {result.status} in {result.seconds:.1f} s: {result.figure}", flush=True)
        if result.status not in ("ok", "skipped"):
            tail = result.log.read_text(encoding="utf-8", errors="replace").splitlines()[-6:]
            print("\n".join("   | " + line[:200] for line in tail), flush=True)
        write_outputs(results, run)  # after every step: a run cut short still leaves files
        (out / "summary.txt").write_text(summary_table(results, steps, run, limits) + "\n",
                                         encoding="utf-8")
    table = summary_table(results, steps, run, limits)
    (out / "summary.txt").write_text(table + "\n", encoding="utf-8")
    print("\n" + table, flush=True)
    if interrupted:
        return 130
    return 0 if all(r.status in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
