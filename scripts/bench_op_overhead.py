"""Per-op Python overhead: time ``a + b`` (and a few other ops) on tiny tensors.

On a 4x4 tensor the arithmetic is nothing; what is left is the cost of one op through
the framework (argument checks, Function.apply, wrapping the result, recording the graph).
Prints one JSON line per case: median microseconds per op over interleaved runs, against raw
NumPy (and PyTorch eager, when it is importable, as a development-only reference).

    python scripts/bench_op_overhead.py [--size 4] [--repeat 15] [--number 20000]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import timeit

import numpy as np

import minitorch_gpu as mt


def median_us_interleaved(cases: dict, number: int, repeat: int) -> dict:
    """Median microseconds per call of each case; the cases take turns in every round, so
    a slow stretch of the machine hits all of them alike."""
    runs = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            n = number if "backward" not in name else max(number // 10, 1)
            runs[name].append(timeit.timeit(fn, number=n) / n * 1e6)
    return {name: statistics.median(times) for name, times in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4, help="tensors are size x size float32")
    parser.add_argument("--repeat", type=int, default=15, help="timing runs; the median is kept")
    parser.add_argument("--number", type=int, default=20000, help="ops per timing run")
    args = parser.parse_args()

    n = args.size
    na, nb = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    a, b = mt.tensor(na), mt.tensor(nb)
    ga, gb = mt.tensor(na, requires_grad=True), mt.tensor(nb, requires_grad=True)

    cases = {
        "numpy a+b": lambda: na + nb,
        "a+b (no grad)": lambda: a + b,
        "a+b (recording the graph)": lambda: ga + gb,
        "a*2.0 (no grad)": lambda: a * 2.0,
        "a@b (no grad)": lambda: a @ b,
        "a.sum() (no grad)": lambda: a.sum(),
        "a.transpose(0,1) (no grad)": lambda: a.transpose(0, 1),
    }

    def fwd_bwd():
        (ga * gb).sum().backward()
    cases["(a*b).sum().backward() (3 ops + backward)"] = fwd_bwd

    try:
        import torch
        torch.set_num_threads(1)
        ta, tb = torch.from_numpy(na), torch.from_numpy(nb)
        tga = torch.from_numpy(na.copy()).requires_grad_()
        tgb = torch.from_numpy(nb.copy()).requires_grad_()
        cases["torch a+b (no grad)"] = lambda: ta + tb
        cases["torch a+b (recording the graph)"] = lambda: tga + tgb

        def torch_fwd_bwd():
            (tga * tgb).sum().backward()
        cases["torch (a*b).sum().backward()"] = torch_fwd_bwd
    except ImportError:
        pass

    results = median_us_interleaved(cases, args.number, args.repeat)
    base = results["numpy a+b"]
    for name, us in results.items():
        print(json.dumps({"case": name, "size": [n, n], "median_us": round(us, 3),
                          "x_numpy": round(us / base, 1), "python": platform.python_version(),
                          "numpy": np.__version__}))

if __name__ == "__main__":
    main()
