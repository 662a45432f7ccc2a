"""``minitorch-gpu plot``: one or more runs' metrics.jsonl drawn as one picture."""
from __future__ import annotations

import argparse
import sys

from .errors import EXIT_FAILED, error


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The plot command."""
    plot = sub.add_parser("plot", help="draw runs' metrics as one picture",
                          description="Draw train and val loss against iterations, tokens "
                                      "seen and training time, the learning rate, tokens/s "
                                      "and MFU of one or more runs from their metrics.jsonl, "
                                      "overlaid and named by their directories (needs "
                                      "matplotlib: the plot extra).")
    plot.add_argument("runs", nargs="+", metavar="RUN",
                      help="a run directory (checkpoint.dir/run_name)")
    plot.add_argument("--out", metavar="FILE.png",
                      help="the picture to write (default: RUN/metrics.png for one run, "
                           "metrics.png in the current directory for several)")
    plot.set_defaults(run=_plot)


def _plot(args: argparse.Namespace) -> int:
    """Draw the runs' metrics into one picture; the exit code."""
    from ..train.plot_runs import PLOT_HINT, MetricsError, default_output, plot_runs, read_runs
    try:
        import matplotlib  # noqa: F401 - before the runs are read
    except ImportError:
        return error("plot", PLOT_HINT)
    try:
        runs = read_runs(args.runs)
    except MetricsError as exc:
        return error("plot", str(exc))
    try:
        path = plot_runs(runs, args.out or default_output(args.runs))
    except ValueError as exc:  # a suffix matplotlib has no writer for
        return error("plot", f"--out: {str(exc).splitlines()[0]}")
    except OSError as exc:
        print(f"minitorch-gpu plot: cannot write {exc.filename}: {exc.strerror}",
              file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {path}")
    return 0
