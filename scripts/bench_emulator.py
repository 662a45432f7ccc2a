"""Where an emulated-GPU training step spends its time: each kernel's launches and seconds
over one step of a small GPT on ``cuda`` under ``MINITORCH_EMULATE_CUDA=1`` (the CuPy
stand-in, the kernels compiled for the CPU). The emulator's speed decides how much of the
``cuda`` test suite CI can run; it says nothing about a GPU's.

    MINITORCH_EMULATE_CUDA=1 python scripts/bench_emulator.py [--batch 2] [--steps 3]

The first step compiles the kernels (cached on disk) and is not counted; the figures are
medians over the steps that follow.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time

import numpy as np


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    import minitorch_gpu as mt
    if not mt.cuda.is_emulated():
        print("bench_emulator: set MINITORCH_EMULATE_CUDA=1", file=sys.stderr)
        return 2
    from minitorch_gpu.backend.emulated_cuda import launch
    from minitorch_gpu.nn.gpt import GPT
    from minitorch_gpu.nn.lm_config import GPTConfig

    seconds = collections.defaultdict(list)  # kernel -> its seconds in each step
    shapes, current = {}, collections.Counter()
    launch_kernel = launch.EmulatedKernel.__call__

    def timed(self, grid, block, arguments, **kwargs):
        start = time.perf_counter()
        launch_kernel(self, grid, block, arguments, **kwargs)
        current[self.name] += time.perf_counter() - start
        shapes[self.name] = (grid, block)

    launch.EmulatedKernel.__call__ = timed
    config = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=2048,
                       dropout=0.0)
    model = GPT(config).to("cuda")
    optimizer = mt.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = mt.tensor(np.random.default_rng(0).integers(0, 2048, (args.batch, 64)),
                       device="cuda")
    steps = []
    for step in range(args.steps + 1):
        current.clear()
        start = time.perf_counter()
        _, loss = model(tokens, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step:  # the first compiled the kernels
            steps.append(time.perf_counter() - start)
            for name, spent in current.items():
                seconds[name].append(spent)
    print(f"one step of a 4-layer GPT (n_embd 128, T 64, batch {args.batch}) on the "
          f"emulated GPU: median {statistics.median(steps):.3f} s over {len(steps)} steps")
    print(f"{'kernel':36s} {'s/step':>8s}  grid, block")
    for name, spent in sorted(seconds.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"{name:36s} {statistics.median(spent):8.3f}  {shapes[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
