"""The metrics log mirrored as TensorBoard event files (``logging.tensorboard: true``).

Each number of a train, eval or hellaswag record of ``metrics.jsonl`` becomes the scalar
``TYPE/KEY`` at step ``iter``: ``train/loss``, ``train/lr``, ``train/step_ms``,
``train/tokens_per_s``, ``train/mfu``, ``eval/train_loss``, ``eval/val_loss``,
``eval/best_val_loss``, ``eval/lr``, ``hellaswag/acc``, ``hellaswag/acc_norm``,
``hellaswag/examples``, ``hellaswag/cropped``, ``hellaswag/seconds``. The event files go to ``run_dir/tensorboard/``, so ``tensorboard --logdir
checkpoints`` shows every run under its name::

    minitorch-gpu train configs/shakespeare_char.yaml --set logging.tensorboard=true
    tensorboard --logdir checkpoints

Written with tensorboardX (the tensorboard extra: ``pip install -e '.[tensorboard]'``), a
standalone writer that needs neither TensorFlow nor PyTorch. A resumed run starts a new
event file that tells TensorBoard to drop the steps after the checkpoint it resumed from,
as the trainer drops them from metrics.jsonl; a run started afresh removes the event
files of the run it replaces.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Dict, Optional

__all__ = ["TensorBoardLog", "TENSORBOARD_HINT", "tensorboard_available"]

TENSORBOARD_HINT = ("logging.tensorboard is true, and tensorboardX, which writes the event "
                    "files, is not installed: pip install -e '.[tensorboard]' (or pip install "
                    "tensorboardX)")
EVENT_FILES = "events.out.tfevents.*"  # the names TensorBoard's writers give their files
SCALAR_RECORDS = ("train", "eval", "hellaswag")  # the kinds of record drawn as scalars


def tensorboard_available() -> bool:
    """Whether tensorboardX is installed (without importing it)."""
    return importlib.util.find_spec("tensorboardX") is not None


def _summary_writer_class() -> Any:
    """tensorboardX's SummaryWriter, imported as where PyTorch is not installed: its
    writer module imports torch whenever it can, to accept torch tensors (here 1.7 s and
    190 MB for a trainer that hands it floats), and treats an ImportError as no torch. So
    ``import torch`` is made to fail while it loads, unless torch is already loaded."""
    keep_out = "torch" not in sys.modules
    if keep_out:
        sys.modules["torch"] = None  # type: ignore[assignment]  # import torch: ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        if keep_out and "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]
    return SummaryWriter


class TensorBoardLog:
    """Writes metrics records as TensorBoard scalars into ``directory``.

    ``resumed_at``: the iteration a resumed run continues from (the steps after it that an
    earlier writer logged are dropped); None for a fresh run, whose directory is cleared of
    earlier event files first. RuntimeError(TENSORBOARD_HINT) without tensorboardX."""

    def __init__(self, directory: Path, resumed_at: Optional[int] = None) -> None:
        try:
            writer_class = _summary_writer_class()
        except ImportError:
            raise RuntimeError(TENSORBOARD_HINT) from None
        self.directory = Path(directory)
        if resumed_at is None:
            for stale in self.directory.glob(EVENT_FILES):
                stale.unlink()
        # purge_step: TensorBoard discards the events of earlier files from this step on;
        # the suffix: file names hold the time in whole seconds, and a resume within the
        # second would write over the file before it
        self.writer = writer_class(
            logdir=str(self.directory), flush_secs=10, filename_suffix=f".{os.getpid()}",
            purge_step=None if resumed_at is None else resumed_at + 1)

    def write(self, record: Dict[str, Any]) -> None:
        """A train, eval or hellaswag record's numbers as scalars at its iteration; other
        records (error) are not scalars and are skipped."""
        kind = record.get("type")
        if kind not in SCALAR_RECORDS:
            return
        step = int(record["iter"])
        for key, value in record.items():
            if key not in ("type", "iter") and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                self.writer.add_scalar(f"{kind}/{key}", float(value), step)

    def close(self) -> None:
        """Write what is queued and close the file."""
        self.writer.close()
