"""A profile's totals: time per pass, what its rows sum to, counted FLOPs and bytes, the
reference timed without hooks, and the roofline they were judged against."""
from __future__ import annotations

from typing import Any, Dict, List

from .records import Recording
from .roofline import Roofline
from .rows import Row, median

__all__ = ["summarize"]


def summarize(recording: Recording, rows: List[Row], roof: Roofline) -> Dict[str, Any]:
    """Per-pass forward time (hooked, median), the sum of the partition rows, the
    reference (unhooked) time when known, counted FLOPs and bytes per pass, the model's
    own FLOP estimate when it has ``flops_per_token``, and the backward's times."""
    forward = [r for r in rows if r.phase == "forward"]
    root = forward[0] if forward else None
    out: Dict[str, Any] = {
        "passes": recording.passes,
        "forward_ms": root.pass_ms if root else None,
        "leaf_sum_ms": sum(r.pass_ms for r in forward if r.leaf),
        "flops_per_pass": root.flops if root else None,
        "bytes_per_pass": root.bytes if root else None,
        "reference_ms": dict(recording.reference_ms) if recording.reference_ms else None,
    }
    model = recording.model
    calls = [c for c in recording.calls if c.name == "" and c.inputs]
    if hasattr(model, "flops_per_token") and calls:
        shape = calls[-1].inputs[0][0]  # idx (B, T)
        if len(shape) == 2:
            B, T = shape
            # flops_per_token counts forward and backward: the forward is a third
            out["model_forward_flops"] = model.flops_per_token(T) * B * T // 3
    backward = [r for r in rows if r.phase == "backward"]
    if backward:
        out["backward_ms"] = median(recording.backward_seconds()) * 1e3
        out["backward_leaf_sum_ms"] = sum(r.pass_ms for r in backward if r.leaf)
    out["roofline"] = {"peak_gflops": roof.peak_flops / 1e9,
                       "bandwidth_gbytes": roof.bandwidth / 1e9,
                       "ridge_flop_per_byte": roof.ridge, "device": roof.device,
                       "dtype": roof.dtype}
    return out
