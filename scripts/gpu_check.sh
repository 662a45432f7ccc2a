#!/usr/bin/env bash
# The GPU check, in one go, on a machine with an NVIDIA GPU whose Python already has numpy,
# CuPy 14 and ml_dtypes (no network needed). Under 8 minutes on one H200:
#   1. the cuda half of the test suite (every op, the fused kernels, the profiler, on cuda)
#   2. shakespeare_char_gpu.yaml trained in bf16 for a few hundred iterations
#   3. one profiled forward pass of that model, with its Chrome trace
#   4. a GPT-2-124M-shaped training step in bf16: tokens/s, step time, MFU against the bf16
#      matmul peak measured in the same run, max |bf16 - fp32| of the logits
# and a short table last. Full logs go to $OUT when it is set (else to a temporary folder).
#
# The pure-Python test tools may be missing there: prepare them beside the checkout first,
# on a machine with a network (".devdeps" is ignored by git):
#     pip install --target .devdeps pytest hypothesis
# The corpus: $TINYSHAKESPEARE, else shared/data/tinyshakespeare.txt or
# ../shared/data/tinyshakespeare.txt; without one, step 2 is skipped and says so.
#     bash scripts/gpu_check.sh [--quick]   # --quick: 60 iterations, 5 timed steps
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/.devdeps:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
export MINITORCH_GPU_CACHE="$out/cache"
iters=300; steps=20
[[ "${1:-}" == "--quick" ]] && { iters=60; steps=5; }
status=0
summary="$out/summary.jsonl"
: > "$summary"

step() {  # step NAME LOGFILE COMMAND...: run, keep the log, record how it ended
    local name=$1 log=$2; shift 2
    echo "== $name" >&2
    local start=$SECONDS
    "$@" > "$log" 2>&1
    local rc=$?
    tail -n 5 "$log" >&2
    printf '{"step": "%s", "rc": %d, "seconds": %d}\n' "$name" "$rc" $((SECONDS - start)) \
        >> "$summary"
    [[ $rc -ne 0 ]] && status=1
    return 0
}

python3 - <<'PY' || exit 1
import cupy
import minitorch_gpu as mt
if not mt.cuda.is_available():
    raise SystemExit(f"no usable GPU: {mt.cuda.unavailable_reason()}")
print(f"{mt.cuda.device_count()} GPU(s); CuPy {cupy.__version__}; "
      f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
import numpy as np
try:  # CuPy registers bfloat16 only with NumPy >= 2.1.2 and ml_dtypes at import
    cupy.asarray(np.zeros(2, mt.bfloat16)).astype(np.float32)
except Exception as exc:
    raise SystemExit(f"CuPy has no bfloat16 here (NumPy {np.__version__}): {exc}")
PY

# 1. the cuda half of every table and test (each compares the GPU to NumPy)
step tests "$out/gpu_tests.log" python3 -m pytest -q -m cuda -p no:cacheprovider tests/

# 2. the GPU recipe in bf16, cut short
corpus="${TINYSHAKESPEARE:-}"
for candidate in shared/data/tinyshakespeare.txt ../shared/data/tinyshakespeare.txt; do
    [[ -z "$corpus" && -f "$candidate" ]] && corpus="$candidate"
done
if [[ -n "$corpus" ]]; then
    step train "$out/train.log" python3 -m minitorch_gpu train configs/shakespeare_char_gpu.yaml \
        --set "data.path=$corpus" --set "train.max_iters=$iters" \
        --set "train.lr_decay_iters=$iters" --set eval.interval=100 --set eval.iters=20 \
        --set "checkpoint.dir=$out/checkpoints" --progress lines --overwrite
    cp "$out"/checkpoints/*/metrics.jsonl "$out/train_metrics.jsonl" 2>/dev/null
    rm -rf "$out/checkpoints" "$out/cache"  # large, and not wanted back
else
    echo "== train: skipped, no tinyshakespeare.txt (set TINYSHAKESPEARE)" >&2
    printf '{"step": "train", "rc": -1, "seconds": 0}\n' >> "$summary"
fi

# 3. one profiled forward pass of the same model (its vocabulary: the 65 characters)
step profile "$out/profile.txt" python3 -m minitorch_gpu profile \
    configs/shakespeare_char_gpu.yaml --set model.vocab_size=65 --warmup 2 --iters 5 \
    --trace "$out/trace.json"

# 4. GPT-2 124M shape, bf16, one GPU
step gpt2 "$out/gpt2_bench.jsonl" python3 scripts/bench_train_step.py --device cuda --bf16 \
    --n-layer 12 --n-head 12 --n-embd 768 --block-size 1024 --vocab-size 50304 \
    --batch-size 16 --steps "$steps" --warmup 3 --no-generate

python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def lines(name):
    path = out / name
    return [json.loads(l) for l in path.read_text().splitlines()
            if l.startswith("{")] if path.exists() else []
print("\nGPU check", out)
for s in lines("summary.jsonl"):
    ok = {0: "ok", -1: "skipped"}.get(s["rc"], f"FAILED (rc {s['rc']})")
    print(f"  {s['step']:<8} {ok:<16} {s['seconds']:>5d} s")
evals = [m for m in lines("train_metrics.jsonl") if "val_loss" in m]
if evals:
    print(f"  train: val loss {evals[-1]['val_loss']:.4f} at iteration {evals[-1].get('iter')}")
for r in lines("gpt2_bench.jsonl"):
    if r["case"] == "train_step":
        print(f"  GPT-2 124M bf16, batch {r['batch_size']} x {r['block_size']}: "
              f"{r['step_ms']['median']:.1f} ms/step, {r['tokens_per_s']:,.0f} tokens/s, "
              f"MFU {100 * r['mfu']:.1f}% of {r['peak_gflop_per_s'] / 1e3:.0f} TFLOP/s "
              f"(bf16 matmul, measured)")
    elif r["case"] == "bf16_vs_fp32_logits":
        print(f"  max |bf16 - fp32| logits: {r['max_abs_diff']:.4g} "
              f"(largest |logit| {r['max_abs_logit']:.3g})")
PY
exit $status
