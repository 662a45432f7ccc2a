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
  decode     scripts/bench_decode.py --device cuda: generation's per-token time, eager
             against the captured one-token step's CUDA Graph (baby, small, GPT-2 124M)
  topk       the same with top_k=50 sampling inside the captured step (GPT-2 124M): whether
             top-k replays from a graph; a capture that fails fails the step, its error in
             the log and the summary
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
    python scripts/gpu_check.py --dry-run           # every step on the emulated GPU

The dry run runs each step for real on the emulated GPU (MINITORCH_EMULATE_CUDA=1 in the
step's environment: "cuda" is the CuPy stand-in on the CPU, the project's kernels compiled
for it), so the first GPU run fails only on what only a GPU confirms. Its sizes are cut to
fit a few minutes on two cores: the cuda tests less those too slow emulated (the
definitions name them and why), the bench's smallest case for one step, the two training
configs for two iterations at a tiny shape on their own device (cuda, bf16), profile at a
tiny shape, both decode steps at the baby's shape for six tokens. Each limit (and per-test
timeout) there is the GPU's times EMULATED_LIMIT_SCALE (3: the emulated GPU runs a launch's
threads one by one on the CPU, and the rest step's tests alone took about its GPU limit on
two idle cores, nearly twice it beside other work); the GPU's limits are never scaled.
Speeds there mean nothing; the records and the paths through "cuda" do. Only
compute-sanitizer (memcheck, racecheck) is GPU-only: an echo stands in for it and its tests
run emulated without it; nvidia-smi and CuPy's config are echoed too. The emulated GPU's
machine ceilings are measured small first (running.SEED_CEILINGS). tests/test_gpu_check.py
runs a few of its steps. The parts live in scripts/gpu_check_parts/.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_check_parts, when imported
from gpu_check_parts.commands import find_sanitizer, stdlib_chars, train_corpus  # noqa: E402
from gpu_check_parts.definitions import (EMULATE_ENV,  # noqa: E402,F401
                                         EMULATED_LIMIT_SCALE, INJECT_ENV, MAX_FILES,
                                         MEMCHECK_SELECTION, RACECHECK_SELECTION, REPO,
                                         TEST_TIMEOUT_ENV, TOP_K, TOTAL_LIMIT_S, Result,
                                         Run)
from gpu_check_parts.env_record import env_record  # noqa: E402
from gpu_check_parts.figures import decode_figure, pytest_figure  # noqa: E402,F401
from gpu_check_parts.reporting import (plan, summary_table, trim,  # noqa: E402,F401
                                       write_outputs)
from gpu_check_parts.running import run_step, seed_emulated_ceilings  # noqa: E402
from gpu_check_parts.steps import STEPS  # noqa: E402


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
                        help="every step on the emulated GPU at tiny sizes (compute-sanitizer "
                             "GPU-only)")
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
    overrides = {}
    for item in args.limit:
        name, _, seconds = item.partition("=")
        if name not in names or not seconds.isdigit() or int(seconds) < 2:
            print(f"gpu_check: --limit {item!r}: expected STEP=SECONDS (>= 2) with STEP one "
                  f"of {', '.join(names)}", file=sys.stderr)
            return 2
        overrides[name] = int(seconds)
    inject = {}
    if args.dry_run and os.environ.get(INJECT_ENV):
        inject = dict(item.split("=", 1) for item in os.environ[INJECT_ENV].split(",")
                      if "=" in item)
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_check_"))
    run = Run(dry=args.dry_run, out=out, work=Path(args.work).resolve(), inject=inject,
              xdist=importlib.util.find_spec("xdist") is not None
              or (REPO / ".devdeps" / "xdist").is_dir(),
              sanitizer=find_sanitizer())
    # the dry run's limits are scaled (EMULATED_LIMIT_SCALE); a --limit is taken as given
    limits = {s.name: overrides.get(s.name, run.limit_s(s)) for s in steps}
    print(plan(steps, run, limits), flush=True)
    if args.list:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    run.work.mkdir(parents=True, exist_ok=True)
    print(f"\ntrain corpus: {train_corpus(stdlib_chars(run))[1]}")
    print(f"pytest in parallel: {'yes (pytest-xdist)' if run.xdist else 'no (no pytest-xdist)'}"
          f"; compute-sanitizer: {run.sanitizer or 'not found'}", flush=True)
    if run.dry:
        print(f"device: {run.device}; GPU-only (stand-ins): "
              + ", ".join(f"{s.name} ({s.gpu_only})" for s in steps if s.gpu_only), flush=True)
        print(seed_emulated_ceilings(run), flush=True)
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
