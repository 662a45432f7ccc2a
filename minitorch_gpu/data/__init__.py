"""The data layer: a corpus (sources), a tokenizer, prepared token files, random batches.

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
from .prepare import PreparedData, prepare, prepared_dir, token_dtype
from .sampler import BatchSampler
from .windows import consecutive_windows

__all__ = ["DataConfig", "cache_root", "describe_source", "load_text", "source_fingerprint", "Tokenizer",
           "CharTokenizer", "BPETokenizer", "tokenizer_from_json", "load_tokenizer",
           "build_tokenizer", "PreparedData", "prepare", "prepared_dir", "token_dtype",
           "BatchSampler", "consecutive_windows"]
