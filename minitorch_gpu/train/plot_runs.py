"""Runs as pictures: each run directory's ``metrics.jsonl`` read into series, then drawn.

    minitorch-gpu plot checkpoints/lr_1e-3 checkpoints/lr_3e-3 --out lr.png

One figure of six panels, every run overlaid in its own colour and named by its directory:
train and val loss against iterations, against tokens seen and against training time;
the learning rate, tokens/s and MFU against iterations; and a seventh, HellaSwag's
acc_norm (and acc) against iterations, when a run scored it.

What the trainer writes (``trainer.py``), one JSON object a line:

- ``train``, every ``train.log_interval`` iterations: ``loss`` (the mean of the window's
  steps), ``lr``, ``step_ms`` (the window's mean step time), ``tokens_per_s`` (all
  ranks'), ``mfu``;
- ``eval``, every ``eval.interval`` iterations: ``train_loss`` and ``val_loss`` over the
  fixed evaluation batches;
- ``hellaswag``, every ``eval.hellaswag_interval`` iterations: ``acc`` and ``acc_norm``;
- ``error``, where a run diverged: not drawn.

Two figures are not in the lines and are derived:

- Tokens seen at iteration i are i x tokens per iteration: ``train.batch_size x
  train.grad_accum_steps x model.block_size`` from the run's ``config.yaml``, times the
  number of ranks, which the config does not hold: it is read off a train line, whose
  ``tokens_per_s x step_ms / 1000`` is all ranks' tokens per iteration.
- Time is the time spent in training steps: each train line's ``step_ms`` times the
  iterations of its window, summed. The lines carry no clock, and this leaves out
  start-up, evaluations, checkpoints and the pause of a resumed run, so runs compare by
  their training speed alone. An evaluation sits at the time of its iteration.
"""
from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import yaml

__all__ = ["MetricsError", "RunMetrics", "read_run", "read_runs", "default_output",
           "plot_runs", "PLOT_HINT"]

PLOT_HINT = "matplotlib is not installed: pip install -e '.[plot]' (or pip install matplotlib)"

# the numbers each kind of line must carry; other kinds of line (error) are skipped
FIELDS = {"train": ("loss", "lr", "step_ms", "tokens_per_s", "mfu"),
          "eval": ("train_loss", "val_loss"), "hellaswag": ("acc", "acc_norm")}


class MetricsError(ValueError):
    """A run directory that cannot be drawn; the message names the file and the line."""


@dataclass
class RunMetrics:
    """One run as columns in file order: ``train["loss"][k]`` is the k-th train line's.

    ``train`` has "iter", the train FIELDS, "tokens" and "seconds"; ``eval`` has "iter",
    "train_loss", "val_loss", "tokens" and "seconds" (tokens seen and training time at
    the line's iteration, see the module's docstring)."""

    name: str
    directory: Path
    tokens_per_iter: int  # all ranks' tokens per optimizer step
    world_size: int  # ranks, read off the train lines
    train: Dict[str, np.ndarray] = field(default_factory=dict)
    eval: Dict[str, np.ndarray] = field(default_factory=dict)
    hellaswag: Dict[str, np.ndarray] = field(default_factory=dict)  # "iter", acc, acc_norm


# --- reading ------------------------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_metrics(path: Path) -> Dict[str, List[Dict[str, Any]]]:
    """The train, eval and hellaswag lines of a metrics.jsonl, each kind in file order;
    error lines and lines of kinds this reader does not know (eval_task) are left out.
    MetricsError names the line that is not a JSON object with a "type", an "iter" and its
    kind's numbers."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MetricsError(f"{path.parent} has no metrics.jsonl: not a run directory, or "
                           f"its run wrote nothing yet (train writes "
                           f"checkpoint.dir/run_name/metrics.jsonl)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MetricsError(f"cannot read {path}: {exc}") from None
    lines: Dict[str, List[Dict[str, Any]]] = {kind: [] for kind in FIELDS}
    seen = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        seen += 1
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise MetricsError(f"{where}: not JSON ({exc})") from None
        if not isinstance(record, dict) or not isinstance(record.get("type"), str):
            raise MetricsError(f"{where}: expected a JSON object with a \"type\", got "
                               f"{line[:60]!r}")
        kind = record["type"]
        iteration = record.get("iter")
        if not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0:
            raise MetricsError(f"{where}: expected an \"iter\" that is an int >= 0, got "
                               f"{iteration!r}")
        if kind not in FIELDS:
            continue
        for key in FIELDS[kind]:
            if not _is_number(record.get(key)):
                got = "none" if key not in record else repr(record[key])
                raise MetricsError(f"{where}: a {kind} line needs a number {key!r}, got {got}")
        lines[kind].append(record)
    if seen == 0:
        raise MetricsError(f"{path} is empty")
    if not lines["train"] and not lines["eval"]:
        raise MetricsError(f"{path} has no train or eval lines to draw")
    return lines


def _tokens_per_step_per_rank(run_dir: Path) -> int:
    """batch_size x grad_accum_steps x block_size, from the run's config.yaml."""
    path = run_dir / "config.yaml"
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        t, m = raw["train"], raw["model"]
        values = [t["batch_size"], t["grad_accum_steps"], m["block_size"]]
    except FileNotFoundError:
        raise MetricsError(f"{run_dir} has no config.yaml (the tokens per iteration come "
                           f"from it)") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise MetricsError(f"{path}: cannot read train.batch_size, train.grad_accum_steps "
                           f"and model.block_size from it ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else exc})") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise MetricsError(f"{path}: train.batch_size, train.grad_accum_steps and "
                           f"model.block_size must be ints >= 1, got {values}")
    return values[0] * values[1] * values[2]


