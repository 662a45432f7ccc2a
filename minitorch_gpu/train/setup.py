"""What a run is built from before its loop starts: the ranks, the device, the pretrained
start, and the batch samplers of the prepared data. The trainer (``trainer.py``) calls
these once, from ``Trainer._build``; each turns its failure into one TrainingError line
naming the config key, so a bad config stops before any step.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from .. import distributed
from ..backend import get_backend
from ..data import BatchSampler, describe_source
from ..distributed import rank_seed
from .config import Config
from .init_from import describe as describe_init, start_from
from .run_state import TrainingError

__all__ = ["batch_samplers", "join_world", "open_backend", "pretrained_start"]


def join_world(cfg: Config) -> Any:
    """The job's ranks (one process: a group whose collectives do nothing)."""
    try:
        return distributed.world(cfg.system.dist_timeout_s)
    except RuntimeError as exc:  # started by mpiexec without mpi4py
        raise TrainingError(str(exc)) from None


def open_backend(cfg: Config, group: Any) -> Any:
    """The backend of this rank's device (``system.device``, one GPU per rank)."""
    try:
        return get_backend(group.rank_device(cfg.system.device))
    except (RuntimeError, ValueError) as exc:  # no CuPy, no GPU, too few GPUs for the ranks
        raise TrainingError(f"system.device: {exc}") from None


def pretrained_start(cfg: Config, log: Callable[[str], None]) -> Optional[Any]:
    """``model.init_from``'s source, which fills the config's shape and tokenizer in (its
    weights are copied once the model is built); None for ``scratch``."""
    try:
        init = start_from(cfg)
    except ValueError as exc:  # ConfigError, PretrainedError: one line each
        raise TrainingError(str(exc)) from None
    if init is not None:
        log(describe_init(init))
    return init


def batch_samplers(cfg: Config, data: Any, rank: int, device: str
                   ) -> Tuple[BatchSampler, Dict[str, Callable[[], BatchSampler]]]:
    """This rank's training sampler (its own seed), and a fresh evaluation sampler per
    split: every evaluation scores the same batches (a fixed seed), so successive
    evaluations differ only by the model, and never move the training stream."""
    t, seed, T = cfg.train, cfg.system.seed, cfg.model.block_size
    eval_batch = cfg.eval.batch_size or t.batch_size
    train_tokens, val_tokens = data.train_tokens(), data.val_tokens()
    for split, tokens in (("train", train_tokens), ("val", val_tokens)):
        if len(tokens) < T + 1:
            raise TrainingError(
                f"data: the corpus is too short for one window: "
                f"{describe_source(cfg.data)}: the {split} split has {len(tokens)} "
                f"tokens, fewer than model.block_size + 1 = {T + 1}: use a larger corpus "
                f"or a smaller model.block_size")
    sampler = BatchSampler(train_tokens, T, t.batch_size, rank_seed(seed, rank), device)
    eval_samplers = {
        "train": lambda: BatchSampler(train_tokens, T, eval_batch, seed + 1, device),
        "val": lambda: BatchSampler(val_tokens, T, eval_batch, seed + 2, device),
    }
    return sampler, eval_samplers
