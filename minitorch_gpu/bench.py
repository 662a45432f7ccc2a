"""How fast this machine trains and samples the GPT, and against PyTorch eager if asked.

Two cases, nanoGPT's CPU shapes (float32, dropout 0)::

    baby   n_layer 4, n_head 4, n_embd 128, block_size 64,  batch 12, vocab 65
    small  n_layer 6, n_head 6, n_embd 384, block_size 256, batch 8,  vocab 65

For each case and side a fresh Python process (so neither side's thread pools, allocator
or lazily loaded kernels touch the other's, and its peak memory is its own) times:

* the training step a trainer runs, forward + cross-entropy + backward + AdamW (nanoGPT's
  settings: lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on the 2-D weights): the median
  step over ``steps`` steps after ``warmup``, tokens/s, and MFU against the float32 matmul
  peak of this machine, measured in the same run before and after the cases (each time
  in its own process, same threads), the larger kept;
* the peak resident memory of training: the process's high-water mark once the steps ran,
  less its resident size just before the model was built (the imports' share left out);
* generation at batch 1 with the KV cache: a 16-token prompt, 200 new tokens, temperature
  1; past ``block_size`` the window slides by half a block (both sides alike).

The torch side (``--vs-torch``, development only: torch is never a dependency) is
``torch_reference.TorchGPT`` with our model's initial weights, explicit-matmul attention,
``torch.optim.AdamW`` with the same groups and settings, and an equivalent KV cache.

    python scripts/bench.py --vs-torch --threads 2        # or: minitorch-gpu bench ...
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

__all__ = ["CASES", "run_bench", "format_table", "torch_available"]

CASES: Dict[str, Dict[str, int]] = {
    "baby": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, vocab_size=65),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=8,
                  vocab_size=65),
}
SIDES = ("minitorch", "torch")
LR, BETAS, WEIGHT_DECAY = 1e-3, (0.9, 0.99), 0.1  # nanoGPT's Shakespeare settings
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
EXIT_OUT_OF_MEMORY = 3  # a measuring process that ran out of memory (its one line on stderr)


def torch_available() -> bool:
    """Whether torch can be imported here (checked without importing it)."""
    import importlib.util
    return importlib.util.find_spec("torch") is not None


# --- inside one measuring process -------------------------------------------------------
def _resident_mb() -> float:
    """This process's resident size now (VmRSS), in MB; 0 off Linux. (Its high-water mark
    is the CPU backend's ``memory_stats()["peak_rss_bytes"]``.)"""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return 0.0


def _peak_mb() -> float:
    from minitorch_gpu.backend import cpu
    return cpu.memory_stats()["peak_rss_bytes"] / 2 ** 20


def _times_ms(run: Callable[[], Any], repeats: int) -> List[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def _build(side: str, shape: Dict[str, int]):
    """(model, optimizer, batches, training FLOPs per step) for one side; both sides start
    from the same weights and see the same batches."""
    import numpy as np

    import minitorch_gpu as mt
    from minitorch_gpu import nn
    mt.manual_seed(1337)
    config = nn.GPTConfig(block_size=shape["block_size"], vocab_size=shape["vocab_size"],
                          n_layer=shape["n_layer"], n_head=shape["n_head"],
                          n_embd=shape["n_embd"], dropout=0.0, bias=True)
    ours = nn.GPT(config)
    rng = np.random.default_rng(0)
    B, T, V = shape["batch_size"], shape["block_size"], shape["vocab_size"]
    data = [(rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))) for _ in range(4)]
    flops = ours.flops_per_token() * B * T
    if side == "minitorch":
        optimizer = ours.configure_optimizers(WEIGHT_DECAY, LR, BETAS)
        return ours, optimizer, [(mt.tensor(x), mt.tensor(y)) for x, y in data], flops
    import torch

    from minitorch_gpu.torch_reference import TorchGPT, torch_adamw
    model = TorchGPT.from_ours(ours)
    del ours
    optimizer = torch_adamw(model, WEIGHT_DECAY, LR, BETAS)
    return model, optimizer, [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in data], flops


