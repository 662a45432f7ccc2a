"""The training loop: a Config in, checkpoints and a metrics log out.

One optimizer step is nanoGPT's: ``grad_accum_steps`` micro-batches, each forward + loss +
backward with the loss scaled by 1 / grad_accum_steps, then the global gradient norm
clipped, an AdamW step at the learning rate of the warm-up + cosine schedule, and the
gradients cleared. Every ``eval.interval`` iterations (and at the last) the mean loss of
``eval.iters`` batches of each split is measured and checkpoints are written; every
``eval.hellaswag_interval``, HellaSwag's accuracy (``periodic_hellaswag.py``).

What the loop runs on is built first (``setup.py``: the ranks, the device, the
samplers). The run directory (``run_directory.py``) is locked while ``fit`` runs. Checkpoint writes are
atomic (``checkpoint/``); a resumed run restores every random stream (``run_state.py``),
so with the same seed it reproduces the loss curve of an uninterrupted run.

A step reads nothing back from the device: reading a value from a GPU waits for every
kernel queued before it, and the GPU then idles while Python queues the next step. Each
step's loss and gradient norm stay on the device and are read together (one host read) at
the next log point (every ``train.log_interval`` iterations), evaluation, checkpoint or
the end, where a NaN or infinite one stops the run, naming the step it came from. So a
diverged run runs on until then, and never saves a checkpoint after the bad step. Under
fp16 (``precision.py``) a step reads one flag, whether its gradients are finite (a step
whose gradients are not is skipped by the loss scaler and lowers the scale: it does not
stop the run), and each log point reads the loss scale.

Under ``mpiexec -n N`` (see ``distributed/``) every rank runs this loop on its own batches
(its own sampler seed) and the gradients are averaged across ranks once per optimizer step,
after the last micro-batch and before clipping, so the weights stay identical everywhere.
Rank 0 alone logs, writes the run directory and saves checkpoints; evaluation is shared out
and summed; a checkpoint holds every rank's random streams, so it resumes on N ranks only.
A single process runs the same code with the collectives doing nothing.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import backend as backend_module
from ..autograd import no_grad
from ..backend import dtypes, manual_seed
from ..checkpoint import CheckpointError, save_checkpoint
from ..data import prepare
from ..distributed import rank_seed
from ..nn.build import build_model, weight_dtype
from ..nn.memory import MemoryLimitError
from ..optim import clip_grad_norm_, constant_lr, cosine_lr
from ..system.atomic import atomic_copy
from ..system.machine import matmul_peak_flops, set_num_threads
from .config import Config, ConfigError, config_to_yaml
from .interrupt import StopOnInterrupt
from .model_from_config import check_training_memory, gpt_config
from .periodic_hellaswag import PeriodicHellaSwag
from .run_directory import MetricsLog, RunDirectory, run_directory
from .run_state import (ResumeRefused, TrainingDiverged, TrainingError, TrainingRefused,
                        TrainResult, checkpoint_meta, load_optimizer_moments, load_resumable,
                        resumed_progress)
from .precision import MixedPrecision
from .setup import batch_samplers, join_world, open_backend, pretrained_start
from .tensorboard_log import TENSORBOARD_HINT, tensorboard_available

__all__ = ["Trainer", "TrainingDiverged", "TrainingError", "TrainingRefused"]


# NumPy's warnings on the overflow, 0/0 and inf - inf of a diverging step are off in the
# step and in evaluation: the loop checks every loss and gradient norm itself and stops with
# one line naming the iteration (``_read_steps``, ``_diverged``), where NumPy would echo
# source lines of the ops first. Scoped (np.errstate), not a warnings filter: elsewhere
# NumPy still warns.
QUIET_FLOATS = {"over": "ignore", "invalid": "ignore", "divide": "ignore"}


def print_now(message: str) -> None:
    """print, flushed: log lines reach a pipe (``| tee log``) as they happen."""
    print(message, flush=True)


def _silent(message: str) -> None:
    """The log of a rank other than 0: one rank speaks for the job."""


class Trainer:
    """Trains the model (a GPT or a Llama) that ``cfg`` describes.

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
        self.directory = RunDirectory(run_directory(cfg))  # rank 0 locks it while fit runs
        self.metrics = MetricsLog(self.directory.metrics)  # rank 0 writes it

    # --- set-up -------------------------------------------------------------------------
    def _check_memory(self, vocab_size: Optional[int]) -> None:
        """TrainingError, one line, when training is estimated past the memory available
        (``check_training_memory``); nothing with --ignore-memory-check."""
        if self.memory_check:
            try:
                check_training_memory(self.cfg, vocab_size, self.backend,
                                      data_parallel=self.group.world_size > 1)
            except MemoryLimitError as exc:  # a malformed limit too
                raise TrainingError(str(exc)) from None

    def _build(self) -> None:
        cfg = self.cfg
        self.group = group = join_world(cfg)
        if not group.is_main:
            self.log, self.progress = _silent, False
        self._claim_run_dir()  # before minutes of data preparation
        threads = cfg.system.threads
        set_num_threads(threads if threads is not None else group.cpu_threads())
        self.dtype = weight_dtype(cfg.system.dtype)
        self.mixed = MixedPrecision(cfg.system.dtype)
        self.precision = self.mixed.autocast  # the forward passes run in it
        self.scaler = self.mixed.scaler  # fp16's loss scaling; a pass-through otherwise
        self.backend = open_backend(cfg, group)
        self.mixed.check_device(self.backend)  # bf16 on a GPU without it: use fp16
        self.device = str(self.backend.device)
        self.init = pretrained_start(cfg, self.log)  # model.init_from fills the config in
        self._check_memory(None)  # before minutes of data preparation, the vocabulary unknown

        # rank 0 measures the peak and tokenizes the corpus into the cache first; the other
        # ranks then find both there instead of writing the same files at the same time
        with group.main_first("rank 0's data preparation"):
            # MFU against the peak of the dtype the products run in
            self.peak_flops = matmul_peak_flops(self.device, self.mixed.dtype or self.dtype)
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
        if self.init is not None and not cfg.train.resume:  # last.ckpt holds them then
            try:
                self.init.load_weights(self.model)
            except ValueError as exc:
                raise TrainingError(str(exc)) from None
        if group.rank > 0:  # its own dropout masks from here on (the weights are rank 0's)
            manual_seed(rank_seed(cfg.system.seed, group.rank))
        t = cfg.train
        self.optimizer = self.model.configure_optimizers(
            t.weight_decay, t.lr, (t.beta1, t.beta2), eps=t.eps)

        self.sampler, self.eval_samplers = batch_samplers(cfg, self.data, group.rank,
                                                          self.device)
        self.tokens_per_iter = t.batch_size * t.grad_accum_steps * m.block_size * group.world_size

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
        return checkpoint_meta(
            iter_num=self.iter_num, evaluated_at=self.evaluated_at,
            best_val_loss=self.best_val_loss, model_config=self.model_config, cfg=self.cfg,
            tokenizer_json=self.tokenizer_json, ranks=ranks,
            data_directory=self.data.directory,
            data_fingerprint=self.data.meta.get("source_fingerprint"),
            grad_scaler=self.scaler.state_dict())

    def _save(self, path: Path, meta: Optional[Dict[str, Any]]) -> None:
        """Write a checkpoint with ``meta`` from ``_meta()``; rank 0 alone writes."""
        if self.group.is_main:
            save_checkpoint(path, self.model.state_dict(), self.optimizer.state_dict(), meta)

    def _claim_run_dir(self) -> None:
        """Rank 0 claims the run directory; a refusal is raised on every rank."""
        refusal = self.directory.claim_on_rank_0(self.group, self.cfg.train.resume,
                                                 self.overwrite, self.log)
        if refusal is not None:
            raise TrainingRefused(refusal)

    def _resume(self) -> None:
        try:
            ckpt, ranks = load_resumable(self.directory.last, self.model_config,
                                         self.group.world_size, self.tokenizer,
                                         self.data.directory)
        except CheckpointError as exc:
            raise TrainingError(f"train.resume: {exc}") from None
        except ResumeRefused as exc:
            raise TrainingError(str(exc)) from None
        self.model.load_state_dict(ckpt.model)
        load_optimizer_moments(self.optimizer, ckpt.optimizer)
        if self.scaler.is_enabled() and ckpt.meta.get("grad_scaler"):  # else a fresh scale
            self.scaler.load_state_dict(ckpt.meta["grad_scaler"])
        self.iter_num, self.evaluated_at, self.best_val_loss = resumed_progress(
            ckpt.meta, self.directory.best)
        backend_module.set_rng_state(ranks[self.group.rank]["rng"])
        self.sampler.load_state_dict(ranks[self.group.rank]["sampler"])
        if self.group.is_main:
            self.metrics.drop_after(self.iter_num)
        self.log(f"resumed {self.directory.last} at iteration {self.iter_num} "
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

    def _write_metrics(self, record: Dict[str, Any]) -> None:
        if self.group.is_main:
            self.metrics.write(record)

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
                self.metrics.close()  # its TensorBoard mirror, whatever failed after it opened
            finally:
                self.directory.release()

    def _fit(self) -> TrainResult:
        cfg, t = self.cfg, self.cfg.train
        if cfg.logging.tensorboard and not tensorboard_available():
            raise TrainingError(TENSORBOARD_HINT)  # before minutes of data preparation
        self._build()
        group = self.group  # the ranks (optimizer groups are param_groups)
        if group.is_main and not t.resume:  # a new run: no file of an old one stays
            self.directory.start_afresh()
        self.iter_num, self.evaluated_at, self.best_val_loss = 0, -1, math.inf
        if t.resume:
            self._resume()
        # the same seed gave every rank the same weights, and a resumed run's come from one
        # file; starting from rank 0's makes sure of it
        group.broadcast_parameters(self.model.parameters())
        self.hellaswag = PeriodicHellaSwag(cfg, group, self.tokenizer, self.iter_num, self.log)
        if group.is_main:
            self.directory.write_text("config.yaml", config_to_yaml(cfg))
            self.directory.write_text("tokenizer.json", self.tokenizer_json)
            if cfg.logging.tensorboard:
                try:
                    self.metrics.open_tensorboard(self.directory.path / "tensorboard",
                                                  self.iter_num if t.resume else None)
                except RuntimeError as exc:  # installed, yet it does not import
                    raise TrainingError(str(exc)) from None
        mc = self.model_config
        llama = (f"n_kv_head {mc.n_kv_head}, ffn_hidden {mc.ffn_hidden}, "
                 if mc.arch == "llama" else "")
        self.log(f"model: {type(self.model).__name__} with {self.model.num_parameters():,} "
                 f"parameters, {self.model.num_params():,} without lookup tables (n_layer "
                 f"{mc.n_layer}, n_head {mc.n_head}, {llama}n_embd {mc.n_embd}, block_size "
                 f"{mc.block_size}, vocab {mc.vocab_size}), {cfg.system.dtype} on {self.device}")
        ranks = f" x {group.world_size} ranks" if group.world_size > 1 else ""
        self.log(f"training: {t.max_iters} iterations of {self.tokens_per_iter:,} tokens "
                 f"(batch {t.batch_size} x {t.grad_accum_steps} accumulation x context "
                 f"{cfg.model.block_size}{ranks}); writing to {self.directory.path}")

        from tqdm import tqdm
        bar = tqdm(total=t.max_iters, initial=self.iter_num, disable=not self.progress,
                   dynamic_ncols=True, file=sys.stderr, unit="it")
        say = bar.write if self.progress else self.log
        stop = StopOnInterrupt(quiet=not group.is_main)
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
                if self.hellaswag.score_if_due(self.model, self.iter_num, self._write_metrics, say):
                    window_start = time.perf_counter()  # nor is HellaSwag
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
                    self._save(self.directory.last, self._meta())
                    # no rank leaves (and ends the job) while rank 0 is still writing
                    group.barrier("saving the checkpoint")
                    say(f"interrupted at iteration {self.iter_num}: saved {self.directory.last} "
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
            run_dir=self.directory.path, iterations=self.iter_num, status=status,
            best_val_loss=self.best_val_loss,
            last_checkpoint=self.directory.last if self.directory.last.exists() else None,
            best_checkpoint=self.directory.best if self.directory.best.exists() else None,
            train_loss=last["train"], val_loss=last["val"], seconds=seconds)

    @np.errstate(**QUIET_FLOATS)
    def _step(self) -> Tuple[Any, Any, bool]:
        """One optimizer step. Returns its loss summed over its micro-batches, its
        gradient norm before clipping (None without clipping): 0-d arrays on the device,
        not read, so that the host never waits for the step's kernels (``_read_steps``
        reads many steps' at once); and whether fp16's scaler skipped the step.

        Under fp16 the scaler multiplies each micro-batch's loss by its scale, divides the
        gradients back after the all-reduce (before clipping, so the clip sees true
        norms), and skips the update when any gradient is inf or NaN, which it reads: the
        one host read of an fp16 step. The all-reduced gradients are the same on every
        rank, so every rank skips the same steps. Elsewhere the scaler does nothing."""
        t, scaler = self.cfg.train, self.scaler
        total = None  # this rank's losses summed over the micro-batches, in float64
        for _ in range(t.grad_accum_steps):
            x, y = self.sampler.next_batch()  # (B, T) each; the next one is on its way
            with self.precision:  # bf16/fp16 products when mixed; backward needs no autocast
                _, loss = self.model(x, y)
            value = loss.data.astype(dtypes.float64)
            total = value if total is None else total + value
            scaler.scale(loss * (1.0 / t.grad_accum_steps)).backward()
        self.group.allreduce_gradients(self.model.parameters())  # the mean over ranks
        scaler.unscale_(self.optimizer)
        norm = None
        if t.grad_clip > 0:
            norm = clip_grad_norm_(self.model.parameters(), t.grad_clip).data
        skipped_before = scaler.skipped_steps
        scaler.step(self.optimizer)
        scaler.update()
        self.optimizer.zero_grad()
        return total, norm, scaler.skipped_steps > skipped_before

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
        values = [loss for _, loss, _, _ in unread]
        if with_norms:
            values += [norm.astype(dtypes.float64) for _, _, norm, _ in unread]
        own = self.backend.to_numpy(self.backend.xp.stack(values)).tolist()  # waits
        summed = self.group.allreduce_sum(own)  # (the values themselves in one process)
        for i, (iteration, _, _, skipped) in enumerate(unread):
            if not math.isfinite(summed[i]):
                self._diverged(own[i] if not math.isfinite(own[i]) else summed[i],
                               at=iteration)
            # a step fp16's scaler skipped had an inf/NaN gradient: that is its job
            if with_norms and not skipped and not math.isfinite(summed[steps + i]):
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
        where = (f"the last good checkpoint, {self.directory.last}, is intact"
                 if self.directory.last.exists() else "no checkpoint had been written yet")
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
            self._save(self.directory.best, meta)
            saved.append(self.directory.best.name)
        if self.cfg.checkpoint.always_save or self.iter_num == self.cfg.train.max_iters \
                or not self.directory.last.exists():
            if improved and self.group.is_main:  # the same bytes: copied, not encoded again
                atomic_copy(self.directory.best, self.directory.last)
            else:
                self._save(self.directory.last, meta)
            saved.append(self.directory.last.name)
        return f" -> saved {', '.join(saved)}" if saved else ""

    def _log_train(self, loss: float, lr: float, iters: int, elapsed: float, bar: Any,
                   say: Callable[[str], None]) -> None:
        dt = elapsed / max(iters, 1)
        tokens_per_s = self.tokens_per_iter / dt if dt > 0 else float("nan")  # all ranks'
        t = self.cfg.train
        # one rank's sequences against one rank's peak: the mean MFU of the ranks' devices
        mfu = self.model.estimate_mfu(t.batch_size * t.grad_accum_steps, dt, self.peak_flops,
                                      seq_len=self.cfg.model.block_size)
        scaling, note = self.mixed.log_fields()  # fp16: the loss scale, the skipped steps
        self._write_metrics({"type": "train", "iter": self.iter_num, "loss": loss, "lr": lr,
                             "step_ms": dt * 1e3, "tokens_per_s": tokens_per_s, "mfu": mfu,
                             **scaling})
        if self.progress:
            bar.set_postfix_str(f"loss {loss:.4f}, lr {lr:.2e}, {tokens_per_s:,.0f} tok/s, "
                                f"mfu {100 * mfu:.1f}%{note}", refresh=False)
        else:
            say(f"iter {self.iter_num}: loss {loss:.4f}, lr {lr:.2e}, {dt * 1e3:.1f} ms/iter, "
                f"{tokens_per_s:,.0f} tok/s, mfu {100 * mfu:.1f}%{note}")
