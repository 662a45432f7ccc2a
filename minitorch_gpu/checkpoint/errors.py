"""CheckpointError: a checkpoint file that can't be loaded, said in one line."""
from __future__ import annotations

__all__ = ["CheckpointError", "one_line"]


class CheckpointError(RuntimeError):
    """A checkpoint file that can't be loaded: the message names the file and what is wrong."""


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line of at most 240 characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, KeyError):  # KeyError's str is the repr of its key
        text = f"missing {text}"
    return text if len(text) <= 240 else text[:237] + "..."
