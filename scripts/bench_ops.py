"""Forward + backward time of the GPT's hot ops at the sizes of a small GPT, against
PyTorch eager on the same inputs when it is importable (a development-only reference).

    python scripts/bench_ops.py [--batch 8] [--seq 256] [--embd 384] [--heads 6]
                                [--vocab 65] [--repeat 15] [--threads 2]

One JSON line per op: median milliseconds of forward+backward over interleaved runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--embd", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=65)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP threads, both sides")
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # before NumPy's BLAS starts its threads

    import minitorch_gpu as mt
    import minitorch_gpu.functional as F

    B, T, C, H, V = args.batch, args.seq, args.embd, args.heads, args.vocab
    rng = np.random.default_rng(0)
    arrays = {
        "x": rng.standard_normal((B, T, C), dtype=np.float32),
        "w_fc": rng.standard_normal((4 * C, C), dtype=np.float32) * 0.02,
        "b_fc": np.zeros(4 * C, np.float32),
        "ln_w": np.ones(C, np.float32), "ln_b": np.zeros(C, np.float32),
        "h": rng.standard_normal((B, T, 4 * C), dtype=np.float32),
        "q": rng.standard_normal((B, H, T, C // H), dtype=np.float32),
        "logits": rng.standard_normal((B * T, V), dtype=np.float32),
        "targets": rng.integers(0, V, B * T),
        "wte": rng.standard_normal((V, C), dtype=np.float32),
        "idx": rng.integers(0, V, (B, T)),
    }

    def ours(name, *, grad=True):
        return mt.tensor(arrays[name], requires_grad=grad and arrays[name].dtype.kind == "f")

    cases = {
        "linear c_fc": (lambda: F.linear(ours("x"), ours("w_fc"), ours("b_fc"))),
        "layer_norm": (lambda: F.layer_norm(ours("x"), C, ours("ln_w"), ours("ln_b"))),
        "gelu tanh": (lambda: F.gelu(ours("h"), approximate="tanh")),
        "causal attention": (lambda: F.scaled_dot_product_attention(
            ours("q"), ours("q"), ours("q"), is_causal=True)),
        "softmax": (lambda: F.softmax(ours("q") @ ours("q").mT, dim=-1)),
        "cross_entropy": (lambda: F.cross_entropy(ours("logits"), ours("targets", grad=False))),
        "embedding": (lambda: F.embedding(ours("idx", grad=False), ours("wte"))),
        "cast fp32->bf16": (lambda: ours("h").to(mt.bfloat16)),
    }

    def run_ours(make):
        out = make()
        out.backward(mt.ones_like(out)) if out.ndim else out.backward()

    torch_cases = {}
    try:
        import torch
        torch.set_num_threads(args.threads)
        TF = torch.nn.functional

        def theirs(name, *, grad=True):
            t = torch.from_numpy(arrays[name].copy())
            return t.requires_grad_() if grad and t.is_floating_point() else t

        torch_cases = {
            "linear c_fc": lambda: TF.linear(theirs("x"), theirs("w_fc"), theirs("b_fc")),
            "layer_norm": lambda: TF.layer_norm(theirs("x"), (C,), theirs("ln_w"), theirs("ln_b")),
            "gelu tanh": lambda: TF.gelu(theirs("h"), approximate="tanh"),
            "causal attention": lambda: TF.scaled_dot_product_attention(
                theirs("q"), theirs("q"), theirs("q"), is_causal=True),
            "softmax": lambda: torch.softmax(theirs("q") @ theirs("q").mT, dim=-1),
            "cross_entropy": lambda: TF.cross_entropy(theirs("logits"), theirs("targets", grad=False)),
            "embedding": lambda: TF.embedding(theirs("idx", grad=False), theirs("wte")),
            "cast fp32->bf16": lambda: theirs("h").to(torch.bfloat16),
        }
    except ImportError:
        torch = None

    def run_torch(make):
        out = make()
        out.backward(torch.ones_like(out)) if out.ndim else out.backward()

    times = {name: {"ours": [], "torch": []} for name in cases}
    for _ in range(args.repeat + 2):  # two warm-up rounds are dropped below
        for name in cases:
            start = time.perf_counter()
            run_ours(cases[name])
            times[name]["ours"].append((time.perf_counter() - start) * 1e3)
            if name in torch_cases:
                start = time.perf_counter()
                run_torch(torch_cases[name])
                times[name]["torch"].append((time.perf_counter() - start) * 1e3)
    for name, runs in times.items():
        row = {"op": name, "shape": dict(B=B, T=T, C=C, H=H, V=V), "threads": args.threads,
               "ours_ms": round(statistics.median(runs["ours"][2:]), 3)}
        if runs["torch"]:
            row["torch_ms"] = round(statistics.median(runs["torch"][2:]), 3)
            row["ours_over_torch"] = round(row["ours_ms"] / row["torch_ms"], 2)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
