"""Tokenizers: text <-> token ids, characters or byte-level BPE, storable as JSON.

A tokenizer's JSON (``to_json``) goes into every checkpoint, so generation never needs the
data cache; ``tokenizer_from_json`` restores either kind.

>>> tok = CharTokenizer.from_text("hello world")
>>> tok.decode(tok.encode("hold")) == "hold"
True
>>> tokenizer_from_json(tok.to_json()).encode("hold") == tok.encode("hold")
True
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator, List, Sequence, Union

import numpy as np
import tokenizers as hf_tokenizers  # the Rust library on PyPI (this file is tokenizer.py)

from .config import DataConfig

__all__ = ["Tokenizer", "CharTokenizer", "BPETokenizer", "tokenizer_from_json",
           "load_tokenizer", "build_tokenizer", "END_OF_TEXT"]

END_OF_TEXT = "<|endoftext|>"  # BPE's one special token, as GPT-2's

# The BPE works on chunks of about this many characters, cut only after a lone newline
# between two non-spaces ("x\ny"): the byte-level pre-tokenizer makes that newline a piece of
# its own whether or not the text is cut there, so the ids equal those of the whole text,
# and the Rust encoder spreads the chunks over all cores. (After "\n\n" it would not: the
# pre-tokenizer splits "\n\ny" as "\n", "\n", "y" but a chunk ending "\n\n" as "\n\n".)
CHUNK_CHARS = 1 << 16
_CHUNK_BOUNDARY = re.compile(r"(?<=\S)\n(?=\S)")


def _chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    start = 0
    while start < len(text):
        cut = _CHUNK_BOUNDARY.search(text, start + size) if start + size < len(text) else None
        end = cut.end() if cut else len(text)
        yield text[start:end]
        start = end


class Tokenizer:
    """Base class: ``encode``/``decode`` between text and ids in ``[0, vocab_size)``."""

    kind: str = ""  # "char" | "bpe"

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of ``text`` as a 1-D int64 array: the fast path for whole corpora."""
        raise NotImplementedError

    def encode_chunks(self, chunks: Sequence[str]) -> List[np.ndarray]:
        """The ids of each of ``chunks``, texts already cut where the ids of their join do
        not change (``_chunks``): the path of a streamed corpus."""
        return [self.encode_array(chunk) for chunk in chunks]

    def encode(self, text: str) -> List[int]:
        return self.encode_array(text).tolist()

    def decode(self, ids: Union[Sequence[int], np.ndarray]) -> str:
        raise NotImplementedError

    def to_json(self) -> str:
        """A JSON string that ``tokenizer_from_json`` turns back into this tokenizer."""
        raise NotImplementedError

    def to_tokenizers_json(self) -> str:
        """This tokenizer as the ``tokenizers`` library's tokenizer.json (what a Hugging
        Face model folder holds), giving the same ids; ``tokenizer_from_json`` reads it
        back as this kind."""
        raise NotImplementedError

    def _check_ids(self, ids: Union[Sequence[int], np.ndarray]) -> np.ndarray:
        array = np.asarray(ids)
        if array.size == 0:
            return np.zeros(0, dtype=np.int64)
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise TypeError(f"{type(self).__name__}.decode: expected a 1-D sequence of ints, "
                            f"got {array.dtype} of shape {array.shape}")
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{type(self).__name__}.decode: id {bad} is outside the "
                             f"vocabulary [0, {self.vocab_size})")
        return array.astype(np.int64, copy=False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class CharTokenizer(Tokenizer):
    """One token per character; the vocabulary is the corpus's sorted set of characters."""

    kind = "char"

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        if not chars:
            raise ValueError("CharTokenizer: expected at least one character, got an empty "
                             "vocabulary")
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"CharTokenizer: expected single characters, got {c!r}")
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer: the vocabulary repeats characters")
        self.chars: List[str] = chars
        code_points = np.array([ord(c) for c in chars], dtype=np.int64)
        # id of each code point up to the largest in the vocabulary, -1 where unknown
        self._ids = np.full(int(code_points.max()) + 1, -1, dtype=np.int64)
        self._ids[code_points] = np.arange(len(chars))
        self._code_points = code_points.astype(np.uint32)

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        if not text:
            raise ValueError("CharTokenizer.from_text: the text is empty, so there is no "
                             "vocabulary")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode_array(self, text: str) -> np.ndarray:
        # utf-32 gives one uint32 per code point; surrogatepass keeps lone surrogates
        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        in_table = points < len(self._ids)
        ids = np.full(points.shape, -1, dtype=np.int64)
        ids[in_table] = self._ids[points[in_table]]
        unknown = np.flatnonzero(ids < 0)
        if unknown.size:
            where = int(unknown[0])
            raise ValueError(f"CharTokenizer.encode: character {text[where]!r} (U+"
                             f"{ord(text[where]):04X}, at index {where}) is not in the "
                             f"vocabulary of {self.vocab_size} characters, which came from the "
                             f"training corpus")
        return ids

    def decode(self, ids: Union[Sequence[int], np.ndarray]) -> str:
        points = self._code_points[self._check_ids(ids)]
        return points.tobytes().decode("utf-32-le", "surrogatepass")

    def to_tokenizers_json(self) -> str:
        # a BPE with one token per character and no merges: with no pre-tokenizer it splits
        # any text into its characters and looks each up; Fuse joins the decoded tokens
        # with nothing between them (the default decoder puts spaces there)
        hf = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE(
            vocab={c: i for i, c in enumerate(self.chars)}, merges=[]))
        hf.decoder = hf_tokenizers.decoders.Fuse()
        return hf.to_str()

    def to_json(self) -> str:
        # a list, not one string: a lone high surrogate next to a lone low one would read
        # back as one astral character; ascii escapes: a lone surrogate survives a UTF-8 file
        return json.dumps({"kind": "char", "chars": self.chars})


