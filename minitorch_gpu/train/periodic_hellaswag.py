"""HellaSwag while training: the trainer's step that scores the model every
``eval.hellaswag_interval`` iterations and at the last (never at the iteration a run starts
or resumes at), as llm.c does.

>>> hellaswag = PeriodicHellaSwag(cfg, group, tokenizer, start=0, log=print)
>>> hellaswag.score_if_due(model, iter_num, metrics.write, print)  # False when not due
>>> # writes {"type": "hellaswag", "iter": 500, "acc": 0.27, "acc_norm": 0.28, ...}

The examples come from ``eval.hellaswag_data`` or, null, from the validation set, which
rank 0 fetches into the cache once, before training. Every line is read and encoded with
the run's tokenizer then too, so a bad file or a character the tokenizer does not know
stops the run before its first step, not hours in. Under MPI the examples are shared out
(rank r scores every world_size-th from the r-th, ``score_hellaswag``'s shard) and the
counts summed, so the figures do not depend on the number of ranks.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

from ..evaluation import HellaSwagError, hellaswag_path, read_examples, score_hellaswag
from ..evaluation.hellaswag import encode_example
from .config import Config
from .run_state import TrainingError

__all__ = ["PeriodicHellaSwag"]


class PeriodicHellaSwag:
    """The HellaSwag step of one run (doing nothing when ``eval.hellaswag_interval`` is
    null). TrainingError at construction when the examples cannot be had or encoded."""

    def __init__(self, cfg: Config, group: Any, tokenizer: Any, start: int,
                 log: Callable[[str], None]) -> None:
        e = cfg.eval
        self.interval, self.limit, self.last = e.hellaswag_interval, e.hellaswag_limit, \
            cfg.train.max_iters
        self.group, self.tokenizer, self.start = group, tokenizer, start
        if self.interval is None:
            return
        found = [None, None]  # (path, refusal), rank 0's
        if group.is_main:
            try:
                found[0] = str(hellaswag_path(e.hellaswag_data, log=log,
                                              hint="set eval.hellaswag_data to a local "
                                                   "HellaSwag jsonl"))
            except HellaSwagError as exc:
                found[1] = str(exc)
        self.path, refusal = group.broadcast_object(found, "rank 0's HellaSwag data")
        if refusal is not None:
            raise TrainingError(f"eval.hellaswag_data: {refusal}")
        examples = 0
        try:
            for example in read_examples(self.path, self.limit):
                encode_example(tokenizer, example)
                examples += 1
        except HellaSwagError as exc:
            raise TrainingError(f"eval.hellaswag_data: {exc}") from None
        if examples == 0:
            raise TrainingError(f"eval.hellaswag_data: {self.path} holds no examples")

    def due(self, iter_num: int) -> bool:
        return self.interval is not None and iter_num > self.start and (
            iter_num % self.interval == 0 or iter_num == self.last)

    def score_if_due(self, model: Any, iter_num: int,
                     write: Callable[[Dict[str, Any]], None], say: Callable[[str], None]) -> bool:
        """Score HellaSwag at ``iter_num`` if it is due, ``write`` its metrics record (the
        same on every rank) and ``say`` it; whether it was due. Every rank calls it at the
        same iterations."""
        if not self.due(iter_num):
            return False
        group = self.group
        own = score_hellaswag(model, self.tokenizer, self.path, self.limit,
                              shard=(group.rank, group.world_size))
        examples, correct, correct_norm, cropped = group.allreduce_sum(
            [own.examples, own.correct, own.correct_norm, own.cropped])
        record = {"type": "hellaswag", "iter": iter_num, "acc": correct / examples,
                  "acc_norm": correct_norm / examples, "examples": int(examples),
                  "cropped": int(cropped), "seconds": own.seconds}
        write(record)
        say(f"hellaswag at iter {iter_num}: acc {record['acc']:.4f}, acc_norm "
            f"{record['acc_norm']:.4f} over {record['examples']} examples "
            f"({record['cropped']} cropped) in {own.seconds:.1f} s")
        return True
