"""Train the same GPT on the same batches in PyTorch eager: a reference for the trainer.

    pip install torch==2.13.0    # development only; never a dependency
    python scripts/reference_train_torch.py configs/shakespeare_char.yaml \\
        --set data.path=../shared/data/tinyshakespeare.txt

It reads the config as ``minitorch-gpu train`` does, prepares the same tokens, builds our
GPT for its initial weights and loads them into a GPT-2 written here in torch (nanoGPT's
parameter names), then trains with torch.optim.AdamW under nanoGPT's parameter groups,
warm-up + cosine schedule and clipping, drawing the very batches our trainer draws (the
same BatchSampler and seed). At the end it scores the whole val split in windows of
block_size, as ``scripts/eval_val_loss.py`` does for our checkpoints. With identical data,
initial weights and schedule, the two runs differ only by the arithmetic of their kernels.
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from torch import nn as tnn
from torch.nn import functional as tF

import minitorch_gpu as mt
from minitorch_gpu.config import load_config
from minitorch_gpu.data import BatchSampler, prepare
from minitorch_gpu.nn import GPT, GPTConfig
from minitorch_gpu.optim import cosine_lr


class Block(tnn.Module):
    def __init__(self, d: int, n_head: int, bias: bool):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = tnn.LayerNorm(d, bias=bias), tnn.LayerNorm(d, bias=bias)
        self.attn = tnn.Module()
        self.attn.c_attn = tnn.Linear(d, 3 * d, bias=bias)
        self.attn.c_proj = tnn.Linear(d, d, bias=bias)
        self.mlp = tnn.Module()
        self.mlp.c_fc = tnn.Linear(d, 4 * d, bias=bias)
        self.mlp.c_proj = tnn.Linear(4 * d, d, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])  # explicit-matmul attention
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v  # (B, nh, T, hs)
        x = x + self.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp.c_proj(tF.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class TorchGPT(tnn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.transformer = tnn.ModuleDict(dict(
            wte=tnn.Embedding(c.vocab_size, c.n_embd), wpe=tnn.Embedding(c.block_size, c.n_embd),
            h=tnn.ModuleList(Block(c.n_embd, c.n_head, c.bias) for _ in range(c.n_layer)),
            ln_f=tnn.LayerNorm(c.n_embd, bias=c.bias)))
        self.lm_head = tnn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
        for block in tr.h:
            x = block(x)
        logits = self.lm_head(tr.ln_f(x))
        return tF.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def to_torch(t: mt.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(t.numpy()))


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
    config = GPTConfig(block_size=m.block_size, vocab_size=data.vocab_size, n_layer=m.n_layer,
                       n_head=m.n_head, n_embd=m.n_embd, dropout=0.0, bias=m.bias)
    mt.manual_seed(cfg.system.seed)
    ours = GPT(config)  # the initial weights our trainer starts from
    model = TorchGPT(config)
    model.load_state_dict({k: to_torch(v) for k, v in ours.state_dict().items()}, strict=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps)
    sampler = BatchSampler(data.train_tokens(), m.block_size, t.batch_size, cfg.system.seed)
    decay_iters = t.max_iters if t.lr_decay_iters is None else t.lr_decay_iters
    start = time.perf_counter()
    for it in range(t.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(it, t.lr, t.min_lr, t.warmup_iters, decay_iters)
        for _ in range(t.grad_accum_steps):
            x, y = sampler.next_batch()
            loss = model(to_torch(x), to_torch(y))
            (loss / t.grad_accum_steps).backward()
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (it + 1) % 250 == 0:
            print(f"torch iter {it + 1}: loss {loss.item():.4f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    tokens = data.val_tokens()
    T = m.block_size
    n = (len(tokens) - 1) // T
    inputs = torch.from_numpy(np.asarray(tokens[:n * T], dtype=np.int64).reshape(n, T))
    targets = torch.from_numpy(np.asarray(tokens[1:n * T + 1], dtype=np.int64).reshape(n, T))
    with torch.no_grad():
        total = sum(model(inputs[i:i + 64], targets[i:i + 64]).item() * len(inputs[i:i + 64])
                    for i in range(0, n, 64))
    print(f"torch: {t.max_iters} iterations in {time.perf_counter() - start:.0f} s; "
          f"val loss {total / n:.4f} over {n * T:,} tokens (whole val split)")


if __name__ == "__main__":
    main()
