"""Forward + backward time of the GPT's and the Llama's hot ops at the sizes of a small
GPT, against PyTorch eager on the same inputs when it is importable (a development-only
reference). The Llama's: rms_norm, swiglu (and ours unfused, silu(g) * u), apply_rotary
on a projection's heads (torch: Hugging Face's q * cos + rotate_half(q) * sin) and
grouped-query causal attention with half as many key/value heads (torch: SDPA with
enable_gqa on the same heads).

    python scripts/bench_ops.py [--batch 8] [--seq 256] [--embd 384] [--heads 6]
                                [--vocab 65] [--repeat 15] [--threads 2] [--only OP ...]
    python scripts/bench_ops.py --attention-sweep [--repeat 15] [--threads 2]

One JSON line per op: median milliseconds of forward+backward over interleaved runs,
ours with the fused CPU kernels (``ours_ms``; backend/cpu_kernels, where numba is
installed) and with them switched off (``numpy_ms``: NumPy's code), and torch's. The
``adamw`` row is one AdamW step over the small GPT's 10.7 M parameters' shapes instead.
The attention rows also time ours with the flash kernel declined (``dense_ms``: the BLAS
products around the softmax kernel), so the two kernel paths are compared in one run.

``--attention-sweep`` measures the dispatch rule of ``backend/cpu_kernels/attention.py``:
causal attention forward + backward of GPT's packed projection (B, T, 3C), the flash
kernel against the dense path, over sequence lengths and head sizes (the bench cases'
(64, 32) and (256, 64) among them), one JSON line per shape.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--embd", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=65)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP threads, both sides")
    parser.add_argument("--only", nargs="+", metavar="OP", help="time only these ops")
    parser.add_argument("--attention-sweep", action="store_true",
                        help="the flash kernel against the dense path over (T, head size)")
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # before NumPy's BLAS starts its threads
    import numpy as np  # only now: OpenBLAS reads those variables as NumPy loads it

    import minitorch_gpu as mt
    import minitorch_gpu.functional as F
    from minitorch_gpu.backend import get_backend

    cpu = get_backend("cpu")
    kernels_on = cpu.fused_kernels() is not None
    if args.attention_sweep:
        return attention_sweep(args.repeat)

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
        "gate": rng.standard_normal((B, T, 8 * C // 3), dtype=np.float32),
        "up": rng.standard_normal((B, T, 8 * C // 3), dtype=np.float32),
        "kv": rng.standard_normal((B, T, C // 2), dtype=np.float32),
    }
    Hkv, D = max(H // 2, 1), C // H
    cos, sin = F.rotary_tables(T, D)

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
        "rms_norm": (lambda: F.rms_norm(ours("x"), C, ours("ln_w"), 1e-5)),
        "swiglu": (lambda: F.swiglu(ours("gate"), ours("up"))),
        "swiglu unfused": (lambda: F.silu(ours("gate")) * ours("up")),
        "apply_rotary": (lambda: F.apply_rotary(ours("x"), cos, sin, head_dim=D)),
        "grouped causal attention": (lambda: F.grouped_causal_attention(
            ours("x"), ours("kv"), ours("kv"), H, Hkv)),
    }

    def run_ours(make):
        out = make()
        out.backward(mt.ones_like(out)) if out.ndim else out.backward()

    # AdamW over the small GPT's parameter shapes (6 layers of 384), gradients set once
    adamw_shapes = [(V, C), (T, C)] + [(3 * C, C), (3 * C,), (C, C), (C,), (4 * C, C),
                                       (4 * C,), (C, 4 * C), (C,), (C,), (C,), (C,), (C,)] * 6
    adamw_arrays = [rng.standard_normal(s, dtype=np.float32) * 0.02 for s in adamw_shapes]
    params = [mt.tensor(a.copy(), requires_grad=True) for a in adamw_arrays]
    for p_ in params:
        p_.grad = mt.tensor(rng.standard_normal(p_.shape, dtype=np.float32))
    optimizer = mt.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    cases["adamw"] = lambda: optimizer.step()

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
            "rms_norm": lambda: TF.rms_norm(theirs("x"), (C,), theirs("ln_w"), 1e-5),
            "swiglu": lambda: TF.silu(theirs("gate")) * theirs("up"),
            "apply_rotary": lambda: torch_rotary(theirs("x")),
            "grouped causal attention": lambda: torch_gqa(theirs("x"), theirs("kv")),
            "adamw": lambda: torch_optimizer.step(),
        }
        torch_params = [torch.from_numpy(a.copy()).requires_grad_() for a in adamw_arrays]
        for p_ in torch_params:
            p_.grad = torch.randn(p_.shape)
        torch_optimizer = torch.optim.AdamW(torch_params, lr=1e-3, betas=(0.9, 0.99),
                                            weight_decay=0.1)
        cos2 = torch.from_numpy(np.concatenate([cos.numpy()] * 2, -1))[:, None, :]
        sin2 = torch.from_numpy(np.concatenate([sin.numpy()] * 2, -1))[:, None, :]

        def torch_rotary(x):  # Hugging Face's form, on (B, T, H, D) views
            heads = x.view(B, T, H, D)
            half = torch.cat([-heads[..., D // 2:], heads[..., :D // 2]], dim=-1)
            return (heads * cos2 + half * sin2).view(B, T, C)

        def torch_gqa(x, kv):
            q = x.view(B, T, H, D).transpose(1, 2)
            k = kv.view(B, T, Hkv, D).transpose(1, 2)
            out = TF.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
            return out.transpose(1, 2).reshape(B, T, C)
    except ImportError:
        torch = None

    def run_torch(make):
        out = make()
        if out is not None:
            out.backward(torch.ones_like(out)) if out.ndim else out.backward()

    def run(make):
        out = make()
        if out is not None:
            run_ours(lambda: out)

    if args.only:
        unknown = sorted(set(args.only) - set(cases))
        if unknown:
            parser.error(f"--only: no op {unknown}; the ops: {sorted(cases)}")
        cases = {name: cases[name] for name in args.only}
    sides = (("ours", True), ("numpy", False)) if kernels_on else (("ours", False),)
    times = {name: {"ours": [], "numpy": [], "torch": [], "dense": []} for name in cases}
    for _ in range(args.repeat + 2):  # two warm-up rounds are dropped below
        for name in cases:
            dense = kernels_on and "attention" in name
            for side, on in sides + ((("dense", True),) if dense else ()):
                cpu.use_fused_kernels = on
                with flash_declined(side == "dense"):
                    start = time.perf_counter()
                    run(cases[name])
                    times[name][side].append((time.perf_counter() - start) * 1e3)
            cpu.use_fused_kernels = True
            if name in torch_cases:
                start = time.perf_counter()
                run_torch(torch_cases[name])
                times[name]["torch"].append((time.perf_counter() - start) * 1e3)
                # torch's OpenMP threads spin a while after an op, holding the cores the
                # next side's threads need: let them sleep first (untimed)
                time.sleep(0.2)
    for name, runs in times.items():
        row = {"op": name, "shape": dict(B=B, T=T, C=C, H=H, V=V), "threads": args.threads,
               "ours_ms": round(statistics.median(runs["ours"][2:]), 3)}
        for side in ("numpy", "dense"):
            if runs[side]:
                row[f"{side}_ms"] = round(statistics.median(runs[side][2:]), 3)
        if runs["torch"]:
            row["torch_ms"] = round(statistics.median(runs["torch"][2:]), 3)
            row["ours_over_torch"] = round(row["ours_ms"] / row["torch_ms"], 2)
        print(json.dumps(row))


@contextlib.contextmanager
def flash_declined(declined: bool):
    """The CPU's flash attention kernel declining every size for the block (the ops then
    take the dense path: BLAS products around the softmax kernel)."""
    from minitorch_gpu.backend.cpu_kernels import attention
    before = attention.FUSED_FROM
    if declined:
        attention.FUSED_FROM = dict.fromkeys(before, 1 << 62)
    try:
        yield
    finally:
        attention.FUSED_FROM = before


def attention_sweep(repeat: int) -> None:
    """Causal attention forward + backward on GPT's packed projection, the flash kernel
    (forced on at every size) against the dense path, interleaved; one JSON line each."""
    import numpy as np

    import minitorch_gpu as mt
    import minitorch_gpu.functional as F
    from minitorch_gpu.backend.cpu_kernels import attention

    shapes = [(12, 4, T, 32) for T in (32, 64, 96, 128, 192, 256)] + \
        [(8, 6, T, 64) for T in (32, 64, 96, 128, 192, 256, 512)] + \
        [(4, 2, T, 128) for T in (64, 96, 128, 256)]
    rng = np.random.default_rng(0)
    for B, H, T, E in shapes:
        qkv = rng.standard_normal((B, T, 3 * H * E), dtype=np.float32)
        grad = mt.tensor(rng.standard_normal((B, T, H * E), dtype=np.float32))
        runs = {"flash": [], "dense": []}
        for _ in range(repeat + 2):
            for side in runs:
                before = attention.FUSED_FROM
                attention.FUSED_FROM = dict.fromkeys(before,
                                                     1 if side == "flash" else 1 << 62)
                try:
                    start = time.perf_counter()
                    x = mt.tensor(qkv, requires_grad=True)
                    F.packed_causal_attention(x, H).backward(grad)
                    runs[side].append((time.perf_counter() - start) * 1e3)
                finally:
                    attention.FUSED_FROM = before
        flash_ms, dense_ms = (statistics.median(runs[s][2:]) for s in ("flash", "dense"))
        print(json.dumps({"shape": dict(B=B, H=H, T=T, E=E), "flash_ms": round(flash_ms, 3),
                          "dense_ms": round(dense_ms, 3),
                          "flash_over_dense": round(flash_ms / dense_ms, 2),
                          "rule_takes_flash": attention.fused_is_faster(T, T, E)}))


if __name__ == "__main__":
    main()
