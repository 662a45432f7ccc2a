"""Each CUDA kernel's registers, spills, static shared memory and theoretical occupancy on
sm_75, sm_80, sm_86, sm_89 and sm_90, as ptxas reports them when NVRTC compiles the builds
the launchers ask for with CuPy 14's options (minitorch_gpu/backend/kernels/nvrtc.py). No
GPU needed.

    python scripts/kernel_resources.py                 # the table at head sizes 17/32/64/128
    python scripts/kernel_resources.py --check         # every build for sm_80 and sm_90 (396
                                                       # x 2), the 21 representative builds
                                                       # (builds.py) for sm_75/86/89: exit 1
                                                       # on a compile error or warning, a
                                                       # spill at head size 32, 64 or 128, or
                                                       # a block that cannot be resident
    python scripts/kernel_resources.py --head-dims 64 96 --arch 75 86

NVRTC runs one compile at a time per process, so the builds are spread over processes.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
from typing import List, Optional

from minitorch_gpu.backend import kernels
from minitorch_gpu.backend.kernels import loader, nvrtc
from minitorch_gpu.backend.kernels.builds import builds_for

# threads per block of each source's launches (the launchers' constants)
THREADS = {"attention.cu": kernels.ATTENTION_WARPS * 32,
           "attention_softmax.cu": kernels.SOFTMAX_THREADS,
           "cross_entropy.cu": kernels.CROSS_ENTROPY_THREADS,
           "layernorm.cu": kernels.LAYERNORM_WARPS_PER_BLOCK * 32,
           "rmsnorm.cu": kernels.RMS_NORM_WARPS_PER_BLOCK * 32,
           "gelu.cu": kernels.ELEMENTWISE_THREADS, "adamw.cu": kernels.ELEMENTWISE_THREADS,
           "rotary.cu": kernels.ELEMENTWISE_THREADS, "swiglu.cu": kernels.ELEMENTWISE_THREADS}
# the column-sum kernels' blocks
COLUMN_THREADS = {"layernorm_backward_dweight_dbias": kernels.LAYERNORM_COLUMN_THREADS,
                  "rms_norm_backward_dweight": kernels.RMS_NORM_COLUMN_THREADS}
NO_SPILL_HEAD_DIMS = (32, 64, 128)


def _compile(job):
    name, defines, arch = job
    try:
        log, _ = nvrtc.compile_source(loader.source_text(name), name,
                                      nvrtc.ptxas_options(arch, defines))
    except nvrtc.NvrtcError as exc:
        return job, None, str(exc)
    return job, nvrtc.resources(log), ("warning" in log.lower() and log) or None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compile every build (sm_80, "
                        "sm_90) or the representative ones (the others); exit 1 on an error, "
                        "a warning, a spill at head size 32, 64 or 128 or a block that cannot "
                        "be resident")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[17, 32, 64, 128],
                        help="attention head sizes to list (default: 17 32 64 128)")
    parser.add_argument("--arch", nargs="+", default=list(nvrtc.ARCHITECTURES),
                        choices=nvrtc.ARCHITECTURES, help="architectures (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    if not nvrtc.available():
        print("kernel_resources: NVRTC is not installed (pip install nvidia-cuda-nvrtc)",
              file=sys.stderr)
        return 2
    shown = set(args.head_dims)
    jobs = [(name, defines, arch) for arch in args.arch for name, defines in builds_for(arch)
            if args.check or dict(defines).get("HEAD_DIM", 0) in shown | {0}]
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_compile, jobs, chunksize=4))
    major, minor = nvrtc.version()
    print(f"NVRTC {major}.{minor}; options: {' '.join(nvrtc.ptxas_options('XX'))}")
    print(f"{'source':22s} {'defines':24s} {'kernel':36s} {'arch':>4s} {'regs':>4s} "
          f"{'spill B':>7s} {'smem B':>6s} {'occupancy':>9s}")
    problems = []
    for (name, defines, arch), rows, error in results:
        d = dict(defines)
        label = " ".join(f"{k}={v}" for k, v in defines)
        if error:
            problems.append(f"{name} {label} sm_{arch}: {error[:300]}")
        for r in rows or []:
            spilled = r.spill_stores + r.spill_loads
            if spilled and d.get("HEAD_DIM", 0) in (0,) + NO_SPILL_HEAD_DIMS:
                problems.append(f"{name} {label} {r.kernel} sm_{arch}: spills {spilled} bytes")
            threads = COLUMN_THREADS.get(r.kernel, THREADS[name])
            share = nvrtc.occupancy(arch, threads, r.registers, r.shared)
            if share == 0:
                problems.append(f"{name} {label} {r.kernel} sm_{arch}: a block of {threads} "
                                f"threads, {r.registers} registers each and {r.shared} bytes "
                                f"of shared memory cannot be resident")
            if d.get("HEAD_DIM", 0) in shown | {0}:
                print(f"{name:22s} {label:24s} {r.kernel:36s} {arch:>4s} {r.registers:4d} "
                      f"{spilled:7d} {r.shared:6d} {100 * share:8.1f}%")
    if args.check:
        counts = ", ".join(f"{len(builds_for(a))} for sm_{a}" for a in args.arch)
        print(f"{len(results)} builds compiled ({counts})")
    for line in problems:
        print("problem:", line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
