"""Where HellaSwag's examples come from: a local jsonl, or the validation set fetched once.

>>> hellaswag_path("my_sample.jsonl")  # a local file, as it is
>>> hellaswag_path(None)  # CACHE/hellaswag/hellaswag_val.jsonl, fetched the first time

The validation set (10,042 examples) is the file llm.c downloads, ``HELLASWAG_URL``
(Rowan Zellers' repository); where that cannot be reached, the Hugging Face dataset
``Rowan/hellaswag`` (through ``datasets``, which may have it cached) is written out in the
same format. Either is written atomically (``system/atomic.py``), so a download cut short
leaves nothing behind, and checked for its 10,042 examples. Offline (no host name
resolves), HellaSwagError says at once to give a local file.
"""
from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..system.atomic import atomic_write
from ..system.machine import cache_dir
from .hellaswag import HellaSwagError

__all__ = ["HELLASWAG_URL", "VALIDATION_EXAMPLES", "hellaswag_path", "validation_set_path"]

HELLASWAG_URL = ("https://raw.githubusercontent.com/rowanz/hellaswag/master/data/"
                 "hellaswag_val.jsonl")
VALIDATION_EXAMPLES = 10042
DOWNLOAD_TIMEOUT_S = 60


def validation_set_path() -> Path:
    """Where the validation set is cached."""
    return cache_dir() / "hellaswag" / "hellaswag_val.jsonl"


def hellaswag_path(data: Optional[str], *, hint: str = "pass --data FILE.jsonl",
                   log: Callable[[str], None] = lambda _: None) -> Path:
    """The jsonl to score: ``data`` when given (it must exist), else the cached validation
    set, fetched first if it is not there yet. HellaSwagError (one line, ending with
    ``hint``) when neither can be had."""
    if data is not None:
        path = Path(data).expanduser()
        if not path.is_file():
            raise HellaSwagError(f"HellaSwag data {data}: no such file")
        return path
    path = validation_set_path()
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for fetch in (_download, _from_datasets):
        try:
            fetch(path)
            log(f"hellaswag: fetched the validation set into {path}")
            return path
        except _Offline as exc:  # no name resolves: the Hub would only retry for a minute
            failures.append(str(exc))
            break
        except HellaSwagError as exc:
            failures.append(str(exc))
    raise HellaSwagError(f"cannot fetch the HellaSwag validation set ({'; '.join(failures)}); "
                         f"offline, {hint} (HellaSwag's jsonl: ctx, endings, label a line)")


class _Offline(HellaSwagError):
    """No host name resolves: this machine has no network."""


def _write_checked(path: Path, lines: Iterable[bytes], source: str) -> None:
    """Write the lines atomically, refusing (writing nothing) unless they are the whole set."""
    with atomic_write(path) as f:
        n = 0
        for line in lines:
            if line.strip():
                f.write(line if line.endswith(b"\n") else line + b"\n")
                n += 1
        if n != VALIDATION_EXAMPLES:
            raise HellaSwagError(f"{source} gave {n} examples, expected {VALIDATION_EXAMPLES}")


def _download(path: Path) -> None:
    try:
        with urllib.request.urlopen(HELLASWAG_URL, timeout=DOWNLOAD_TIMEOUT_S) as response:
            _write_checked(path, response, HELLASWAG_URL)
    except OSError as exc:  # URLError, a timeout, a cut connection
        reason = getattr(exc, "reason", exc)
        kind = _Offline if isinstance(reason, socket.gaierror) else HellaSwagError
        raise kind(f"{HELLASWAG_URL}: {reason}") from None


def _from_datasets(path: Path) -> None:
    try:
        import datasets
    except ImportError:
        raise HellaSwagError("the datasets package is not installed") from None
    try:
        rows = datasets.load_dataset("Rowan/hellaswag", split="validation")
    except Exception as exc:  # offline, a hub error, a format this datasets cannot read
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HellaSwagError(f"datasets Rowan/hellaswag: {detail[:200]}") from None
    # the Hub's copy holds label as a string ("3") and ind as an int
    _write_checked(path, (json.dumps({"ind": row["ind"], "ctx": row["ctx"],
                                      "endings": list(row["endings"]),
                                      "label": int(row["label"])}).encode()
                          for row in rows), "datasets Rowan/hellaswag")
