"""A tour of minitorch_gpu in one script: views and strides, then a small GPT trained with
AdamW on a corpus every Python has (the Zen of Python), then text sampled from it with the
KV cache, all through the Python API (the CLI does the same from a YAML config).

    python scripts/tour.py [--steps 400] [--device cpu]

The pieces are the framework's own: tensors and autograd, ``nn.GPT`` (nanoGPT's
architecture and parameter names), ``optim.AdamW`` with a warm-up + cosine schedule and
gradient clipping, and ``GPT.generate``.
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import time

import minitorch_gpu as mt
import minitorch_gpu.nn as nn
import minitorch_gpu.optim as optim


def zen_text() -> str:
    """The Zen of Python, which the standard library keeps ROT13-encoded in ``this``."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing ``this`` prints it
        import this
    return codecs.decode(this.s, "rot13")


def show_views(device: str) -> None:
    x = mt.arange(12, dtype="float32", device=device).view(3, 4)
    t = x.t()
    print(f"x: shape {x.shape}, strides {x.stride()}, contiguous {x.is_contiguous()}")
    print(f"x.t(): shape {t.shape}, strides {t.stride()}, same memory "
          f"{t.data_ptr() == x.data_ptr()}, contiguous {t.is_contiguous()}")
    try:
        t.view(12)
    except RuntimeError as err:
        print(f"x.t().view(12) -> RuntimeError: {str(err)[:80]}...")
    print(f"x.t().reshape(12) copies: {t.reshape(12).tolist()}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()
    mt.manual_seed(args.seed)
    show_views(args.device)

    text = zen_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = mt.tensor([stoi[c] for c in text], device=args.device)
    print(f"corpus: the Zen of Python, {len(text)} characters, vocabulary {len(chars)}")

    # a character-level GPT-2: same architecture and parameter names as nanoGPT's
    config = nn.GPTConfig(block_size=32, vocab_size=len(chars), n_layer=2, n_head=4,
                          n_embd=64, dropout=0.0)
    model = nn.GPT(config).to(args.device)
    print(f"model: GPT with {model.num_params():,} parameters "
          f"(n_layer {config.n_layer}, n_head {config.n_head}, n_embd {config.n_embd})\n")
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-3,
                                           betas=(0.9, 0.99))
    schedule = optim.WarmupCosineLR(optimizer, warmup_iters=20, lr_decay_iters=args.steps,
                                    min_lr=3e-4)

    batch, T = 16, config.block_size
    offsets = mt.arange(T, device=args.device)
    start = time.perf_counter()
    for step in range(args.steps + 1):
        starts = mt.randint(0, len(text) - T - 1, (batch, 1), device=args.device)
        idx, targets = data[starts + offsets], data[starts + offsets + 1]  # (B, T) each
        _, loss = model(idx, targets)
        optimizer.zero_grad()
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0:
            print(f"step {step:4d}  loss {loss.item():.3f}")
    elapsed = time.perf_counter() - start
    print(f"\n{args.steps} steps in {elapsed:.1f}s ({args.steps / elapsed:.0f} steps/s)\n")

    model.eval()
    prompt = mt.tensor([[stoi[c] for c in "Beautiful is "]], device=args.device)
    out = model.generate(prompt, 160, temperature=0.8, top_k=10)  # KV-cached sampling
    print("sample:\n" + "".join(chars[i] for i in out[0].tolist()))


if __name__ == "__main__":
    main()
