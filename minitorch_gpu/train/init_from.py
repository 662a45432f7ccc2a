"""``model.init_from``: a training run that starts from a pretrained model (nanoGPT's
``init_from='gpt2'``): the source's shape, tokenizer and weights.

``start_from(cfg)`` reads the source's shape and tokenizer (no weights yet) and fills the
run config in: the model section takes the source's shape, and every shape key the config
gives must agree with it (``model.block_size`` may be smaller: the context is cropped, as
nanoGPT's ``crop_block_size``; ``model.dropout`` is the run's own); the data section's
tokenizer becomes the source's, written once into the data cache, so the corpus is
tokenized with it (the data keys that would choose another must be left out). The trainer
then builds the model as for any run and ``InitSource.load_weights`` copies the source's
weights in (not on ``--resume``: last.ckpt holds them).
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..system.atomic import atomic_write
from ..checkpoint import CheckpointError, load_checkpoint, read_checkpoint_meta
from .config import Config, ConfigError
from ..data.sources import cache_root
from ..data.tokenizer import Tokenizer
from ..nn import CausalLM, GPTConfig
from ..pretrained import resolve_source
from ..pretrained.hf_config import PretrainedError
from ..pretrained.hf_folder import HFFolder, load_folder_weights, read_folder

__all__ = ["InitSource", "SCRATCH", "start_from"]

SCRATCH = "scratch"
# the model keys the source decides; block_size may be cropped, dropout is the run's
_SOURCE_KEYS = [f.name for f in dataclasses.fields(GPTConfig)
                if f.name not in ("block_size", "dropout")]
_DATA_KEYS = ("tokenizer", "tokenizer_path", "vocab_size")  # the tokenizer is the source's


@dataclass
class InitSource:
    """A pretrained source as a run starts from it."""

    source: str  # model.init_from as given
    config: GPTConfig  # the source's shape, as stored (its vocabulary padding kept)
    tokenizer: Tokenizer
    path: Path  # an HF folder, or a checkpoint file
    folder: Optional[HFFolder]  # None: one of this project's checkpoints

    def load_weights(self, model: CausalLM) -> None:
        """Copy the source's weights into ``model`` (built from the config start_from
        filled in; a cropped context reads the first block_size positions)."""
        if self.folder is not None:
            load_folder_weights(model, self.folder)
            return
        try:
            weights = load_checkpoint(self.path, load_optimizer=False).model
        except CheckpointError as exc:
            raise PretrainedError(str(exc)) from None
        if "transformer.wpe.weight" in weights:
            weights["transformer.wpe.weight"] = \
                weights["transformer.wpe.weight"][:model.config.block_size]
        model.load_state_dict(weights)


def start_from(cfg: Config) -> Optional[InitSource]:
    """The source ``cfg.model.init_from`` names, with ``cfg``'s model and data sections
    filled in from it (see the module's docstring); None for ``scratch``. ConfigError for a
    key that disagrees with the source, PretrainedError for a source that cannot be read."""
    m, d = cfg.model, cfg.data
    if m.init_from == SCRATCH:
        return None
    init = _read_source(m.init_from)
    # the keys the YAML and --set gave; a section made in Python: those off their defaults
    given = getattr(m, "given", None)
    if given is None:
        given = {f.name for f in dataclasses.fields(m) if getattr(m, f.name) != f.default}
    src = init.config
    for key in _SOURCE_KEYS + ["pad_vocab_to"]:  # the source's vocabulary is not padded
        ours, theirs = getattr(m, key), getattr(src, key, 1)
        if key in given and ours != theirs and not (key == "vocab_size" and ours is None):
            raise ConfigError(f"config key 'model.{key}': {ours!r} disagrees with model."
                              f"init_from {m.init_from}'s {theirs!r}; leave it out (the shape "
                              f"comes from the source)")
    if "block_size" in given and m.block_size > src.block_size:
        raise ConfigError(f"config key 'model.block_size': {m.block_size} is longer than "
                          f"model.init_from {m.init_from}'s context ({src.block_size}); "
                          f"give at most that, or leave it out")
    for key in _DATA_KEYS:
        if key in getattr(d, "given", ()):
            raise ConfigError(f"config key 'data.{key}': the tokenizer comes from "
                              f"model.init_from ({m.init_from}); leave it out")
    for key in _SOURCE_KEYS:
        setattr(m, key, getattr(src, key))
    m.pad_vocab_to = 1
    if "block_size" not in given:
        m.block_size = src.block_size
    d.tokenizer, d.tokenizer_path = "file", str(_cache_tokenizer(cfg, init.tokenizer))
    return init


def _read_source(source: str) -> InitSource:
    """The source's shape and tokenizer, reading no weight."""
    path = resolve_source(source)
    if path.is_dir() and (path / "config.json").is_file():
        folder = read_folder(path)
        if folder.tokenizer is None:
            raise PretrainedError(f"{path}: has no tokenizer (tokenizer.json, or vocab.json "
                                  f"and merges.txt); training needs the source's tokenizer")
        return InitSource(source, folder.config, folder.tokenizer, path, folder)
    from ..pretrained.inference import checkpoint_model, resolve_checkpoint
    try:
        file = resolve_checkpoint(path)
        config, tokenizer = checkpoint_model(read_checkpoint_meta(file), file)
    except CheckpointError as exc:
        raise PretrainedError(str(exc)) from None
    return InitSource(source, config, tokenizer, file, None)


def _cache_tokenizer(cfg: Config, tokenizer: Tokenizer) -> Path:
    """The source's tokenizer as a file in the data cache, named by its contents: the
    prepared tokens' cache key hashes it, so one source's corpus is tokenized once."""
    text = tokenizer.to_json()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    path = cache_root(cfg.data) / "init_from" / f"tokenizer-{digest}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path, "w") as f:
            f.write(text)
    return path


def describe(init: InitSource) -> str:
    """One line for the log: what the run starts from."""
    c = init.config
    return (f"init_from {init.source}: a {c.arch} of {c.n_layer} layers, {c.n_embd} wide, "
            f"vocab {c.vocab_size}, from {init.path}")
