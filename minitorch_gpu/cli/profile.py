"""``minitorch-gpu profile``: time each layer of a config's (or a checkpoint's) model, a GPT
or a Llama."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

from ..nn.memory import check_workload, workload
from .errors import EXIT_FAILED, error
from .options import add_config_arguments, add_memory_argument, config_from_args

SORT_CHOICES = ("tree", "time", "flops", "name")  # the profiler's; it is imported lazily


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The profile command."""
    prof = sub.add_parser("profile", help="time each layer of a config's model",
                          description="Time the forward pass (and with --backward the "
                                      "backward) of the config's model (a GPT or a Llama) "
                                      "layer by layer, with counted FLOPs and bytes against "
                                      "this machine's measured roofline.")
    add_config_arguments(prof)
    prof.add_argument("--checkpoint", help="profile this checkpoint's model (a .ckpt or a "
                                           "run directory) instead of a fresh one: its "
                                           "shape is the checkpoint's (model.* is "
                                           "not read), the device and dtype the config's")
    prof.add_argument("--batch-size", type=int, help="sequences per pass (default "
                                                     "train.batch_size)")
    prof.add_argument("--seq-len", type=int, help="tokens per sequence (default "
                                                  "model.block_size)")
    prof.add_argument("--warmup", type=int, default=2, help="passes run first, untimed "
                                                            "(default 2)")
    prof.add_argument("--iters", type=int, default=10, help="passes measured (default 10)")
    prof.add_argument("--backward", action="store_true",
                      help="also run and time loss.backward() (training mode)")
    prof.add_argument("--sort", choices=SORT_CHOICES, default="tree",
                      help="tree: the module tree with inclusive figures (default); time, "
                           "flops, name: the rows that add up to the pass, as a flat list")
    prof.add_argument("--depth", type=int, help="cut the tree at this depth (0 is the "
                                                "model, 3 a block)")
    prof.add_argument("--trace", metavar="PATH", help="write a Chrome trace (JSON) for "
                                                      "ui.perfetto.dev or chrome://tracing")
    prof.add_argument("--csv", metavar="PATH", help="write the rows as CSV")
    prof.add_argument("--plot", metavar="PATH", help="draw the roofline with each layer on "
                                                     "it (PNG; needs matplotlib)")
    add_memory_argument(prof)
    prof.set_defaults(run=_profile)


def _profile(args: argparse.Namespace) -> int:
    """Profile the model and print its table (and the files asked for); the exit code."""
    import minitorch_gpu as mt
    from ..checkpoint import CheckpointError
    from ..train.config import ConfigError
    from ..nn.memory import MemoryLimitError
    from ..profiler import PLOT_HINT, profile_model
    try:
        cfg = config_from_args(args)
        for option, value, least in (("--batch-size", args.batch_size, 1),
                                     ("--seq-len", args.seq_len, 1), ("--depth", args.depth, 0)):
            if value is not None and value < least:
                raise ValueError(f"{option} must be >= {least}, got {value}")
        if args.warmup < 0 or args.iters < 1:
            raise ValueError(f"--warmup must be >= 0 and --iters >= 1, got {args.warmup} "
                             f"and {args.iters}")
        if args.plot:
            try:
                import matplotlib  # noqa: F401 - before minutes of profiling, not after
            except ImportError:
                raise ValueError(PLOT_HINT) from None
        model = _model_to_profile(cfg, args.checkpoint, _profile_memory_check(cfg, args))
    except (ConfigError, CheckpointError, ValueError, MemoryLimitError) as exc:
        return error("profile", str(exc).splitlines()[0])
    block = model.config.block_size
    B = args.batch_size or cfg.train.batch_size
    T = args.seq_len or block
    if T > block:
        return error("profile", f"--seq-len {T} is longer than the model's block size "
                                f"{block}")
    mt.manual_seed(cfg.system.seed)
    device = str(next(model.parameters()).device)
    idx = mt.randint(0, model.config.vocab_size, (B, T), device=device)
    targets = mt.randint(0, model.config.vocab_size, (B, T), device=device)
    mode = "forward and backward, training mode" if args.backward else \
        "forward, eval mode, no grad"
    mixed = cfg.system.dtype in ("bf16", "fp16")  # mixed precision: its forward's autocast
    if mixed:
        mode += f", {cfg.system.dtype} autocast"
    c = model.config
    heads = f"{c.n_head} heads" if c.kv_heads == c.n_head else \
        f"{c.n_head} heads, {c.n_kv_head} key/value heads"
    print(f"{model.num_params() / 1e6:.2f}M-parameter {type(model).__name__} ({c.n_layer} "
          f"layers, {heads}, {c.n_embd} wide), batch {B} x {T} "
          f"tokens on {device}; {mode}; {args.warmup} warm-up + {args.iters} passes",
          flush=True)
    try:
        prof = profile_model(model, idx, targets, warmup=args.warmup, iters=args.iters,
                             backward=args.backward,
                             autocast=cfg.system.dtype if mixed else None)
        table = prof.table(sort=args.sort, depth=args.depth)
    except MemoryError:  # anything else here (a CUDA error, say) is unexpected: see main
        print(f"minitorch-gpu profile: out of memory at batch {B} x {T}; try a smaller "
              f"--batch-size or --seq-len", file=sys.stderr)
        return EXIT_FAILED
    print(table)
    try:
        for path, export in ((args.trace, prof.export_chrome_trace),
                             (args.csv, prof.export_csv), (args.plot, prof.plot_roofline)):
            if path:
                print(f"wrote {export(path)}")
    except OSError as exc:
        print(f"minitorch-gpu profile: cannot write {exc.filename}: {exc.strerror}",
              file=sys.stderr)
        return EXIT_FAILED
    return 0


