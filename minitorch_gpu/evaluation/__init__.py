"""Scoring a trained model: its loss over a whole token split, and HellaSwag.

``loss.py`` (the mean loss and perplexity over every token of a split, in consecutive
windows of the block size), ``hellaswag.py`` (HellaSwag's multiple choice: the file format,
each ending's log-probability given its context, accuracy), ``hellaswag_data.py`` (where
the examples come from: a local jsonl, or the validation set downloaded once into the
cache)::

    result = split_loss(model, data.val_tokens(), batch_size=32)  # result.perplexity
    summary = score_hellaswag(model, tokenizer, "hellaswag_val.jsonl", limit=100)

The CLI's ``minitorch-gpu eval`` and the trainer's periodic HellaSwag both call these.

Application layer: may import the engine, ``nn``, ``data``, ``checkpoint``,
``pretrained``, ``distributed`` and the foundation; never ``train/``, ``profiler/`` or
``bench/`` beside it (the trainer imports this, not the other way round), nor the CLI.
"""
from .hellaswag import (HellaSwagError, HellaSwagSummary, read_examples, score_example,
                        score_hellaswag)
from .hellaswag_data import HELLASWAG_URL, hellaswag_path
from .loss import SplitLoss, split_loss

__all__ = ["HellaSwagError", "HellaSwagSummary", "read_examples", "score_example",
           "score_hellaswag", "HELLASWAG_URL", "hellaswag_path", "SplitLoss", "split_loss"]
