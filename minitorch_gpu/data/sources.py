"""Corpus sources: the text a run trains on, chosen by ``data.source``.

* ``text_files``: ``data.path`` and ``data.paths``, files or globs (``**`` recurses); UTF-8
  text only (anything else is an error naming the file).
* ``python_stdlib``: the ``.py`` files of this interpreter's standard library (~11 MB); no
  download.
* ``tinyshakespeare``: Karpathy's 1.1 MB corpus, downloaded once into the cache (or
  ``data.path``, a local copy).
* ``hf_dataset``: a Hugging Face dataset from the hub, a ``save_to_disk`` folder or a local
  .txt/.json/.jsonl/.csv/.parquet file; ``data.text_field`` is the column read.

>>> text = load_text(DataConfig(source="python_stdlib", max_chars=10_000))
>>> len(text)
10000
"""
from __future__ import annotations

import codecs
import glob
import hashlib
import itertools
import json
import os
import sys
import sysconfig
import urllib.error
import urllib.request
from pathlib import Path
from typing import (Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional,
                    Tuple)

from ..system.atomic import atomic_write
from .config import DataConfig
from ..system.machine import cache_dir

__all__ = ["cache_root", "describe_source", "load_text", "source_fingerprint", "documents",
           "document_count", "joined_pieces", "fetch_source", "joining", "Joining",
           "text_file_paths", "stdlib_file_paths", "TINYSHAKESPEARE_URL",
           "TINYSHAKESPEARE_SHA256"]

TINYSHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                       "tinyshakespeare/input.txt")
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DOWNLOAD_TIMEOUT_S = 30.0

# Directories of the standard library left out of the python_stdlib corpus: installed
# packages are not the stdlib; the test suites (17 MB) and IDLE would more than double the
# corpus with repetitive code; encodings/ (1.4 MB of generated code-page tables) and
# pydoc_data/ (0.8 MB of documentation in one string) are data, and a small model trained
# with them learns to write code-page tables. What remains is ~9.2 MB in ~550 files of
# code on CPython 3.11.
STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib",
                                  "encodings", "pydoc_data", "__pycache__"})

# The datasets builder for each local file type hf_dataset reads.
HF_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv",
               ".parquet": "parquet"}

Log = Callable[[str], None]


def cache_root(cfg: DataConfig) -> Path:
    """Where downloads and prepared tokens live: ``data.cache_dir``, else
    ``$MINITORCH_GPU_CACHE``, else ``~/.cache/minitorch_gpu``."""
    return Path(cfg.cache_dir).expanduser() if cfg.cache_dir else cache_dir()


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


def _stat(path: Path) -> Tuple[str, int, int, int]:
    # ctime too: copying an older version over the file with its times kept (cp -p, rsync -t,
    # tar) can leave size and mtime as they were, but the kernel sets ctime on every write
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns


BLOCK_CHARS = 1 << 20  # a file is read this many characters at a time


def _blocks(path: Path, strict: bool) -> Iterator[str]:
    """The text of ``path`` in blocks of BLOCK_CHARS characters, with universal newlines
    ("\r\n" and a lone "\r" read as "\n", across block edges too); at least one block
    ("" for an empty file). ``strict``: a file the user named must be UTF-8, and a
    ValueError names it (a binary file a glob picked up, a Latin-1 or UTF-16 file) rather
    than training on replacement characters; else bad bytes read as U+FFFD."""
    with open(path, encoding="utf-8", errors="strict" if strict else "replace") as f:
        first = True
        while True:
            try:
                block = f.read(BLOCK_CHARS)
            except UnicodeDecodeError as exc:
                offset, byte = _first_bad_byte(path)
                raise ValueError(
                    f"data source text_files: {str(path)!r} is not UTF-8 text (byte "
                    f"0x{byte:02x} at offset {offset}: {exc.reason}); convert it to UTF-8 "
                    f"or leave it out of data.path/data.paths") from None
            if not block and not first:
                return
            first = False
            yield block


