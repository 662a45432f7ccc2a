"""A first run of minitorch_gpu: views and strides, then a tiny language model trained
with autograd on a corpus every Python has (the Zen of Python), then text sampled from it.

    python scripts/quickstart.py [--steps 400] [--device cpu]

Everything here is the core API: tensors, views, ops, backward, no_grad. The GPT, the
optimizers and the YAML-driven trainer build on exactly these pieces.
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import math
import time

import minitorch_gpu as mt
import minitorch_gpu.functional as F


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
    vocab, context, emb, hidden, batch = len(chars), 8, 24, 256, 64
    print(f"corpus: the Zen of Python, {len(text)} characters, vocabulary {vocab}")

    def param(*shape: int, scale: float) -> mt.Tensor:
        return (mt.randn(*shape, device=args.device) * scale).requires_grad_()

    # a character MLP language model: embed the last 8 characters, one hidden layer
    wte = param(vocab, emb, scale=1.0)
    w1 = param(hidden, context * emb, scale=1 / math.sqrt(context * emb))
    b1 = param(hidden, scale=0.0)
    w2 = param(vocab, hidden, scale=0.1 / math.sqrt(hidden))
    b2 = param(vocab, scale=0.0)
    params = [wte, w1, b1, w2, b2]
    print(f"model: {sum(p.numel() for p in params):,} parameters\n")

    def logits_of(idx: mt.Tensor) -> mt.Tensor:
        x = F.embedding(idx, wte).flatten(1)  # (B, context * emb)
        h = F.gelu(F.linear(x, w1, b1), approximate="tanh")  # (B, hidden)
        return F.linear(h, w2, b2)  # (B, vocab)

    offsets = mt.arange(context, device=args.device)
    start = time.perf_counter()
    for step in range(args.steps + 1):
        starts = mt.randint(0, len(text) - context, (batch,), device=args.device)
        window = starts.unsqueeze(1) + offsets  # (B, context) positions
        idx, target = data[window], data[starts + context]
        loss = F.cross_entropy(logits_of(idx), target)
        for p in params:
            p.grad = None
        loss.backward()
        lr = 0.5 * (0.5 * (1 + math.cos(math.pi * step / args.steps)) * 0.9 + 0.1)
        with mt.no_grad():  # plain SGD with a cosine schedule
            for p in params:
                p -= lr * p.grad
        if step % 100 == 0:
            print(f"step {step:4d}  loss {loss.item():.3f}")
    elapsed = time.perf_counter() - start
    print(f"\n{args.steps} steps in {elapsed:.1f}s ({args.steps / elapsed:.0f} steps/s)\n")

    with mt.no_grad():
        out = [stoi[c] for c in "Beautiful is "]
        for _ in range(160):
            idx = mt.tensor([out[-context:]], device=args.device)
            probs = F.softmax(logits_of(idx) / 0.8, dim=-1)
            cumulative = probs.cpu().numpy()[0].cumsum()
            draw = mt.rand(1).item() * cumulative[-1]
            out.append(int((cumulative < draw).sum()))
    print("sample:\n" + "".join(chars[i] for i in out))


if __name__ == "__main__":
    main()
