#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): one prepared run on a machine with an NVIDIA GPU
# whose Python already has numpy, CuPy 14, ml_dtypes and pytest (no network needed). Each
# step under its own time limit, 360 s in all; at most 8 files under $OUT; a summary last.
#     bash scripts/gpu_check.sh                   # the whole check
#     bash scripts/gpu_check.sh --only bench,rest # rerun the steps that failed
#     bash scripts/gpu_check.sh --list            # the steps and their limits
#     bash scripts/gpu_check.sh --dry-run         # every step on the emulated GPU, tiny
#                                                 # sizes, limits x3, ~100 s on two idle
#                                                 # cores (compute-sanitizer GPU-only)
# Pure-Python test tools missing there can travel beside the checkout in ".devdeps"
# (ignored by git), prepared on a machine with a network:
#     pip install --target .devdeps pytest pytest-xdist hypothesis
cd "$(dirname "$0")/.." || exit 2
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
