"""A run's directory, ``checkpoint.dir/run_name/``: made, checked and locked for one trainer,
the files it holds, and its metrics log.

It holds::

    config.yaml      the fully resolved config of the run
    tokenizer.json   the tokenizer (also inside every checkpoint)
    metrics.jsonl    one JSON object per logged step ("train") and per evaluation ("eval")
    last.ckpt        the latest state: model, optimizer, iteration, RNG and sampler states
    best.ckpt        the state with the lowest validation loss so far
    tensorboard/     with logging.tensorboard: metrics.jsonl's numbers as TensorBoard events

One trainer at a time: ``RunDirectory.claim`` locks the directory (``.lock``, see
``run_lock.py``) before it checks or writes anything there, and ``release`` unlocks it (the
kernel does when the process dies); a second trainer, ``--resume`` and ``--overwrite``
included, is refused, naming the first's PID. With the lock held, the temporary files of
saves killed outright are removed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from ..system.atomic import atomic_write, remove_leftover_temporaries
from .config import Config
from .run_lock import RunDirectoryInUse, RunLock, lock_run_directory
from .tensorboard_log import TensorBoardLog

__all__ = ["MetricsLog", "RunDirectory", "RunDirectoryRefused", "run_directory"]


class RunDirectoryRefused(RuntimeError):
    """A run directory this run may not use (in use, holding another run, nothing in it to
    resume, not makeable); the message says why and what to do."""


def run_directory(cfg: Config) -> Path:
    """``checkpoint.dir/run_name``, with ``~`` expanded (a shell leaves ``--set
    checkpoint.dir=~/runs`` as it is)."""
    return Path(cfg.checkpoint.dir).expanduser() / str(cfg.checkpoint.run_name or "run")


class RunDirectory:
    """The files of one run, and the lock that keeps other trainers out of them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last = path / "last.ckpt"
        self.best = path / "best.ckpt"
        self.metrics = path / "metrics.jsonl"
        self._lock: Optional[RunLock] = None  # while claimed
        self._made = False  # whether claim made the directory (release removes it if empty)

    def claim(self, resume: bool, overwrite: bool, log: Callable[[str], None]) -> None:
        """Lock the directory, then check it (the lock first, so that two trainers can't
        both pass the checks) and clear what killed saves left. RunDirectoryRefused when
        this run may not use it. The lock stays held until ``release``; an old run's files
        go only at ``start_afresh``, once the new run is built."""
        if resume and overwrite:
            raise RunDirectoryRefused("train.resume and --overwrite contradict each other: "
                                      "resume the run or start it over, not both")
        if resume and not self.path.is_dir():  # nothing to resume: nothing to make
            raise RunDirectoryRefused(f"train.resume: there is no checkpoint to resume at "
                                      f"{self.last} (start the run without --resume)")
        try:
            self._made = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in the way, no permission, a read-only disk
            raise RunDirectoryRefused(f"checkpoint.dir: cannot make the run directory "
                                      f"{self.path}: {exc.strerror or exc}") from None
        self._take_lock(log)
        if resume:
            if not self.last.exists():
                raise RunDirectoryRefused(f"train.resume: there is no checkpoint to resume at "
                                          f"{self.last} (start the run without --resume)")
        elif self.last.exists() and not overwrite:
            raise RunDirectoryRefused(
                f"{self.path} already holds a run ({self.last.name}); continue it with "
                f"--resume, start over with --overwrite, or name a new run with "
                f"--set checkpoint.run_name=NAME")
        if self._lock.held:  # else another trainer may be saving right now
            files, size = remove_leftover_temporaries(self.path)
            if files:
                log(f"removed {files} temporary file(s) of killed saves from {self.path} "
                    f"({size:,} bytes)")

    def claim_on_rank_0(self, group: Any, resume: bool, overwrite: bool,
                        log: Callable[[str], None]) -> Optional[str]:
        """Rank 0 of ``group`` claims the directory (``claim``); the others read it only
        after that. Returns the refusal on every rank, so all end together, none left
        waiting to be aborted (under MPI, rank 0 alone holds the lock); None when claimed."""
        refusal = None
        if group.is_main:
            try:
                self.claim(resume, overwrite, log)
            except RunDirectoryRefused as exc:
                refusal = str(exc)
        return group.broadcast_object(refusal, "rank 0's check of the run directory")

    def _take_lock(self, log: Callable[[str], None]) -> None:
        try:
            self._lock = lock_run_directory(self.path)
        except RunDirectoryInUse as exc:
            raise RunDirectoryRefused(f"{exc}; wait for it to end or stop it, or name a new "
                                      f"run with --set checkpoint.run_name=NAME") from None
        except OSError as exc:  # no permission, a read-only disk
            raise RunDirectoryRefused(f"checkpoint.dir: cannot lock the run directory "
                                      f"{self.path}: {exc.strerror or exc}") from None
        if self._lock.warning:
            log(f"warning: {self._lock.warning}; nothing stops another trainer from "
                f"writing {self.path} at the same time")

    def release(self) -> None:
        """Unlock the directory (nothing when it is not locked). A directory this claim
        made and nothing was written into (a run refused before it began: the memory check,
        a bad corpus) goes too, so a refused first run leaves no empty run behind."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._made:
            self._made = False
            try:
                self.path.rmdir()  # only when empty: a run that wrote anything keeps it
            except OSError:
                pass

    def start_afresh(self) -> None:
        """Remove an old run's checkpoints and metrics: no file of it stays in a new run."""
        for stale in (self.last, self.best, self.metrics):
            if stale.exists():
                stale.unlink()

    def write_text(self, name: str, text: str) -> None:
        """Write the file ``name`` in the directory atomically."""
        _write_text_atomic(self.path / name, text)


class MetricsLog:
    """metrics.jsonl, one JSON object per line, and its TensorBoard mirror when opened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tensorboard: Optional[TensorBoardLog] = None  # with logging.tensorboard

    def open_tensorboard(self, directory: Path, resumed_at: Optional[int]) -> None:
        """Mirror the records as TensorBoard events in ``directory`` from here on;
        RuntimeError when tensorboardX is installed yet does not import."""
        self.tensorboard = TensorBoardLog(directory, resumed_at)

    def write(self, record: Dict[str, Any]) -> None:
        """Append ``record`` as a line (and as events, with TensorBoard open)."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def drop_after(self, iter_num: int) -> None:
        """Forget logged steps a resumed checkpoint does not include (a run that went on
        past its last save) and errors, so a resumed run's log has each iteration once."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if isinstance(record, dict) and record.get("iter", 0) <= iter_num \
                    and record.get("type") != "error":
                kept.append(line)
        _write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def close(self) -> None:
        """Close the TensorBoard mirror, if open (the lines are written as they come)."""
        if self.tensorboard is not None:
            self.tensorboard, writer = None, self.tensorboard
            writer.close()


def _write_text_atomic(path: Path, text: str) -> None:
    with atomic_write(path, "w") as f:
        f.write(text)
