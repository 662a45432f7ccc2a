"""Run configuration: YAML loaded into typed dataclasses, with overrides and validation.

A config file has seven sections, each a dataclass below, every field commented::

    model:      {n_layer: 4, n_head: 4, n_embd: 128, block_size: 64}
    data:       {source: tinyshakespeare, tokenizer: char}
    train:      {batch_size: 12, lr: 1.0e-3, max_iters: 2000}
    eval:       {interval: 250, iters: 20}
    checkpoint: {dir: checkpoints}
    system:     {device: cpu, dtype: float32, seed: 1337}
    logging:    {tensorboard: false}

Keys follow nanoGPT where it has one (``train.lr``, ``train.grad_accum_steps``,
``eval.interval``...). Unknown keys are errors that suggest the nearest valid key; values
are checked against each field's type and range. Command-line overrides are
``section.key=value`` strings whose value is parsed as YAML::

    cfg = load_config("configs/shakespeare_char.yaml", ["train.lr=3e-4", "model.n_layer=2"])
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import yaml

from .config_yaml import Loader, parse_yaml_value, yaml_error_text
from ..data.config import DataConfig
from ..nn.lm_config import ARCHS, GPTConfig, check_arch_fields

__all__ = ["Config", "ConfigError", "ModelConfig", "DataConfig", "TrainConfig", "EvalConfig",
           "CheckpointConfig", "SystemConfig", "LoggingConfig", "load_config",
           "config_from_dict", "apply_overrides", "parse_yaml_value", "config_to_yaml"]


class ConfigError(ValueError):
    """A config that cannot be used: the message names the key, the expected and the actual."""


@dataclass
class ModelConfig(GPTConfig):
    """GPTConfig's fields (nn/lm_config.py), defaults for a small CPU model; vocab: the data's."""

    block_size: int = 64  # these four: GPTConfig's fields, only their defaults differ
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    vocab_size: Optional[int] = None  # null: the tokenizer's vocabulary, padded to pad_vocab_to
    pad_vocab_to: int = 1  # round the vocabulary up to a multiple of this (64 for fast GEMMs)
    init_from: str = "scratch"  # scratch | a pretrained source (hf:gpt2, a Hugging Face folder, a run or .ckpt): its shape, tokenizer and weights

    def __post_init__(self) -> None:
        """Not GPTConfig's checks: ``validate``'s, naming each key as YAML spells it."""


@dataclass
class TrainConfig:
    """The optimisation: AdamW, nanoGPT's warm-up + cosine schedule, clipping, iterations."""

    batch_size: int = 12  # sequences per micro-batch
    grad_accum_steps: int = 1  # micro-batches per optimizer step (the effective batch is their product)
    max_iters: int = 2000  # optimizer steps in all
    lr: float = 1.0e-3  # peak learning rate, reached after warm-up
    min_lr: float = 1.0e-4  # the floor the cosine decays to (nanoGPT: lr / 10)
    warmup_iters: int = 100  # linear warm-up from lr / (warmup_iters + 1) to lr
    lr_decay_iters: Optional[int] = None  # where the cosine reaches min_lr; null: max_iters
    decay_lr: bool = True  # false: a constant lr
    weight_decay: float = 0.1  # AdamW's decoupled decay, on 2-D weights only
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.99  # AdamW's second-moment decay (0.95 for large models)
    eps: float = 1.0e-8  # AdamW's denominator guard
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 turns clipping off
    log_interval: int = 10  # a metrics line every this many iterations
    resume: bool = False  # continue from checkpoint.dir/run_name/last.ckpt


