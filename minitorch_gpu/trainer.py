"""The training loop: a Config in, checkpoints and a metrics log out.

One optimizer step is nanoGPT's: ``grad_accum_steps`` micro-batches, each forward + loss +
backward with the loss scaled by 1 / grad_accum_steps, then the global gradient norm
clipped, an AdamW step at the learning rate of the warm-up + cosine schedule, and the
gradients cleared. Every ``eval.interval`` iterations (and at the last) the mean loss of
``eval.iters`` batches of each split is measured and checkpoints are written.

A run directory, ``checkpoint.dir/run_name/``, holds::

    config.yaml      the fully resolved config of the run
    tokenizer.json   the tokenizer (also inside every checkpoint)
    metrics.jsonl    one JSON object per logged step ("train") and per evaluation ("eval")
    last.ckpt        the latest state: model, optimizer, iteration, RNG and sampler states
    best.ckpt        the state with the lowest validation loss so far
    tensorboard/     with logging.tensorboard: metrics.jsonl's numbers as TensorBoard events

One trainer at a time: ``fit`` locks the run directory (``.lock``, see ``run_lock.py``)
before it checks or writes anything there and unlocks it when it returns (the kernel does
when the process dies); a second trainer, ``--resume`` and ``--overwrite`` included,
refuses, naming the first's PID. With the lock held, the temporary files of saves killed
outright are removed.

Checkpoint writes are atomic (see ``checkpoint.py``). A resumed run restores every random
stream, so with the same seed it reproduces the loss curve of an uninterrupted run.

A step reads nothing back from the device: reading a value from a GPU waits for every
kernel queued before it, and the GPU then idles while Python queues the next step. Each
step's loss and gradient norm stay on the device and are read together (one host read) at
the next log point (every ``train.log_interval`` iterations), evaluation, checkpoint or
the end, where a NaN or infinite one stops the run, naming the step it came from. So a
diverged run runs on until then, and never saves a checkpoint after the bad step.

Under ``mpiexec -n N`` (see ``distributed/``) every rank runs this loop on its own batches
(its own sampler seed) and the gradients are averaged across ranks once per optimizer step,
after the last micro-batch and before clipping, so the weights stay identical everywhere.
Rank 0 alone logs, writes the run directory and saves checkpoints; evaluation is shared out
and summed; a checkpoint holds every rank's random streams, so it resumes on N ranks only.
A single process runs the same code with the collectives doing nothing.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import backend as backend_module
from . import distributed
from .atomic import atomic_write, remove_leftover_temporaries
from .amp import autocast
from .autograd import no_grad
from .backend import dtypes, get_backend, manual_seed
from .checkpoint import (CheckpointError, load_checkpoint, read_checkpoint_meta,
                         save_checkpoint)
from .config import Config, ConfigError, config_to_yaml
from .data import BatchSampler, describe_source, prepare
from .distributed import rank_seed
from .machine import matmul_peak_flops, set_num_threads
from .memory import (MemoryLimitError, Workload, check_gpt_arrays, check_memory,
                     estimate_memory, memory_limit)
from .model_from_config import DTYPES, build_model, gpt_config, weight_dtype
from .optim import clip_grad_norm_, constant_lr, cosine_lr
from .run_lock import RunDirectoryInUse, RunLock, lock_run_directory
from .tensorboard_log import TENSORBOARD_HINT, TensorBoardLog, tensorboard_available

__all__ = ["Trainer", "TrainResult", "TrainingDiverged", "TrainingError", "TrainingRefused",
           "run_directory"]

class TrainingError(RuntimeError):
    """A run that cannot start or continue; the message says why and what to do."""


class TrainingDiverged(TrainingError):
    """The loss became NaN or infinite; the last good checkpoint is left as it was."""


class TrainingRefused(TrainingError):
    """Rank 0's refusal of the run directory (in use, holds a run, nothing to resume),
    raised on every rank at once: under MPI no rank waits for another, so the job can end
    without an abort, each rank on its own."""


@dataclass
class TrainResult:
    run_dir: Path
    iterations: int  # optimizer steps completed
    status: str  # "finished" or "interrupted"
    best_val_loss: float
    last_checkpoint: Optional[Path]
    best_checkpoint: Optional[Path]
    train_loss: Optional[float]  # of the last evaluation
    val_loss: Optional[float]
    seconds: float


# NumPy's warnings on the overflow, 0/0 and inf - inf of a diverging step are off in the
# step and in evaluation: the loop checks every loss and gradient norm itself and stops with
# one line naming the iteration (``_read_steps``, ``_diverged``), where NumPy would echo
# source lines of the ops first. Scoped (np.errstate), not a warnings filter: elsewhere
# NumPy still warns.
QUIET_FLOATS = {"over": "ignore", "invalid": "ignore", "divide": "ignore"}


def print_now(message: str) -> None:
    """print, flushed: log lines reach a pipe (``| tee log``) as they happen."""
    print(message, flush=True)


def run_directory(cfg: Config) -> Path:
    """``checkpoint.dir/run_name``, with ``~`` expanded (a shell leaves ``--set
    checkpoint.dir=~/runs`` as it is)."""
    return Path(cfg.checkpoint.dir).expanduser() / str(cfg.checkpoint.run_name or "run")


def _silent(message: str) -> None:
    """The log of a rank other than 0: one rank speaks for the job."""


def _write_text_atomic(path: Path, text: str) -> None:
    with atomic_write(path, "w") as f:
        f.write(text)


class Trainer:
    """Trains the GPT that ``cfg`` describes.

    >>> result = Trainer(load_config("configs/shakespeare_char.yaml")).fit()
    >>> result.best_checkpoint       # checkpoints/shakespeare_char/best.ckpt
    """

    def __init__(self, cfg: Config, *, log: Callable[[str], None] = print_now,
                 progress: Optional[bool] = None, overwrite: bool = False,
                 check_memory: bool = True) -> None:
        self.cfg = cfg
        # refuse a model and micro-batch estimated past the memory available, before they
        # are allocated (memory.py); --ignore-memory-check turns it off
        self.memory_check = check_memory
        self.log = log
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.overwrite = overwrite
        self.run_dir = run_directory(cfg)
        self.last_path = self.run_dir / "last.ckpt"
        self.best_path = self.run_dir / "best.ckpt"
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._run_lock: Optional[RunLock] = None  # rank 0's, while fit runs
        # rank 0's mirror of metrics.jsonl in TensorBoard, with logging.tensorboard (fit)
        self.tensorboard: Optional[TensorBoardLog] = None

    # --- set-up -------------------------------------------------------------------------
    def _check_memory(self, vocab_size: Optional[int]) -> None:
        """TrainingError, one line, when the model, its optimizer and one micro-batch (or
        evaluation batch) are estimated past the memory available (``memory.py``): Python
        arithmetic, before anything is allocated. ``vocab_size`` None: before the data is
        read, the vocabulary at its least (model.vocab_size, else model.pad_vocab_to)."""
        if not self.memory_check:
            return
        cfg, m, t = self.cfg, self.cfg.model, self.cfg.train
        vocab = vocab_size or m.vocab_size or m.pad_vocab_to
        work = Workload("train", m.n_layer, m.n_head, m.n_embd, m.block_size, vocab,
                        bias=m.bias, dropout=m.dropout, batch=t.batch_size,
                        eval_batch=cfg.eval.batch_size, dtype=cfg.system.dtype,
                        device=self.device, data_parallel=self.group.world_size > 1)
        names = {"n_layer": "model.n_layer", "n_embd": "model.n_embd",
                 "block_size": "model.block_size", "batch": "train.batch_size",
                 "eval_batch": "eval.batch_size", "n_head": "model.n_head",
                 "vocab_size": "model.vocab_size" if m.vocab_size is not None or
                 cfg.data.tokenizer != "bpe" else "data.vocab_size"}
        try:
            check_memory(estimate_memory(work),
                         memory_limit(self.backend, cfg.system.memory_limit_gb), names)
        except (MemoryLimitError, ValueError) as exc:  # ValueError: a malformed variable
            raise TrainingError(str(exc)) from None

    def _build(self) -> None:
        cfg = self.cfg
        try:
            self.group = distributed.world(cfg.system.dist_timeout_s)
        except RuntimeError as exc:  # started by mpiexec without mpi4py
            raise TrainingError(str(exc)) from None
        group = self.group
        if not group.is_main:
            self.log, self.progress = _silent, False
        self._claim_run_dir()  # before minutes of data preparation
        threads = cfg.system.threads
        set_num_threads(threads if threads is not None else group.cpu_threads())
        self.dtype = weight_dtype(cfg.system.dtype)
        mixed = cfg.system.dtype == "bf16"
        self.precision = autocast("bf16", enabled=mixed)  # the forward passes run in it
        try:
            self.backend = get_backend(group.rank_device(cfg.system.device))
        except (RuntimeError, ValueError) as exc:  # no CuPy, no GPU, too few GPUs for the ranks
            raise TrainingError(f"system.device: {exc}") from None
        self.device = str(self.backend.device)
        self._check_memory(None)  # before minutes of data preparation, the vocabulary unknown

        # rank 0 measures the peak and tokenizes the corpus into the cache first; the other
        # ranks then find both there instead of writing the same files at the same time
        with group.main_first("rank 0's data preparation"):
            # MFU against the peak of the dtype the products run in
            self.peak_flops = matmul_peak_flops(self.device,
                                                dtypes.bfloat16 if mixed else self.dtype)
            try:
                self.data = prepare(cfg.data, log=self.log)
            except (ValueError, RuntimeError, OSError) as exc:  # no corpus, too small, offline
                raise TrainingError(f"data: {exc}") from None
        manual_seed(cfg.system.seed)
        self.tokenizer = self.data.tokenizer
        self.tokenizer_json = self.tokenizer.to_json()  # into every checkpoint
        m = cfg.model
        try:
            self.model_config = gpt_config(m, self.tokenizer.vocab_size)
        except ConfigError as exc:  # model.vocab_size below the tokenizer's
            raise TrainingError(str(exc)) from None
        self._check_memory(self.model_config.vocab_size)
        self.model = build_model(self.model_config, self.dtype, self.device)
        if group.rank > 0:  # its own dropout masks from here on (the weights are rank 0's)
            manual_seed(rank_seed(cfg.system.seed, group.rank))
        t = cfg.train
        self.optimizer = self.model.configure_optimizers(
            t.weight_decay, t.lr, (t.beta1, t.beta2), eps=t.eps)

        seed, T = cfg.system.seed, m.block_size
        eval_batch = cfg.eval.batch_size or t.batch_size
        train_tokens, val_tokens = self.data.train_tokens(), self.data.val_tokens()
        for split, tokens in (("train", train_tokens), ("val", val_tokens)):
            if len(tokens) < T + 1:
                raise TrainingError(
                    f"data: the corpus is too short for one window: "
                    f"{describe_source(cfg.data)}: the {split} split has {len(tokens)} "
                    f"tokens, fewer than model.block_size + 1 = {T + 1}: use a larger corpus "
                    f"or a smaller model.block_size")
        self.sampler = BatchSampler(train_tokens, T, t.batch_size, rank_seed(seed, group.rank),
                                    self.device)
        # every evaluation scores the same batches (a fresh sampler of a fixed seed), so
        # successive evaluations differ only by the model, and never move the training stream
        self.eval_samplers = {
            "train": lambda: BatchSampler(train_tokens, T, eval_batch, seed + 1, self.device),
            "val": lambda: BatchSampler(val_tokens, T, eval_batch, seed + 2, self.device),
        }
        self.tokens_per_iter = t.batch_size * t.grad_accum_steps * T * group.world_size

    def lr_at(self, it: int) -> float:
        t = self.cfg.train
        if not t.decay_lr:
            return constant_lr(it, t.lr)
        decay = t.max_iters if t.lr_decay_iters is None else t.lr_decay_iters
        return cosine_lr(it, t.lr, t.min_lr, t.warmup_iters, decay)

    # --- checkpoints --------------------------------------------------------------------
    def _meta(self) -> Optional[Dict[str, Any]]:
        """A checkpoint's metadata on rank 0, None on the others. Every rank's random streams
        are gathered into it, so every rank must call it at the same point of the run."""
        ranks = self.group.gather_object({"rng": backend_module.get_rng_state(),
                                          "sampler": self.sampler.state_dict()})
        if ranks is None:
            return None
        return {
            "iter_num": self.iter_num,
            "evaluated_at": self.evaluated_at,
            "best_val_loss": self.best_val_loss,
            "model_config": dataclasses.asdict(self.model_config),
            "dtype": self.cfg.system.dtype,
            "config": self.cfg.to_dict(),
            "tokenizer": self.tokenizer_json,
            "rng": ranks[0]["rng"],
            "sampler": ranks[0]["sampler"],
            "world_size": self.group.world_size,
            "other_ranks": ranks[1:],  # ranks 1.. of a data-parallel run: their rng and sampler
            "data": {"directory": str(self.data.directory),
                     "fingerprint": self.data.meta.get("source_fingerprint")},
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def _save(self, path: Path, meta: Optional[Dict[str, Any]]) -> None:
        """Write a checkpoint with ``meta`` from ``_meta()``; rank 0 alone writes."""
        if self.group.is_main:
            save_checkpoint(path, self.model.state_dict(), self.optimizer.state_dict(), meta)

    def _claim_run_dir(self) -> None:
        """Rank 0 locks and checks the run directory; the others read it only after that.
        A refusal goes to every rank, so all end together, none left waiting to be
        aborted (under MPI, rank 0 alone holds the lock)."""
        refusal = None
        if self.group.is_main:
            try:
                self._prepare_run_dir()
            except TrainingError as exc:
                refusal = str(exc)
        refusal = self.group.broadcast_object(refusal, "rank 0's check of the run directory")
        if refusal is not None:
            raise TrainingRefused(refusal)

    def _prepare_run_dir(self) -> None:
        """Lock the run directory, then check it (the lock first, so that two trainers
        can't both pass the checks) and clear what killed saves left. The lock stays held
        until fit returns; an old run's files go only once the new run is built (fit)."""
        resume = self.cfg.train.resume
        if resume and self.overwrite:
            raise TrainingError("train.resume and --overwrite contradict each other: resume the "
                                "run or start it over, not both")
        if resume and not self.run_dir.is_dir():  # nothing to resume: nothing to make
            raise TrainingError(f"train.resume: there is no checkpoint to resume at "
                                f"{self.last_path} (start the run without --resume)")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in the way, no permission, a read-only disk
            raise TrainingError(f"checkpoint.dir: cannot make the run directory "
                                f"{self.run_dir}: {exc.strerror or exc}") from None
        self._lock_run_dir()
        if resume:
            if not self.last_path.exists():
                raise TrainingError(f"train.resume: there is no checkpoint to resume at "
                                    f"{self.last_path} (start the run without --resume)")
        elif self.last_path.exists() and not self.overwrite:
            raise TrainingError(
                f"{self.run_dir} already holds a run ({self.last_path.name}); continue it with "
                f"--resume, start over with --overwrite, or name a new run with "
                f"--set checkpoint.run_name=NAME")
        if self._run_lock.held:  # else another trainer may be saving right now
            files, size = remove_leftover_temporaries(self.run_dir)
            if files:
                self.log(f"removed {files} temporary file(s) of killed saves from "
                         f"{self.run_dir} ({size:,} bytes)")

    def _lock_run_dir(self) -> None:
        try:
            self._run_lock = lock_run_directory(self.run_dir)
        except RunDirectoryInUse as exc:
            raise TrainingError(f"{exc}; wait for it to end or stop it, or name a new run "
                                f"with --set checkpoint.run_name=NAME") from None
        except OSError as exc:  # no permission, a read-only disk
            raise TrainingError(f"checkpoint.dir: cannot lock the run directory "
                                f"{self.run_dir}: {exc.strerror or exc}") from None
        if self._run_lock.warning:
            self.log(f"warning: {self._run_lock.warning}; nothing stops another trainer "
                     f"from writing {self.run_dir} at the same time")

    def _unlock_run_dir(self) -> None:
        if self._run_lock is not None:
            self._run_lock.release()
            self._run_lock = None

    def _check_resumable(self, meta: Dict[str, Any], table: Dict[str, Any],
                         file_size: int) -> None:
        """load_checkpoint's check of last.ckpt, before any of its arrays is read: its
        metadata's model is the config's (the model already built, and memory-checked, in
        _build), and its arrays are that model's (names, shapes, dtypes, bytes)."""
        saved = meta.get("model_config")
        saved = saved if isinstance(saved, dict) else {}
        wanted = dataclasses.asdict(self.model_config)
        # dropout shapes no weight: a resumed run may change it, as nanoGPT's may
        differ = [key for key in wanted if key != "dropout" and saved.get(key) != wanted[key]]
        if differ:
            held = ", ".join(f"{key} {saved.get(key)!r}" for key in differ)
            asked = ", ".join(f"{key} {wanted[key]!r}" for key in differ)
            raise TrainingError(f"train.resume: {self.last_path} holds a model with {held}; "
                                f"the config asks for {asked}")
        try:
            check_gpt_arrays(self.model_config, DTYPES.get(meta.get("dtype")), table,
                             file_size)
        except ValueError as exc:
            raise TrainingError(f"train.resume: {self.last_path}: the weights do not fit "
                                f"the model it describes ({exc})") from None

    def _resume(self) -> None:
        try:
            ckpt = load_checkpoint(self.last_path, check=self._check_resumable)
        except CheckpointError as exc:
            raise TrainingError(f"train.resume: {exc}") from None
        meta = ckpt.meta
        saved_ranks = int(meta.get("world_size", 1))
        if saved_ranks != self.group.world_size:
            raise TrainingError(
                f"train.resume: {self.last_path} was saved by a run of {saved_ranks} rank(s), "
                f"and this one has {self.group.world_size}: it holds each rank's batch stream, "
                f"so resume it on {saved_ranks} (mpiexec -n {saved_ranks} ...), or start a new "
                f"run")
        ranks = [{"rng": meta["rng"], "sampler": meta["sampler"]}, *meta.get("other_ranks", [])]
        if len(ranks) != saved_ranks:
            raise TrainingError(f"train.resume: {self.last_path} says it was saved by "
                                f"{saved_ranks} ranks but holds the state of {len(ranks)}")
        if not _same_tokenizer(meta.get("tokenizer"), self.tokenizer_json):
            raise TrainingError(
                f"train.resume: {self.last_path} was trained with another tokenizer than the "
                f"data gives now ({self.tokenizer.kind}, vocab {self.tokenizer.vocab_size:,}, "
                f"from {self.data.directory}): the data or its settings changed since; resume "
                f"with the data it was trained on, or start a new run")
        self.model.load_state_dict(ckpt.model)
        # the optimizer's moments come from the checkpoint, its settings from the config
        # (load_state_dict brings back the saved betas, eps and weight decay, as PyTorch's
        # does: a resumed run's --set train.weight_decay would be ignored, and its
        # config.yaml would say otherwise)
        settings = [{key: value for key, value in group.items() if key != "params"}
                    for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(ckpt.optimizer)
        for group, setting in zip(self.optimizer.param_groups, settings):
            group.update(setting)
        self.iter_num = int(meta["iter_num"])
        self.evaluated_at = int(meta.get("evaluated_at", -1))
        self.best_val_loss = float(meta["best_val_loss"])
        if self.best_path.exists():  # a best.ckpt newer than last.ckpt (always_save: false)
            try:
                best = float(read_checkpoint_meta(self.best_path)["best_val_loss"])
            except (CheckpointError, KeyError, TypeError, ValueError):
                best = math.inf  # unreadable: the next better evaluation replaces it
            self.best_val_loss = min(self.best_val_loss, best)
        backend_module.set_rng_state(ranks[self.group.rank]["rng"])
        self.sampler.load_state_dict(ranks[self.group.rank]["sampler"])
        if self.group.is_main:
            self._drop_metrics_after(self.iter_num)
        self.log(f"resumed {self.last_path} at iteration {self.iter_num} "
                 f"(best val loss {self.best_val_loss:.4f})")

    # --- measuring ----------------------------------------------------------------------
    @no_grad()
    @np.errstate(**QUIET_FLOATS)
    def evaluate(self) -> Dict[str, float]:
        """Mean loss over ``eval.iters`` batches of the train and val splits (the same
        batches at every evaluation). With several ranks each scores its share of those
        batches (rank r every world_size-th, from the r-th) and the sums are added up, so
        the figures do not depend on the number of ranks."""
        self.model.eval()
        group, iters, backend = self.group, self.cfg.eval.iters, self.backend
        totals = []  # each split's sum of losses, on the device
        for split in ("train", "val"):
            sampler = self.eval_samplers[split]()
            total = backend.asarray(0.0, dtype=dtypes.float64)
            for i in range(iters):
                x, y = sampler.next_batch()  # drawn on every rank: the streams stay in step
                if i % group.world_size == group.rank:
                    with self.precision:
                        _, loss = self.model(x, y)
                    total = total + loss.data.astype(dtypes.float64)
            totals.append(total)
        own = backend.to_numpy(backend.xp.stack(totals)).tolist()  # one read for both
        train_total, val_total = group.allreduce_sum(own)
        self.model.train()
        return {"train": train_total / iters, "val": val_total / iters}

    def _drop_metrics_after(self, iter_num: int) -> None:
        """Forget logged steps the checkpoint does not include (a run that went on past
        its last save), so a resumed run's metrics.jsonl has each iteration once."""
        if not self.metrics_path.exists():
            return
        kept = []
        for line in self.metrics_path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if isinstance(record, dict) and record.get("iter", 0) <= iter_num \
                    and record.get("type") != "error":
                kept.append(line)
        _write_text_atomic(self.metrics_path, "".join(line + "\n" for line in kept))

    def _write_metrics(self, record: Dict[str, Any]) -> None:
        if not self.group.is_main:
            return
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:  # logging.tensorboard: the same record, as events
            self.tensorboard.write(record)

    # --- the loop -----------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train to ``train.max_iters``; returns where the checkpoints are. Ctrl-C finishes
        the step under way, saves ``last.ckpt`` and returns with status "interrupted" (a
        second Ctrl-C quits at once, leaving the checkpoints as they were); a NaN or
        infinite loss raises TrainingDiverged and writes nothing more. The run directory
        is locked from its first check to the return (TrainingRefused while another
        process holds it)."""
        try:
            return self._fit()
        finally:
            try:
                if self.tensorboard is not None:  # opened, whatever failed after it
                    self.tensorboard, writer = None, self.tensorboard
                    writer.close()
            finally:
                self._unlock_run_dir()

    def _fit(self) -> TrainResult:
        cfg, t = self.cfg, self.cfg.train
        if cfg.logging.tensorboard and not tensorboard_available():
            raise TrainingError(TENSORBOARD_HINT)  # before minutes of data preparation
        self._build()
        group = self.group  # the ranks (optimizer groups are param_groups)
        if group.is_main and not t.resume:  # a new run: no file of an old one stays
            for stale in (self.last_path, self.best_path, self.metrics_path):
                if stale.exists():
                    stale.unlink()
        self.iter_num, self.evaluated_at, self.best_val_loss = 0, -1, math.inf
        if t.resume:
            self._resume()
        # the same seed gave every rank the same weights, and a resumed run's come from one
        # file; starting from rank 0's makes sure of it
        group.broadcast_parameters(self.model.parameters())
        if group.is_main:
            _write_text_atomic(self.run_dir / "config.yaml", config_to_yaml(cfg))
            _write_text_atomic(self.run_dir / "tokenizer.json", self.tokenizer_json)
            if cfg.logging.tensorboard:
                try:
                    self.tensorboard = TensorBoardLog(self.run_dir / "tensorboard",
                                                      self.iter_num if t.resume else None)
                except RuntimeError as exc:  # installed, yet it does not import
                    raise TrainingError(str(exc)) from None
        self.log(f"model: GPT with {self.model.num_params():,} parameters (n_layer "
                 f"{cfg.model.n_layer}, n_head {cfg.model.n_head}, n_embd {cfg.model.n_embd}, "
                 f"block_size {cfg.model.block_size}, vocab {self.model_config.vocab_size}), "
                 f"{cfg.system.dtype} on {self.device}")
        ranks = f" x {group.world_size} ranks" if group.world_size > 1 else ""
        self.log(f"training: {t.max_iters} iterations of {self.tokens_per_iter:,} tokens "
                 f"(batch {t.batch_size} x {t.grad_accum_steps} accumulation x context "
                 f"{cfg.model.block_size}{ranks}); writing to {self.run_dir}")

        from tqdm import tqdm
        bar = tqdm(total=t.max_iters, initial=self.iter_num, disable=not self.progress,
                   dynamic_ncols=True, file=sys.stderr, unit="it")
        say = bar.write if self.progress else self.log
        stop = _StopOnInterrupt(quiet=not group.is_main)
        started = time.perf_counter()
        last = {"train": None, "val": None}
        status = "finished"
        self._unread = []  # the steps whose loss is still on the device (_read_steps)
        window_start, window_losses = time.perf_counter(), []
        try:
            while True:
                lr = self.lr_at(self.iter_num)
                for param_group in self.optimizer.param_groups:
                    param_group["lr"] = lr
                due = self.iter_num % cfg.eval.interval == 0 or self.iter_num == t.max_iters
                if due and self.evaluated_at != self.iter_num:
                    window_losses += self._read_steps()  # none diverged: worth evaluating
                    losses = self.evaluate()
                    for split in ("train", "val"):  # weights the last update broke
                        if not math.isfinite(losses[split]):
                            self._diverged(losses[split], what=f"{split} loss at evaluation")
                    last = losses
                    self.evaluated_at = self.iter_num
                    note = self._after_eval(losses)
                    say(f"eval at iter {self.iter_num}: train loss {losses['train']:.4f}, "
                        f"val loss {losses['val']:.4f}{note}")
                    window_start = time.perf_counter()  # evaluation is not training speed
                if self.iter_num >= t.max_iters:
                    break
                self._unread.append((self.iter_num, *self._step()))
                # whether any rank got Ctrl-C (mpiexec passes it to every rank, which may be
                # a step apart): all ranks stop after the same step. A host-side sum (MPI
                # over the CPU): it does not wait for the GPU
                interrupted = group.allreduce_sum([float(stop.requested)])[0] > 0
                self.iter_num += 1
                bar.update(1)
                if self.iter_num % t.log_interval == 0 or self.iter_num == t.max_iters:
                    # the read waits for the window's kernels, so the clock is read after it
                    window_losses += self._read_steps()
                    elapsed = time.perf_counter() - window_start
                    self._log_train(sum(window_losses) / len(window_losses), lr,
                                    len(window_losses), elapsed, bar, say)
                    window_start, window_losses = time.perf_counter(), []
                if interrupted:
                    window_losses += self._read_steps()  # no checkpoint after a NaN
                    self._save(self.last_path, self._meta())
                    # no rank leaves (and ends the job) while rank 0 is still writing
                    group.barrier("saving the checkpoint")
                    say(f"interrupted at iteration {self.iter_num}: saved {self.last_path} "
                        f"(continue with --resume)")
                    status = "interrupted"
                    break
        except Exception:
            # a check deferred on the device (a token id out of range) failed before this
            # error, and may well be its cause: it is raised first, this one as its context
            self.backend.raise_deferred_errors()
            raise
        finally:
            bar.close()
            stop.restore()
        seconds = time.perf_counter() - started
        return TrainResult(
            run_dir=self.run_dir, iterations=self.iter_num, status=status,
            best_val_loss=self.best_val_loss,
            last_checkpoint=self.last_path if self.last_path.exists() else None,
            best_checkpoint=self.best_path if self.best_path.exists() else None,
            train_loss=last["train"], val_loss=last["val"], seconds=seconds)

    @np.errstate(**QUIET_FLOATS)
    def _step(self) -> Tuple[Any, Any]:
        """One optimizer step. Returns its loss summed over its micro-batches and its
        gradient norm before clipping (None without clipping): 0-d arrays on the device,
        not read, so that the host never waits for the step's kernels (``_read_steps``
        reads many steps' at once)."""
        t = self.cfg.train
        total = None  # this rank's losses summed over the micro-batches, in float64
        for _ in range(t.grad_accum_steps):
            x, y = self.sampler.next_batch()  # (B, T) each; the next one is on its way
            with self.precision:  # bf16 products when mixed; backward needs no autocast
                _, loss = self.model(x, y)
            value = loss.data.astype(dtypes.float64)
            total = value if total is None else total + value
            (loss * (1.0 / t.grad_accum_steps)).backward()
        self.group.allreduce_gradients(self.model.parameters())  # the mean over ranks
        norm = None
        if t.grad_clip > 0:
            norm = clip_grad_norm_(self.model.parameters(), t.grad_clip).data
        self.optimizer.step()
        self.optimizer.zero_grad()
        return total, norm

    def _read_steps(self) -> List[float]:
        """Read the losses and gradient norms of the steps run since the last read, in one
        host read; stop the run (TrainingDiverged) at the first that is not finite.
        Returns each step's mean loss over its micro-batches and all ranks, in order.

        Every rank calls it at the same iterations (log points, evaluations, Ctrl-C), and
        the values are summed over the ranks first, so every rank sees the same numbers
        and a NaN on any rank stops them all, naming the same step."""
        unread, self._unread = self._unread, []
        if not unread:
            return []
        steps = len(unread)
        with_norms = unread[0][2] is not None
        values = [loss for _, loss, _ in unread]
        if with_norms:
            values += [norm.astype(dtypes.float64) for _, _, norm in unread]
        own = self.backend.to_numpy(self.backend.xp.stack(values)).tolist()  # waits
        summed = self.group.allreduce_sum(own)  # (the values themselves in one process)
        for i, (iteration, _, _) in enumerate(unread):
            if not math.isfinite(summed[i]):
                self._diverged(own[i] if not math.isfinite(own[i]) else summed[i],
                               at=iteration)
            if with_norms and not math.isfinite(summed[steps + i]):
                norm = own[steps + i]
                self._diverged(norm if not math.isfinite(norm) else summed[steps + i],
                               what="gradient norm", at=iteration)
        t = self.cfg.train
        return [loss / (t.grad_accum_steps * self.group.world_size) for loss in summed[:steps]]

    def _diverged(self, value: float, what: str = "loss", at: Optional[int] = None) -> None:
        """Stop the run: ``what`` became ``value`` at iteration ``at`` (the current one if
        None). The metrics log records it; no checkpoint is written."""
        at = self.iter_num if at is None else at
        self.optimizer.zero_grad()
        self._write_metrics({"type": "error", "iter": at, "error": f"{what} is {value}"})
        where = (f"the last good checkpoint, {self.last_path}, is intact"
                 if self.last_path.exists() else "no checkpoint had been written yet")
        read = (f" (losses are read from the device every train.log_interval iterations; "
                f"this one was read at iteration {self.iter_num})"
                if self.iter_num > at + 1 else "")
        raise TrainingDiverged(
            f"the {what} became {value} at iteration {at}: training stopped and {where}"
            f"{read}. Lower train.lr or raise train.warmup_iters, and check the data")

    def _after_eval(self, losses: Dict[str, float]) -> str:
        """Log an evaluation and write the checkpoints it calls for; a note for the log."""
        improved = losses["val"] < self.best_val_loss
        if improved:
            self.best_val_loss = losses["val"]
        self._write_metrics({"type": "eval", "iter": self.iter_num, "train_loss": losses["train"],
                             "val_loss": losses["val"], "best_val_loss": self.best_val_loss,
                             "lr": self.lr_at(self.iter_num)})
        if self.iter_num == 0 and not self.cfg.train.resume:
            return ""  # an untrained model is not worth a checkpoint
        saved = []
        meta = self._meta()
        if improved:
            self._save(self.best_path, meta)
            saved.append(self.best_path.name)
        if self.cfg.checkpoint.always_save or self.iter_num == self.cfg.train.max_iters \
                or not self.last_path.exists():
            self._save(self.last_path, meta)
            saved.append(self.last_path.name)
        return f" -> saved {', '.join(saved)}" if saved else ""

    def _log_train(self, loss: float, lr: float, iters: int, elapsed: float, bar: Any,
                   say: Callable[[str], None]) -> None:
        dt = elapsed / max(iters, 1)
        tokens_per_s = self.tokens_per_iter / dt if dt > 0 else float("nan")  # all ranks'
        t = self.cfg.train
        # one rank's sequences against one rank's peak: the mean MFU of the ranks' devices
        mfu = self.model.estimate_mfu(t.batch_size * t.grad_accum_steps, dt, self.peak_flops,
                                      seq_len=self.cfg.model.block_size)
        self._write_metrics({"type": "train", "iter": self.iter_num, "loss": loss, "lr": lr,
                             "step_ms": dt * 1e3, "tokens_per_s": tokens_per_s, "mfu": mfu})
        if self.progress:
            bar.set_postfix_str(f"loss {loss:.4f}, lr {lr:.2e}, {tokens_per_s:,.0f} tok/s, "
                                f"mfu {100 * mfu:.1f}%", refresh=False)
        else:
            say(f"iter {self.iter_num}: loss {loss:.4f}, lr {lr:.2e}, {dt * 1e3:.1f} ms/iter, "
                f"{tokens_per_s:,.0f} tok/s, mfu {100 * mfu:.1f}%")


def _same_tokenizer(saved_json: Any, current_json: str) -> bool:
    """Whether two tokenizers' JSON describe the same tokenizer (as data, not as text)."""
    try:
        return json.loads(saved_json) == json.loads(current_json)
    except (TypeError, ValueError):
        return False


class _StopOnInterrupt:
    """The first Ctrl-C (SIGINT) asks the loop to stop after the current step, so the state
    it saves is whole; a second one raises KeyboardInterrupt as usual. Installed only in
    the main thread (signal handlers can be set nowhere else). ``quiet``: say nothing (the
    ranks other than 0, which mpiexec passes the same Ctrl-C to)."""

    def __init__(self, quiet: bool = False) -> None:
        self.requested = False
        self.quiet = quiet
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            self.restore()
            raise KeyboardInterrupt
        self.requested = True
        if self.quiet:
            return
        # os.write, not print: a handler that prints while the loop is printing makes
        # Python raise "reentrant call"; a raw write to the file descriptor cannot
        with contextlib.suppress(OSError, ValueError):
            os.write(sys.stderr.fileno(),
                     b"\nCtrl-C: saving after this step (press again to quit without saving)\n")

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None