def _first_bad_byte(path: Path) -> Tuple[int, int]:
    """The offset and value of the first byte of ``path`` that is not UTF-8, read in blocks."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    done = 0
    with open(path, "rb") as f:
        for data in iter(lambda: f.read(1 << 20), b""):
            pending = len(decoder.getstate()[0])  # the last block's unfinished character
            try:
                decoder.decode(data)
            except UnicodeDecodeError as exc:  # exc.object: the pending bytes + data
                return done - pending + exc.start, exc.object[exc.start]
            done += len(data)
    return done, 0


def _read(path: Path) -> str:
    return "".join(_blocks(path, strict=False))


# --- text_files -------------------------------------------------------------------------------
def text_file_paths(cfg: DataConfig) -> List[Path]:
    """The files of ``data.path`` and ``data.paths`` in order: ``~`` expanded, each glob's
    matches sorted, repeats dropped (the same file however it is spelt: relative or absolute,
    through ``..`` or a link). A name that is an existing file is taken as it is, even when
    it holds glob characters (``notes[1].txt``). FileNotFoundError names a pattern that
    matches nothing."""
    first = cfg.path if isinstance(cfg.path, (list, tuple)) else [cfg.path] if cfg.path else []
    patterns = list(first) + list(cfg.paths)
    if not patterns:
        raise ValueError("data source text_files: expected data.path or data.paths (files or "
                         "globs), got neither")
    found: Dict[str, Path] = {}  # real path -> the path as first named
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if os.path.isfile(expanded):
            matches = [Path(expanded)]
        elif glob.has_magic(expanded):
            matches = [Path(p) for p in sorted(glob.glob(expanded, recursive=True))
                       if os.path.isfile(p)]
        elif os.path.isdir(expanded):
            raise ValueError(f"data source text_files: {pattern!r} is a directory; expected "
                             f"a file or a glob such as '{pattern.rstrip('/')}/**/*.txt'")
        else:
            matches = []
        if not matches:
            raise FileNotFoundError(f"data source text_files: {pattern!r} matches no file "
                                    f"(expanded: {expanded!r})")
        for match in matches:
            found.setdefault(os.path.realpath(match), match)
    return list(found.values())


# --- python_stdlib ----------------------------------------------------------------------------
def stdlib_file_paths() -> List[Path]:
    """The standard library's ``.py`` files, sorted, without STDLIB_EXCLUDED_DIRS."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise RuntimeError(f"data source python_stdlib: the standard library folder "
                           f"{str(root)!r} of {sys.executable} does not exist")
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in STDLIB_EXCLUDED_DIRS]  # prune in place
        paths.extend(Path(folder, f) for f in files if f.endswith(".py"))
    return sorted(paths, key=lambda p: p.relative_to(root).as_posix())


# --- tinyshakespeare --------------------------------------------------------------------------
def tinyshakespeare_cache_path(cfg: DataConfig) -> Path:
    return cache_root(cfg) / "tinyshakespeare" / "input.txt"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _tinyshakespeare_path(cfg: DataConfig, log: Log) -> Path:
    """``data.path`` when given (a variant only gets a note), else the cached copy,
    downloaded on first use."""
    if cfg.path:
        path = Path(cfg.path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"data source tinyshakespeare: data.path {cfg.path!r} is "
                                    f"not a file")
        if _sha256_file(path) != TINYSHAKESPEARE_SHA256:
            log(f"data: note: {path} is not the reference tinyshakespeare (sha256 differs); "
                f"using it as given")
        return path
    path = tinyshakespeare_cache_path(cfg)
    if not path.is_file():
        _download_tinyshakespeare(path, log)
    return path