@dataclass
class EvalConfig:
    """Evaluation on held-out data while training."""

    interval: int = 250  # evaluate (and checkpoint) every this many iterations, and at the end
    iters: int = 20  # batches of train and of val averaged per evaluation
    batch_size: Optional[int] = None  # null: train.batch_size
    # HellaSwag's accuracy every this many iterations and at the end (evaluation/
    # hellaswag.py), into metrics.jsonl as "hellaswag" records; null: never
    hellaswag_interval: Optional[int] = None
    # a local jsonl in HellaSwag's format; null: the validation set (10,042 examples),
    # fetched once into the cache
    hellaswag_data: Optional[str] = None
    hellaswag_limit: Optional[int] = None  # score the first this many examples; null: all


@dataclass
class CheckpointConfig:
    """Where runs are written and what is kept."""

    dir: str = "checkpoints"  # runs are written under dir/run_name/
    run_name: Optional[str] = None  # null: the config file's name without .yaml
    always_save: bool = True  # save last.ckpt at every evaluation (best.ckpt only when val improves)


@dataclass
class SystemConfig:
    """The machine: device, precision, seeds and threads."""

    device: str = "cpu"  # cpu | cuda | cuda:N
    dtype: str = "float32"  # float32 | float64 | bf16 | fp16 (mixed precision: fp32 master
    # weights; fp16 with dynamic loss scaling, for GPUs without bf16 such as the T4)
    seed: int = 1337  # seeds weights, batches and dropout; same seed, same run
    # BLAS threads on the CPU; null: the library's default (under mpiexec: the cores shared
    # out among the ranks)
    threads: Optional[int] = None
    # under mpiexec: how long a rank waits in a collective for the others before it ends
    # the job
    dist_timeout_s: float = 300.0
    # the memory (GB) a run may take, checked against its estimate before anything is
    # allocated; null: what the device has free (MemAvailable on the CPU, the GPU's free
    # memory on cuda), or $MINITORCH_GPU_MEMORY_LIMIT_GB when set. --ignore-memory-check
    # skips the check
    memory_limit_gb: Optional[float] = None


@dataclass
class LoggingConfig:
    """What a run writes about itself besides metrics.jsonl (which it always writes)."""

    # also write the metrics as TensorBoard event files into run_dir/tensorboard/ (rank 0;
    # needs the tensorboard extra: pip install -e '.[tensorboard]')
    tensorboard: bool = False


@dataclass
class Config:
    """A whole run: one dataclass per YAML section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS: Dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig,
            "eval": EvalConfig, "checkpoint": CheckpointConfig, "system": SystemConfig,
            "logging": LoggingConfig}

CHOICES = {
    ("data", "source"): ("text_files", "python_stdlib", "tinyshakespeare", "hf_dataset"),
    ("data", "tokenizer"): ("char", "bpe", "file"),
    ("data", "val_split"): ("auto", "position", "documents"),
    ("system", "dtype"): ("float32", "float64", "bf16", "fp16"),
    ("model", "arch"): ARCHS,
}


# --- YAML ---------------------------------------------------------------------------------
def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False)


# --- building and checking -----------------------------------------------------------------
def _suggest(key: str, valid: Sequence[str], section: str = "") -> str:
    """"; did you mean 'train.lr'?" for the nearest valid key, or the list of valid keys."""
    dot = f"{section}." if section else ""
    near = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    return f"; did you mean '{dot}{near[0]}'?" if near else \
        f"; valid keys: {', '.join(dot + v for v in valid)}"


# nanoGPT's train.py names for the keys this config spells otherwise
NANOGPT_NAMES = {"learning_rate": "train.lr",
                 "gradient_accumulation_steps": "train.grad_accum_steps",
                 "eval_interval": "eval.interval", "eval_iters": "eval.iters",
                 "out_dir": "checkpoint.dir", "always_save_checkpoint": "checkpoint.always_save"}


def _suggest_home(key: str, section: str = "") -> str:
    """"; did you mean 'model.dropout'?" for a key written without its section or in
    another one: the sections that have a key of that name, or nanoGPT's name for it
    (``learning_rate``: ``train.lr``). Empty when there is none."""
    homes = [NANOGPT_NAMES[key]] if key in NANOGPT_NAMES else [
        f"{name}.{key}" for name, cls in SECTIONS.items()
        if name != section and key in {f.name for f in dataclasses.fields(cls)}]
    return f"; did you mean {' or '.join(repr(h) for h in homes)}?" if homes else ""


def _unknown_key_hint(key: str, section: str = "") -> str:
    """What to say after "unknown config key": the key's home in another section or in
    nanoGPT's spelling, else the nearest key of ``section`` (of the sections without one)."""
    valid = [f.name for f in dataclasses.fields(SECTIONS[section])] if section \
        else list(SECTIONS)
    return _suggest_home(key, section) or _suggest(key, valid, section)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin in (list, List):
        item = typing.get_args(tp)[0]
        return f"a list of {_PLURAL.get(item, _type_name(item))}"
    return {int: "an int", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, str(tp))


