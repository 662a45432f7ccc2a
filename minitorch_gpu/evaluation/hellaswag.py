"""HellaSwag: pick the ending of a context that the model finds most likely.

The file is HellaSwag's jsonl, one JSON object a line::

    {"ind": 24, "ctx": "A man is sitting on a roof. he", "label": 3,
     "endings": ["is using wrap to wrap a pair of skis.", "...", "...", "starts pulling up
                 roofing on a roof."]}

Each ending is scored as llm.c and lm-eval score it: the context is tokenized, then the
ending with a leading space (``" " + ending``), and the ending's score is the sum over its
tokens of ``log p(token | everything before it)``, from a log-softmax in float64 of the
model's logits. ``acc`` counts the examples whose highest sum is the label's, ``acc_norm``
those whose highest mean per ending token is (the figure llm.c reports: longer endings are
not penalised for their length). The four endings go through the model as one batch of
four rows, padded on the right to the longest (causal attention: padding after a token
never changes its logits, and the padded positions are not scored).

A context and ending longer than the block size + 1 tokens keeps its last block size + 1
tokens (cropped from the left, as generation crops), and the example counts as cropped in
the summary; an ending of more than block size tokens is scored on its last block size.

The file is read a line at a time and each example scored as it is read: memory holds one
example, whatever the file's length. A bad line stops the scoring with HellaSwagError
naming the line and what was wrong.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from ..autograd import no_grad
from ..creation import tensor

__all__ = ["HellaSwagError", "Example", "HellaSwagSummary", "read_examples", "count_examples",
           "encode_example", "score_example", "score_hellaswag"]

ENDINGS = 4  # HellaSwag's choices per example


class HellaSwagError(ValueError):
    """A HellaSwag file that cannot be scored; the message names the file and the line."""


@dataclass
class Example:
    """One multiple-choice question, as read from its line."""

    ind: Any  # the dataset's own index (the line's "ind"; its position when absent)
    ctx: str
    endings: List[str]  # four
    label: int  # 0..3, the true ending
    line: int  # where it was in the file (1-based)


def _check_example(record: Any, where: str, position: int, number: int) -> Example:
    if not isinstance(record, dict):
        raise HellaSwagError(f"{where}: expected a JSON object with ctx, endings and label, "
                             f"got {type(record).__name__}")
    missing = [key for key in ("ctx", "endings", "label") if key not in record]
    if missing:
        raise HellaSwagError(f"{where}: missing key(s) {', '.join(missing)} (a HellaSwag line "
                             f"has ctx, endings and label)")
    ctx, endings, label = record["ctx"], record["endings"], record["label"]
    if not isinstance(ctx, str) or not ctx:
        raise HellaSwagError(f"{where}: ctx must be a non-empty string, got {ctx!r:.60}")
    if not isinstance(endings, list) or len(endings) != ENDINGS \
            or not all(isinstance(e, str) for e in endings):
        got = (f"{len(endings)} of them" if isinstance(endings, list)
               else type(endings).__name__)
        raise HellaSwagError(f"{where}: endings must be a list of {ENDINGS} strings, got {got}")
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < ENDINGS:
        raise HellaSwagError(f"{where}: label must be an int in 0..{ENDINGS - 1}, got "
                             f"{label!r:.40}")
    return Example(record.get("ind", position), ctx, list(endings), label, number)


def read_examples(path: Union[str, Path], limit: Optional[int] = None) -> Iterator[Example]:
    """The examples of a HellaSwag jsonl, in order, the first ``limit`` (None: all), read
    one line at a time; blank lines are skipped. HellaSwagError names a bad line."""
    path = Path(path)
    position = 0
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if limit is not None and position >= limit:
                    return
                if not line.strip():
                    continue
                where = f"{path} line {number}"
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise HellaSwagError(f"{where}: not valid JSON ({exc})") from None
                yield _check_example(record, where, position, number)
                position += 1
    except UnicodeDecodeError as exc:
        raise HellaSwagError(f"{path}: not UTF-8 text ({exc})") from None
    except OSError as exc:
        raise HellaSwagError(f"cannot read {path}: {exc.strerror or exc}") from None


def count_examples(path: Union[str, Path], limit: Optional[int] = None) -> int:
    """How many examples ``read_examples`` will give (non-blank lines, up to ``limit``)."""
    try:
        with open(path, "rb") as f:
            n = sum(1 for line in f if line.strip())
    except OSError as exc:
        raise HellaSwagError(f"cannot read {path}: {exc.strerror or exc}") from None
    return n if limit is None else min(n, limit)


def encode_example(tokenizer: Any, example: Example) -> Tuple[List[int], List[List[int]]]:
    """(context ids, each ending's ids), the ending encoded with its leading space."""
    try:
        ctx = tokenizer.encode(example.ctx)
        endings = [tokenizer.encode(" " + ending) for ending in example.endings]
    except ValueError as exc:  # a character the vocabulary does not hold
        raise HellaSwagError(f"line {example.line} (ind {example.ind}): the model's "
                             f"tokenizer cannot encode it: {exc}") from None
    if not ctx:
        raise HellaSwagError(f"line {example.line} (ind {example.ind}): ctx encodes to no "
                             f"tokens")
    return ctx, endings


def score_example(model: Any, tokenizer: Any, example: Example) -> Tuple[Dict[str, Any], bool]:
    """(the example's record, whether it was cropped). The record holds ``ind``,
    ``label``, ``sum_logprob`` and ``mean_logprob`` (one per ending), ``pred`` (the
    highest sum) and ``pred_norm`` (the highest mean). Run under no_grad, model in eval."""
    T = model.config.block_size
    ctx, endings = encode_example(tokenizer, example)
    rows, scored, cropped = [], [], False
    for ending in endings:
        sequence = ctx + ending
        if len(sequence) > T + 1:  # the model reads at most T tokens: keep the last T + 1
            sequence, cropped = sequence[-(T + 1):], True
        rows.append(sequence)
        scored.append(min(len(ending), len(sequence) - 1))  # the ending's targets
    width = max(len(row) for row in rows) - 1
    inputs = np.zeros((ENDINGS, width), dtype=np.int64)  # (4, L), padded with id 0
    which_row, which_position, targets = [], [], []
    for i, (row, n) in enumerate(zip(rows, scored)):
        inputs[i, :len(row) - 1] = row[:-1]
        positions = np.arange(len(row) - 1 - n, len(row) - 1)  # predicting the ending
        which_row.append(np.full(n, i))
        which_position.append(positions)
        targets.append(np.asarray(row, dtype=np.int64)[positions + 1])
    rows_at, positions_at = np.concatenate(which_row), np.concatenate(which_position)
    logits, _ = model(tensor(inputs, device=model.lm_head.weight.device), all_logits=True)
    picked = np.asarray(logits[rows_at, positions_at], dtype=np.float64)  # (K, V)
    top = picked.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(picked - top).sum(axis=1))  # logsumexp per row
    logprob = picked[np.arange(len(picked)), np.concatenate(targets)] - log_norm  # (K,)
    sums = np.array([logprob[rows_at == i].sum() for i in range(ENDINGS)])
    means = sums / np.asarray(scored, dtype=np.float64)
    record = {"ind": example.ind, "label": example.label,
              "sum_logprob": sums.tolist(), "mean_logprob": means.tolist(),
              "pred": int(np.argmax(sums)), "pred_norm": int(np.argmax(means))}
    return record, cropped


