"""The data section of a run config: where the text comes from and how it becomes tokens.

Its own module in data/, so that the data layer reads its settings without importing the
run config (train/config.py) above it; the run config holds one as its ``data`` section,
and loads and checks it with the others.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Union

__all__ = ["DataConfig"]


@dataclass
class DataConfig:
    """Where the text comes from and how it becomes tokens."""

    source: str = "tinyshakespeare"  # text_files | python_stdlib | tinyshakespeare | hf_dataset
    path: Union[str, List[str], None] = None  # text_files: a file or glob (or a list); tinyshakespeare: a local copy; hf_dataset: a local file or load_from_disk folder
    paths: List[str] = field(default_factory=list)  # text_files: more files or globs
    dataset: Optional[str] = None  # hf_dataset: the dataset name on the hub (e.g. "roneneldan/TinyStories")
    dataset_config: Optional[str] = None  # hf_dataset: the dataset's configuration name, if any
    split: str = "train"  # hf_dataset: the split to read
    text_field: str = "text"  # hf_dataset: the column holding the text
    max_chars: Optional[int] = None  # use only the first max_chars characters of the corpus (null: all)
    tokenizer: str = "char"  # char (vocabulary from the corpus) | bpe (byte-level, trained) | file
    vocab_size: int = 4096  # bpe: the vocabulary to train to
    tokenizer_path: Optional[str] = None  # tokenizer: file: a tokenizer.json to load
    val_fraction: float = 0.1  # the fraction of the corpus held out for validation
    val_split: str = "auto"  # position (the last val_fraction of the tokens) | documents (every 1/val_fraction-th document, whole) | auto: documents for at least 1/val_fraction documents
    tokenizer_sample_chars: int = 50_000_000  # bpe: train on at most the corpus's first this many characters
    shard_tokens: int = 100_000_000  # tokens per shard file (the last of a split holds the rest)
    workers: Optional[int] = None  # processes that tokenize; null: one per core; 0: none, in this process
    cache_dir: Optional[str] = None  # prepared tokens and downloads; null: $MINITORCH_GPU_CACHE or ~/.cache/minitorch_gpu