_PLURAL = {int: "ints", float: "numbers", bool: "booleans", str: "strings"}


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against the annotation ``tp``; ints widen to floats."""
    origin = typing.get_origin(tp)
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        if len(args) == 1:  # Optional[X]
            return _coerce(value, args[0], where)
        for arg in args:  # Union[str, List[str]]: a string, else a list of them
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} "
                          f"{value!r}")
    if origin in (list, List):
        item = typing.get_args(tp)[0]
        if value is None:
            return []  # null: no items
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]  # a single path where a list is allowed
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # a run name of 1, a device of 0...
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} "
                      f"{value!r}")


def _build_section(name: str, cls: type, values: Any) -> Any:
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"config section {name!r}: expected a mapping of keys to values, got "
                          f"{type(values).__name__} {values!r}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"unknown config key '{name}.{key}'"
                              f"{_unknown_key_hint(str(key), name)}")
        kwargs[key] = _coerce(value, hints[key], f"config key '{name}.{key}'")
    section = cls(**kwargs)
    section.given = frozenset(kwargs)  # the keys the YAML and --set gave (not a field)
    return section


def config_from_dict(raw: Any) -> Config:
    """A validated Config from a dict of sections (missing sections and keys take defaults)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"a config must be a mapping of sections ({', '.join(SECTIONS)}), "
                          f"got {type(raw).__name__}")
    for key in raw:
        if key not in SECTIONS:  # a flat, nanoGPT-style `batch_size: 12` names its section
            raise ConfigError(f"unknown config section {key!r}"
                              f"{_unknown_key_hint(str(key))}")
    cfg = Config(**{name: _build_section(name, cls, raw.get(name))
                    for name, cls in SECTIONS.items()})
    validate(cfg)
    return cfg


def _check(condition: bool, key: str, expected: str, actual: Any) -> None:
    if not condition:
        raise ConfigError(f"config key '{key}': expected {expected}, got {actual!r}")


def _model_key_error(key: str, message: str) -> None:
    """A broken rule of the model's shape (nn/lm_config.check_arch_fields), naming model.KEY."""
    raise ConfigError(f"config key 'model.{key}': {key} {message}")


