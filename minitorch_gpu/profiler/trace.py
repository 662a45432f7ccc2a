"""A recording as Chrome's trace-event JSON: one complete event per module call (nested as
the calls were) on the forward track, one per autograd node on the backward track."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from .records import Recording

__all__ = ["write_trace"]


def write_trace(recording: Recording, path: Path) -> Path:
    """Write ``recording``'s spans to ``path``, with shapes, FLOPs and bytes as args; it
    opens in ui.perfetto.dev and chrome://tracing."""
    starts = ([c.start for c in recording.calls if c.end]
              + [n.start for n in recording.nodes])
    origin = min(starts) if starts else 0.0

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    events: List[Dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "minitorch_gpu"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "forward"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "backward"}},
    ]
    for call in recording.calls:
        if not call.end:
            continue
        cost = call.cost()
        events.append({
            "name": call.name or type(call.module).__name__, "cat": "forward", "ph": "X",
            "pid": 1, "tid": 1, "ts": us(call.start), "dur": us(call.end) - us(call.start),
            "args": {"type": type(call.module).__name__, "pass": call.pass_index,
                     "inputs": [list(s[0]) for s in call.inputs],
                     "outputs": [list(s[0]) for s in call.outputs],
                     "own_flops": cost.flops, "own_bytes": cost.bytes}})
    for i, (start, end) in enumerate(recording.backward_passes):
        events.append({"name": "backward", "cat": "backward", "ph": "X", "pid": 1, "tid": 2,
                       "ts": us(start), "dur": us(end) - us(start), "args": {"pass": i}})
    for node in recording.nodes:
        events.append({"name": node.name, "cat": "backward", "ph": "X", "pid": 1, "tid": 2,
                       "ts": us(node.start), "dur": us(node.end) - us(node.start),
                       "args": {"module": node.scope, "pass": node.pass_index}})
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return path