def _download_tinyshakespeare(dest: Path, log: Log) -> None:
    log(f"data: downloading tinyshakespeare to {dest}")
    try:
        with urllib.request.urlopen(TINYSHAKESPEARE_URL, timeout=DOWNLOAD_TIMEOUT_S) as reply:
            payload = reply.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:  # offline, timeout, refused
        raise RuntimeError(
            f"data source tinyshakespeare: the download from {TINYSHAKESPEARE_URL} failed "
            f"({exc}); put the file at {dest} or set data.path to a local copy") from None
    digest = hashlib.sha256(payload).hexdigest()
    if digest != TINYSHAKESPEARE_SHA256:
        raise RuntimeError(f"data source tinyshakespeare: the download from "
                           f"{TINYSHAKESPEARE_URL} has sha256 {digest}, expected "
                           f"{TINYSHAKESPEARE_SHA256}; put a good copy at {dest} or set "
                           f"data.path")
    try:  # atomic: an interrupted download never leaves a partial input.txt
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(dest) as f:
            f.write(payload)
    except OSError as exc:  # a read-only cache, or a file where its folder should be
        raise RuntimeError(
            f"data source tinyshakespeare: downloaded, but can't save it in {dest.parent} "
            f"({exc.strerror or exc}); set data.cache_dir (or $MINITORCH_GPU_CACHE) to a "
            f"writable folder, or data.path to a local copy") from None


# --- hf_dataset -------------------------------------------------------------------------------
def _hf_local_path(cfg: DataConfig) -> Optional[Path]:
    if not cfg.path:
        return None
    path = Path(cfg.path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"data source hf_dataset: data.path {cfg.path!r} does not "
                                f"exist")
    if path.is_file() and path.suffix.lower() not in HF_BUILDERS:
        raise ValueError(f"data source hf_dataset: data.path {cfg.path!r}: expected a "
                         f"{'/'.join(HF_BUILDERS)} file or a save_to_disk folder, got a "
                         f"{path.suffix or 'extensionless'} file")
    return path


def _hf_rows(cfg: DataConfig) -> Tuple[Iterator[Dict[str, Any]], Optional[List[str]],
                                         Optional[int]]:
    """The dataset's rows as a stream, its columns and its row count where known before
    reading: a save_to_disk folder is memory-mapped Arrow, read a batch at a time; a local
    file and a hub dataset stream through ``datasets``' streaming loaders (a hub dataset is
    then read over the network as it is used, never downloaded whole)."""
    import datasets  # slow to import (~1 s): only when this source is used

    path = _hf_local_path(cfg)
    if path is not None and path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if cfg.split not in loaded:
                raise ValueError(f"data source hf_dataset: {cfg.path!r} has splits "
                                 f"{sorted(loaded)}, not data.split {cfg.split!r}")
            loaded = loaded[cfg.split]
        columns = list(loaded.column_names)
        if cfg.text_field not in columns:
            raise ValueError(f"data source hf_dataset: data.text_field {cfg.text_field!r} is "
                             f"not a column; the dataset has {columns}")
        column = loaded.select_columns([cfg.text_field])
        rows = ({cfg.text_field: text} for batch in column.iter(batch_size=1000)
                for text in batch[cfg.text_field])
        return rows, columns, len(loaded)
    if path is not None:  # one local file is one split, "train"
        builder = HF_BUILDERS[path.suffix.lower()]
        extra = {"sample_by": "document"} if builder == "text" else {}  # the file as it is
        stream = datasets.load_dataset(builder, data_files=str(path), split="train",
                                       streaming=True, **extra)
    else:
        stream = datasets.load_dataset(cfg.dataset, cfg.dataset_config, split=cfg.split,
                                       streaming=True)
    return iter(stream), None, None