def validate(cfg: Config) -> None:
    """ConfigError naming the key when a value is impossible."""
    for (section, key), options in CHOICES.items():
        value = getattr(getattr(cfg, section), key)
        if value not in options:
            near = difflib.get_close_matches(str(value), options, n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"config key '{section}.{key}': expected one of "
                              f"{', '.join(options)}, got {value!r}{hint}")
    m, d, t, e, s = cfg.model, cfg.data, cfg.train, cfg.eval, cfg.system
    for key in ("n_layer", "n_head", "n_embd", "block_size", "pad_vocab_to"):
        _check(getattr(m, key) >= 1, f"model.{key}", "an int >= 1", getattr(m, key))
    check_arch_fields(m, _model_key_error, vocab_optional=True)  # GPTConfig's rules
    _check(bool(m.init_from.strip()), "model.init_from", "scratch or a pretrained source",
           m.init_from)
    _check(0.0 <= m.dropout < 1.0, "model.dropout", "a number in [0, 1)", m.dropout)
    _check(d.max_chars is None or d.max_chars >= 1, "data.max_chars", "an int >= 1 or null",
           d.max_chars)
    _check(d.vocab_size >= 257 or d.tokenizer != "bpe", "data.vocab_size",
           "an int >= 257 for a byte-level BPE (256 bytes + merges)", d.vocab_size)
    _check(0.0 < d.val_fraction < 1.0, "data.val_fraction", "a number in (0, 1)",
           d.val_fraction)
    for key in ("tokenizer_sample_chars", "shard_tokens"):
        _check(getattr(d, key) >= 1, f"data.{key}", "an int >= 1", getattr(d, key))
    _check(d.workers is None or d.workers >= 0, "data.workers", "an int >= 0 or null",
           d.workers)
    if d.source == "text_files":
        _check(bool(d.path or d.paths), "data.path", "a file or glob for source text_files",
               d.path)
    else:
        _check(not isinstance(d.path, list), "data.path",
               f"a single path for source {d.source} (a list is for text_files)", d.path)
    if d.source == "hf_dataset":
        _check(bool(d.dataset or d.path), "data.dataset",
               "a dataset name (or data.path, a local file or saved dataset) for source "
               "hf_dataset", d.dataset)
    if d.tokenizer == "file":
        _check(bool(d.tokenizer_path), "data.tokenizer_path",
               "the path of a tokenizer.json for tokenizer: file", d.tokenizer_path)
    for key in ("batch_size", "grad_accum_steps", "max_iters", "log_interval"):
        _check(getattr(t, key) >= 1, f"train.{key}", "an int >= 1", getattr(t, key))
    for key in ("lr", "min_lr", "weight_decay", "grad_clip", "eps"):
        _check(getattr(t, key) >= 0.0, f"train.{key}", "a number >= 0", getattr(t, key))
    for key in ("lr", "min_lr", "weight_decay", "eps"):  # grad_clip: .inf means no clipping
        _check(math.isfinite(getattr(t, key)), f"train.{key}", "a finite number",
               getattr(t, key))
    _check(t.lr > 0, "train.lr", "a number > 0", t.lr)
    for key in ("beta1", "beta2"):
        _check(0.0 <= getattr(t, key) < 1.0, f"train.{key}", "a number in [0, 1)",
               getattr(t, key))
    _check(t.warmup_iters >= 0, "train.warmup_iters", "an int >= 0", t.warmup_iters)
    if t.decay_lr:  # the schedule: warm-up, then cosine from lr down to min_lr
        decay = t.max_iters if t.lr_decay_iters is None else t.lr_decay_iters
        if decay < t.warmup_iters:
            given = "" if t.lr_decay_iters is not None else \
                " (null, so train.max_iters); set train.lr_decay_iters or lower " \
                "train.warmup_iters"
            raise ConfigError(f"config key 'train.lr_decay_iters': expected an int >= "
                              f"train.warmup_iters ({t.warmup_iters}), got {decay}{given}")
        _check(t.min_lr <= t.lr, "train.min_lr",
               f"a number <= train.lr ({t.lr}), the rate the cosine decays from", t.min_lr)
    _check(e.interval >= 1, "eval.interval", "an int >= 1", e.interval)
    _check(e.iters >= 1, "eval.iters", "an int >= 1", e.iters)
    _check(e.batch_size is None or e.batch_size >= 1, "eval.batch_size", "an int >= 1 or null",
           e.batch_size)
    for key in ("hellaswag_interval", "hellaswag_limit"):
        value = getattr(e, key)
        _check(value is None or value >= 1, f"eval.{key}", "an int >= 1 or null", value)
    _check(e.hellaswag_data is None or bool(str(e.hellaswag_data).strip()),
           "eval.hellaswag_data", "a HellaSwag jsonl file or null", e.hellaswag_data)
    _check(bool(cfg.checkpoint.dir), "checkpoint.dir", "a directory", cfg.checkpoint.dir)
    run = cfg.checkpoint.run_name
    _check(run is None or (bool(run) and "/" not in run and run not in (".", "..")),
           "checkpoint.run_name", "a name without '/' (or null)", run)
    _check(re.fullmatch(r"cpu|cuda(:\d+)?", s.device) is not None, "system.device",
           "cpu, cuda or cuda:N", s.device)
    _check(s.seed >= 0, "system.seed", "an int >= 0", s.seed)
    _check(s.threads is None or s.threads >= 1, "system.threads", "an int >= 1 or null",
           s.threads)
    _check(s.dist_timeout_s > 0 and math.isfinite(s.dist_timeout_s), "system.dist_timeout_s",
           "a finite number of seconds > 0", s.dist_timeout_s)
    _check(s.memory_limit_gb is None or (s.memory_limit_gb > 0
                                         and math.isfinite(s.memory_limit_gb)),
           "system.memory_limit_gb", "a finite number of GB > 0 or null", s.memory_limit_gb)


