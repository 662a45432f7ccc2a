"""Training-step and generation speed of a small GPT on this machine.

Times the whole step a trainer runs, forward + cross-entropy + backward + AdamW, on
nanoGPT's CPU "baby" Shakespeare shape by default (n_layer 4, n_head 4, n_embd 128,
block_size 64, batch 12, vocab 65, float32, dropout 0), then KV-cached generation at batch 1.
Prints one JSON line per measurement: median (and min, max) over the timed steps after
warm-up, tokens per second, and the FLOP rate implied by ``flops_per_token()``.

    python scripts/bench_train_step.py [--steps 50] [--warmup 5] [--n-layer 4] ...
    python scripts/bench_train_step.py --cprofile 20   # where a step's time goes, by function
    python scripts/bench_train_step.py --device cuda --bf16 --n-layer 12 --n-head 12 \
        --n-embd 768 --block-size 1024 --vocab-size 50304 --batch-size 8 --no-generate
        # GPT-2 124M in bf16 on a GPU: MFU against the bf16 matmul peak measured here, and
        # the largest |bf16 - fp32| difference of the logits on one batch
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import time

import numpy as np

import minitorch_gpu as mt
import minitorch_gpu.nn as nn
from minitorch_gpu.machine import matmul_peak_flops


def median_min_max(samples: list) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def print_profile(step, steps: int, top: int = 14) -> None:
    """Own time per step of the functions that take the most (cProfile adds its overhead)."""
    profile = cProfile.Profile()
    profile.enable()
    for i in range(steps):
        step(i)
    profile.disable()
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, _, own, cumulative, _)
    total = sum(own for _, _, own, _, _ in stats.values())
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    print(f"{'function':58s} {'calls/step':>10s} {'own ms/step':>11s} {'% of step':>9s}")
    for (path, line, name), (calls, _, own, _, _) in rows:
        where = f"{os.path.relpath(path) if path != '~' else ''}:{line}({name})"
        print(f"{where[-58:]:58s} {calls / steps:10.1f} {own / steps * 1e3:11.2f} "
              f"{100 * own / total:9.1f}")
    print(f"{'total':58s} {'':10s} {total / steps * 1e3:11.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--vocab-size", type=int, default=65)
    parser.add_argument("--steps", type=int, default=50, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--new-tokens", type=int, default=200, help="tokens to generate")
    parser.add_argument("--prompt", type=int, default=16, help="prompt length for generation")
    parser.add_argument("--generate-runs", type=int, default=5, help="timed generation runs")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--bf16", action="store_true",
                        help="bf16 mixed precision (autocast; fp32 master weights)")
    parser.add_argument("--no-generate", action="store_true", help="time training only")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="instead of timing, profile N steps with cProfile and print the "
                             "functions that take the most time (ms per step)")
    args = parser.parse_args()

    mt.manual_seed(1337)
    config = nn.GPTConfig(block_size=args.block_size, vocab_size=args.vocab_size,
                          n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                          dropout=0.0, bias=True)
    model = nn.GPT(config).to(args.device)
    device = str(next(model.parameters()).device)
    sync = mt.get_backend(device).synchronize
    precision = mt.autocast("bf16", enabled=args.bf16)
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3,
                                           betas=(0.9, 0.99))
    rng = np.random.default_rng(0)
    B, T = args.batch_size, args.block_size
    batches = [(mt.tensor(rng.integers(0, args.vocab_size, (B, T)), device=device),
                mt.tensor(rng.integers(0, args.vocab_size, (B, T)), device=device))
               for _ in range(8)]

    def step(i: int) -> float:
        x, y = batches[i % len(batches)]
        with precision:
            _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    for i in range(args.warmup):
        step(i)
    if args.cprofile:
        print_profile(step, args.cprofile)
        return
    times = []
    for i in range(args.steps):
        sync()
        start = time.perf_counter()
        step(i)  # .item() of the loss waits for the device
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    ms = median_min_max(times)
    tokens_per_step = B * T
    flop_rate = model.flops_per_token() * tokens_per_step / (ms["median"] / 1e3)
    peak = matmul_peak_flops(device, mt.bfloat16 if args.bf16 else mt.float32)
    machine = {"machine": platform.machine(), "cpus": os.cpu_count(),
               "python": platform.python_version(), "numpy": np.__version__}
    print(json.dumps({
        "case": "train_step", "device": device, "dtype": "bf16" if args.bf16 else "float32",
        "n_layer": args.n_layer, "n_head": args.n_head,
        "n_embd": args.n_embd, "block_size": T, "batch_size": B, "vocab_size": args.vocab_size,
        "params": model.num_params(), "steps": args.steps, "step_ms": ms,
        "tokens_per_s": tokens_per_step / (ms["median"] / 1e3),
        "gflop_per_s": flop_rate / 1e9, "peak_gflop_per_s": peak / 1e9,
        "mfu": flop_rate / peak, **machine}), flush=True)
    if args.bf16:  # how far bf16 moves the logits from float32's, on one batch
        with mt.no_grad():
            x, y = batches[0]
            logits32, _ = model(x, y)
            with precision:
                logits16, _ = model(x, y)
            diff = (logits16.float() - logits32).abs().max().item()
        print(json.dumps({"case": "bf16_vs_fp32_logits", "max_abs_diff": diff,
                          "max_abs_logit": logits32.abs().max().item()}), flush=True)
    if args.no_generate:
        return

    # generation at batch 1: past block_size the window slides, by one token (exactly
    # nanoGPT's cropping: the whole window reruns per token) or by half a block
    model.eval()
    prompt = batches[0][0][:1, :args.prompt]
    for use_cache, shift in ((True, 1), (True, T // 2), (False, 1)):
        runs = []
        for _ in range(args.generate_runs):
            start = time.perf_counter()
            model.generate(prompt, args.new_tokens, temperature=1.0, use_cache=use_cache,
                           window_shift=shift)
            runs.append(time.perf_counter() - start)
        seconds = median_min_max(runs)
        print(json.dumps({"case": "generate", "kv_cache": use_cache, "window_shift": shift,
                          "batch_size": 1, "prompt": args.prompt,
                          "new_tokens": args.new_tokens, "seconds": seconds,
                          "tokens_per_s": args.new_tokens / seconds["median"]}))


if __name__ == "__main__":
    main()