def _profile_memory_check(cfg, args: argparse.Namespace):
    """``check(config, device, from_checkpoint)``: MemoryLimitError when profiling a model of
    ``config`` (a GPTConfig) as ``args`` ask is estimated past the memory ``device`` has;
    nothing with --ignore-memory-check."""
    from ..backend import get_backend

    def check(config: Any, device: str, from_checkpoint: bool) -> None:
        if args.ignore_memory_check:
            return
        task = "forward+backward" if args.backward else "forward"
        names = {"n_layer": "model.n_layer", "n_embd": "model.n_embd",
                 "n_head": "model.n_head", "block_size": "model.block_size",
                 "vocab_size": "model.vocab_size"}
        if config.arch == "llama":
            names.update({"n_kv_head": "model.n_kv_head", "ffn_hidden": "model.ffn_hidden"})
        if from_checkpoint:  # the checkpoint's shape: model.* is not read
            names = {key: key for key in names}
        names["batch"] = "--batch-size" if args.batch_size else "train.batch_size"
        names["seq_len"] = "--seq-len"
        work = workload(task, config, dtype=cfg.system.dtype, device=device,
                        batch=args.batch_size or cfg.train.batch_size, seq_len=args.seq_len,
                        from_checkpoint=from_checkpoint)
        check_workload(work, get_backend(device), cfg.system.memory_limit_gb, names,
                       "lower them, or pass --ignore-memory-check")
    return check


def _model_to_profile(cfg, checkpoint: Optional[str], check_memory=None):
    """The config's model, fresh (seeded) or from ``checkpoint``, on the config's device;
    ``check_memory(config, device, from_checkpoint)`` runs before it is built."""
    import minitorch_gpu as mt
    from ..backend import get_backend
    from ..system.machine import set_num_threads
    from ..nn.build import build_model, weight_dtype
    from ..train.model_from_config import gpt_config
    set_num_threads(cfg.system.threads)
    try:
        device = str(get_backend(cfg.system.device).device)
    except RuntimeError as exc:  # no CuPy, no such GPU: the message names the fix
        raise ValueError(f"system.device: {exc}") from None
    if checkpoint is not None:
        from ..pretrained.inference import load_for_inference
        memory = None if check_memory is None else \
            (lambda config, meta: check_memory(config, device, True))
        model, _, _ = load_for_inference(checkpoint, device, keep_padding=True,
                                         check_memory=memory)
        return model.to(weight_dtype(cfg.system.dtype))
    if check_memory is not None:  # before the data is read: the vocabulary at its least
        vocab = cfg.model.vocab_size or cfg.model.pad_vocab_to
        check_memory(gpt_config(cfg.model, vocab), device, False)
    tokenizer_vocab = None
    if cfg.model.vocab_size is None:  # the tokenizer's: the data must be prepared (cached)
        from ..data import prepare
        try:
            data = prepare(cfg.data, log=lambda line: print(line, file=sys.stderr))
        except (ValueError, RuntimeError, OSError) as exc:
            raise ValueError(f"data: {str(exc).splitlines()[0]} (the vocabulary size comes "
                             f"from the data; --set model.vocab_size=N profiles without it)") \
                from None
        tokenizer_vocab = data.tokenizer.vocab_size
    config = gpt_config(cfg.model, tokenizer_vocab)
    if check_memory is not None:
        check_memory(config, device, False)
    mt.manual_seed(cfg.system.seed)
    return build_model(config, weight_dtype(cfg.system.dtype), device)