def _is_text_field(cls: type, key: str) -> bool:
    """Whether ``cls.key`` holds a string (a name or a path), maybe null."""
    tp = typing.get_type_hints(cls)[key]
    return tp is str or (typing.get_origin(tp) is Union and str in typing.get_args(tp))


def apply_overrides(raw: Dict[str, Any], overrides: Sequence[str]) -> Dict[str, Any]:
    """``raw`` with each ``section.key=value`` applied (value parsed as YAML)."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in (raw or {}).items()}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value, e.g. "
                              f"train.lr=3e-4")
        dotted, text = item.split("=", 1)
        parts = dotted.strip().split(".")
        if len(parts) != 2 or not all(parts):
            hint = _suggest_home(parts[-1]) or ", e.g. train.lr=3e-4"
            raise ConfigError(f"override {item!r}: expected section.key=value{hint}")
        section, key = parts
        if section not in SECTIONS:
            raise ConfigError(f"override {item!r}: unknown config section {section!r}"
                              f"{_suggest(section, list(SECTIONS))}")
        valid = [f.name for f in dataclasses.fields(SECTIONS[section])]
        if key not in valid:
            raise ConfigError(f"override {item!r}: unknown config key '{section}.{key}'"
                              f"{_unknown_key_hint(key, section)}")
        try:
            value = parse_yaml_value(text)
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: "0x_" passes for an int
            raise ConfigError(f"override {item!r}: the value is not valid YAML "
                              f"({yaml_error_text(exc)})") from None
        if _is_text_field(SECTIONS[section], key) and value is not None \
                and not isinstance(value, (str, list, dict)):
            # a run name of 007, 1e3 or on: the text as typed, not YAML's 7, 1000.0 or True
            value = text.strip()
        target = raw.setdefault(section, {})
        if target is None:
            target = raw[section] = {}
        if not isinstance(target, dict):  # `train: 5` in the file
            raise ConfigError(f"config section {section!r}: expected a mapping of keys to "
                              f"values, got {type(target).__name__} {target!r}")
        target[key] = value
    return raw


def load_config(path: Union[str, Path], overrides: Sequence[str] = ()) -> Config:
    """The Config of a YAML file with ``overrides`` applied. ``checkpoint.run_name`` defaults
    to the file's name without its extension."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist"
                          if not path.exists() else f"config path {str(path)!r} is not a file")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: "0x_" passes for an int, or
        # the file is not UTF-8 text
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: "
                          f"{yaml_error_text(exc)}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"config file {str(path)!r}: expected a mapping of sections "
                          f"({', '.join(SECTIONS)}), got {type(raw).__name__}")
    try:
        cfg = config_from_dict(apply_overrides(raw or {}, overrides))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if cfg.checkpoint.run_name is None:
        cfg.checkpoint.run_name = path.stem
    return cfg
