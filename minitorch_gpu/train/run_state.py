"""A run's state: the metadata its checkpoints hold beside the weights, the checks that a
last.ckpt can continue the run a config describes, and how the run ended (TrainResult).

A checkpoint holds every rank's random streams and batch sampler, so a resumed run
reproduces the loss curve of an uninterrupted one, on as many ranks as it was saved by.
The checks refuse (ResumeRefused, one line naming the file) a checkpoint of another model,
of weights that do not fit the model it describes, of another number of ranks, or of
another tokenizer than the data gives now. TrainingError and its kinds are how a run that
cannot start or go on says so (the trainer raises them; the CLI turns them into one line).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..checkpoint import Checkpoint, CheckpointError, load_checkpoint, read_checkpoint_meta
from .config import Config
from ..nn.memory import check_model_arrays
from ..nn.build import DTYPES
from ..nn import GPTConfig

__all__ = ["ResumeRefused", "TrainResult", "TrainingDiverged", "TrainingError",
           "TrainingRefused", "check_resumable", "check_same_tokenizer", "checkpoint_meta",
           "load_optimizer_moments", "load_resumable", "resumed_progress", "saved_ranks"]


class TrainingError(RuntimeError):
    """A run that cannot start or continue; the message says why and what to do."""


class TrainingDiverged(TrainingError):
    """The loss became NaN or infinite; the last good checkpoint is left as it was."""


class TrainingRefused(TrainingError):
    """Rank 0's refusal of the run directory (in use, holds a run, nothing to resume),
    raised on every rank at once: under MPI no rank waits for another, so the job can end
    without an abort, each rank on its own."""


class ResumeRefused(RuntimeError):
    """A last.ckpt this run cannot continue from; the message says why and what to do."""


@dataclass
class TrainResult:
    """How a run ended: ``Trainer.fit``'s answer."""

    run_dir: Path
    iterations: int  # optimizer steps completed
    status: str  # "finished" or "interrupted"
    best_val_loss: float
    last_checkpoint: Optional[Path]
    best_checkpoint: Optional[Path]
    train_loss: Optional[float]  # of the last evaluation
    val_loss: Optional[float]
    seconds: float


