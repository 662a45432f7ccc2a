"""Train the same model on the same batches in PyTorch eager: a reference for the trainer.

    pip install torch==2.13.0    # development only; never a dependency
    python scripts/reference_train_torch.py configs/shakespeare_char.yaml \\
        --set data.path=../shared/data/tinyshakespeare.txt

It reads the config as ``minitorch-gpu train`` does, prepares the same tokens, builds our
model for its initial weights and loads them into its twin written in torch
(``torch_reference``: a GPT-2 with nanoGPT's parameter names, or for ``model.arch: llama``
a Llama with Hugging Face's), then trains with torch.optim.AdamW under nanoGPT's parameter groups,
warm-up + cosine schedule and clipping, drawing the very batches our trainer draws (the
same BatchSampler and seed). At the end it scores the whole val split in windows of
block_size, as ``scripts/eval_val_loss.py`` does for our checkpoints. With identical data,
initial weights and schedule, the two runs differ only by the arithmetic of their kernels.
"""
from __future__ import annotations

import argparse
import time

import torch

import minitorch_gpu as mt
from minitorch_gpu.train.config import load_config
from minitorch_gpu.data import BatchSampler, consecutive_windows, prepare
from minitorch_gpu.nn import model_for
from minitorch_gpu.optim import cosine_lr
from minitorch_gpu.train.model_from_config import gpt_config
from minitorch_gpu.bench.torch_reference import TorchGPT, TorchLlama, to_torch, torch_adamw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    torch.set_num_threads(args.threads)
    m, t = cfg.model, cfg.train
    data = prepare(cfg.data, log=lambda _: None)
    mt.manual_seed(cfg.system.seed)
    ours = model_for(gpt_config(m, data.tokenizer.vocab_size))  # the trainer's initial weights
    model = (TorchLlama if ours.config.arch == "llama" else TorchGPT).from_ours(ours)
    optimizer = torch_adamw(model, t.weight_decay, t.lr, (t.beta1, t.beta2), t.eps)
    sampler = BatchSampler(data.train_tokens(), m.block_size, t.batch_size, cfg.system.seed)
    decay_iters = t.max_iters if t.lr_decay_iters is None else t.lr_decay_iters
    start = time.perf_counter()
    for it in range(t.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(it, t.lr, t.min_lr, t.warmup_iters, decay_iters)
        for _ in range(t.grad_accum_steps):
            x, y = sampler.next_batch()
            _, loss = model(to_torch(x), to_torch(y))
            (loss / t.grad_accum_steps).backward()
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (it + 1) % 250 == 0:
            print(f"torch iter {it + 1}: loss {loss.item():.4f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    T = m.block_size
    inputs, targets = (torch.from_numpy(a) for a in consecutive_windows(data.val_tokens(), T))
    n = len(inputs)
    with torch.no_grad():
        total = sum(model(inputs[i:i + 64], targets[i:i + 64])[1].item()
                    * len(inputs[i:i + 64])
                    for i in range(0, n, 64))
    print(f"torch: {t.max_iters} iterations in {time.perf_counter() - start:.0f} s; "
          f"val loss {total / n:.4f} over {n * T:,} tokens (whole val split)")


if __name__ == "__main__":
    main()
