"""The roofline picture: every layer as a point (intensity, achieved GFLOP/s) under the
machine's two roofs. Needs matplotlib, an optional extra."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import numpy as np

from .roofline import Roofline
from .rows import Row

__all__ = ["PLOT_HINT", "plot_roofline"]

PLOT_HINT = ('--plot needs matplotlib: pip install "minitorch-gpu[plot]" (or pip install '
             'matplotlib)')


def plot_roofline(rows: List[Row], roof: Roofline, model_name: str, path: Path) -> Path:
    """Each forward row that partitions the pass as a point (FLOP/byte, achieved GFLOP/s)
    under ``roof``, saved as an image at ``path``."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no screen needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(PLOT_HINT) from None
    points = [r for r in rows if r.phase == "forward" and r.leaf
              and r.flops and r.intensity and r.gflops]
    intensities = [r.intensity for r in points] or [roof.ridge]
    low = min(min(intensities), roof.ridge) / 4
    high = max(max(intensities), roof.ridge) * 4
    xs = np.geomspace(low, high, 200)
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.plot(xs, [roof.attainable(x) / 1e9 for x in xs], color="black",
            label=f"roof: {roof.bandwidth / 1e9:.1f} GB/s x intensity, capped at "
                  f"{roof.peak_flops / 1e9:.0f} GFLOP/s")
    ax.axvline(roof.ridge, color="grey", linestyle=":", label=f"ridge {roof.ridge:.1f} "
                                                              f"FLOP/byte")
    kinds: Dict[str, List[Row]] = {}
    for r in points:
        kinds.setdefault(r.type if r.kind == "module" else "(self)", []).append(r)
    for kind, group in sorted(kinds.items()):
        ax.scatter([r.intensity for r in group], [r.gflops for r in group], label=kind,
                   s=30)
    named = set()
    for r in sorted(points, key=lambda r: -(r.percent or 0.0)):
        # name each kind of layer once (every block has an attn.c_attn), where it matters
        label = (".".join(r.name.split(".")[-2:]) if r.kind == "module"
                 else f"{r.type} (self)")
        label = label.split(".", 1)[1] if label.split(".")[0].isdigit() else label
        if label not in named and (r.percent or 0.0) >= 1.0:
            named.add(label)
            ax.annotate(label, (r.intensity, r.gflops), fontsize=7,
                        textcoords="offset points", xytext=(4, -3))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"{model_name} forward on {roof.device} ({roof.dtype})")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