class BPETokenizer(Tokenizer):
    """Byte-level BPE (GPT-2 style) on the ``tokenizers`` library: any text encodes, and
    ``decode(encode(s)) == s``."""

    kind = "bpe"

    def __init__(self, hf_tokenizer: hf_tokenizers.Tokenizer) -> None:
        if not isinstance(hf_tokenizer, hf_tokenizers.Tokenizer):
            raise TypeError(f"BPETokenizer: expected a tokenizers.Tokenizer, got "
                            f"{type(hf_tokenizer).__name__}")
        self.hf = hf_tokenizer
        # the largest id + 1, not the count of tokens: a tokenizer.json whose ids skip
        # numbers still emits its largest, which the embedding and token files must hold
        ids = hf_tokenizer.get_vocab(with_added_tokens=True).values()
        self._vocab_size = max(ids) + 1 if ids else 0

    @classmethod
    def train(cls, text: str, vocab_size: int) -> "BPETokenizer":
        """A tokenizer trained on ``text`` to at most ``vocab_size`` tokens (fewer when the
        text has too few distinct pairs): 256 bytes, ``<|endoftext|>`` and merges."""
        minimum = len(hf_tokenizers.pre_tokenizers.ByteLevel.alphabet()) + 1
        if vocab_size < minimum:
            raise ValueError(f"BPETokenizer.train: vocab_size must be >= {minimum} (256 bytes "
                             f"+ {END_OF_TEXT}), got {vocab_size}")
        hf = hf_tokenizers.Tokenizer(hf_tokenizers.models.BPE())
        hf.pre_tokenizer = hf_tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = hf_tokenizers.decoders.ByteLevel()
        trainer = hf_tokenizers.trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[END_OF_TEXT], show_progress=False,
            initial_alphabet=hf_tokenizers.pre_tokenizers.ByteLevel.alphabet())
        hf.train_from_iterator(_chunks(text), trainer=trainer)
        return cls(hf)

    @classmethod
    def from_file(cls, path: Union[str, Path]) -> "BPETokenizer":
        """A ``tokenizer.json`` written by the ``tokenizers`` library (e.g. GPT-2's) or by
        ``to_json``."""
        restored = load_tokenizer(path)
        if not isinstance(restored, BPETokenizer):
            raise ValueError(f"BPETokenizer.from_file: {str(path)!r} holds a {restored.kind} "
                             f"tokenizer, expected a BPE one")
        return restored

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode_array(self, text: str) -> np.ndarray:
        chunks = list(_chunks(text))
        if not chunks:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(self.encode_chunks(chunks))

    def encode_chunks(self, chunks: Sequence[str]) -> List[np.ndarray]:
        # one call for all: the Rust encoder spreads the chunks over every core
        encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)  # no offsets
        return [np.array(e.ids, dtype=np.int64)
                for e in encode(list(chunks), add_special_tokens=False)]

    def decode(self, ids: Union[Sequence[int], np.ndarray]) -> str:
        # keep <|endoftext|>: a text holding it must come back whole
        return self.hf.decode(self._check_ids(ids).tolist(), skip_special_tokens=False)

    def to_tokenizers_json(self) -> str:
        return self.hf.to_str()

    def to_json(self) -> str:
        return json.dumps({"kind": "bpe", "tokenizer": json.loads(self.hf.to_str())},
                          ensure_ascii=False)


