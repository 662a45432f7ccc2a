"""How fast this machine trains and samples the GPT and the Llama, and against PyTorch
(eager, and torch.compile) if asked; the table is ``bench_table``'s.

Three cases run by default, nanoGPT's CPU shapes (float32, dropout 0) and a Llama of the
baby's shape and about its parameters (no biases, an untied head, 2 key/value heads of 4,
SwiGLU 384 wide: 804,224 parameters to the baby GPT's 809,856); a fourth runs when named,
GPT-2 124M's shape for a GPU::

    baby   n_layer 4,  n_head 4,  n_embd 128, block_size 64,   batch 12, vocab 65
    small  n_layer 6,  n_head 6,  n_embd 384, block_size 256,  batch 8,  vocab 65
    llama  n_layer 4,  n_head 4,  n_embd 128, block_size 64,   batch 12, vocab 65,
           n_kv_head 2, ffn_hidden 384
    gpt2   n_layer 12, n_head 12, n_embd 768, block_size 1024, batch 16, vocab 50304

The step time per parameter (ns/param in the table) puts cases of different
architectures side by side.

For each case and side a fresh Python process (so no side's thread pools, allocator or
lazily loaded kernels touch another's, and its peak memory is its own) times:

* the training step a trainer runs, forward + cross-entropy + backward + AdamW (nanoGPT's
  settings: lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on the 2-D weights): the median
  step over ``steps`` steps after ``warmup``, tokens/s, and MFU against the matmul peak of
  this device in the step's dtype, measured in the same run before and after the cases
  (each time in its own process, same threads), the larger kept;
* what ran the arithmetic (``machine.libraries``): NumPy's BLAS, its version and the
  kernel architecture it picked (OpenBLAS runs its Haswell kernels on an AVX-512 processor
  where ``OPENBLAS_CORETYPE=Haswell`` is set, a third slower there), their threads, numba's
  and PyTorch's, in every record and under the table: a figure that does not say which
  kernel ran cannot be compared with another;
* the peak memory of training: on the CPU the process's resident high-water mark once the
  steps ran, less its resident size just before the model was built (the imports' share
  left out); on a GPU what the memory pool holds once the steps ran;
* with ``bf16``, the step under bf16 autocast (float32 master weights) and the largest
  |bf16 - float32| difference of the logits on one batch;
* generation at batch 1 with the KV cache: a 16-token prompt, 200 new tokens, temperature
  1; past ``block_size`` the window slides by half a block (every side alike). Ours is
  timed twice: as ``generate`` runs by default, each token a replay of the captured
  decode step (``nn.decoder``), and with ``capture=False``, each token through the eager
  ops (the "gen eager" column).

With ``cprofile`` it times nothing: it runs that many steps under cProfile instead and
reports the functions that take the most of a step's own time.

With ``vs_torch`` (development only: torch is never a dependency) the same model runs in
PyTorch, ``torch_reference``'s TorchGPT or TorchLlama with our model's initial weights,
``torch.optim.AdamW`` with the same groups and settings, and an equivalent KV cache, as up
to three sides (``torch_sides``, TORCH_SIDES): "torch", eager with torch's fused
``scaled_dot_product_attention`` (sdpa), the side the our/torch ratios are taken against;
"torch-explicit", eager with attention as explicit products (explicit); "torch-compile",
the sdpa model under ``torch.compile`` (compile): its training step is compiled (the
compilation falls in the warm-up steps, and the compiler's own memory in its training
memory), its generation would be the eager "torch" side's and is not timed again. Beside
the paired our/torch ratios, our figures over the best torch side's (each column's best
median) say how far we are from PyTorch's best here. A torch side that fails (say
``torch.compile`` with no C++ compiler) is recorded with its one-line reason and the
bench goes on.

    minitorch-gpu bench --vs-torch --threads 2
    minitorch-gpu bench --vs-torch --torch-sides sdpa,explicit    # no compilation
    minitorch-gpu bench --case gpt2 --device cuda --bf16 --no-generate
    minitorch-gpu bench --case baby --cprofile 20
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

from .summary import OUR_SIDES, median_record, ratios
from .table import format_table

__all__ = ["CASES", "GPU_CASES", "TORCH_SIDES", "run_bench", "format_table",
           "parse_torch_sides", "torch_available"]

CASES: Dict[str, Dict[str, Any]] = {  # the default cases
    "baby": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, vocab_size=65),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=8,
                  vocab_size=65),
    # the baby's shape as a Llama, its SwiGLU width chosen for about the baby's parameters
    "llama": dict(arch="llama", n_layer=4, n_head=4, n_kv_head=2, n_embd=128, block_size=64,
                  batch_size=12, vocab_size=65, ffn_hidden=384),
}
GPU_CASES: Dict[str, Dict[str, Any]] = {  # run only when named: too large for a CPU
    # GPT-2 124M, its vocabulary padded to a multiple of 64 as nanoGPT's
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, batch_size=16,
                 vocab_size=50304),
}
# the torch sides by the name --torch-sides gives them, in the order they run
# ours, and ours with the fused CPU kernels off (backend/cpu_kernels; --numpy-side)
TORCH_SIDES = {"sdpa": "torch", "explicit": "torch-explicit", "compile": "torch-compile"}
TORCH_ARCHS = ("gpt2", "llama")  # the archs torch_reference has a model of (with generate)
LR, BETAS, WEIGHT_DECAY = 1e-3, (0.9, 0.99), 0.1  # nanoGPT's Shakespeare settings
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
EXIT_OUT_OF_MEMORY = 3  # a measuring process that ran out of memory (its one line on stderr)
PROFILE_ROWS = 14  # the functions a cProfile table lists


def torch_available() -> bool:
    """Whether torch can be imported here (checked without importing it)."""
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def parse_torch_sides(text: str) -> tuple:
    """The side names of a comma-separated list of TORCH_SIDES keys ("sdpa,compile"), in
    TORCH_SIDES' order; ValueError naming a bad one and the valid ones."""
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if name not in TORCH_SIDES:
            raise ValueError(f"unknown torch side {name!r}, expected some of "
                             f"{','.join(TORCH_SIDES)} (comma-separated)")
    return tuple(side for key, side in TORCH_SIDES.items() if key in names)


