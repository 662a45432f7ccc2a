"""The data layer: a corpus (sources), a tokenizer, prepared token shards, random batches.

sources.py streams a corpus's documents; encoding.py cuts the stream into chunks and
tokenizes them in worker processes; shards.py is the shard file format and ``TokenSplit``,
a split read across shards; prepare.py runs the whole preparation, resumable; sampler.py
draws batches; windows.py cuts a split into consecutive windows.

>>> from minitorch_gpu.data import DataConfig
>>> from minitorch_gpu.data import BatchSampler, prepare
>>> data = prepare(DataConfig(source="tinyshakespeare", tokenizer="char"))
>>> sampler = BatchSampler(data.train_tokens(), block_size=64, batch_size=12, seed=1337)
>>> x, y = sampler.next_batch()  # int64 Tensors (12, 64)

Inputs-and-outputs layer: may import ``nn``/``optim``, the engine and the foundation;
nothing beside it, and never ``train/``, ``profiler/``, ``bench/`` or the CLI above.
"""
from .config import DataConfig
from .sources import cache_root, describe_source, load_text, source_fingerprint
from .tokenizer import (BPETokenizer, CharTokenizer, Tokenizer, build_tokenizer, load_tokenizer,
                        tokenizer_from_json)
from .prepare import PreparedData, prepare, prepared_dir, token_dtype, val_split_of
from .shards import ShardError, TokenSplit, read_header
from .sampler import BatchSampler
from .windows import consecutive_windows

__all__ = ["DataConfig", "cache_root", "describe_source", "load_text", "source_fingerprint", "Tokenizer",
           "CharTokenizer", "BPETokenizer", "tokenizer_from_json", "load_tokenizer",
           "build_tokenizer", "PreparedData", "prepare", "prepared_dir", "token_dtype",
           "val_split_of", "ShardError", "TokenSplit", "read_header",
           "BatchSampler", "consecutive_windows"]