def tokenizer_from_json(text: str) -> Tokenizer:
    """The tokenizer ``to_json`` wrote (either kind), or a ``tokenizers`` library
    tokenizer.json (as a BPETokenizer)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"tokenizer_from_json: the text is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"tokenizer_from_json: expected a JSON object, got "
                         f"{type(data).__name__}")
    kind = data.get("kind")
    try:
        if kind == "char":
            return CharTokenizer(list(data["chars"]))
        if kind == "bpe":
            return BPETokenizer(hf_tokenizers.Tokenizer.from_str(json.dumps(data["tokenizer"])))
        if kind is None and _is_char_layout(data):  # CharTokenizer.to_tokenizers_json's
            vocab = data["model"]["vocab"]
            return CharTokenizer(sorted(vocab, key=vocab.get))
        if kind is None and "model" in data:  # the tokenizers library's own format
            return BPETokenizer(hf_tokenizers.Tokenizer.from_str(text))
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception
        raise ValueError(f"tokenizer_from_json: a broken {kind or 'tokenizers library'} "
                         f"tokenizer ({type(exc).__name__}: {exc})") from None
    raise ValueError(f"tokenizer_from_json: expected kind 'char' or 'bpe' (or a tokenizers "
                     f"library tokenizer.json), got kind {kind!r}")


def _is_char_layout(data: dict) -> bool:
    """Whether a tokenizer.json is CharTokenizer's: a BPE of single characters with ids
    0..n-1, no merges, nothing around it but the Fuse decoder."""
    model = data.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE" or model.get("merges") or \
            data.get("decoder") != {"type": "Fuse"} or data.get("added_tokens") or \
            any(data.get(key) for key in ("normalizer", "pre_tokenizer", "post_processor")):
        return False
    vocab = model.get("vocab")
    return isinstance(vocab, dict) and bool(vocab) and \
        all(isinstance(c, str) and len(c) == 1 for c in vocab) and \
        sorted(vocab.values()) == list(range(len(vocab)))


def load_tokenizer(path: Union[str, Path]) -> Tokenizer:
    """The tokenizer in a JSON file: one ``to_json`` wrote, or a ``tokenizers`` library
    tokenizer.json."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"load_tokenizer: {str(path)!r} is not a file")
    try:
        return tokenizer_from_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"load_tokenizer: {str(path)!r}: {exc}") from None


def build_tokenizer(cfg: DataConfig, text: str) -> Tokenizer:
    """The tokenizer ``data.tokenizer`` asks for: built from ``text`` (char), trained on it
    (bpe, to ``data.vocab_size``) or loaded from ``data.tokenizer_path`` (file, either kind)."""
    if cfg.tokenizer == "char":
        return CharTokenizer.from_text(text)
    if cfg.tokenizer == "bpe":
        return BPETokenizer.train(text, cfg.vocab_size)
    if cfg.tokenizer == "file":
        if not cfg.tokenizer_path:
            raise ValueError("data.tokenizer_path: expected the path of a tokenizer.json for "
                             "tokenizer: file, got none")
        tokenizer = load_tokenizer(cfg.tokenizer_path)
        _check_lossless(tokenizer, text, f"data.tokenizer_path {cfg.tokenizer_path!r}")
        return tokenizer
    raise ValueError(f"data.tokenizer: expected one of char, bpe, file, got "
                     f"{cfg.tokenizer!r}")


def _check_lossless(tokenizer: Tokenizer, text: str, name: str) -> None:
    """ValueError unless ``tokenizer`` gives back each distinct character of ``text`` and its
    first chunk as they were. A given tokenizer.json need not be byte-level: a word-level
    one turns what it doesn't know into [UNK], a BPE without byte fallback drops it, a
    normalizer lowercases, and the corpus would be trained on silently changed."""
    for sample in sorted(set(text)) + [text[:CHUNK_CHARS]]:
        back = tokenizer.decode(tokenizer.encode(sample))
        if back != sample:
            where = next((i for i, (a, b) in enumerate(zip(sample, back)) if a != b),
                         min(len(sample), len(back)))
            raise ValueError(f"{name}: the tokenizer does not encode this corpus losslessly: "
                             f"{sample[where:where + 20]!r} decodes as "
                             f"{back[where:where + 20]!r}; expected a byte-level BPE (such "
                             f"as GPT-2's tokenizer.json) or data.tokenizer: bpe or char")