def case_shape(case: str) -> Dict[str, Any]:
    """The shape of a case by name, a default one or a GPU one."""
    shapes = {**CASES, **GPU_CASES}
    if case not in shapes:
        raise ValueError(f"bench: unknown case {case!r}, expected one of {sorted(shapes)}")
    return shapes[case]


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


def _peak_mb(device: str) -> float:
    """The process's resident high-water mark on the CPU; what a GPU's pool holds."""
    from minitorch_gpu.backend import get_backend
    stats = get_backend(device).memory_stats()
    return stats.get("peak_rss_bytes", stats.get("bytes_reserved", 0)) / 2 ** 20


def _times_ms(run: Callable[[], Any], repeats: int) -> List[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def case_config(shape: Dict[str, Any]) -> Any:
    """The GPTConfig of a case's shape (a GPT-2 with biases, or a Llama), dropout 0."""
    from minitorch_gpu import nn
    return nn.GPTConfig(**{k: v for k, v in shape.items() if k != "batch_size"}, dropout=0.0)


def _build(side: str, shape: Dict[str, Any], device: str):
    """(model, its training forward, optimizer, batches, training FLOPs per step,
    parameters) for one side; every side starts from the same weights and sees the same
    batches."""
    import numpy as np

    import minitorch_gpu as mt
    from minitorch_gpu import nn
    mt.manual_seed(1337)
    config = case_config(shape)
    ours = nn.model_for(config)
    rng = np.random.default_rng(0)
    B, T, V = shape["batch_size"], shape["block_size"], shape["vocab_size"]
    data = [(rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))) for _ in range(4)]
    flops = ours.flops_per_token() * B * T
    parameters = ours.num_parameters()
    if side in OUR_SIDES:
        ours = ours.to(device)
        optimizer = ours.configure_optimizers(WEIGHT_DECAY, LR, BETAS)
        batches = [(mt.tensor(x, device=device), mt.tensor(y, device=device)) for x, y in data]
        return ours, ours, optimizer, batches, flops, parameters
    import torch

    from minitorch_gpu.bench.torch_reference import TorchGPT, TorchLlama, torch_adamw
    reference = TorchLlama if config.arch == "llama" else TorchGPT
    model = reference.from_ours(ours, "explicit" if side == "torch-explicit" else "sdpa")
    del ours
    # torch.compile compiles at the first call (a warm-up step), forward and backward;
    # generation calls the eager model, whose parameters the compiled one shares
    forward = torch.compile(model) if side == "torch-compile" else model
    optimizer = torch_adamw(model, WEIGHT_DECAY, LR, BETAS)
    return (model, forward, optimizer,
            [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in data], flops, parameters)


