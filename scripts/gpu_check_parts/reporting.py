"""What comes back: each step's log cut to its head and end, the plan and the summary."""
from __future__ import annotations

from typing import Dict, List

from .definitions import (FILE_CAP, HEAD_BYTES, SECTION_CAP, TOTAL_LIMIT_S, Result, Run,
                          Step)


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
    gpu_only = sorted({s.name for s in steps if s.gpu_only})
    mode = (f" (dry run on {run.device}, limits x{run.limit_scale}; GPU-only, run as "
            f"stand-ins: {', '.join(gpu_only) or 'none'})") if run.dry else ""
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
    scaled = (f"; the dry run's limits are the GPU's x{run.limit_scale} for the emulated "
              f"GPU (EMULATED_LIMIT_SCALE)") if run.dry else ""
    lines.append(f"{'total':<10} {sum(limits.values()):>5}  (at most {TOTAL_LIMIT_S} s in a "
                 f"whole run on a GPU{scaled})")
    return "\n".join(lines)

