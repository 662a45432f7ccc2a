"""The key figure of each step, read from its whole log, for the summary table."""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Callable, Dict, List

from .commands import train_corpus
from .definitions import Run

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


def last_error(text: str) -> str:
    """The last line of the log naming an exception (a traceback's last line, or the
    message a script exits with), cut to 160 characters; "" if none."""
    found = re.findall(r"^((?:[\w.]+(?:Error|Exception|Interrupt)|bench_decode): .*)$",
                       text, re.M)
    return found[-1][:160] if found else ""


def decode_figure(text: str, run: Run) -> str:
    """"baby 1234 -> 456 us/token (2.71x)" per case, from bench_decode.py's table, then
    the sampling when it is top-k, or the error that ended it."""
    rows = re.findall(r"^(\w+)\s+(\d+)\s+(\d+)\s+([\d.]+)x \| a CUDA Graph", text, re.M)
    parts = [f"{case} {eager} -> {graph} us/token ({ratio}x)"
             for case, eager, graph, ratio in rows]
    top_k = re.search(r"^sampling: .*\btop_k (\d+)", text, re.M)
    if top_k and parts:
        parts[0] = f"top_k={top_k.group(1)}: {parts[0]}"
    error = last_error(text)
    if error:
        parts.append(f"error: {error}")
    return "; ".join(parts) or "no measurement"


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
    if steps and "skipped_steps" in steps[-1]:  # fp16: the loss scale's record
        parts.append(f"loss scale {steps[-1]['scale']:g}, "
                     f"{steps[-1]['skipped_steps']} steps skipped")
    timed = steps[1:] or steps  # the first iteration compiles
    if timed:
        parts.append(f"{statistics.median(r['step_ms'] for r in timed):.1f} ms/iter, "
                     f"MFU {100 * statistics.median(r['mfu'] for r in timed):.1f}%")
    return ", ".join(parts) if len(parts) > 1 else f"{parts[0]}, no metrics"


def profile_figure(text: str, run: Run) -> str:
    passes = re.findall(r"^(forward|backward): ([\d.]+) ms per pass", text, re.M)
    return ", ".join(f"{name} {ms} ms" for name, ms in passes) or "no profile"


def sanitizer_figure(text: str, run: Run) -> str:
    if run.dry:  # the emulated GPU checks bounds and barriers itself, but is no sanitizer
        return f"GPU-only (compute-sanitizer not run); emulated: {pytest_figure(text, run)}"
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

