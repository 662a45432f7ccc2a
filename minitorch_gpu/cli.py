"""``minitorch-gpu``: train, prepare data, generate text, profile the layers, draw runs.

    minitorch-gpu train configs/quickstart.yaml [--set train.lr=3e-4] [--resume]
    minitorch-gpu prepare configs/quickstart.yaml [--force]
    minitorch-gpu generate checkpoints/quickstart --prompt "def " --max-new-tokens 200
    minitorch-gpu profile configs/shakespeare_char.yaml --set model.vocab_size=65 [--backward]
    minitorch-gpu bench [--case baby small] [--threads 2] [--vs-torch] [--quick]
    minitorch-gpu plot checkpoints/quickstart [checkpoints/other ...] [--out runs.png]

Also ``python -m minitorch_gpu``. Exit codes: 0 done, 1 training diverged or failed,
2 bad input (a config, a checkpoint, an option, sizes past the memory available), 130
interrupted (after saving), 141 the reader of stdout went away (``minitorch-gpu generate
... | head``), quietly.

An expected failure (bad input, a full disk, a diverged run) is one line on stderr. Any
other error (a bug, a CUDA or driver failure) is a one-line summary followed by its full
traceback, and exit code 1: the one log a run leaves is enough to find where it failed.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback
from typing import Any, Dict, List, Optional

# 130 and 141 are what a shell reports for a process ended by SIGINT and SIGPIPE (128 + n)
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 1, 2, 130, 141
SORT_CHOICES = ("tree", "time", "flops", "name")  # the profiler's; it is imported lazily
BENCH_CASES = ("baby", "small")  # bench.CASES's keys; bench is imported lazily
# set when a command failed on every MPI rank at once (the trainer's TrainingRefused: rank
# 0's verdict on the run directory, sent to every rank): each rank then ends on its own, as
# after Ctrl-C, and none aborts the job (MPI_Abort would add its own line to rank 0's)
_every_rank_refused = False


def _add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a YAML config file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=3e-4 --set "
                        "model.n_layer=2 (the value is read as YAML; repeatable)")
    p.add_argument("--device", help="shorthand for --set system.device=DEVICE (cpu, cuda, "
                                    "cuda:N)")


def _add_memory_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ignore-memory-check", action="store_true",
                   help="run even when the model's estimated memory is over what the device "
                        "has free (or system.memory_limit_gb, or "
                        "$MINITORCH_GPU_MEMORY_LIMIT_GB)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minitorch-gpu",
        description="Train a small GPT from a YAML config and generate text from its "
                    "checkpoints.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    train = sub.add_parser("train", help="train a GPT from a config",
                           description="Train the GPT a config describes; checkpoints, the "
                                       "resolved config and metrics.jsonl go to "
                                       "checkpoint.dir/run_name/.")
    _add_config_arguments(train)
    train.add_argument("--resume", action="store_true",
                       help="continue from the run's last.ckpt (same as --set "
                            "train.resume=true)")
    train.add_argument("--overwrite", action="store_true",
                       help="start over even if the run directory already holds a run")
    train.add_argument("--progress", choices=("auto", "bar", "lines"), default="auto",
                       help="a progress bar, or a log line every train.log_interval "
                            "iterations (auto: a bar on a terminal)")
    _add_memory_argument(train)

    prep = sub.add_parser("prepare", help="tokenize a config's corpus into its cache",
                          description="Tokenize the corpus once into train.bin/val.bin and "
                                      "meta.json in the data cache (skipped when nothing "
                                      "changed). Training does this itself when needed.")
    _add_config_arguments(prep)
    prep.add_argument("--force", action="store_true", help="prepare again even if cached")

    gen = sub.add_parser("generate", help="sample text from a checkpoint",
                         description="Sample text from a checkpoint, streaming it to stdout "
                                     "token by token (with the KV cache).")
    gen.add_argument("checkpoint", help="a .ckpt file, or a run directory (its best.ckpt, "
                                        "else last.ckpt)")
    prompt = gen.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default=None, help="the text to continue (default: a "
                                                       "newline)")
    prompt.add_argument("--prompt-file", default=None, help="read the prompt from a file")
    gen.add_argument("--max-new-tokens", type=int, default=500, help="tokens to sample per "
                                                                      "sample (default 500)")
    gen.add_argument("--temperature", type=float, default=0.8,
                     help="below 1 sharper, above 1 more random, 0 greedy (default 0.8)")
    gen.add_argument("--top-k", type=int, default=200,
                     help="sample among the k most likely tokens; 0 for all (default 200)")
    gen.add_argument("--top-p", type=float, default=None,
                     help="sample among the most likely tokens whose probability reaches p")
    gen.add_argument("--num-samples", type=int, default=1, help="samples to draw (default 1)")
    gen.add_argument("--seed", type=int, default=1337, help="random seed (default 1337)")
    gen.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    _add_memory_argument(gen)

    prof = sub.add_parser("profile", help="time each layer of a config's model",
                          description="Time the forward pass (and with --backward the "
                                      "backward) of the config's GPT layer by layer, with "
                                      "counted FLOPs and bytes against this machine's "
                                      "measured roofline.")
    _add_config_arguments(prof)
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
    _add_memory_argument(prof)

    bench = sub.add_parser("bench", help="time a training step and generation",
                           description="Time the GPT's training step (forward, loss, "
                                       "backward, AdamW) and KV-cached generation on "
                                       "nanoGPT's CPU shapes, each case in a fresh process; "
                                       "one JSON line per case, then a table.")
    bench.add_argument("--case", nargs="+", choices=BENCH_CASES, default=list(BENCH_CASES),
                       help="which shapes (default: all)")
    bench.add_argument("--threads", type=int, help="BLAS threads on both sides (default: "
                                                   "the libraries' own choice)")
    bench.add_argument("--vs-torch", action="store_true",
                       help="also time the same GPT in PyTorch eager and print our/torch "
                            "ratios (needs torch installed; development only)")
    bench.add_argument("--steps", type=int, default=30, help="timed training steps "
                                                             "(default 30)")
    bench.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    bench.add_argument("--new-tokens", type=int, default=200,
                       help="tokens to generate per run (default 200)")
    bench.add_argument("--generate-runs", type=int, default=3,
                       help="timed generation runs (default 3)")
    bench.add_argument("--rounds", type=int, default=1,
                       help="measure each case this many times (with --vs-torch, ours and "
                            "torch's in turn) and report medians (default 1)")
    bench.add_argument("--quick", action="store_true",
                       help="a handful of steps and tokens: checks that it runs, not speed")
    _add_memory_argument(bench)

    plot = sub.add_parser("plot", help="draw runs' metrics as one picture",
                          description="Draw train and val loss against iterations, tokens "
                                      "seen and training time, the learning rate, tokens/s "
                                      "and MFU of one or more runs from their metrics.jsonl, "
                                      "overlaid and named by their directories (needs "
                                      "matplotlib: the plot extra).")
    plot.add_argument("runs", nargs="+", metavar="RUN",
                      help="a run directory (checkpoint.dir/run_name)")
    plot.add_argument("--out", metavar="FILE.png",
                      help="the picture to write (default: RUN/metrics.png for one run, "
                           "metrics.png in the current directory for several)")
    return parser


def _error(command: str, message: str) -> int:
    print(f"minitorch-gpu {command}: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _unexpected(command: str, exc: Exception) -> int:
    """An error no check of the command expected: a one-line summary, then the whole
    traceback (the summary alone would hide where a CUDA failure or a bug came from)."""
    lines = str(exc).splitlines()
    detail = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    print(f"minitorch-gpu {command}: unexpected error: {detail}", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    return EXIT_FAILED


def _load_config(args: argparse.Namespace):
    from .config import load_config
    overrides = list(args.overrides)
    if args.device:
        overrides.append(f"system.device={args.device}")
    if getattr(args, "resume", False):
        overrides.append("train.resume=true")
    return load_config(args.config, overrides)


def _train(args: argparse.Namespace) -> int:
    from .checkpoint import CheckpointError
    from .config import ConfigError
    from .trainer import Trainer, TrainingDiverged, TrainingError, TrainingRefused
    try:
        cfg = _load_config(args)
    except ConfigError as exc:
        return _error("train", str(exc))
    progress = {"auto": None, "bar": True, "lines": False}[args.progress]
    trainer = Trainer(cfg, progress=progress, overwrite=args.overwrite,
                      check_memory=not args.ignore_memory_check)
    try:
        result = trainer.fit()
    except TrainingDiverged as exc:
        print(f"minitorch-gpu train: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # the second Ctrl-C: quit without saving
        print("minitorch-gpu train: interrupted; the checkpoints on disk are as they were",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except TrainingRefused as exc:  # on every rank: rank 0 says why
        global _every_rank_refused
        _every_rank_refused = True
        return _error("train", str(exc)) if trainer.group.is_main else EXIT_BAD_INPUT
    except (TrainingError, CheckpointError, ConfigError) as exc:
        return _error("train", str(exc))
    except BrokenPipeError:
        raise  # stdout's reader went away: main() stops quietly
    except OSError as exc:  # writing a checkpoint or a log: a full disk, a lost mount
        print(f"minitorch-gpu train: {exc}; the checkpoints on disk are as they were",
              file=sys.stderr)
        return EXIT_FAILED
    code = EXIT_INTERRUPTED if result.status == "interrupted" else 0
    if not trainer.group.is_main:  # under mpiexec, rank 0 reports for the job
        return code
    ckpt = result.best_checkpoint or result.last_checkpoint
    print(f"{result.status}: {result.iterations} iterations in {result.seconds:.0f} s; "
          f"best val loss {result.best_val_loss:.4f}")
    if ckpt is not None:
        prompt = _example_prompt(cfg, trainer.tokenizer)
        option = "" if prompt == "\n" else f" --prompt {shlex.quote(prompt)}"
        print(f"checkpoints in {result.run_dir}; sample from it with:\n"
              f"  minitorch-gpu generate {shlex.quote(str(result.run_dir))}{option} "
              f"--max-new-tokens 300")
    return code


def _example_prompt(cfg, tokenizer) -> str:
    """A prompt for the command printed after training, one the tokenizer can encode (a
    character-level vocabulary holds only the corpus's characters)."""
    preferred = {"python_stdlib": "def ", "tinyshakespeare": "ROMEO:"}.get(cfg.data.source)
    for prompt in (preferred, "The ", "the ", "\n"):
        if prompt is None:
            continue
        try:
            if tokenizer.encode(prompt):
                return prompt
        except ValueError:  # a character outside the vocabulary
            continue
    return tokenizer.decode([0])  # some character of the corpus


def _prepare(args: argparse.Namespace) -> int:
    from .config import ConfigError
    from .data import prepare
    try:
        cfg = _load_config(args)
        prepare(cfg.data, force=args.force)
    except (ConfigError, ValueError, RuntimeError, OSError) as exc:
        return _error("prepare", str(exc))
    return 0


def _generate(args: argparse.Namespace) -> int:
    import minitorch_gpu as mt
    from .backend import get_backend
    from .checkpoint import CheckpointError
    from .inference import load_for_inference, stream_text
    from .nn.sampling import check_sampling

    top_k = args.top_k or None
    try:
        check_sampling(args.temperature, top_k, args.top_p)
        if args.max_new_tokens < 0 or args.num_samples < 1:
            raise ValueError("--max-new-tokens must be >= 0 and --num-samples >= 1")
        if args.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {args.seed}")
        get_backend(args.device)  # before the checkpoint is read
    except (ValueError, RuntimeError) as exc:  # RuntimeError: an unusable device
        return _error("generate", str(exc).splitlines()[0])
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as exc:
            return _error("generate", f"cannot read --prompt-file: {exc}")
        except UnicodeDecodeError as exc:
            return _error("generate", f"--prompt-file {args.prompt_file!r} is not UTF-8 text "
                                      f"(byte {exc.object[exc.start]:#04x} at offset "
                                      f"{exc.start})")
    else:
        prompt = "\n" if args.prompt is None else args.prompt
    from .memory import MemoryLimitError

    def check_memory(config: Any, meta: Dict[str, Any]) -> None:
        if not args.ignore_memory_check:  # the weights, the KV cache of a batch of one
            dtype = "float64" if meta.get("dtype") == "float64" else "float32"
            _check_memory(_workload("generate", config, dtype=dtype, device=args.device,
                                    from_checkpoint=True), get_backend(args.device), None,
                          {"n_layer": "n_layer", "n_embd": "n_embd",
                           "block_size": "block_size", "vocab_size": "vocab_size"},
                          "pass --ignore-memory-check to try anyway")

    try:
        model, tokenizer, _ = load_for_inference(args.checkpoint, args.device,
                                                 check_memory=check_memory)
    except (CheckpointError, MemoryLimitError) as exc:
        return _error("generate", str(exc))
    mt.manual_seed(args.seed)
    out = sys.stdout
    try:
        for sample in range(args.num_samples):
            # checked before the prompt is printed: a refused prompt prints nothing
            pieces = stream_text(model, tokenizer, prompt, args.max_new_tokens,
                                 args.temperature, top_k, args.top_p)
            out.write(prompt)
            for piece in pieces:
                out.write(piece)
                out.flush()
            out.write("\n" if sample == args.num_samples - 1 else "\n---------------\n")
            out.flush()
    except ValueError as exc:  # a prompt the tokenizer cannot encode
        return _error("generate", str(exc))
    except KeyboardInterrupt:
        out.write("\n")
        return EXIT_INTERRUPTED
    return 0


def _profile(args: argparse.Namespace) -> int:
    import minitorch_gpu as mt
    from .checkpoint import CheckpointError
    from .config import ConfigError
    from .memory import MemoryLimitError
    from .profiler import PLOT_HINT, profile_model
    from .trainer import TrainingError
    try:
        cfg = _load_config(args)
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
    except (ConfigError, CheckpointError, ValueError, TrainingError, MemoryLimitError) as exc:
        return _error("profile", str(exc).splitlines()[0])
    block = model.config.block_size
    B = args.batch_size or cfg.train.batch_size
    T = args.seq_len or block
    if T > block:
        return _error("profile", f"--seq-len {T} is longer than the model's block size "
                                 f"{block}")
    mt.manual_seed(cfg.system.seed)
    device = str(next(model.parameters()).device)
    idx = mt.randint(0, model.config.vocab_size, (B, T), device=device)
    targets = mt.randint(0, model.config.vocab_size, (B, T), device=device)
    mode = "forward and backward, training mode" if args.backward else \
        "forward, eval mode, no grad"
    mixed = cfg.system.dtype == "bf16"
    if mixed:
        mode += ", bf16 autocast"
    print(f"{model.num_params() / 1e6:.2f}M-parameter GPT ({model.config.n_layer} layers, "
          f"{model.config.n_head} heads, {model.config.n_embd} wide), batch {B} x {T} "
          f"tokens on {device}; {mode}; {args.warmup} warm-up + {args.iters} passes",
          flush=True)
    try:
        prof = profile_model(model, idx, targets, warmup=args.warmup, iters=args.iters,
                             backward=args.backward, autocast="bf16" if mixed else None)
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
    """``check(config, device, from_checkpoint)``: MemoryLimitError when profiling a GPT of
    ``config`` (a GPTConfig) as ``args`` ask is estimated past the memory ``device`` has;
    nothing with --ignore-memory-check."""
    from .backend import get_backend

    def check(config: Any, device: str, from_checkpoint: bool) -> None:
        if args.ignore_memory_check:
            return
        task = "forward+backward" if args.backward else "forward"
        names = {"n_layer": "model.n_layer", "n_embd": "model.n_embd",
                 "n_head": "model.n_head", "block_size": "model.block_size",
                 "vocab_size": "model.vocab_size"}
        if from_checkpoint:  # the checkpoint's shape: model.* is not read
            names = {key: key for key in names}
        names["batch"] = "--batch-size" if args.batch_size else "train.batch_size"
        names["seq_len"] = "--seq-len"
        work = _workload(task, config, dtype=cfg.system.dtype, device=device,
                         batch=args.batch_size or cfg.train.batch_size, seq_len=args.seq_len,
                         from_checkpoint=from_checkpoint)
        _check_memory(work, get_backend(device), cfg.system.memory_limit_gb, names,
                      "lower them, or pass --ignore-memory-check")
    return check


def _workload(task: str, config: Any, **settings: Any):
    """A memory.Workload of ``task`` on a GPT of ``config`` (a GPTConfig)."""
    from .memory import Workload
    return Workload(task, config.n_layer, config.n_head, config.n_embd, config.block_size,
                    config.vocab_size, bias=config.bias, dropout=config.dropout, **settings)


def _check_memory(work: Any, backend: Any, limit_gb: Optional[float],
                  names: Dict[str, str], advice: str) -> None:
    """MemoryLimitError (one line) when ``work`` is estimated past the memory limit
    (``limit_gb``, else $MINITORCH_GPU_MEMORY_LIMIT_GB, else what ``backend`` has free)."""
    from .memory import MemoryLimitError, check_memory, estimate_memory, memory_limit
    try:
        limit = memory_limit(backend, limit_gb)
    except ValueError as exc:  # a malformed $MINITORCH_GPU_MEMORY_LIMIT_GB
        raise MemoryLimitError(str(exc)) from None
    check_memory(estimate_memory(work), limit, names, advice)


def _model_to_profile(cfg, checkpoint: Optional[str], check_memory=None):
    """The config's GPT, fresh (seeded) or from ``checkpoint``, on the config's device;
    ``check_memory(config, device, from_checkpoint)`` runs before it is built."""
    import minitorch_gpu as mt
    from .backend import get_backend
    from .machine import set_num_threads
    from .nn import GPT
    from .model_from_config import gpt_config
    set_num_threads(cfg.system.threads)
    try:
        device = str(get_backend(cfg.system.device).device)
    except RuntimeError as exc:  # no CuPy, no such GPU: the message names the fix
        raise ValueError(f"system.device: {exc}") from None
    if checkpoint is not None:
        from .inference import load_for_inference
        memory = None if check_memory is None else \
            (lambda config, meta: check_memory(config, device, True))
        model, _, _ = load_for_inference(checkpoint, device, keep_padding=True,
                                         check_memory=memory)
        return model.to(_weights_dtype(cfg))
    if check_memory is not None:  # before the data is read: the vocabulary at its least
        vocab = cfg.model.vocab_size or cfg.model.pad_vocab_to
        check_memory(gpt_config(cfg.model, vocab), device, False)
    tokenizer_vocab = None
    if cfg.model.vocab_size is None:  # the tokenizer's: the data must be prepared (cached)
        from .data import prepare
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
    return GPT(config).to(_weights_dtype(cfg)).to(device)


def _bench(args: argparse.Namespace) -> int:
    from .bench import format_table, run_bench
    for name in ("threads", "steps", "new_tokens", "generate_runs", "rounds"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return _error("bench", f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup < 0:
        return _error("bench", f"--warmup must be >= 0, got {args.warmup}")
    if args.quick:
        args.steps, args.warmup, args.new_tokens, args.generate_runs = 2, 1, 8, 1
    if not args.ignore_memory_check:  # each case's training step and generation, on the CPU
        from .backend import cpu
        from .bench import CASES
        from .memory import MemoryLimitError
        from .nn import GPTConfig
        for case in args.case:
            shape = dict(CASES[case])
            batch = shape.pop("batch_size")
            for task, sequences in (("train", batch), ("generate", 1)):
                try:
                    _check_memory(_workload(task, GPTConfig(**shape), batch=sequences), cpu,
                                  None, {key: key for key in shape},
                                  "pass --ignore-memory-check to run it anyway")
                except MemoryLimitError as exc:
                    return _error("bench", f"{case}: {exc}")
    try:
        records = run_bench(args.case, vs_torch=args.vs_torch, threads=args.threads,
                            steps=args.steps, warmup=args.warmup, new_tokens=args.new_tokens,
                            generate_runs=args.generate_runs, rounds=args.rounds,
                            emit=lambda line: print(line, flush=True))
    except RuntimeError as exc:
        return _error("bench", str(exc))
    print(format_table(records))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from .plot_runs import PLOT_HINT, MetricsError, default_output, plot_runs, read_runs
    try:
        import matplotlib  # noqa: F401 - before the runs are read
    except ImportError:
        return _error("plot", PLOT_HINT)
    try:
        runs = read_runs(args.runs)
    except MetricsError as exc:
        return _error("plot", str(exc))
    try:
        path = plot_runs(runs, args.out or default_output(args.runs))
    except ValueError as exc:  # a suffix matplotlib has no writer for
        return _error("plot", f"--out: {str(exc).splitlines()[0]}")
    except OSError as exc:
        print(f"minitorch-gpu plot: cannot write {exc.filename}: {exc.strerror}",
              file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {path}")
    return 0


def _weights_dtype(cfg) -> Any:
    """The weights' dtype, as the trainer keeps them: float32 for bf16 mixed precision."""
    from .model_from_config import DTYPES
    return DTYPES[cfg.system.dtype]


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    command = {"train": _train, "prepare": _prepare, "generate": _generate,
               "profile": _profile, "bench": _bench, "plot": _plot}[args.command]
    try:
        return command(args)
    except BrokenPipeError:  # stdout's reader went away (`... | head`): stop, quietly
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:  # Ctrl-C while loading or preparing (training saves first)
        print(f"minitorch-gpu {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except MemoryError as exc:  # past the memory check (--ignore-memory-check), or its miss
        return _out_of_memory(args.command, exc)
    except Exception as exc:  # what the command's own handlers did not expect
        return _unexpected(args.command, exc)


def _out_of_memory(command: str, exc: MemoryError) -> int:
    """A MemoryError (NumPy's, CuPy's, Python's) as one line; nothing was written in a half
    state (checkpoints are atomic), so it is bad input: sizes this machine can't hold."""
    detail = " ".join(str(exc).split()) or "an allocation failed"
    hint = {"train": "; lower the model's sizes or train.batch_size (the checkpoints on disk "
                     "are as they were)",
            "generate": "; try --device with more memory",
            "prepare": "; data.max_chars reads less of the corpus"}.get(command, "")
    print(f"minitorch-gpu {command}: out of memory: {detail[:300]}{hint}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit finds no broken pipe
    to complain about (Python's documented recipe for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # stdout is not a file (in tests)
        pass


def entry_point() -> None:
    code = main()
    # Ctrl-C reaches every rank (mpiexec forwards it) and the ranks stop after one agreed
    # step, so each ends on its own, as after a refusal every rank got; any other failure
    # ends the whole job
    if code not in (0, EXIT_INTERRUPTED) and not _every_rank_refused:
        # one of several MPI ranks: the others would wait for this one in their next
        # collective; end them all (nothing happens in a single process)
        from .distributed import abort_job
        abort_job(code)
    sys.exit(code)


if __name__ == "__main__":
    entry_point()
