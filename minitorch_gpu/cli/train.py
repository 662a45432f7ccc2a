"""``minitorch-gpu train`` and ``minitorch-gpu prepare``: a config's run, and its data."""
from __future__ import annotations

import argparse
import shlex
import sys

from . import errors
from .errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, error
from .options import add_config_arguments, add_memory_argument, config_from_args


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The train and prepare commands."""
    train = sub.add_parser("train", help="train a GPT or a Llama from a config",
                           description="Train the model a config describes (model.arch: gpt2 or llama); checkpoints, the "
                                       "resolved config and metrics.jsonl go to "
                                       "checkpoint.dir/run_name/.")
    add_config_arguments(train)
    train.add_argument("--resume", action="store_true",
                       help="continue from the run's last.ckpt (same as --set "
                            "train.resume=true)")
    train.add_argument("--overwrite", action="store_true",
                       help="start over even if the run directory already holds a run")
    train.add_argument("--progress", choices=("auto", "bar", "lines"), default="auto",
                       help="a progress bar, or a log line every train.log_interval "
                            "iterations (auto: a bar on a terminal)")
    add_memory_argument(train)
    train.set_defaults(run=_train)

    prep = sub.add_parser("prepare", help="tokenize a config's corpus into its cache",
                          description="Tokenize the corpus once, streamed through worker "
                                      "processes, into token shards and a manifest in the "
                                      "data cache (skipped when nothing changed; an "
                                      "interrupted prepare continues from its finished "
                                      "shards). Training does this itself when needed.")
    add_config_arguments(prep)
    prep.add_argument("--force", action="store_true", help="prepare again even if cached")
    prep.set_defaults(run=_prepare)


def _train(args: argparse.Namespace) -> int:
    """Train the config's model; the exit code."""
    from ..checkpoint import CheckpointError
    from ..train.config import ConfigError
    from ..train.trainer import Trainer, TrainingDiverged, TrainingError, TrainingRefused
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        return error("train", str(exc))
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
        errors.every_rank_refused = True
        return error("train", str(exc)) if trainer.group.is_main else EXIT_BAD_INPUT
    except (TrainingError, CheckpointError, ConfigError) as exc:
        return error("train", str(exc))
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
    """Tokenize the config's corpus into its cache; the exit code."""
    from ..train.config import ConfigError
    from ..data import prepare
    try:
        cfg = config_from_args(args)
        prepare(cfg.data, force=args.force)
    except (ConfigError, ValueError, RuntimeError, OSError) as exc:
        return error("prepare", str(exc))
    return 0
