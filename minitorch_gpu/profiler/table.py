"""The rows as text: the table ``Profile.table`` prints, with its totals, and CSV."""
from __future__ import annotations

import csv
from dataclasses import fields
from pathlib import Path
from typing import Any, Dict, List, Optional

from .rows import Row

__all__ = ["SORT_KEYS", "format_table", "write_csv"]

SORT_KEYS = ("tree", "time", "flops", "name")


def _si(value: Optional[float], digits: int = 3) -> str:
    """12.3G, 456M, 7.89k, 12: a figure in 4 or 5 characters."""
    if value is None:
        return "?"
    if value == 0:
        return "0"
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def _fixed(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


COLUMNS = (  # header, width, how to show a row's value
    ("calls", 5, lambda r: str(r.calls) if r.calls else "-"),
    ("ms/call", 8, lambda r: _fixed(r.time_ms, ".3f")),
    ("IQR", 6, lambda r: _fixed(r.spread_ms, ".3f")),
    ("%", 5, lambda r: _fixed(r.percent, ".1f")),
    ("FLOPs", 6, lambda r: _si(r.flops)),
    ("bytes", 6, lambda r: _si(r.bytes)),
    ("FLOP/B", 6, lambda r: _fixed(r.intensity, ".3g")),
    ("GFLOP/s", 7, lambda r: _fixed(r.gflops, ".3g")),
    ("GB/s", 6, lambda r: _fixed(r.gbytes, ".3g")),
    ("bound", 7, lambda r: r.bound),
    ("roof%", 5, lambda r: _fixed(r.roof_pct, ".0f")),
    ("out", 6, lambda r: "-" if r.out_bytes is None else _si(r.out_bytes)),
    ("params", 6, lambda r: _si(r.params) if r.params else "-"),
)


def _select(rows: List[Row], sort: str, depth: Optional[int]) -> List[Row]:
    if sort == "tree":
        return [r for r in rows if depth is None or r.depth <= depth]
    # a flat list of the rows that partition the pass: leaves, (self) and engine rows, or,
    # cut at ``depth``, the rows at that depth standing for their subtrees
    chosen = [r for r in rows
              if (depth is None and r.leaf)
              or (depth is not None and (r.depth == depth
                                         or (r.leaf and r.depth < depth)))]
    if sort == "time":
        return sorted(chosen, key=lambda r: -(r.pass_ms or 0.0))
    if sort == "flops":
        return sorted(chosen, key=lambda r: -(r.flops or 0))
    return sorted(chosen, key=lambda r: r.name)


def format_table(rows: List[Row], summary: Dict[str, Any], sort: str = "tree",
                 depth: Optional[int] = None) -> str:
    """``rows`` as text, a column per figure, one table per phase, then ``summary``'s
    totals; see ``Profile.table`` for ``sort`` and ``depth``."""
    if sort not in SORT_KEYS:
        raise ValueError(f"profile.table: sort must be one of {', '.join(SORT_KEYS)}, got "
                         f"{sort!r}")
    if depth is not None and (not isinstance(depth, int) or depth < 0):
        raise ValueError(f"profile.table: depth must be an int >= 0, got {depth!r}")
    if not rows:
        return "(nothing recorded: call the model inside `with profile(model):`)"
    roof = summary["roofline"]
    lines = [f"roofline of {roof['device']} in {roof['dtype']}: peak "
             f"{roof['peak_gflops']:.1f} GFLOP/s (matmul), {roof['bandwidth_gbytes']:.1f} GB/s "
             f"(copy), ridge {roof['ridge_flop_per_byte']:.1f} FLOP/byte; "
             f"{summary['passes']} passes; times are medians, % of the pass"]
    for phase in ("forward", "backward"):
        chosen = _select([r for r in rows if r.phase == phase], sort, depth)
        if not chosen:
            continue
        indent = sort == "tree"
        width = max(len(("  " * r.depth if indent else "") + r.name) for r in chosen)
        width = max(width, len(phase) + 2)
        header = f"{phase:<{width}}" + "".join(f" {h:>{w}}" for h, w, _ in COLUMNS)
        lines += ["", header, "-" * len(header)]
        for r in chosen:
            label = ("  " * r.depth if indent else "") + r.name
            lines.append(f"{label:<{width}}" + "".join(f" {fmt(r):>{w}}"
                                                       for _, w, fmt in COLUMNS))
    lines.append("")
    lines += _totals_lines(summary)
    return "\n".join(lines)


def _totals_lines(s: Dict[str, Any]) -> List[str]:
    lines = []
    fwd = s["forward_ms"]
    ref = s["reference_ms"] or {}
    text = (f"forward: {fwd:.3f} ms per pass with hooks; leaf and (self) rows sum to "
            f"{s['leaf_sum_ms']:.3f} ms")
    if ref.get("forward"):
        text += (f"; {ref['forward']:.3f} ms without hooks (sum/unhooked "
                 f"{s['leaf_sum_ms'] / ref['forward']:.3f})")
    lines.append(text)
    if s.get("flops_per_pass") is not None:
        text = f"FLOPs counted: {_si(s['flops_per_pass'], 4)} per forward pass"
        if s.get("model_forward_flops"):
            text += (f"; flops_per_token()/3 x tokens: {_si(s['model_forward_flops'], 4)} "
                     f"(ratio {s['flops_per_pass'] / s['model_forward_flops']:.3f})")
        lines.append(text)
    if "backward_ms" in s:
        text = (f"backward: {s['backward_ms']:.3f} ms per pass; its rows sum to "
                f"{s['backward_leaf_sum_ms']:.3f} ms")
        if ref.get("backward"):
            text += f"; {ref['backward']:.3f} ms without the profiler"
        lines.append(text)
    return lines


def write_csv(rows: List[Row], path: Path) -> Path:
    """``rows`` as CSV, one line per row, every field a column."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=[field.name for field in fields(Row)])
        writer.writeheader()
        writer.writerows(row.as_dict() for row in rows)
    return path
