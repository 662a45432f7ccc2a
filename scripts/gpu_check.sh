#!/usr/bin/env bash
# Every GPU check of the suite in one go, on a machine with CuPy and a CUDA GPU.
#
# Such a machine may have no network: prepare the pure-Python test tools beside the
# checkout first, on a machine that has one (".devdeps" is ignored by git):
#     pip install --target .devdeps pytest hypothesis
# then, on the GPU machine, from the repository root (with .devdeps copied along):
#     bash scripts/gpu_check.sh
# The log goes to $OUT/gpu_tests.log when OUT is set, else to /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/.devdeps:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
log="${OUT:-/tmp}/gpu_tests.log"
python3 - <<'PY'
import cupy
import minitorch_gpu as mt
if not mt.cuda.is_available():
    raise SystemExit(f"no usable GPU: {mt.cuda.unavailable_reason()}")
print(f"{mt.cuda.device_count()} GPU(s); CuPy {cupy.__version__}; "
      f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
PY
# the cuda half of every table and test (cpu and cuda must agree: each compares to NumPy)
python3 -m pytest -q -m cuda -p no:cacheprovider tests/ 2>&1 | tee "$log"
