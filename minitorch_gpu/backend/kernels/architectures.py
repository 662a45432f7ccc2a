"""The GPU architectures the kernels are built and checked for, and each one's SM limits.

Every build the launchers can ask for is compiled by NVRTC for sm_80 and sm_90, and a
representative set (each kernel in each storage dtype, ``builds.builds_for``) for the
others, so that ``scripts/kernel_resources.py --check`` stays within CI's time. The loader
names these in the error a build that fails on a GPU raises; ``nvrtc.occupancy`` reads
the limits.
"""
from __future__ import annotations

from typing import Dict

__all__ = ["ARCHITECTURES", "BF16_MIN_ARCH", "EVERY_BUILD_ARCHITECTURES", "SM_LIMITS"]

# the GPUs people train on: T4 (sm_75), A100 (80), A10 / RTX 3090 (86), L4 / RTX 4090 (89),
# H100 / H200 (90). NVRTC 13 compiles for nothing older than sm_75.
ARCHITECTURES = ("75", "80", "86", "89", "90")
EVERY_BUILD_ARCHITECTURES = ("80", "90")  # every build; the others the representative set
BF16_MIN_ARCH = "80"  # bf16 arithmetic and tensor cores came with Ampere (compute 8.0)

# per SM (and per block), for theoretical occupancy: the CUDA C Programming Guide's
# "Technical Specifications per Compute Capability" table. max_threads is a block's most
# (1,024 everywhere); shared is the largest carve-out of the SM's unified data cache,
# shared_per_block what one block may use (its static part is at most 48 KiB anyway);
# reserved the shared memory the system keeps per block (1 KiB from 8.0 on, none on 7.5)
# and shared_unit its allocation granularity (256 bytes on 7.x, 128 from 8.0 on).
SM_LIMITS: Dict[str, Dict[str, int]] = {
    "75": dict(max_warps=32, max_blocks=16, registers=65536, shared=65536,
               shared_per_block=65536, reserved=0, shared_unit=256, max_threads=1024),
    "80": dict(max_warps=64, max_blocks=32, registers=65536, shared=167936,
               shared_per_block=166912, reserved=1024, shared_unit=128, max_threads=1024),
    "86": dict(max_warps=48, max_blocks=16, registers=65536, shared=102400,
               shared_per_block=101376, reserved=1024, shared_unit=128, max_threads=1024),
    "89": dict(max_warps=48, max_blocks=24, registers=65536, shared=102400,
               shared_per_block=101376, reserved=1024, shared_unit=128, max_threads=1024),
    "90": dict(max_warps=64, max_blocks=32, registers=65536, shared=233472,
               shared_per_block=232448, reserved=1024, shared_unit=128, max_threads=1024),
}