def _world_size(train: List[Dict[str, Any]], per_rank: int) -> int:
    """The ranks of the run: the trainer writes tokens_per_s = (all ranks' tokens per
    iteration) / step time, so tokens_per_s x step_ms / 1000 over one rank's tokens."""
    for record in train:
        tokens = record["tokens_per_s"] * record["step_ms"] / 1e3
        if math.isfinite(tokens) and tokens > 0:
            return max(1, round(tokens / per_rank))
    return 1  # no timed step: one process


def read_run(run_dir: Union[str, Path], name: Optional[str] = None) -> RunMetrics:
    """A run directory's metrics as series, named ``name`` (default: the directory's)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MetricsError(f"{run_dir} is not a run directory" if run_dir.exists()
                           else f"{run_dir} does not exist")
    lines = read_metrics(run_dir / "metrics.jsonl")
    per_rank = _tokens_per_step_per_rank(run_dir)
    ranks = _world_size(lines["train"], per_rank)
    tokens_per_iter = per_rank * ranks

    train = {key: np.array([r[key] for r in lines["train"]], dtype=np.float64)
             for key in ("iter", *FIELDS["train"])}
    # each train line closes a window of steps since the one before (or since iteration
    # 0): its mean step time times its length is the window's time
    steps = np.diff(train["iter"], prepend=0.0).clip(min=0.0)
    train["seconds"] = np.cumsum(np.nan_to_num(train["step_ms"]) * steps / 1e3)
    evals = {key: np.array([r[key] for r in lines["eval"]], dtype=np.float64)
             for key in ("iter", *FIELDS["eval"])}
    # an evaluation at the training time of its iteration (between two log points: the
    # time in between, linearly)
    evals["seconds"] = np.interp(evals["iter"], np.r_[0.0, train["iter"]],
                                 np.r_[0.0, train["seconds"]])
    for series in (train, evals):
        series["tokens"] = series["iter"] * tokens_per_iter
    hellaswag = {key: np.array([r[key] for r in lines["hellaswag"]], dtype=np.float64)
                 for key in ("iter", *FIELDS["hellaswag"])}
    return RunMetrics(name=name or run_dir.resolve().name, directory=run_dir,
                      tokens_per_iter=tokens_per_iter, world_size=ranks, train=train,
                      eval=evals, hellaswag=hellaswag)


def read_runs(run_dirs: Sequence[Union[str, Path]]) -> List[RunMetrics]:
    """Each directory read and named after itself; where two share a name (runs of two
    checkpoint.dir's), they are named by the paths as given."""
    names = [Path(d).resolve().name for d in run_dirs]
    if len(set(names)) < len(names):
        names = [str(d) for d in run_dirs]
    return [read_run(d, n) for d, n in zip(run_dirs, names)]


def default_output(run_dirs: Sequence[Union[str, Path]]) -> Path:
    """RUN/metrics.png for one run; metrics.png in the current directory for several."""
    return Path(run_dirs[0]) / "metrics.png" if len(run_dirs) == 1 else Path("metrics.png")


# --- drawing ------------------------------------------------------------------------------
def _time_unit(runs: Sequence[RunMetrics]) -> Tuple[float, str]:
    """The unit of the time axis: seconds, minutes past 2 minutes, hours past 2 hours."""
    longest = max((float(r.train["seconds"][-1]) for r in runs if len(r.train["seconds"])),
                  default=0.0)
    if longest >= 2 * 3600:
        return 3600.0, "h"
    return (60.0, "min") if longest >= 120 else (1.0, "s")


def plot_runs(runs: Sequence[RunMetrics], out: Union[str, Path], *, dpi: int = 100) -> Path:
    """Draw ``runs`` into one picture at ``out`` (its format from its suffix; PNG without
    one). RuntimeError(PLOT_HINT) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no screen needed
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.ticker import EngFormatter
    except ImportError:
        raise RuntimeError(PLOT_HINT) from None
    scale, unit = _time_unit(runs)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    with_hellaswag = any(len(run.hellaswag.get("iter", ())) for run in runs)
    fig, axes = plt.subplots(2, 4 if with_hellaswag else 3, layout="constrained",
                             figsize=(20 if with_hellaswag else 15, 8.4))
    (by_iter, by_tokens, by_time), (lr_ax, speed_ax, mfu_ax) = axes[0][:3], axes[1][:3]
    panels = [(by_iter, "iteration", "loss", "loss by iteration"),
              (by_tokens, "tokens seen", "loss", "loss by tokens seen"),
              (by_time, f"time in training steps ({unit})", "loss", "loss by training time"),
              (lr_ax, "iteration", "learning rate", "learning rate"),
              (speed_ax, "iteration", "tokens/s", "throughput (all ranks)"),
              (mfu_ax, "iteration", "MFU (%)", "model FLOPs utilisation")]
    if with_hellaswag:
        hellaswag_ax = axes[0][3]
        fig.delaxes(axes[1][3])
        panels.append((hellaswag_ax, "iteration", "accuracy",
                       "HellaSwag acc_norm (solid), acc (dashed)"))
    for k, run in enumerate(runs):
        color = colors[k % len(colors)]
        t, e = run.train, run.eval
        for ax, x in ((by_iter, "iter"), (by_tokens, "tokens"), (by_time, "seconds")):
            xs_t, xs_e = (t[x], e[x]) if x != "seconds" else (t[x] / scale, e[x] / scale)
            ax.plot(xs_t, t["loss"], color=color, linewidth=0.8, alpha=0.35)
            ax.plot(xs_e, e["train_loss"], color=color, linestyle="--", linewidth=1.2)
            ax.plot(xs_e, e["val_loss"], color=color, marker="o", markersize=3.5,
                    linewidth=1.6)
        lr_ax.plot(t["iter"], t["lr"], color=color)
        speed_ax.plot(t["iter"], t["tokens_per_s"], color=color)
        mfu_ax.plot(t["iter"], 100 * t["mfu"], color=color)
        if with_hellaswag and len(run.hellaswag["iter"]):
            h = run.hellaswag
            hellaswag_ax.plot(h["iter"], h["acc_norm"], color=color, marker="o",
                              markersize=3.5, linewidth=1.6)
            hellaswag_ax.plot(h["iter"], h["acc"], color=color, linestyle="--", linewidth=1.2)

    for ax, xlabel, ylabel, title in panels:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
    for ax in (speed_ax, mfu_ax):  # from 0: a few percent of noise looks like a few percent
        ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
    by_tokens.xaxis.set_major_formatter(EngFormatter())
    speed_ax.yaxis.set_major_formatter(EngFormatter())
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    styles = [Line2D([], [], color="grey", linewidth=0.8, alpha=0.5,
                     label="train (logged steps)"),
              Line2D([], [], color="grey", linestyle="--", label="train (evaluation)"),
              Line2D([], [], color="grey", marker="o", markersize=3.5,
                     label="val (evaluation)")]
    by_iter.legend(handles=styles, fontsize=8, loc="upper right")
    named = [Line2D([], [], color=colors[k % len(colors)], linewidth=2.5, label=run.name)
             for k, run in enumerate(runs)]
    fig.legend(handles=named, loc="outside upper center", ncols=min(len(runs), 6),
               fontsize=10, frameon=False)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if out.suffix.lower() in ("", ".png"):
            _save_png(fig, out, dpi)
        else:  # .svg, .pdf...: matplotlib's writer for the suffix (ValueError: none)
            fig.savefig(out, dpi=dpi)
    finally:
        plt.close(fig)
    return out


def _save_png(fig: Any, out: Path, dpi: int) -> None:
    """A PNG of 256 colours: a plot has a few dozen, and the palette makes the file a
    third of matplotlib's RGBA one (200 KB -> 70 KB for two runs), with no visible change.
    Pillow comes with matplotlib."""
    from PIL import Image
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=256).save(out, format="PNG", optimize=True)