def _hf_texts(cfg: DataConfig) -> Iterator[str]:
    """The text column of the dataset's rows in order, rows without text (None) left out."""
    rows, columns, _ = _hf_rows(cfg)
    for row in rows:
        if columns is None:  # a stream: its first row names the columns
            columns = list(row)
            if cfg.text_field not in row:
                raise ValueError(f"data source hf_dataset: data.text_field "
                                 f"{cfg.text_field!r} is not a column; the dataset has "
                                 f"{columns}")
        text = row[cfg.text_field]
        if text is None:
            continue
        if not isinstance(text, str):
            raise TypeError(f"data source hf_dataset: data.text_field {cfg.text_field!r}: "
                            f"expected a column of strings, got {type(text).__name__} "
                            f"{text!r:.80}")
        yield text


# --- the corpus as documents ------------------------------------------------------------------
class Joining(NamedTuple):
    """How a source's documents join into the one text ``load_text`` gives."""

    separator: str  # between two documents
    newline_end: bool  # a document not ending in "\n" gets one


def joining(cfg: DataConfig) -> Joining:
    """Files end with a newline and are separated by a blank line; dataset rows are
    separated by a blank line; tinyshakespeare is one file, read as it is."""
    if cfg.source in ("text_files", "python_stdlib"):
        return Joining("\n", True)
    return Joining("\n\n", False) if cfg.source == "hf_dataset" else Joining("", False)


def documents(cfg: DataConfig, log: Log = print) -> Iterator[Iterable[str]]:
    """The corpus's documents in order (a file, a dataset row), each an iterable of text
    blocks, at least one: nothing is read before it is asked for, so a corpus of any size
    streams through in bounded memory."""
    if cfg.source == "text_files":
        for path in text_file_paths(cfg):
            yield _blocks(path, strict=True)
    elif cfg.source == "python_stdlib":
        for path in stdlib_file_paths():
            yield _blocks(path, strict=False)
    elif cfg.source == "tinyshakespeare":
        yield _blocks(_tinyshakespeare_path(cfg, log), strict=False)
    elif cfg.source == "hf_dataset":
        for text in _hf_texts(cfg):
            yield (text,)
    else:
        raise ValueError(f"data.source: expected one of text_files, python_stdlib, "
                         f"tinyshakespeare, hf_dataset, got {cfg.source!r}")


def document_count(cfg: DataConfig) -> Optional[int]:
    """How many documents ``documents(cfg)`` yields, where that is known without reading
    them (None for a streamed dataset); before data.max_chars cuts it."""
    if cfg.source == "text_files":
        return len(text_file_paths(cfg))
    if cfg.source == "python_stdlib":
        return len(stdlib_file_paths())
    if cfg.source == "hf_dataset":
        path = _hf_local_path(cfg)
        return _hf_rows(cfg)[2] if path is not None and path.is_dir() else None
    return 1


def joined_pieces(cfg: DataConfig, route: Optional[Callable[[int], int]] = None,
                  log: Log = print) -> Iterator[Tuple[int, int, str]]:
    """``(document, stream, text)`` pieces of the corpus, in order: document ``i`` goes to stream
    ``route(i)`` (0 for all without ``route``), and the documents of one stream join as
    ``joining(cfg)`` says. ``data.max_chars`` cuts the pieces of all streams together, so
    with one stream their concatenation is ``load_text(cfg)``."""
    separator, newline_end = joining(cfg)
    budget = cfg.max_chars
    started = set()  # the streams that hold a document already
    for index, blocks in enumerate(documents(cfg, log)):
        stream = route(index) if route is not None else 0
        pieces: Iterable[str] = blocks
        if stream in started and separator:
            pieces = itertools.chain((None,), blocks)  # None: the separator
        started.add(stream)
        last = ""  # the document's own last characters (an empty file still gets "\n")
        for piece in pieces:
            if piece is None:
                piece = separator
            elif piece:
                last = piece
            kept = piece if budget is None else piece[:budget]
            yield index, stream, kept
            if budget is not None:
                budget -= len(kept)
                if budget <= 0:
                    return
        if newline_end and not last.endswith("\n"):
            yield index, stream, "\n"
            if budget is not None:
                budget -= 1
                if budget <= 0:
                    return
