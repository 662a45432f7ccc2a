"""``minitorch-gpu bench``'s records as a table (``bench.run_bench`` makes them): a row per
case and side, the ratio rows against torch, notes under it; or, from ``cprofile``, each
case's functions by own time per step.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..system.machine import describe_libraries

__all__ = ["format_table"]

RATIO_LABELS = {"minitorch/torch": "ratio ours/torch", "minitorch/best-torch": "ratio ours/best"}
COMPILE_NOTE = ("torch-compile: the training step under torch.compile (compiled in the "
                "warm-up; its train MB includes the compiler's); generation not compiled, "
                "the torch row's eager generation")


def format_table(records: List[Dict[str, Any]]) -> str:
    """The records as a short table, ratio rows included (or, from ``cprofile``, each
    case's functions by own time per step)."""
    if any("functions" in r for r in records):
        return "\n\n".join(_format_profile(r) for r in records)
    lines = [f"{'case':6s} {'side':16s} {'step ms':>8s} {'ns/param':>8s} {'train tok/s':>11s} "
             f"{'MFU':>6s} {'gen tok/s':>9s} {'gen eager':>9s} {'train MB':>8s}"]
    notes = []
    for r in records:
        if r["case"] == "matmul_peak":
            continue
        generated = r.get("generate_tokens_per_s")
        eager = r.get("generate_uncaptured_tokens_per_s")
        if r["side"] in RATIO_LABELS:
            lines.append(f"{r['case']:6s} {RATIO_LABELS[r['side']]:16s} {'':>8s} {'':>8s} "
                         f"{_times(r.get('train_tokens_per_s'), 11)} {'':>6s} "
                         f"{_times(generated, 9)} {_times(eager, 9)} "
                         f"{_times(r.get('train_memory_mb'), 8)}")
            if "best_side" in r:
                columns = {"train_tokens_per_s": "train", "generate_tokens_per_s": "gen",
                           "generate_uncaptured_tokens_per_s": "gen eager",
                           "train_memory_mb": "memory"}
                best = ", ".join(f"{columns[key]} {side}" for key, side in r["best_side"].items())
                notes.append(f"{r['case']}: ours/best against the best torch side of each "
                             f"column: {best}")
            continue
        if "failed" in r:
            lines.append(f"{r['case']:6s} {r['side']:16s} failed: {r['failed']}")
            continue
        gen = f"{generated:9.0f}" if generated is not None else f"{'-':>9s}"
        gen += f" {eager:9.0f}" if eager is not None else f" {'-':>9s}"
        per_param = r.get("step_ns_per_param")
        per_param = f"{per_param:8.1f}" if per_param is not None else f"{'-':>8s}"
        lines.append(f"{r['case']:6s} {r['side']:16s} {r['step_ms']['median']:8.1f} "
                     f"{per_param} {r['train_tokens_per_s']:11.0f} {100 * r['mfu']:5.1f}% "
                     f"{gen} {r['train_memory_mb']:8.0f}")
        if r["side"] == "torch-compile" and COMPILE_NOTE not in notes:
            notes.append(COMPILE_NOTE)
        if "torch" in r:
            notes.append(f"{r['case']}: {r['torch']} (torch_reference), our side only")
        if "bf16_max_abs_logit_diff" in r:
            notes.append(f"{r['case']}: max |bf16 - fp32| logit "
                         f"{r['bf16_max_abs_logit_diff']:.3g} on one batch (largest |logit| "
                         f"{r['max_abs_logit']:.3g})")
    peaks = [r for r in records if r["case"] == "matmul_peak"]
    if peaks:
        peak, device = peaks[0], peaks[0].get("device", "cpu")
        rate = peak["gflop_per_s"]
        where = f"with {peak['threads']} BLAS threads" if device == "cpu" else f"on {device}"
        rate_text = f"{rate / 1e3:.0f} TFLOP/s" if rate >= 1e4 else f"{rate:.0f} GFLOP/s"
        lines.append(f"MFU against the {peak.get('dtype', 'float32')} matmul peak (the larger "
                     f"of two measurements, before and after): {rate_text} {where}")
    return "\n".join(lines + notes + _libraries_lines(records))


def _libraries_lines(records: List[Dict[str, Any]]) -> List[str]:
    """One line per side saying what ran its arithmetic (the peak's process counts as a
    side), sides with the same libraries on one line."""
    by_text: Dict[str, List[str]] = {}
    for r in records:
        if "libraries" in r:
            side = "matmul peak" if r["case"] == "matmul_peak" else r["side"]
            sides = by_text.setdefault(describe_libraries(r["libraries"]), [])
            if side not in sides:
                sides.append(side)
    return [f"ran on ({', '.join(sides)}): {text}" for text, sides in by_text.items()]


def _times(ratio: Optional[float], width: int) -> str:
    """A ratio as ``0.75x`` right-aligned in ``width`` characters; ``-`` if there is none."""
    return f"{ratio:{width - 1}.2f}x" if ratio is not None else f"{'-':>{width}s}"


def _format_profile(r: Dict[str, Any]) -> str:
    """One cProfile record: the functions with the most own time per step."""
    lines = [f"{r['case']} {r['side']} on {r['device']} ({r['dtype']}): own time per step "
             f"over {r['cprofile_steps']} steps under cProfile",
             f"{'function':58s} {'calls/step':>10s} {'own ms/step':>11s} {'% of step':>9s}"]
    for row in r["functions"]:
        lines.append(f"{row['function'][-58:]:58s} {row['calls_per_step']:10.1f} "
                     f"{row['own_ms_per_step']:11.2f} {row['percent']:9.1f}")
    lines.append(f"{'total':58s} {'':10s} {r['total_ms_per_step']:11.2f}")
    return "\n".join(lines)
