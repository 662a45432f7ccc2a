"""``minitorch-gpu eval``: score a run, a checkpoint, a Hugging Face folder or ``hf:NAME``.

    minitorch-gpu eval checkpoints/quickstart                       # val loss, every token
    minitorch-gpu eval hf:gpt2 --task loss --data notes.txt
    minitorch-gpu eval checkpoints/quickstart --task hellaswag --limit 500 --json
    minitorch-gpu eval hf:gpt2 --task hellaswag --output hellaswag_gpt2.jsonl

The summary is one line on stdout (and with ``--json`` one JSON record after it); a run's
result is also appended to its metrics.jsonl as an ``eval_task`` record, unless a trainer
holds the run right now. What each task computes: ``evaluation/`` and docs/evaluation.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Dict

from .errors import error
from .options import add_memory_argument

TASKS = ("loss", "hellaswag")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The eval command."""
    p = sub.add_parser("eval", help="score a model: its loss over a whole split, or HellaSwag",
                       description="Score a run directory, a checkpoint, a Hugging Face model "
                                   "folder or hf:NAME: its mean loss and perplexity over every "
                                   "token of a split (--task loss), or HellaSwag's accuracy "
                                   "(--task hellaswag).")
    p.add_argument("model", metavar="MODEL",
                   help="a .ckpt file, a run directory (its best.ckpt, else last.ckpt), a "
                        "Hugging Face model folder, or hf:NAME")
    p.add_argument("--task", choices=TASKS, default="loss",
                   help="loss: over the run's val split or --data; hellaswag: multiple choice "
                        "(default loss)")
    p.add_argument("--data", metavar="FILE",
                   help="loss: a text file to score instead of the run's val split (needed for "
                        "a Hugging Face model); hellaswag: a jsonl in HellaSwag's format "
                        "(default: the validation set, fetched once into the cache)")
    p.add_argument("--limit", type=int, metavar="N", help="hellaswag: the first N examples only")
    p.add_argument("--output", metavar="FILE.jsonl",
                   help="hellaswag: write each example's scores, one JSON object a line")
    p.add_argument("--json", action="store_true",
                   help="also print the summary as one JSON record")
    p.add_argument("--batch-size", type=int, default=32,
                   help="loss: windows per forward pass (default 32)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    add_memory_argument(p)
    p.set_defaults(run=_eval)


def _eval(args: argparse.Namespace) -> int:
    """Score the model, print the summary, record it in its run; the exit code."""
    from ..backend import get_backend
    from ..evaluation import HellaSwagError
    from ..nn.memory import MemoryLimitError
    from ..pretrained import PretrainedError, load_pretrained

    try:
        if args.limit is not None and args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
        for option in ("limit", "output"):
            if getattr(args, option) is not None and args.task != "hellaswag":
                raise ValueError(f"--{option} is for --task hellaswag")
        get_backend(args.device)  # before the model is read
    except (ValueError, RuntimeError) as exc:
        return error("eval", str(exc).splitlines()[0])
    try:  # keep_padding: the model exactly as trained
        loaded = load_pretrained(args.model, args.device, keep_padding=True,
                                 check_memory=not args.ignore_memory_check,
                                 memory_advice="pass --ignore-memory-check to try anyway")
    except (PretrainedError, MemoryLimitError) as exc:
        return error("eval", str(exc))
    if loaded.tokenizer is None and (args.task == "hellaswag" or args.data is not None):
        return error("eval", f"{loaded.path} has no tokenizer (tokenizer.json, or vocab.json "
                             f"and merges.txt): add one to score text")
    progress = sys.stderr.isatty()
    try:
        if args.task == "loss":
            result = _score_loss(args, loaded, progress)
        else:
            result = _score_hellaswag(args, loaded, progress)
    except (HellaSwagError, ValueError, OSError) as exc:  # a bad file, too few tokens
        return error("eval", str(exc).splitlines()[0])
    print(result.summary(), flush=True)
    record = {"type": "eval_task", **result.record()}
    if loaded.kind == "checkpoint":
        record["iter"] = int(loaded.meta.get("iter_num", 0))
        record["checkpoint"] = loaded.path.name
    if args.data is not None:
        record["data"] = str(args.data)
    if args.json:
        print(json.dumps({"model": str(args.model), **record}), flush=True)
    if loaded.kind == "checkpoint":
        _record_in_run(loaded.path.parent, record)
    return 0


def _score_loss(args: argparse.Namespace, loaded: Any, progress: bool) -> Any:
    from ..evaluation import split_loss
    if args.data is not None:
        try:
            text = Path(args.data).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"--data {args.data}: not UTF-8 text") from None
        except OSError as exc:
            raise ValueError(f"--data {args.data}: {exc.strerror or exc}") from None
        tokens = loaded.tokenizer.encode_array(text)  # a ValueError names a strange character
    else:
        tokens = _run_val_tokens(loaded)
    return split_loss(loaded.model, tokens, args.batch_size, progress=progress)


def _run_val_tokens(loaded: Any) -> Any:
    """The val split of the data the checkpoint's run was trained on (prepared again from
    its config if the cache no longer holds it)."""
    from ..data import prepare
    from ..train.config import ConfigError, config_from_dict
    if loaded.kind != "checkpoint" or not isinstance(loaded.meta.get("config"), dict):
        raise ValueError(f"{loaded.source} has no run config whose val split to score: "
                         f"pass --data FILE (a text file)")
    try:
        cfg = config_from_dict(loaded.meta["config"])
        data = prepare(cfg.data, log=lambda line: print(line, file=sys.stderr))
    except ConfigError as exc:
        raise ValueError(f"{loaded.path}: its run config: {exc}") from None
    except (RuntimeError, OSError) as exc:  # the corpus gone, offline
        raise ValueError(f"{loaded.path}: cannot prepare its run's data ({exc}); pass "
                         f"--data FILE") from None
    return data.val_tokens()


def _score_hellaswag(args: argparse.Namespace, loaded: Any, progress: bool) -> Any:
    from ..evaluation import hellaswag_path, score_hellaswag
    from ..system.atomic import atomic_write
    path = hellaswag_path(args.data, log=lambda line: print(line, file=sys.stderr))
    # the per-example file appears whole, or not at all when scoring fails
    with (atomic_write(Path(args.output), "w") if args.output is not None
          else contextlib.nullcontext()) as out:
        write = None if out is None else (lambda record: out.write(json.dumps(record) + "\n"))
        return score_hellaswag(loaded.model, loaded.tokenizer, path, args.limit,
                               progress=progress, on_record=write)


def _record_in_run(directory: Path, record: Dict[str, Any]) -> None:
    """Append ``record`` to the run's metrics.jsonl, under the run's lock; a run being
    trained right now is left alone, with a note."""
    from ..train.run_directory import MetricsLog
    from ..train.run_lock import RunDirectoryInUse, lock_run_directory
    if not (directory / "metrics.jsonl").is_file():
        return  # a checkpoint file outside a run directory
    try:
        lock = lock_run_directory(directory)
    except RunDirectoryInUse as exc:
        _note(f"not written to {directory / 'metrics.jsonl'}: {exc}")
        return
    except OSError as exc:  # a read-only run directory
        _note(f"not written to {directory / 'metrics.jsonl'}: {exc.strerror or exc}")
        return
    try:
        MetricsLog(directory / "metrics.jsonl").write(record)
    finally:
        lock.release()


def _note(message: str) -> None:
    print(f"minitorch-gpu eval: note: {message}", file=sys.stderr)