# --- the public entry points ------------------------------------------------------------------
def fetch_source(cfg: DataConfig, log: Log = print) -> None:
    """Download what the source needs before it is read (tinyshakespeare, once); nothing for
    the others, which stream from where they are."""
    if cfg.source == "tinyshakespeare":
        _tinyshakespeare_path(cfg, log)


def describe_source(cfg: DataConfig) -> str:
    """The corpus as the user named it, for messages: ``text_files 'notes/*.txt'``,
    ``hf_dataset 'roneneldan/TinyStories' (split 'train', field 'text')``, with the
    ``data.max_chars`` cut when there is one."""
    if cfg.source == "text_files":
        first = cfg.path if isinstance(cfg.path, (list, tuple)) else [cfg.path] if cfg.path else []
        named = list(first) + list(cfg.paths)
        what = f"text_files {named[0]!r}" if len(named) == 1 else f"text_files {named}"
    elif cfg.source == "python_stdlib":
        what = f"python_stdlib ({sysconfig.get_paths()['stdlib']})"
    elif cfg.source == "tinyshakespeare":
        what = f"tinyshakespeare ({cfg.path or tinyshakespeare_cache_path(cfg)})"
    elif cfg.source == "hf_dataset":
        what = (f"hf_dataset {cfg.path or cfg.dataset!r} (split {cfg.split!r}, field "
                f"{cfg.text_field!r})")
    else:
        what = f"data.source {cfg.source!r}"
    return what if cfg.max_chars is None else f"{what} cut to data.max_chars={cfg.max_chars:,}"


def load_text(cfg: DataConfig, *, log: Log = print) -> str:
    """The whole corpus of ``cfg`` as one string, cut to ``data.max_chars``. ``log`` gets
    notes (a download, a non-reference tinyshakespeare). Small corpora only: ``prepare``
    streams ``joined_pieces`` instead."""
    return "".join(piece for _, _, piece in joined_pieces(cfg, log=log))


def _hf_fingerprint(cfg: DataConfig) -> Any:
    path = _hf_local_path(cfg)
    if path is None:  # a hub dataset: its name, config and split (prepare(force=True) to refresh)
        return None
    if path.is_file():
        return _stat(path)
    states = sorted(path.rglob("state.json"))  # save_to_disk records _fingerprint there
    fingerprints = []
    for state in states:
        try:
            fingerprints.append(json.loads(state.read_text()).get("_fingerprint"))
        except (OSError, ValueError):
            fingerprints.append(None)
    if states and all(fingerprints):
        return fingerprints
    return [_stat(p) for p in sorted(path.rglob("*")) if p.is_file()]


def source_fingerprint(cfg: DataConfig) -> str:
    """A hash that changes when the corpus may have changed, cheap to compute: file sizes,
    mtimes and ctimes, not contents (the stdlib: the interpreter version and each file's
    size)."""
    settings: Dict[str, Any] = {"source": cfg.source, "max_chars": cfg.max_chars}
    if cfg.source == "text_files":
        settings["files"] = [_stat(p) for p in text_file_paths(cfg)]
    elif cfg.source == "python_stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        settings["python"] = sys.version
        settings["files"] = [(p.relative_to(root).as_posix(), p.stat().st_size)
                             for p in stdlib_file_paths()]
    elif cfg.source == "tinyshakespeare":
        path = Path(cfg.path).expanduser() if cfg.path else tinyshakespeare_cache_path(cfg)
        settings["file"] = _stat(path) if path.is_file() else None
    elif cfg.source == "hf_dataset":
        settings.update(dataset=cfg.dataset, dataset_config=cfg.dataset_config,
                        split=cfg.split, text_field=cfg.text_field, local=_hf_fingerprint(cfg))
    else:
        raise ValueError(f"data.source: expected one of text_files, python_stdlib, "
                         f"tinyshakespeare, hf_dataset, got {cfg.source!r}")
    return _hash(settings)[:16]