def measure_peak(threads: Optional[int], device: str = "cpu",
                 bf16: bool = False) -> Dict[str, Any]:
    """The matmul peak of ``device`` with ``threads`` BLAS threads, in a process of its
    own: the best of several square products (2048 on the CPU, in float32, as bf16 runs
    there; 8192 on a GPU, in bf16 when ``bf16``)."""
    import numpy as np

    from minitorch_gpu.backend import _cupy, dtypes, get_backend
    from minitorch_gpu.system.machine import _measure_matmul, set_num_threads
    set_num_threads(threads)
    device = str(get_backend(device).device)
    on_cpu = device == "cpu"
    dtype = dtypes.bfloat16 if bf16 and not on_cpu else np.float32
    # the emulated GPU: a small product (its rate means nothing; 8192 takes minutes there)
    n, repeats = (2048, 8) if on_cpu else (256, 2) if _cupy.EMULATED else (8192, 10)
    from minitorch_gpu.system.machine import libraries
    return {"case": "matmul_peak", "threads": threads, "device": device,
            "dtype": "bf16" if dtype == dtypes.bfloat16 else "float32",
            "gflop_per_s": _measure_matmul(device, dtype, n, repeats) / 1e9,
            "libraries": libraries()}


def measure(side: str, case: str, threads: Optional[int], steps: int, warmup: int,
            new_tokens: int, generate_runs: int, device: str = "cpu", bf16: bool = False,
            generate: bool = True, cprofile: int = 0) -> Dict[str, Any]:
    """One case on one side, in this process: what ``run_bench`` prints for it."""
    import minitorch_gpu as mt
    from minitorch_gpu.system.machine import libraries, set_num_threads
    set_num_threads(threads)
    if side not in OUR_SIDES:
        import torch
        if threads is not None:
            torch.set_num_threads(threads)
    backend = mt.get_backend(device)
    if side == "minitorch-numpy":  # our NumPy code, the fused CPU kernels switched off
        backend.use_fused_kernels = False
    device = str(backend.device)
    shape = case_shape(case)
    rss_before = _resident_mb()
    model, forward, optimizer, batches, flops_per_step, parameters = _build(side, shape, device)
    precision = mt.autocast("bf16", enabled=bf16)

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        with precision:
            _, loss = forward(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()  # waits for the device

    for i in range(warmup):
        step(i)
    described = {"case": case, "side": side, "threads": threads, "device": device,
                 "dtype": "bf16" if bf16 else "float32", **shape,
                 "libraries": libraries()}  # once the steps loaded what they run on
    if cprofile:
        return {**described, "cprofile_steps": cprofile, **profile_steps(step, cprofile)}
    counter = iter(range(steps))

    def timed() -> None:
        step(next(counter))
        backend.synchronize()

    step_ms = _times_ms(timed, steps)
    train_peak_mb = _peak_mb(device)
    B, T = shape["batch_size"], shape["block_size"]
    median = statistics.median(step_ms)
    record = {
        **described, "steps": steps,
        "step_ms": {"median": median, "min": min(step_ms), "max": max(step_ms)},
        "train_tokens_per_s": B * T / (median / 1e3),
        "flops_per_step": flops_per_step,
        "parameters": parameters,
        # the step time per parameter: what compares cases of different architectures
        "step_ns_per_param": median * 1e6 / parameters,
        "train_memory_mb": train_peak_mb - (rss_before if device == "cpu" else 0.0),
        "peak_rss_mb": _peak_mb("cpu"),
    }
    if bf16:
        record.update(bf16_logit_difference(model, batches[0]))
    if generate and side != "torch-compile":  # its generation is the torch side's
        model.eval()
        prompt = batches[0][0][:1, :16]

        def generate_once(**options: Any) -> None:  # the same signature on both sides
            model.generate(prompt, new_tokens, 1.0, window_shift=T // 2, **options)
            backend.synchronize()

        generate_once()  # warm-up (ours: the capture of the decode step)
        generate_ms = statistics.median(_times_ms(generate_once, generate_runs))
        record.update(generate_new_tokens=new_tokens,
                      generate_tokens_per_s=new_tokens / (generate_ms / 1e3))
        if side in OUR_SIDES:  # and each token through the eager ops, as before capture
            eager_ms = statistics.median(_times_ms(lambda: generate_once(capture=False),
                                                   generate_runs))
            record["generate_uncaptured_tokens_per_s"] = new_tokens / (eager_ms / 1e3)
    return record


def bf16_logit_difference(model: Any, batch: Any) -> Dict[str, float]:
    """How far bf16 autocast moves our model's logits from float32's on one batch: the
    largest absolute difference, and the largest absolute logit for scale."""
    import minitorch_gpu as mt
    x, y = batch
    with mt.no_grad():
        logits32, _ = model(x, y)
        with mt.autocast("bf16"):
            logits16, _ = model(x, y)
        diff = (logits16.float() - logits32).abs().max().item()
    return {"bf16_max_abs_logit_diff": diff, "max_abs_logit": logits32.abs().max().item()}


def profile_steps(step: Callable[[int], Any], steps: int) -> Dict[str, Any]:
    """Run ``step`` ``steps`` times under cProfile: the functions with the most own time
    per step (cProfile's overhead included), and the total."""
    import cProfile
    import pstats
    profile = cProfile.Profile()
    profile.enable()
    for i in range(steps):
        step(i)
    profile.disable()
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, _, own, cumulative, _)
    total = sum(own for _, _, own, _, _ in stats.values())
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:PROFILE_ROWS]
    functions = [{"function": f"{os.path.relpath(path) if path != '~' else ''}:{line}({name})",
                  "calls_per_step": calls / steps, "own_ms_per_step": own / steps * 1e3,
                  "percent": 100 * own / total}
                 for (path, line, name), (calls, _, own, _, _) in rows]
    return {"functions": functions, "total_ms_per_step": total / steps * 1e3}


