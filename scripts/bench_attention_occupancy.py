"""On a GPU: flash attention's forward at head size 64 built as shipped (ptxas asked for 5
resident blocks per SM: 96 registers on sm_90, 31% occupancy) against the same build
without the request (124 registers, 25%), timed in one process with CUDA events. What
only a GPU can decide (docs/PERF.md, "The CUDA kernels' resources").

    python scripts/bench_attention_occupancy.py                 # (8, 12, 1024, 64) bf16, causal
    python scripts/bench_attention_occupancy.py --shape 16 12 2048 64 --repeats 50

Exits 2 with the reason where no GPU (or no CuPy) is present.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=4, default=[8, 12, 1024, 64],
                        metavar=("B", "H", "T", "D"))
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    import minitorch_gpu as mt
    if not mt.cuda.is_available():
        print(f"bench_attention_occupancy: needs a GPU: {mt.cuda.unavailable_reason()}",
              file=sys.stderr)
        return 2
    import cupy

    from minitorch_gpu.backend.kernels import attention, loader
    B, H, T, D = args.shape
    rng = cupy.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, T, D), dtype=cupy.float32).astype(mt.bfloat16)
               for _ in range(3))
    real_load = loader.load_kernel
    results = {}
    for label, blocks in (("shipped (min blocks 5 at head 64)", None), ("no request", 0)):
        def load(like, filename, name, _blocks=blocks, **defines):
            if _blocks is not None:
                defines["FWD_MIN_BLOCKS_AT_64"] = _blocks
            return real_load(like, filename, name, **defines)
        loader.load_kernel = load
        try:
            attention.flash_attention_forward(q, k, v, True, D ** -0.5)  # compile, warm
            times = []
            for _ in range(args.repeats):
                start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                start.record()
                attention.flash_attention_forward(q, k, v, True, D ** -0.5)
                stop.record()
                stop.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, stop))
        finally:
            loader.load_kernel = real_load
        results[label] = statistics.median(times)
    for label, ms in results.items():
        print(f"{label:36s} {ms:8.3f} ms (median of {args.repeats})")
    print(f"device: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, shape "
          f"{tuple(args.shape)} bf16, causal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