@dataclass
class HellaSwagSummary:
    """What the examples scored added up to."""

    examples: int = 0
    correct: int = 0  # the highest sum was the label's
    correct_norm: int = 0  # the highest mean per token was the label's
    cropped: int = 0  # examples with a context cropped to the block size
    seconds: float = 0.0

    @property
    def acc(self) -> float:
        return self.correct / self.examples if self.examples else float("nan")

    @property
    def acc_norm(self) -> float:
        return self.correct_norm / self.examples if self.examples else float("nan")

    def summary(self) -> str:
        return (f"hellaswag: acc {self.acc:.4f} acc_norm {self.acc_norm:.4f} over "
                f"{self.examples} examples ({self.cropped} contexts cropped) in "
                f"{self.seconds:.1f} s")

    def record(self) -> Dict[str, Any]:
        return {"task": "hellaswag", "acc": self.acc, "acc_norm": self.acc_norm,
                "examples": self.examples, "correct": self.correct,
                "correct_norm": self.correct_norm, "cropped": self.cropped,
                "seconds": self.seconds}


def score_hellaswag(model: Any, tokenizer: Any, path: Union[str, Path],
                    limit: Optional[int] = None, *, progress: bool = False,
                    shard: Tuple[int, int] = (0, 1),
                    on_record: Optional[Callable[[Dict[str, Any]], None]] = None
                    ) -> HellaSwagSummary:
    """Score the first ``limit`` examples of the jsonl at ``path`` (None: all), passing
    each example's record to ``on_record``. ``shard=(rank, ranks)`` scores every
    ranks-th example from the rank-th (the ranks' summaries add up to the whole); every
    line is still read and checked, so a bad line stops every rank alike. The model's
    train/eval mode is restored afterwards."""
    rank, ranks = shard
    from tqdm import tqdm
    bar = tqdm(total=count_examples(path, limit), disable=not progress, file=sys.stderr,
               unit="example", dynamic_ncols=True, desc="hellaswag")
    summary = HellaSwagSummary()
    start, training = time.perf_counter(), model.training
    model.eval()
    try:
        with no_grad():
            for position, example in enumerate(read_examples(path, limit)):
                bar.update(1)
                if position % ranks != rank:
                    continue
                record, cropped = score_example(model, tokenizer, example)
                summary.examples += 1
                summary.correct += record["pred"] == example.label
                summary.correct_norm += record["pred_norm"] == example.label
                summary.cropped += cropped
                if on_record is not None:
                    on_record(record)
                if progress and summary.examples % 20 == 0:
                    bar.set_postfix_str(f"acc_norm {summary.acc_norm:.4f}", refresh=False)
    finally:
        bar.close()
        model.train(training)
    summary.seconds = time.perf_counter() - start
    return summary
