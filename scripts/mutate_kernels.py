"""How strong the emulated kernel tests are: each mutant of the CUDA sources (one
``__syncthreads();`` removed, or one loop's ``<`` made ``<=``), one at a time, run against
its kernels' tests on the emulated GPU (tests/test_kernels_emulated.py); a mutant the
tests pass survived, and is printed.

    python scripts/mutate_kernels.py                  # every mutant (about ten minutes)
    python scripts/mutate_kernels.py --source gelu.cu --source layernorm.cu

The mutant is written over the source in the checkout for its test run and the source put
back after it (also on Ctrl-C); the emulated builds go to a temporary cache.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "minitorch_gpu" / "backend" / "kernels"
TESTS = "tests/test_kernels_emulated.py"
# each source's tests in TESTS (pytest -k)
FAMILIES = {"gelu.cu": "gelu", "swiglu.cu": "swiglu", "layernorm.cu": "layer_norm",
            "rmsnorm.cu": "rms_norm", "rotary.cu": "rotary",
            "cross_entropy.cu": "cross_entropy", "attention_softmax.cu": "dense or dropout",
            "attention.cu": "flash", "adamw.cu": "adamw"}
_LOOP = re.compile(r"for \([^;]*;[^;<]*?(<)(?!=)[^;]*;")


def _code_only(text: str) -> str:
    """``text`` with its comments blanked (newlines kept): positions stay those of text."""
    def blank(m: "re.Match[str]") -> str:
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"/\*.*?\*/|//[^\n]*", blank, text, flags=re.S)


def mutants(text: str) -> List[Tuple[str, int, str]]:
    """(what, line, mutated text) for every barrier and every loop condition's '<' in the
    code (not in comments)."""
    code, out = _code_only(text), []
    for m in re.finditer(r"__syncthreads\(\);", code):
        line = text.count("\n", 0, m.start()) + 1
        out.append(("barrier removed", line, text[:m.start()] + text[m.end():]))
    for m in _LOOP.finditer(code):
        at = m.start(1)
        line = text.count("\n", 0, at) + 1
        out.append(("loop < made <=", line, text[:at] + "<=" + text[at + 1:]))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", action="append", choices=sorted(FAMILIES),
                        help="only these sources (repeatable; default: all)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per mutant")
    args = parser.parse_args(argv)
    chosen = args.source or sorted(FAMILIES)
    survived, total, start = [], 0, time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "MINITORCH_GPU_CACHE": cache}
        for name in chosen:
            path = SOURCES / name
            original = path.read_text(encoding="utf-8")
            try:
                for what, line, text in mutants(original):
                    total += 1
                    path.write_text(text, encoding="utf-8")
                    try:
                        done = subprocess.run(
                            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                             TESTS, "-k", FAMILIES[name]], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=args.timeout)
                        verdict = "caught" if done.returncode != 0 else "SURVIVED"
                    except subprocess.TimeoutExpired:
                        verdict = "caught (timed out)"
                    print(f"{name}:{line:<4d} {what:16s} {verdict}", flush=True)
                    if verdict == "SURVIVED":
                        survived.append(f"{name}:{line} {what}")
            finally:
                path.write_text(original, encoding="utf-8")
    print(f"{total - len(survived)} of {total} mutants caught, {len(survived)} survived "
          f"({time.perf_counter() - start:.0f} s)")
    for entry in survived:
        print("survived:", entry)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
