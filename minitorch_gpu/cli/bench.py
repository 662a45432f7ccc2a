"""``minitorch-gpu bench``: the training step's and generation's speed (``..bench``)."""
from __future__ import annotations

import argparse

from ..nn.memory import check_workload, workload
from .errors import error
from .options import add_memory_argument

BENCH_CASES = ("baby", "small", "llama")  # bench.CASES's keys; bench is imported lazily
GPU_BENCH_CASES = ("gpt2",)  # bench.GPU_CASES's keys: run only when named


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The bench command."""
    bench = sub.add_parser("bench", help="time a training step and generation",
                           description="Time the training step (forward, loss, "
                                       "backward, AdamW) and KV-cached generation of the "
                                       "GPT on nanoGPT's CPU shapes and of a Llama of the "
                                       "baby's shape, each case in a fresh process; one "
                                       "JSON line per case, then a table.")
    # extend: --case baby llama and --case baby --case llama alike (default None, as an
    # extended default list would keep its cases)
    bench.add_argument("--case", nargs="+", action="extend",
                       choices=BENCH_CASES + GPU_BENCH_CASES,
                       help="which shapes, in one list or --case repeated (default: baby, "
                            "small and llama, the baby's shape as a Llama; gpt2, GPT-2 124M "
                            "at batch 16 x 1024, for a GPU)")
    bench.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    bench.add_argument("--bf16", action="store_true",
                       help="the step under bf16 autocast (float32 master weights): MFU "
                            "against the bf16 matmul peak, and the largest |bf16 - fp32| "
                            "logit difference on one batch")
    bench.add_argument("--threads", type=int, help="BLAS threads on both sides (default: "
                                                   "the libraries' own choice)")
    bench.add_argument("--vs-torch", action="store_true",
                       help="also time the same model in PyTorch and print our/torch "
                            "ratios against PyTorch eager with scaled_dot_product_attention "
                            "and against the best torch side (needs torch installed; "
                            "development only)")
    bench.add_argument("--torch-sides", metavar="SIDES",
                       help="with --vs-torch, which torch sides, comma-separated: sdpa "
                            "(eager, fused attention: the ratios' reference), explicit "
                            "(eager, attention as explicit products), compile "
                            "(torch.compile of the sdpa model's training step; about a "
                            "minute per case to compile) (default: all three)")
    bench.add_argument("--steps", type=int, default=30, help="timed training steps "
                                                             "(default 30)")
    bench.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    bench.add_argument("--new-tokens", type=int, default=200,
                       help="tokens to generate per run (default 200)")
    bench.add_argument("--generate-runs", type=int, default=3,
                       help="timed generation runs (default 3)")
    bench.add_argument("--no-generate", action="store_true", help="time training only")
    bench.add_argument("--numpy-side", action="store_true",
                       help="time our side a second time with the fused CPU kernels "
                            "(numba's) switched off: NumPy's code, the row minitorch-numpy")
    bench.add_argument("--rounds", type=int, default=1,
                       help="measure each case this many times (with --vs-torch, ours and "
                            "each torch side's in turn) and report medians (default 1)")
    bench.add_argument("--cprofile", type=int, default=0, metavar="N",
                       help="instead of timing, run N steps under cProfile and print the "
                            "functions that take the most time (ms per step)")
    bench.add_argument("--quick", action="store_true",
                       help="a handful of steps and tokens: checks that it runs, not speed")
    add_memory_argument(bench)
    bench.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> int:
    """Run the bench cases, one JSON line each, then the table; the exit code."""
    from ..backend import get_backend
    from ..bench.runner import TORCH_SIDES, format_table, parse_torch_sides, run_bench
    for name in ("threads", "steps", "new_tokens", "generate_runs", "rounds"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return error("bench", f"--{name.replace('_', '-')} must be >= 1, got {value}")
    for name in ("warmup", "cprofile"):
        if getattr(args, name) < 0:
            return error("bench", f"--{name} must be >= 0, got {getattr(args, name)}")
    if args.vs_torch and (args.bf16 or args.device != "cpu"):
        return error("bench", "--vs-torch compares float32 steps on the CPU; drop --bf16 "
                              "and --device")
    torch_sides = tuple(TORCH_SIDES.values())
    if args.torch_sides is not None:
        if not args.vs_torch:
            return error("bench", "--torch-sides chooses the torch sides of --vs-torch; "
                                  "add --vs-torch")
        try:
            torch_sides = parse_torch_sides(args.torch_sides)
        except ValueError as exc:
            return error("bench", f"--torch-sides: {exc}")
    try:
        backend = get_backend(args.device)  # before any case runs
    except (ValueError, RuntimeError) as exc:  # RuntimeError: no CuPy, no such GPU
        return error("bench", f"--device: {str(exc).splitlines()[0]}")
    args.case = list(dict.fromkeys(args.case or BENCH_CASES))  # each case once, in order
    if args.quick:
        args.steps, args.warmup, args.new_tokens, args.generate_runs = 2, 1, 8, 1
    if not args.ignore_memory_check:  # each case's training step and generation
        refused = _memory_refusal(args, backend)
        if refused:
            return error("bench", refused)
    try:
        records = run_bench(args.case, vs_torch=args.vs_torch, torch_sides=torch_sides,
                            numpy_side=args.numpy_side,
                            threads=args.threads,
                            steps=args.steps, warmup=args.warmup, new_tokens=args.new_tokens,
                            generate_runs=args.generate_runs, rounds=args.rounds,
                            device=args.device, bf16=args.bf16,
                            generate=not args.no_generate, cprofile=args.cprofile,
                            emit=lambda line: print(line, flush=True))
    except RuntimeError as exc:
        return error("bench", str(exc))
    print(format_table(records))
    return 0


def _memory_refusal(args: argparse.Namespace, backend) -> str:
    """Why a case of ``args`` would not fit in the memory ``backend`` has ("" if all do)."""
    from ..nn.memory import MemoryLimitError
    from ..bench.runner import case_config, case_shape
    tasks = [("train", None)] + ([] if args.no_generate or args.cprofile else
                                 [("generate", 1)])
    for case in args.case:
        shape = dict(case_shape(case))
        batch = shape.pop("batch_size")
        for task, sequences in tasks:
            try:
                check_workload(workload(task, case_config(shape), batch=sequences or batch,
                                        dtype="bf16" if args.bf16 else "float32",
                                        device=args.device),
                               backend, None, {key: key for key in shape},
                               "pass --ignore-memory-check to run it anyway")
            except MemoryLimitError as exc:
                return f"{case}: {exc}"
    return ""
