"""The CLI's exit codes and its one-line error.

An expected failure (bad input, a full disk, a diverged run) is one line on stderr,
``minitorch-gpu COMMAND: error: ...``, and exit code 2 (``EXIT_BAD_INPUT``).
"""
from __future__ import annotations

import sys

# 130 and 141 are what a shell reports for a process ended by SIGINT and SIGPIPE (128 + n)
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 1, 2, 130, 141
# set when a command failed on every MPI rank at once (the trainer's TrainingRefused: rank
# 0's verdict on the run directory, sent to every rank): each rank then ends on its own, as
# after Ctrl-C, and none aborts the job (MPI_Abort would add its own line to rank 0's)
every_rank_refused = False


def error(command: str, message: str) -> int:
    """``message`` as one line on stderr, naming the command; the bad-input exit code."""
    print(f"minitorch-gpu {command}: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT
