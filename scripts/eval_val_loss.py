"""The loss of a checkpoint over its whole validation split, not a sample of batches.

    python scripts/eval_val_loss.py checkpoints/shakespeare_char [--batch-size 64]

The trainer's evaluation averages ``eval.iters`` random batches (nanoGPT's estimate, noisy
by a few hundredths at 20 batches); this scores every token of the val split once, in
consecutive windows of ``block_size`` tokens, each predicting its next tokens. The work is
``minitorch_gpu/evaluation/loss.py``'s, as ``minitorch-gpu eval RUN`` does it (which also
records the result in the run's metrics.jsonl); this prints the one line it always printed.
"""
from __future__ import annotations

import argparse

from minitorch_gpu.data import prepare
from minitorch_gpu.evaluation import split_loss
from minitorch_gpu.pretrained.inference import load_for_inference
from minitorch_gpu.train.config import config_from_dict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a .ckpt file or a run directory")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    model, _, meta = load_for_inference(args.checkpoint, args.device, keep_padding=True)
    tokens = prepare(config_from_dict(meta["config"]).data, log=lambda _: None).val_tokens()
    result = split_loss(model, tokens, args.batch_size)
    print(f"{args.checkpoint}: val loss {result.loss:.4f} over {result.tokens:,} tokens "
          f"({result.windows} windows of {result.block_size}; iteration {meta['iter_num']}) "
          f"in {result.seconds:.1f} s")


if __name__ == "__main__":
    main()