def measure_peak(threads: Optional[int]) -> Dict[str, Any]:
    """The float32 matmul peak of this machine with ``threads`` BLAS threads: NumPy's BLAS,
    the best of several 2048 x 2048 products, in a process of its own."""
    import numpy as np

    from minitorch_gpu.machine import _measure_matmul, set_num_threads
    set_num_threads(threads)
    return {"case": "matmul_peak", "threads": threads,
            "gflop_per_s": _measure_matmul("cpu", np.float32, 2048, 8) / 1e9}


def measure(side: str, case: str, threads: Optional[int], steps: int, warmup: int,
            new_tokens: int, generate_runs: int) -> Dict[str, Any]:
    """One case on one side, in this process: what ``run_bench`` prints for it."""
    from minitorch_gpu.machine import set_num_threads
    set_num_threads(threads)
    if side == "torch":
        import torch
        if threads is not None:
            torch.set_num_threads(threads)
    shape = CASES[case]
    rss_before = _resident_mb()
    model, optimizer, batches, flops_per_step = _build(side, shape)

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()

    for i in range(warmup):
        step(i)
    counter = iter(range(steps))
    step_ms = _times_ms(lambda: step(next(counter)), steps)
    train_peak_mb = _peak_mb()

    model.eval()
    B, T = shape["batch_size"], shape["block_size"]
    prompt = batches[0][0][:1, :16]

    def generate() -> None:  # the same signature on both sides
        model.generate(prompt, new_tokens, 1.0, window_shift=T // 2)

    generate()  # warm-up
    generate_ms = statistics.median(_times_ms(generate, generate_runs))
    median = statistics.median(step_ms)
    return {
        "case": case, "side": side, "threads": threads, **shape, "steps": steps,
        "step_ms": {"median": median, "min": min(step_ms), "max": max(step_ms)},
        "train_tokens_per_s": B * T / (median / 1e3),
        "flops_per_step": flops_per_step,
        "train_memory_mb": train_peak_mb - rss_before, "peak_rss_mb": train_peak_mb,
        "generate_new_tokens": new_tokens,
        "generate_tokens_per_s": new_tokens / (generate_ms / 1e3),
    }


# --- the parent: one process per case and side ------------------------------------------
def _run_child(what: str, **spec: Any) -> Dict[str, Any]:
    """``measure(**spec)`` (or ``measure_peak``) in a fresh Python process."""
    env = dict(os.environ)
    if spec["threads"] is not None:  # BLAS libraries read these once, when they load
        env.update({name: str(spec["threads"]) for name in THREAD_VARIABLES})
    done = subprocess.run([sys.executable, "-m", "minitorch_gpu.bench", what, json.dumps(spec)],
                          env=env, capture_output=True, text=True)
    name = " ".join(str(spec[k]) for k in ("side", "case") if k in spec) or what
    if done.returncode == EXIT_OUT_OF_MEMORY:
        raise MemoryError(f"the {name} run: {done.stderr.strip()[-300:]}")
    if done.returncode != 0:
        raise RuntimeError(f"bench: the {name} run failed (exit {done.returncode}):\n"
                           f"{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_bench(cases: Iterable[str] = ("baby", "small"), *, vs_torch: bool = False,
              threads: Optional[int] = None, steps: int = 30, warmup: int = 5,
              new_tokens: int = 200, generate_runs: int = 3, rounds: int = 1,
              emit: Callable[[str], None] = print) -> List[Dict[str, Any]]:
    """Measure the matmul peak, then each case ``rounds`` times (ours, then torch's when
    ``vs_torch``: pairs taken close together, so a machine whose speed drifts moves both),
    ``emit`` one JSON line per process as it finishes, then per case and side the medians
    over the rounds and, with torch, the medians of the rounds' our/torch ratios. Returns
    the summary records (the peak first)."""
    cases = list(cases)
    for case in cases:
        if case not in CASES:
            raise ValueError(f"bench: unknown case {case!r}, expected one of {sorted(CASES)}")
    if vs_torch and not torch_available():
        raise RuntimeError("bench: --vs-torch needs torch, which is not installed (a "
                           "development-only comparison: pip install torch)")
    # the peak is measured before and after the cases, and the larger kept: a slow
    # stretch of a shared machine during one measurement would overstate every MFU
    peak = _run_child("peak", threads=threads)
    emit(json.dumps(peak))
    summary = [peak]
    sides = SIDES[:2 if vs_torch else 1]
    for case in cases:
        runs: Dict[str, List[Dict[str, Any]]] = {side: [] for side in sides}
        for round_ in range(rounds):
            for side in sides:
                record = _run_child("measure", side=side, case=case, threads=threads,
                                    steps=steps, warmup=warmup, new_tokens=new_tokens,
                                    generate_runs=generate_runs)
                record["round"] = round_
                seconds = record["step_ms"]["median"] / 1e3
                record["mfu"] = record["flops_per_step"] / seconds / (peak["gflop_per_s"] * 1e9)
                emit(json.dumps(record))  # its MFU against the first peak
                runs[side].append(record)
        for side in sides:
            summary.append(_median_record(runs[side]))
        if vs_torch:
            ratio: Dict[str, Any] = {"case": case, "side": "minitorch/torch", "rounds": rounds}
            for key in ("train_tokens_per_s", "generate_tokens_per_s", "train_memory_mb"):
                ratio[key] = statistics.median(ours[key] / theirs[key] for ours, theirs in
                                               zip(runs["minitorch"], runs["torch"]))
            summary.append(ratio)
    again = _run_child("peak", threads=threads)
    emit(json.dumps(again))
    peak["gflop_per_s"] = max(peak["gflop_per_s"], again["gflop_per_s"])
    for record in summary[1:]:
        if "mfu" in record:  # against the kept peak
            seconds = record["step_ms"]["median"] / 1e3
            record["mfu"] = record["flops_per_step"] / seconds / (peak["gflop_per_s"] * 1e9)
    if rounds > 1 or vs_torch:
        for record in summary:
            emit(json.dumps({**record, "summary": True}))
    return summary


def _median_record(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One side's rounds as one record: the median of each figure over the rounds."""
    merged = dict(runs[-1], rounds=len(runs))
    merged.pop("round", None)
    for key in ("train_tokens_per_s", "mfu", "train_memory_mb", "peak_rss_mb",
                "generate_tokens_per_s"):
        merged[key] = statistics.median(r[key] for r in runs)
    merged["step_ms"] = {k: statistics.median(r["step_ms"][k] for r in runs)
                         for k in ("median", "min", "max")}
    return merged


def format_table(records: List[Dict[str, Any]]) -> str:
    """The records as a short table, ratio rows included."""
    lines = [f"{'case':6s} {'side':16s} {'step ms':>8s} {'train tok/s':>11s} {'MFU':>6s} "
             f"{'gen tok/s':>9s} {'train MB':>8s}"]
    for r in records:
        if r["case"] == "matmul_peak":
            continue
        if r["side"] == "minitorch/torch":
            lines.append(f"{r['case']:6s} {'ratio ours/torch':16s} {'':>8s} "
                         f"{r['train_tokens_per_s']:10.2f}x {'':>6s} "
                         f"{r['generate_tokens_per_s']:8.2f}x {r['train_memory_mb']:7.2f}x")
        else:
            lines.append(f"{r['case']:6s} {r['side']:16s} {r['step_ms']['median']:8.1f} "
                         f"{r['train_tokens_per_s']:11.0f} {100 * r['mfu']:5.1f}% "
                         f"{r['generate_tokens_per_s']:9.0f} {r['train_memory_mb']:8.0f}")
    peaks = [r for r in records if r["case"] == "matmul_peak"]
    if peaks:
        lines.append(f"MFU against the float32 matmul peak (the larger of two measurements, "
                     f"before and after): {peaks[0]['gflop_per_s']:.0f} GFLOP/s with "
                     f"{peaks[0]['threads']} BLAS threads")
    return "\n".join(lines)


if __name__ == "__main__":  # one measuring process, started by _run_child
    work = {"measure": measure, "peak": measure_peak}[sys.argv[1]]
    try:
        print(json.dumps(work(**json.loads(sys.argv[2]))), flush=True)
    except MemoryError as exc:  # one line for the parent to pass on (a traceback is noise)
        print(" ".join(str(exc).split()) or "an allocation failed", file=sys.stderr)
        sys.exit(EXIT_OUT_OF_MEMORY)
