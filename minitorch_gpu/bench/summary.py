"""A bench's rounds summed up: one record per side (the median of each figure over the
rounds) and the ratio records, ours over torch eager's paired figures and over the best
torch side's (``runner.run_bench`` makes the rounds)."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List

__all__ = ["OUR_SIDES", "RATIO_KEYS", "median_record", "ratios"]

OUR_SIDES = ("minitorch", "minitorch-numpy")

RATIO_KEYS = ("train_tokens_per_s", "generate_tokens_per_s", "train_memory_mb",
              "generate_uncaptured_tokens_per_s")
# a figure of ours taken against another of torch's: our uncaptured generation against
# torch's (eager) generation
AGAINST = {"generate_uncaptured_tokens_per_s": "generate_tokens_per_s"}


def ratios(case: str, runs: Dict[str, List[Dict[str, Any]]],
            medians: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One case's ratio records: ours over the "torch" side (eager, SDPA), the median of
    the rounds' paired ratios ("minitorch/torch"); and, where two torch sides or more
    were measured, our median over the best torch side's median of each figure, the
    larger tokens/s and the smaller memory, naming that side ("minitorch/best-torch")."""
    ratios: List[Dict[str, Any]] = []
    pairs = [(ours, theirs) for ours, theirs in zip(runs["minitorch"], runs.get("torch", []))
             if "failed" not in theirs]
    if pairs:
        ratio: Dict[str, Any] = {"case": case, "side": "minitorch/torch", "rounds": len(pairs)}
        for key in RATIO_KEYS:
            other = AGAINST.get(key, key)
            if key in pairs[0][0] and other in pairs[0][1]:
                ratio[key] = statistics.median(ours[key] / theirs[other]
                                               for ours, theirs in pairs)
        ratios.append(ratio)
    ours, theirs = medians[0], [m for m in medians[1:]
                                if "failed" not in m and m["side"] not in OUR_SIDES]
    if len(theirs) > 1:
        best: Dict[str, Any] = {"case": case, "side": "minitorch/best-torch", "best_side": {}}
        for key in RATIO_KEYS:
            other = AGAINST.get(key, key)
            having = [m for m in theirs if other in m]
            if key in ours and having:
                pick = (min if key == "train_memory_mb" else max)(having,
                                                                  key=lambda m: m[other])
                best[key] = ours[key] / pick[other]
                best["best_side"][key] = pick["side"]
        ratios.append(best)
    return ratios


def median_record(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One side's rounds as one record: the median of each figure over the rounds it was
    measured in (a failed round left out; the last failure's record if all failed)."""
    measured = [r for r in runs if "failed" not in r]
    merged = dict((measured or runs)[-1], rounds=len(measured or runs))
    merged.pop("round", None)
    if not measured:
        return merged
    for key in ("train_tokens_per_s", "mfu", "train_memory_mb", "peak_rss_mb",
                "generate_tokens_per_s", "generate_uncaptured_tokens_per_s",
                "bf16_max_abs_logit_diff", "step_ns_per_param"):
        if key in merged:
            merged[key] = statistics.median(r[key] for r in measured)
    merged["step_ms"] = {k: statistics.median(r["step_ms"][k] for r in measured)
                         for k in ("median", "min", "max")}
    if len(measured) < len(runs):
        merged["failed_rounds"] = len(runs) - len(measured)
    return merged

