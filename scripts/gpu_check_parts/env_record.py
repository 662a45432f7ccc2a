"""The environment record: the env step runs scripts/gpu_check.py --env-record. In the dry
run the probe sees the emulated GPU (the step's MINITORCH_EMULATE_CUDA=1) and says so;
nvidia-smi and CuPy's config, which only a GPU machine has, are echoed stand-ins."""
from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from typing import List

from .commands import find_sanitizer
from .definitions import REPO

GPU_PROBE = r"""
import numpy as np
import minitorch_gpu as mt
if not mt.cuda.is_available():
    print(f"cuda: NOT available: {mt.cuda.unavailable_reason()}")
    raise SystemExit(1)
from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
print(f"emulated: {'yes: ' + mt.cuda.EMULATED_NOTE if mt.cuda.is_emulated() else 'no'}")
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
    echo = ["echo", "(dry run: GPU-only, a stand-in)"]
    show("CuPy's config", echo if dry else
         [sys.executable, "-c", "import cupy; cupy.show_config()"], timeout=6)
    show("nvidia-smi", echo if dry else ["nvidia-smi"], timeout=4)
    show("nvidia-smi query", echo if dry else [
        "nvidia-smi", "--format=csv", "--query-gpu=name,driver_version,memory.total,"
        "clocks.max.sm,clocks.max.memory,power.limit,compute_cap,persistence_mode"], timeout=4)
    found = dict(re.findall(r"^(gpu|cupy|bf16|cuda|emulated): (.*)$", lines, re.M))
    if "gpu" in found:
        key = [found["gpu"], f"CuPy {found.get('cupy', '?')}",
               f"bf16 {found.get('bf16', 'untested').split(' ')[0]}"]
    else:
        why = found.get("cuda", lines.splitlines()[-1] if lines else "?")
        key = [f"no GPU: {why.replace('NOT available: ', '')[:90]}"]
    if found.get("emulated", "no") != "no":
        key.append("emulated")
    print("\nkey: " + "; ".join(key) + (" (dry run)" if dry else ""))
    return 0 if rc == 0 else 1