def checkpoint_meta(*, iter_num: int, evaluated_at: int, best_val_loss: float,
                    model_config: GPTConfig, cfg: Config, tokenizer_json: str,
                    ranks: List[Dict[str, Any]], data_directory: Path,
                    data_fingerprint: Any, grad_scaler: Dict[str, Any]) -> Dict[str, Any]:
    """A checkpoint's metadata: where the run is, what it trains, and ``ranks``, each rank's
    ``{"rng": ..., "sampler": ...}`` state, rank 0 first; ``grad_scaler`` is fp16's loss
    scaler's ``state_dict()`` (``{}`` in other precisions), the same on every rank."""
    return {
        "iter_num": iter_num,
        "evaluated_at": evaluated_at,
        "best_val_loss": best_val_loss,
        "model_config": dataclasses.asdict(model_config),
        "dtype": cfg.system.dtype,
        "config": cfg.to_dict(),
        "tokenizer": tokenizer_json,
        "rng": ranks[0]["rng"],
        "sampler": ranks[0]["sampler"],
        "world_size": len(ranks),
        "other_ranks": ranks[1:],  # ranks 1.. of a data-parallel run: their rng and sampler
        "data": {"directory": str(data_directory), "fingerprint": data_fingerprint},
        "grad_scaler": grad_scaler,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def check_resumable(path: Path, model_config: GPTConfig, meta: Dict[str, Any],
                    table: Dict[str, Any], file_size: int) -> None:
    """load_checkpoint's check of the last.ckpt at ``path``, before any of its arrays is
    read: its metadata's model is ``model_config`` (the model already built, and
    memory-checked), and its arrays are that model's (names, shapes, dtypes, bytes)."""
    try:  # a run saved before the Llama fields existed: a GPT-2 with their defaults
        saved = dataclasses.asdict(GPTConfig.from_dict(meta.get("model_config")))
    except (TypeError, ValueError):
        saved = {}
    wanted = dataclasses.asdict(model_config)
    # dropout shapes no weight: a resumed run may change it, as nanoGPT's may
    differ = [key for key in wanted if key != "dropout" and saved.get(key) != wanted[key]]
    if differ:
        held = ", ".join(f"{key} {saved.get(key)!r}" for key in differ)
        asked = ", ".join(f"{key} {wanted[key]!r}" for key in differ)
        raise ResumeRefused(f"train.resume: {path} holds a model with {held}; the config "
                            f"asks for {asked}")
    try:
        check_model_arrays(model_config, DTYPES.get(meta.get("dtype")), table, file_size)
    except ValueError as exc:
        raise ResumeRefused(f"train.resume: {path}: the weights do not fit the model it "
                            f"describes ({exc})") from None


def load_resumable(path: Path, model_config: GPTConfig, world_size: int, tokenizer: Any,
                   data_directory: Path) -> Tuple[Checkpoint, List[Dict[str, Any]]]:
    """The last.ckpt at ``path``, checked to continue this run (``check_resumable`` before
    its arrays are read, then ``saved_ranks`` and ``check_same_tokenizer``), and each rank's
    state in it. ResumeRefused, or CheckpointError for a file that is no checkpoint."""
    ckpt = load_checkpoint(path, check=functools.partial(check_resumable, path, model_config))
    ranks = saved_ranks(path, ckpt.meta, world_size)
    check_same_tokenizer(path, ckpt.meta, tokenizer, data_directory)
    return ckpt, ranks


def load_optimizer_moments(optimizer: Any, state: Dict[str, Any]) -> None:
    """The optimizer's moments from a checkpoint's ``state``, its settings as they are (from
    the config): load_state_dict brings back the saved betas, eps and weight decay, as
    PyTorch's does, so a resumed run's --set train.weight_decay would be ignored, and its
    config.yaml would say otherwise."""
    settings = [{key: value for key, value in group.items() if key != "params"}
                for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, setting in zip(optimizer.param_groups, settings):
        group.update(setting)


def saved_ranks(path: Path, meta: Dict[str, Any], world_size: int) -> List[Dict[str, Any]]:
    """Each rank's ``{"rng": ..., "sampler": ...}`` in the metadata of the checkpoint at
    ``path``, rank 0 first; ResumeRefused unless it was saved by ``world_size`` ranks."""
    saved = int(meta.get("world_size", 1))
    if saved != world_size:
        raise ResumeRefused(
            f"train.resume: {path} was saved by a run of {saved} rank(s), and this one has "
            f"{world_size}: it holds each rank's batch stream, so resume it on {saved} "
            f"(mpiexec -n {saved} ...), or start a new run")
    ranks = [{"rng": meta["rng"], "sampler": meta["sampler"]}, *meta.get("other_ranks", [])]
    if len(ranks) != saved:
        raise ResumeRefused(f"train.resume: {path} says it was saved by {saved} ranks but "
                            f"holds the state of {len(ranks)}")
    return ranks


def check_same_tokenizer(path: Path, meta: Dict[str, Any], tokenizer: Any,
                         data_directory: Path) -> None:
    """ResumeRefused unless the checkpoint at ``path`` was trained with ``tokenizer``, the
    one the data (prepared in ``data_directory``) gives now (compared as data, not text)."""
    try:
        same = json.loads(meta.get("tokenizer")) == json.loads(tokenizer.to_json())
    except (TypeError, ValueError):
        same = False
    if not same:
        raise ResumeRefused(
            f"train.resume: {path} was trained with another tokenizer than the data gives "
            f"now ({tokenizer.kind}, vocab {tokenizer.vocab_size:,}, from {data_directory}): "
            f"the data or its settings changed since; resume with the data it was trained "
            f"on, or start a new run")


def resumed_progress(meta: Dict[str, Any], best_path: Path) -> Tuple[int, int, float]:
    """(iteration, iteration last evaluated, best val loss) a run resumed from a last.ckpt
    of ``meta`` goes on from; the best val loss is that of a best.ckpt at ``best_path``
    saved after the last.ckpt, when lower (checkpoint.always_save: false)."""
    best = float(meta["best_val_loss"])
    if best_path.exists():
        try:
            newer = float(read_checkpoint_meta(best_path)["best_val_loss"])
        except (CheckpointError, KeyError, TypeError, ValueError):
            newer = math.inf  # unreadable: the next better evaluation replaces it
        best = min(best, newer)
    return int(meta["iter_num"]), int(meta.get("evaluated_at", -1)), best
