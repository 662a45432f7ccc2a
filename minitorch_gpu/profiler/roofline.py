"""The machine's roofline, and a layer's verdict against it.

A layer whose FLOP per byte (its arithmetic intensity) is below the machine's ridge point
(peak FLOP/s over copy bandwidth, both measured, see ``machine``) can at best run at
bandwidth times intensity: it is memory-bound; above, compute-bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import numpy as np

__all__ = ["Roofline", "Verdict"]


class Verdict(NamedTuple):
    """Work done in some seconds, judged against a roofline (None: not known)."""

    intensity: Optional[float]  # FLOP per byte
    gflops: Optional[float]  # achieved GFLOP/s
    gbytes: Optional[float]  # achieved GB/s
    bound: str  # "compute", "memory", or "-" for no work at all
    roof_pct: Optional[float]  # achieved rate as % of the roof at this intensity


@dataclass(frozen=True)
class Roofline:
    """The two ceilings of a device for one dtype: peak FLOP/s of a matrix product and
    bytes/s of a large copy. ``ridge`` (FLOP/byte) is where they meet."""

    peak_flops: float
    bandwidth: float
    device: str = "cpu"
    dtype: str = "float32"

    @classmethod
    def measure(cls, device: str, dtype: Any) -> "Roofline":
        from ..system.machine import copy_bandwidth, matmul_peak_flops
        return cls(matmul_peak_flops(device, dtype), copy_bandwidth(device, dtype),
                   device, np.dtype(dtype).name)

    @property
    def ridge(self) -> float:
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The best FLOP/s at ``intensity`` FLOP/byte: min(peak, bandwidth x intensity)."""
        return min(self.peak_flops, self.bandwidth * intensity)

    def judge(self, flops: Optional[float], nbytes: Optional[float],
              seconds: float) -> Verdict:
        """Intensity, achieved rates, the verdict and roof % of ``flops`` FLOPs and
        ``nbytes`` bytes done in ``seconds``."""
        intensity = flops / nbytes if flops is not None and nbytes else None
        gflops = flops / seconds / 1e9 if flops is not None and seconds > 0 else None
        gbytes = nbytes / seconds / 1e9 if nbytes is not None and seconds > 0 else None
        if intensity is None or flops == 0:
            bound = "memory" if nbytes else "-"
            roof_rate = self.bandwidth if nbytes else None
            achieved = gbytes
        else:
            bound = "memory" if intensity < self.ridge else "compute"
            roof_rate = self.attainable(intensity)
            achieved = gflops
        # how close to its roof: FLOP/s against min(peak, bw x I), or bytes/s against bw
        roof_pct = (100.0 * achieved * 1e9 / roof_rate
                    if achieved is not None and roof_rate else None)
        return Verdict(intensity, gflops, gbytes, bound, roof_pct)
