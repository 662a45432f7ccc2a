"""Peak memory and time of ``load_pretrained`` on a Hugging Face GPT-2 124M folder.

    python scripts/bench_pretrained_memory.py --runs 3
    python scripts/bench_pretrained_memory.py --runs 3 --dtype bf16   # bf16 weights in the file

Builds a GPT-2 small folder the way transformers saves GPT2LMHeadModel (config.json with
model_type gpt2, model.safetensors with Hugging Face's names, Conv1D weights stored
(in, out), the tied lm_head left out) from random NumPy arrays, no torch, in a temporary
folder (or ``--dir``, kept). Each run loads it in two fresh processes, so the interpreter's
baseline is clean (``import minitorch_gpu`` and ``load_pretrained`` imported, nothing else):

- rss: RSS right before the call (VmRSS), then the process's high-water mark
  (``getrusage(RUSAGE_SELF).ru_maxrss``; /proc's VmHWM is checked to agree: ru_maxrss
  also remembers the high-water of the process that started this one, so the folder is
  written in a child of its own) after it, and the call's wall time. RSS counts
  the anonymous memory (the model's arrays, temporaries) and the touched pages of the
  memory-mapped safetensors file (file-backed, clean: the kernel can drop them at will).
  A thread polling /proc/self/status every millisecond gives the two parts' peaks
  separately (RssAnon, RssFile): a lower bound, as safetensors holds the GIL while it
  reads a tensor and a short peak may pass between two polls; ru_maxrss is the figure.
- tracemalloc: in the second process, the peak of traced allocations during the call
  made with tracemalloc on (NumPy reports its arrays to it, bytes objects are Python's):
  anonymous memory alone, never the file's pages, but counting allocated arrays whose
  pages were never touched (``empty``), which RSS does not.

Figures are above the baseline, in MB (10^6 bytes) and as multiples of the model's
float32 weights (its parameter count x 4 bytes, the tied embedding counted once). The
file is in the page cache when it is loaded, as it is right after it was written.
Prints one line per run and the medians.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

GPT2_SMALL = dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)
MB = 10 ** 6


def gpt2_shapes(n_layer: int, n_embd: int, n_positions: int, vocab_size: int, **_) -> dict:
    """Hugging Face GPT2LMHeadModel's file keys -> shapes (Conv1D weights (in, out))."""
    C = n_embd
    shapes = {"transformer.wte.weight": (vocab_size, C), "transformer.wpe.weight": (n_positions, C)}
    for i in range(n_layer):
        h = f"transformer.h.{i}."
        shapes.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,),
                       h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
                       h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                       h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
                       h + "mlp.c_fc.weight": (C, 4 * C), h + "mlp.c_fc.bias": (4 * C,),
                       h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
    shapes.update({"transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)})
    return shapes


def write_folder(folder: Path, dtype: str, seed: int) -> int:
    """config.json and model.safetensors of a random GPT-2 small in ``folder``; the
    parameter count (the tied lm_head is not in the file, so counted once)."""
    import numpy as np
    from safetensors.numpy import save_file
    cast = np.float32
    if dtype == "bf16":
        import ml_dtypes
        cast = ml_dtypes.bfloat16
    rng = np.random.default_rng(seed)
    tensors = {}
    for key, shape in gpt2_shapes(**GPT2_SMALL).items():
        array = rng.standard_normal(shape, dtype=np.float32)
        array *= 0.02
        if key.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            array += 1.0
        tensors[key] = array.astype(cast, copy=False)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
              "n_ctx": GPT2_SMALL["n_positions"], "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
              "bos_token_id": 50256, "eos_token_id": 50256,
              "torch_dtype": "bfloat16" if dtype == "bf16" else "float32", **GPT2_SMALL}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return sum(int(np.prod(shape)) for shape in gpt2_shapes(**GPT2_SMALL).values())


def proc_status() -> dict:
    """This process's VmRSS, RssAnon, RssFile, VmHWM in bytes (Linux)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[name] = int(value.split()[0]) * 1024
    return out


class Poller(threading.Thread):
    """Polls /proc/self/status until stopped; the peaks of RssAnon and RssFile."""

    def __init__(self, interval: float = 0.001) -> None:
        super().__init__(daemon=True)
        self.interval, self.done = interval, threading.Event()
        self.peak = {"RssAnon": 0, "RssFile": 0}

    def run(self) -> None:
        while not self.done.is_set():
            now = proc_status()
            for key in self.peak:
                self.peak[key] = max(self.peak[key], now[key])
            time.sleep(self.interval)

    def stop(self) -> dict:
        self.done.set()
        self.join()
        return self.peak


def child(args) -> None:
    if args.child == "write":  # in a child too: ru_maxrss starts at the high-water mark
        # of the process that started this one, which should not be ~1 GB of arrays
        print(json.dumps({"params": write_folder(Path(args.folder), args.dtype, args.seed)}))
        return
    import gc

    import minitorch_gpu  # noqa: F401 - the baseline includes the package
    from minitorch_gpu.pretrained import load_pretrained
    gc.collect()
    if args.child == "rss":
        before = proc_status()
        maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        poller = Poller()
        poller.start()
        start = time.perf_counter()
        loaded = load_pretrained(args.folder)
        seconds = time.perf_counter() - start
        polled = poller.stop()
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        after = proc_status()
        result = {"seconds": seconds, "baseline": before["VmRSS"],
                  "maxrss_before": maxrss_before, "maxrss": maxrss,
                  "rss_peak": maxrss - before["VmRSS"],
                  "hwm_peak": after["VmHWM"] - before["VmRSS"],
                  "anon_peak": polled["RssAnon"] - before["RssAnon"],
                  "file_peak": polled["RssFile"] - before["RssFile"],
                  "anon_after": after["RssAnon"] - before["RssAnon"],
                  "file_after": after["RssFile"] - before["RssFile"],
                  "params": sum(p.numel() for p in loaded.model.parameters())}
    else:
        tracemalloc.start()
        baseline = tracemalloc.get_traced_memory()[0]
        loaded = load_pretrained(args.folder)
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        result = {"traced_peak": peak - baseline, "traced_after": current - baseline}
    del loaded
    print(json.dumps(result))


def run_child(mode: str, folder: Path, *options: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", mode, "--folder", str(folder),
                           *options], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(folder: Path, args) -> None:
    start = time.perf_counter()
    params = run_child("write", folder, "--dtype", args.dtype, "--seed", str(args.seed))["params"]
    size = (folder / "model.safetensors").stat().st_size
    weights = params * 4  # float32 here, whatever the file stores
    print(f"wrote {folder} ({args.dtype}): {params:,} parameters, float32 weights "
          f"{weights / MB:.1f} MB, file {size / MB:.1f} MB, in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    runs = []
    for run in range(args.runs):
        result = {**run_child("rss", folder), **run_child("tracemalloc", folder)}
        if result["params"] != params:
            sys.exit(f"the model has {result['params']:,} parameters, the file {params:,}")
        if abs(result["hwm_peak"] - result["rss_peak"]) > 4 * MB:
            print(f"note: ru_maxrss and VmHWM disagree ({result['rss_peak'] / MB:.0f} MB, "
                  f"{result['hwm_peak'] / MB:.0f} MB above the baseline)")
        runs.append(result)
        print(f"run {run + 1}: {describe(result, weights)}  "
              f"[baseline RSS {result['baseline'] / MB:.0f} MB, high-water before "
              f"{result['maxrss_before'] / MB:.0f} MB; held after: anon "
              f"{result['anon_after'] / MB:.0f} MB, file {result['file_after'] / MB:.0f} MB, "
              f"traced {result['traced_after'] / MB:.0f} MB]", flush=True)
    if not runs:  # --runs 0 --dir DIR: the folder alone
        return
    median = {key: statistics.median(r[key] for r in runs)
              for key in ("seconds", "rss_peak", "anon_peak", "file_peak", "traced_peak")}
    print(f"median of {args.runs} ({args.dtype} file): {describe(median, weights)}")


def describe(r: dict, weights: int) -> str:
    def part(name: str, key: str) -> str:
        return f"{name} {r[key] / MB:.0f} MB ({r[key] / weights:.2f}x)"
    return (f"load {r['seconds']:.2f} s; above baseline: {part('RSS peak', 'rss_peak')} "
            f"[polled: {part('anon', 'anon_peak')}, {part('file-backed', 'file_peak')}]; "
            f"{part('tracemalloc peak', 'traced_peak')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", choices=["float32", "bf16"], default="float32",
                        help="the weights' dtype in the file (loaded as float32)")
    parser.add_argument("--dir", help="build the folder here and keep it (default: a "
                                      "temporary folder, removed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", choices=["write", "rss", "tracemalloc"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.dir:
        return bench(Path(args.dir), args)
    with tempfile.TemporaryDirectory() as folder:
        bench(Path(folder) / "gpt2", args)


if __name__ == "__main__":
    main()
