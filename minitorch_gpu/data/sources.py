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

import glob
import hashlib
import json
import os
import sys
import sysconfig
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..system.atomic import atomic_write
from .config import DataConfig
from ..system.machine import cache_dir

__all__ = ["cache_root", "describe_source", "load_text", "source_fingerprint",
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


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _read_utf8(path: Path) -> str:
    """The text of a file the user named; ValueError, naming it, if it is not UTF-8 (a
    binary file a glob picked up, a Latin-1 or UTF-16 file), rather than training on
    replacement characters."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"data source text_files: {str(path)!r} is not UTF-8 text (byte "
                         f"0x{data[exc.start]:02x} at offset {exc.start}: {exc.reason}); "
                         f"convert it to UTF-8 or leave it out of data.path/data.paths") from None
    # universal newlines, as _read (read_text) gives them: "\r\n" and a lone "\r" become "\n"
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _join_files(paths: List[Path], max_chars: Optional[int],
                read: Callable[[Path], str] = _read) -> str:
    """The files' texts (each from ``read``) with one blank line between them, reading no
    further than ``max_chars`` needs."""
    parts, total = [], 0
    for path in paths:
        text = read(path)
        if not text.endswith("\n"):
            text += "\n"
        parts.append(text)
        total += len(text) + 1
        if max_chars is not None and total >= max_chars:
            break
    return "\n".join(parts)


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


def _load_hf_dataset(cfg: DataConfig) -> Any:
    import datasets  # slow to import (~1 s): only when this source is used

    path = _hf_local_path(cfg)
    hf_cache = str(cache_root(cfg) / "hf_datasets")
    if path is not None and path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if cfg.split not in loaded:
                raise ValueError(f"data source hf_dataset: {cfg.path!r} has splits "
                                 f"{sorted(loaded)}, not data.split {cfg.split!r}")
            loaded = loaded[cfg.split]
        return loaded
    if path is not None:  # one local file is one split, "train"
        builder = HF_BUILDERS[path.suffix.lower()]
        extra = {"sample_by": "document"} if builder == "text" else {}  # the file as it is
        return datasets.load_dataset(builder, data_files=str(path), split="train",
                                     cache_dir=hf_cache, **extra)
    return datasets.load_dataset(cfg.dataset, cfg.dataset_config, split=cfg.split,
                                 cache_dir=hf_cache)


def _hf_text(cfg: DataConfig) -> str:
    dataset = _load_hf_dataset(cfg)
    columns = list(dataset.column_names)
    if cfg.text_field not in columns:
        raise ValueError(f"data source hf_dataset: data.text_field {cfg.text_field!r} is not "
                         f"a column; the dataset has {columns}")
    texts: List[str] = []
    total = 0
    column = dataset.select_columns([cfg.text_field])
    for batch in column.iter(batch_size=10_000):  # a batch at a time: stop at max_chars
        kept = [t for t in batch[cfg.text_field] if t is not None]
        if not all(isinstance(t, str) for t in kept):
            odd = next(t for t in kept if not isinstance(t, str))
            raise TypeError(f"data source hf_dataset: data.text_field {cfg.text_field!r}: "
                            f"expected a column of strings, got {type(odd).__name__} {odd!r:.80}")
        texts.extend(kept)
        total += sum(len(t) + 2 for t in kept)
        if cfg.max_chars is not None and total >= cfg.max_chars:
            break
    return "\n\n".join(texts)


# --- the public entry points ------------------------------------------------------------------
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
    notes (a download, a non-reference tinyshakespeare)."""
    if cfg.source == "text_files":
        text = _join_files(text_file_paths(cfg), cfg.max_chars, read=_read_utf8)
    elif cfg.source == "python_stdlib":
        text = _join_files(stdlib_file_paths(), cfg.max_chars)
    elif cfg.source == "tinyshakespeare":
        text = _read(_tinyshakespeare_path(cfg, log))
    elif cfg.source == "hf_dataset":
        text = _hf_text(cfg)
    else:
        raise ValueError(f"data.source: expected one of text_files, python_stdlib, "
                         f"tinyshakespeare, hf_dataset, got {cfg.source!r}")
    return text if cfg.max_chars is None else text[:cfg.max_chars]


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
