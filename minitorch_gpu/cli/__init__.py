"""``minitorch-gpu``: train, prepare data, generate text, profile the layers, draw runs.

    minitorch-gpu train configs/quickstart.yaml [--set train.lr=3e-4] [--resume]
    minitorch-gpu prepare configs/quickstart.yaml [--force]
    minitorch-gpu generate checkpoints/quickstart --prompt "def " --max-new-tokens 200
    minitorch-gpu generate hf:gpt2 --prompt "Hello" [--block-size 256]
    minitorch-gpu export checkpoints/quickstart out/quickstart_hf [--dtype bf16]
    minitorch-gpu profile configs/shakespeare_char.yaml --set model.vocab_size=65 [--backward]
    minitorch-gpu bench [--case baby small] [--threads 2] [--vs-torch] [--quick]
    minitorch-gpu bench --case gpt2 --device cuda --bf16 [--no-generate] [--cprofile 20]
    minitorch-gpu plot checkpoints/quickstart [checkpoints/other ...] [--out runs.png]
    minitorch-gpu eval checkpoints/quickstart [--task loss|hellaswag] [--data FILE] [--limit N]
    minitorch-gpu eval hf:gpt2 --task hellaswag [--output scores.jsonl] [--json]

Also ``python -m minitorch_gpu``. Exit codes: 0 done, 1 training diverged or failed,
2 bad input (a config, a checkpoint, an option, sizes past the memory available), 130
interrupted (after saving), 141 the reader of stdout went away (``minitorch-gpu generate
... | head``), quietly.

An expected failure (bad input, a full disk, a diverged run) is one line on stderr. Any
other error (a bug, a CUDA or driver failure) is a one-line summary followed by its full
traceback, and exit code 1: the one log a run leaves is enough to find where it failed.

Here the parser, the dispatch and what every command shares (Ctrl-C, a closed pipe, out of
memory, the unexpected); each command's options and work in its own module: train.py
(train, prepare), generate.py, export.py, profile.py, bench.py, plot.py, eval.py.

Command-line layer, the top: may import every layer below; nothing imports it.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import List, Optional

from .. import cuda
from . import bench, errors, eval, export, generate, plot, profile, train
from .bench import BENCH_CASES
from .errors import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED
from .profile import SORT_CHOICES

__all__ = ["main", "entry_point", "build_parser", "BENCH_CASES", "SORT_CHOICES",
           "EXIT_FAILED", "EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "EXIT_BROKEN_PIPE"]


def build_parser() -> argparse.ArgumentParser:
    """The ``minitorch-gpu`` parser: one subcommand per command module."""
    parser = argparse.ArgumentParser(
        prog="minitorch-gpu",
        description="Train a small GPT from a YAML config and generate text from its "
                    "checkpoints.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    train.add_parsers(sub)
    for command in (generate, export, profile, bench, plot, eval):
        command.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command ``argv`` names (default: sys.argv[1:]); its exit code."""
    args = build_parser().parse_args(argv)
    if cuda.is_emulated():
        print(f"minitorch-gpu {args.command}: {cuda.EMULATED_NOTE}", file=sys.stderr)
    try:
        return args.run(args)
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


def _unexpected(command: str, exc: Exception) -> int:
    """An error no check of the command expected: a one-line summary, then the whole
    traceback (the summary alone would hide where a CUDA failure or a bug came from)."""
    lines = str(exc).splitlines()
    detail = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    print(f"minitorch-gpu {command}: unexpected error: {detail}", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    return EXIT_FAILED


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
    """The console script: ``main()``, then exit with its code."""
    code = main()
    # Ctrl-C reaches every rank (mpiexec forwards it) and the ranks stop after one agreed
    # step, so each ends on its own, as after a refusal every rank got; any other failure
    # ends the whole job
    if code not in (0, EXIT_INTERRUPTED) and not errors.every_rank_refused:
        # one of several MPI ranks: the others would wait for this one in their next
        # collective; end them all (nothing happens in a single process)
        from ..distributed import abort_job
        abort_job(code)
    sys.exit(code)