# --- the parent: one process per case and side ------------------------------------------
def _run_child(what: str, **spec: Any) -> Dict[str, Any]:
    """``measure(**spec)`` (or ``measure_peak``) in a fresh Python process."""
    env = dict(os.environ)
    if spec["threads"] is not None:  # BLAS libraries read these once, when they load
        env.update({name: str(spec["threads"]) for name in THREAD_VARIABLES})
    done = subprocess.run([sys.executable, "-m", "minitorch_gpu.bench.runner", what, json.dumps(spec)],
                          env=env, capture_output=True, text=True)
    name = " ".join(str(spec[k]) for k in ("side", "case") if k in spec) or what
    if done.returncode != 0 and spec.get("side", "minitorch") not in OUR_SIDES:
        # a torch side that failed (torch.compile with no C++ compiler, say, or out of
        # memory): a row with its one-line reason, the last line on stderr; the bench goes on
        lines = done.stderr.strip().splitlines()
        reason = (f"killed by signal {-done.returncode}" if done.returncode < 0 else
                  lines[-1] if lines else f"exit {done.returncode}")
        return {"case": spec["case"], "side": spec["side"], "threads": spec["threads"],
                "failed": reason[:300]}
    if done.returncode == EXIT_OUT_OF_MEMORY:
        raise MemoryError(f"the {name} run: {done.stderr.strip()[-300:]}")
    if done.returncode != 0:
        raise RuntimeError(f"bench: the {name} run failed (exit {done.returncode}):\n"
                           f"{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_bench(cases: Iterable[str] = ("baby", "small"), *, vs_torch: bool = False,
              torch_sides: Iterable[str] = tuple(TORCH_SIDES.values()),
              threads: Optional[int] = None, steps: int = 30, warmup: int = 5,
              new_tokens: int = 200, generate_runs: int = 3, rounds: int = 1,
              device: str = "cpu", bf16: bool = False, generate: bool = True,
              cprofile: int = 0, numpy_side: bool = False,
              emit: Callable[[str], None] = print) -> List[Dict[str, Any]]:
    """Measure the matmul peak, then each case ``rounds`` times (ours, then with
    ``vs_torch`` each of ``torch_sides`` (TORCH_SIDES' values) in turn: rounds taken close
    together, so a machine whose speed drifts moves every side), ``emit`` one JSON line
    per process as it finishes (with ``numpy_side``, ours a second time with the fused CPU
    kernels off: "minitorch-numpy"), then per case and side the medians over the rounds and,
    with torch, the ratio records (``_ratios``). Returns the summary records (the peak
    first). With ``cprofile``, each case and side's profile instead (no peak, one round)."""
    cases, torch_sides = list(cases), tuple(torch_sides)
    for case in cases:
        case_shape(case)
    bad = [side for side in torch_sides if side not in TORCH_SIDES.values()]
    if bad or not torch_sides:
        raise ValueError(f"bench: torch_sides must be some of {list(TORCH_SIDES.values())}, "
                         f"got {list(torch_sides)}")
    if vs_torch and (bf16 or device != "cpu"):
        raise ValueError("bench: --vs-torch compares float32 steps on the CPU; drop --bf16 "
                         "and --device")
    if vs_torch and not torch_available():
        raise RuntimeError("bench: --vs-torch needs torch, which is not installed (a "
                           "development-only comparison: pip install torch)")
    sides = OUR_SIDES[:2 if numpy_side else 1] + (torch_sides if vs_torch else ())

    def sides_of(case: str) -> tuple:  # our side alone where torch_reference has no model
        return sides if case_shape(case).get("arch", "gpt2") in TORCH_ARCHS else sides[:1]
    work = dict(threads=threads, steps=steps, warmup=warmup, new_tokens=new_tokens,
                generate_runs=generate_runs, device=device, bf16=bf16, generate=generate)
    if cprofile:
        profiles = [_run_child("measure", side=side, case=case, cprofile=cprofile, **work)
                    for case in cases for side in sides_of(case)]
        for record in profiles:
            emit(json.dumps(record))
        return profiles
    # the peak is measured before and after the cases, and the larger kept: a slow
    # stretch of a shared machine during one measurement would overstate every MFU
    peak = _run_child("peak", threads=threads, device=device, bf16=bf16)
    emit(json.dumps(peak))
    summary = [peak]
    for case in cases:
        runs: Dict[str, List[Dict[str, Any]]] = {side: [] for side in sides_of(case)}
        for round_ in range(rounds):
            for side in runs:
                record = _run_child("measure", side=side, case=case, **work)
                record["round"] = round_
                if "failed" not in record:
                    seconds = record["step_ms"]["median"] / 1e3
                    record["mfu"] = (record["flops_per_step"] / seconds
                                     / (peak["gflop_per_s"] * 1e9))
                emit(json.dumps(record))  # its MFU against the first peak
                runs[side].append(record)
        medians = [median_record(runs[side]) for side in runs]
        summary += medians
        if vs_torch and len(runs) == 1:
            summary[-1]["torch"] = "no torch reference for this arch"
        elif vs_torch:
            summary += ratios(case, runs, medians)
    again = _run_child("peak", threads=threads, device=device, bf16=bf16)
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


if __name__ == "__main__":  # one measuring process, started by _run_child
    work = {"measure": measure, "peak": measure_peak}[sys.argv[1]]
    spec = json.loads(sys.argv[2])
    try:
        print(json.dumps(work(**spec)), flush=True)
    except MemoryError as exc:  # one line for the parent to pass on (a traceback is noise)
        print(" ".join(str(exc).split()) or "an allocation failed", file=sys.stderr)
        sys.exit(EXIT_OUT_OF_MEMORY)
    except Exception as exc:  # noqa: BLE001  a torch side's failure: its row's reason
        if spec.get("side", "minitorch") in OUR_SIDES:
            raise
        import traceback
        traceback.print_exc()  # then one line, the last, whatever the message's length
        message = str(exc).strip().splitlines()
        print(f"{type(exc).__name__}: {message[0] if message else ''}", file=sys.stderr)
        sys.exit(1)
