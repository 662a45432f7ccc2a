"""The loss of a checkpoint over its whole validation split, not a sample of batches.

    python scripts/eval_val_loss.py checkpoints/shakespeare_char [--batch-size 64]

The trainer's evaluation averages ``eval.iters`` random batches (nanoGPT's estimate, noisy
by a few hundredths at 20 batches); this scores every token of the val split once, in
consecutive windows of ``block_size`` tokens, each predicting its next tokens.
"""
from __future__ import annotations

import argparse
import time

import minitorch_gpu as mt
from minitorch_gpu.train.config import config_from_dict
from minitorch_gpu.data import consecutive_windows, prepare
from minitorch_gpu.pretrained.inference import load_for_inference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a .ckpt file or a run directory")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    model, _, meta = load_for_inference(args.checkpoint, args.device, keep_padding=True)
    cfg = config_from_dict(meta["config"])
    tokens = prepare(cfg.data, log=lambda _: None).val_tokens()
    T = model.config.block_size
    inputs, targets = consecutive_windows(tokens, T)  # (n, T) each
    n = len(inputs)
    start = time.perf_counter()
    total = 0.0
    with mt.no_grad():
        for i in range(0, n, args.batch_size):
            x = mt.tensor(inputs[i:i + args.batch_size], device=args.device)
            y = mt.tensor(targets[i:i + args.batch_size], device=args.device)
            _, loss = model(x, y)
            total += loss.item() * x.shape[0]
    print(f"{args.checkpoint}: val loss {total / n:.4f} over {n * T:,} tokens "
          f"({n} windows of {T}; iteration {meta['iter_num']}) in "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
