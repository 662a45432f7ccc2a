"""Running one step: its own process group, environment and time limit."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from typing import Dict

from .definitions import (EMULATE_ENV, INJECTED_TIMEOUT_S, REPO, TEST_TIMEOUT_ENV, Result,
                          Run, Step)

# the dry run's machine ceilings (the MFU's roof): minitorch_gpu measures them once per
# cache with an 8192 product and a 2 GiB copy on a GPU, a minute and 4 GiB of memory on the
# emulated one; measured here with small arrays instead, into the steps' cache. The figures
# mean nothing (nor does any speed on the emulated GPU); the steps read them as on a GPU
SEED_CEILINGS = r"""
import sys
from minitorch_gpu.system import machine
from minitorch_gpu.backend import dtypes
path = machine.cache_dir() / "machine.json"
for dtype in (dtypes.float32, dtypes.bfloat16):
    flops = machine._measure_matmul("cuda:0", dtype, 256, 2)
    copy = machine._measure_copy("cuda:0", dtype, 1 << 20, 2)
    machine._write_cache(path, machine._machine_key("matmul", "cuda:0", dtype), flops)
    machine._write_cache(path, machine._machine_key("copy", "cuda:0", dtype), copy)
print(f"emulated GPU's ceilings (small arrays, meaningless) cached in {path}")
"""


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
        env[TEST_TIMEOUT_ENV] = str(run.test_timeout_s(step))
    if run.dry:
        env[EMULATE_ENV] = "1"
    else:  # a GPU run on the GPU, even where the shell set the emulation
        env.pop(EMULATE_ENV, None)
    return env


def seed_emulated_ceilings(run: Run) -> str:
    """Before the dry run's steps: the emulated GPU's machine ceilings measured small into
    the steps' cache (SEED_CEILINGS); its one line of output, or why it failed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH")])), MINITORCH_GPU_CACHE=str(run.work / "cache"))
    env[EMULATE_ENV] = "1"
    try:
        done = subprocess.run([run.python, "-c", SEED_CEILINGS], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "the emulated GPU's ceilings: not cached (timed out after 60 s)"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[-1] if lines else f"the emulated GPU's ceilings: exit {done.returncode}"


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

