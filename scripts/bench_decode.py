"""Where a generated token's time goes: eager (every op through Tensor, node and
dispatch) against a replay of the captured decode step, per token, on the bench's cases.

    python scripts/bench_decode.py [--cases baby,small,llama] [--tokens 200] [--repeats 5]
    python scripts/bench_decode.py --device cuda --cases baby,gpt2   # a GPU: graphs
    python scripts/bench_decode.py --device cuda --cases gpt2 --top-k 50   # top-k sampling

For each case, at batch 1 after a 16-token prompt, as ``minitorch-gpu bench`` generates:

* ``eager``, ``captured``: microseconds per token of ``model.generate`` (200 tokens,
  temperature 1, the window sliding by half a block), without and with the capture;
  medians over ``repeats`` runs;
* for the one-token step alone (the token after the prompt, replayed at one position):
  ``ops``, the ops its replay runs; ``forwards``, the time inside their forward calls;
  ``replay``, the whole replay (the difference is the replay loop's own Python);
* ``array``: the share of the replay spent inside compiled calls (NumPy's functions and
  methods, BLAS, numba's kernels), the rest being Python, from cProfile's own-time
  accounting over the replays (cProfile slows every call alike; the share is what it
  reports, not a timing).

On a GPU (``--device cuda``) the captured one-token step is a CUDA Graph: only the
per-token figures are printed (a launch has no op list to time), each run ending with a
synchronisation, and the row says what the one-token capture became; one that is no graph
there, or a capture that fails, ends the run with an error (exit status not 0). The
captured runs go first, so a capture's failure shows before the eager timing. ``--top-k``
samples from the k likeliest tokens (the sampling is part of the captured step). The
machine's BLAS (threadpoolctl) is printed first: the CPU's figures depend on its kernels.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from typing import Optional

import minitorch_gpu as mt
from minitorch_gpu.bench.runner import CASES, GPU_CASES, case_config
from minitorch_gpu.capturing.replay import _GraphCapture
from minitorch_gpu.nn import model_for
from minitorch_gpu.nn.decoder import decoder_for
from minitorch_gpu.system.machine import describe_libraries, libraries


def per_token_us(model, prompt, tokens: int, repeats: int, capture: bool,
                 top_k: Optional[int] = None) -> float:
    window = model.config.block_size // 2
    backend = prompt._backend

    def run() -> None:
        model.generate(prompt, tokens, 1.0, top_k=top_k, window_shift=window, capture=capture)
        backend.synchronize()
    run()  # warm-up (the captures)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / tokens * 1e6


def token_capture(model, prompt, top_k: Optional[int]):
    """What the captured runs left as the one-token step of ``generate``'s decoder (on a
    GPU a ``_GraphCapture``), or None if it holds none."""
    with mt.no_grad():  # the key generate's decoder was made under
        decoder = decoder_for(model, 1, prompt.device, model.lm_head.weight.dtype, 1.0,
                              top_k, None)
    held = list(decoder.token_step._captures.values())
    return held[-1] if held else None


def one_token_step(model, prompt, top_k: Optional[int] = None):
    """The decoder's one-token capture, and its inputs at the position after the prompt."""
    with mt.no_grad():
        decoder = decoder_for(model, 1, prompt.device, mt.float32, 1.0, top_k, None)
        token = decoder.step(prompt, decoder.position(0))  # the prompt's step
        decoder.cache.length = prompt.shape[1]
        position = decoder.position(prompt.shape[1])
        decoder.step(token, position)  # captured, if it was not
        held = decoder.token_step._captures[decoder.token_step._key((token, position))]
    return held, [token.data, position.data]


def step_split(held, arrays, rounds: int = 2000) -> dict:
    with mt.no_grad():
        start = time.perf_counter()
        for _ in range(rounds):
            held.replay(arrays)
        replay = (time.perf_counter() - start) / rounds * 1e6
        slots = held.template.copy()
        for i, a in zip(held.input_slots, arrays):
            slots[i] = a
        inside = 0
        for _ in range(rounds):
            for forward, ctx, arguments, kwargs, target, _ in held.program:
                args = arguments(slots)
                t0 = time.perf_counter_ns()
                slots[target] = forward(ctx, *args, **(kwargs or {}))
                inside += time.perf_counter_ns() - t0
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(rounds // 4):
            held.replay(arrays)
        profile.disable()
    stats = pstats.Stats(profile).stats
    total = sum(s[2] for s in stats.values())  # own time of every function
    compiled = sum(s[2] for (path, _, _), s in stats.items() if path == "~")  # builtins
    return {"ops": len(held.program), "replay": replay, "forwards": inside / rounds / 1e3,
            "array": compiled / total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="baby,small,llama")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--top-k", type=int, default=None,
                        help="sample from the k likeliest tokens (default: the whole "
                             "vocabulary)")
    args = parser.parse_args()
    print(describe_libraries(libraries()))
    print(f"sampling: temperature 1, "
          f"{'top_k ' + str(args.top_k) if args.top_k else 'the whole vocabulary'}")
    print(f"{'case':6s} {'eager us/tok':>12s} {'captured':>9s} {'speed-up':>8s} | one-token "
          f"step: {'ops':>4s} {'forwards':>8s} {'replay':>7s} {'array share':>11s}")
    cases = {**CASES, **GPU_CASES}
    for case in args.cases.split(","):
        mt.manual_seed(0)
        model = model_for(case_config(cases[case])).to(args.device).eval()
        prompt = mt.randint(0, cases[case]["vocab_size"], (1, 16), device=args.device)
        captured = per_token_us(model, prompt, args.tokens, args.repeats, True, args.top_k)
        held = token_capture(model, prompt, args.top_k)
        eager = per_token_us(model, prompt, args.tokens, args.repeats, False, args.top_k)
        if args.device != "cpu":  # a graph: nothing to split
            if not isinstance(held, _GraphCapture):
                raise SystemExit(f"bench_decode: {case}'s one-token step on {args.device} "
                                 f"is not a CUDA Graph: expected a _GraphCapture, got "
                                 f"{type(held).__name__}")
            print(f"{case:6s} {eager:12.0f} {captured:9.0f} {eager / captured:7.2f}x | "
                  f"a CUDA Graph per token on {args.device}")
            continue
        split = step_split(*one_token_step(model, prompt, args.top_k))
        print(f"{case:6s} {eager:12.0f} {captured:9.0f} {eager / captured:7.2f}x | "
              f"{'':10s} {split['ops']:4d} {split['forwards']:8.0f} {split['replay']:7.0f} "
              f"{100 * split['array']:10.0f}%")


if __name__ == "__main__":
    main()
