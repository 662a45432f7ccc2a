"""Config: YAML into typed sections, overrides, and the errors for each kind of bad input."""
from __future__ import annotations

from pathlib import Path

import pytest

from minitorch_gpu.config import (Config, ConfigError, apply_overrides, config_from_dict,
                                  config_to_yaml, load_config, parse_yaml_value)

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_sections_become_typed_fields_and_the_run_is_named_after_the_file(tmp_path):
    path = write(tmp_path, "model:\n  n_layer: 2\ntrain:\n  lr: 3e-4\n  batch_size: 4\n",
                 "tiny_run.yaml")
    cfg = load_config(path)
    assert cfg.model.n_layer == 2 and cfg.model.n_head == 4  # given, and a default
    assert cfg.train.lr == 3e-4 and isinstance(cfg.train.lr, float)  # YAML 1.1 says str
    assert cfg.train.batch_size == 4
    assert cfg.checkpoint.run_name == "tiny_run"


def test_integers_widen_to_floats_and_a_single_path_to_a_list():
    cfg = config_from_dict({"train": {"lr": 1}, "data": {"source": "text_files",
                                                        "paths": "a.txt"}})
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert cfg.data.paths == ["a.txt"]


def test_overrides_are_parsed_as_yaml_and_win_over_the_file(tmp_path):
    path = write(tmp_path, "train:\n  lr: 1.0e-3\n")
    cfg = load_config(path, ["train.lr=3e-4", "model.n_layer=2", "model.bias=false",
                             "checkpoint.run_name=other", "train.lr_decay_iters=null"])
    assert cfg.train.lr == 3e-4 and cfg.model.n_layer == 2 and cfg.model.bias is False
    assert cfg.checkpoint.run_name == "other" and cfg.train.lr_decay_iters is None


@pytest.mark.parametrize("text, expected", [
    ("3e-4", 3e-4), ("1.5", 1.5), ("12", 12), ("true", True), ("null", None),
    ("cuda:0", "cuda:0"), ("[a, b]", ["a", "b"]), ("-1e3", -1000.0)])
def test_override_values_are_yaml(text, expected):
    assert parse_yaml_value(text) == expected


@pytest.mark.parametrize("raw, message", [
    # unknown keys, with the nearest valid key suggested
    ({"trian": {}}, r"unknown config section 'trian'; did you mean 'train'\?"),
    ({"train": {"lrr": 1e-3}}, r"unknown config key 'train.lrr'; did you mean 'train.lr'\?"),
    ({"model": {"nlayer": 2}}, r"did you mean 'model.n_layer'\?"),
    ({"train": {"zzzz": 1}}, r"unknown config key 'train.zzzz'; valid keys: train.batch_size"),
    # wrong types
    ({"train": {"lr": "fast"}}, r"'train.lr': expected a number, got str 'fast'"),
    ({"model": {"n_layer": 2.5}}, r"'model.n_layer': expected an int, got float 2.5"),
    ({"model": {"bias": "yes"}}, r"'model.bias': expected true or false, got str 'yes'"),
    ({"train": {"batch_size": True}}, r"'train.batch_size': expected an int, got bool"),
    ({"train": 5}, r"section 'train': expected a mapping"),
    # impossible values
    ({"model": {"n_embd": 130, "n_head": 4}},
     r"'model.n_embd': n_embd \(130\) must be divisible by model.n_head \(4\)"),
    ({"model": {"block_size": 0}}, r"'model.block_size': expected an int >= 1, got 0"),
    ({"train": {"batch_size": 0}}, r"'train.batch_size': expected an int >= 1, got 0"),
    ({"train": {"grad_accum_steps": 0}}, r"'train.grad_accum_steps': expected an int >= 1"),
    ({"train": {"lr": 0}}, r"'train.lr': expected a number > 0"),
    ({"train": {"beta2": 1.0}}, r"'train.beta2': expected a number in \[0, 1\)"),
    ({"model": {"dropout": 1.0}}, r"'model.dropout': expected a number in \[0, 1\)"),
    ({"train": {"warmup_iters": 500, "max_iters": 100}},
     r"'train.lr_decay_iters': expected an int >= train.warmup_iters \(500\), got 100"),
    ({"data": {"val_fraction": 0}}, r"'data.val_fraction': expected a number in \(0, 1\)"),
    ({"data": {"source": "tinyshakespear"}},
     r"'data.source': expected one of .*got 'tinyshakespear'; did you mean 'tinyshakespeare'"),
    ({"data": {"source": "text_files"}}, r"'data.path': expected a file or glob"),
    ({"data": {"tokenizer": "bpe", "vocab_size": 100}}, r"'data.vocab_size': expected an int >= 257"),
    ({"data": {"tokenizer": "file"}}, r"'data.tokenizer_path': expected the path"),
    ({"system": {"dtype": "fp8"}}, r"'system.dtype': expected one of float32, float64, bf16"),
    ({"system": {"device": "gpu"}}, r"'system.device': expected cpu, cuda or cuda:N, got 'gpu'"),
    ({"checkpoint": {"run_name": "a/b"}}, r"'checkpoint.run_name': expected a name without '/'"),
    ({"eval": {"iters": 0}}, r"'eval.iters': expected an int >= 1"),
])
def test_bad_configs_name_the_key_the_expected_and_the_actual(raw, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


@pytest.mark.parametrize("override, message", [
    ("train.lr", r"expected section.key=value"),
    ("lr=3e-4", r"expected section.key=value"),
    ("trainn.lr=1", r"unknown config section 'trainn'; did you mean 'train'"),
    ("train.rl=1", r"unknown config key 'train.rl'; did you mean 'train.lr'"),
    ("train.lr=[1", r"not valid YAML"),
])
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides({}, [override])


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config file '.*nope.yaml' does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(write(tmp_path, "model: [1,\n"))
    with pytest.raises(ConfigError, match="expected a mapping of sections"):
        load_config(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match=r"run.yaml: unknown config key 'model.layers'"):
        load_config(write(tmp_path, "model:\n  layers: 2\n"))


def test_the_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = load_config(ROOT / "configs" / "shakespeare_char.yaml", ["train.lr=3e-4"])
    again = load_config(write(tmp_path, config_to_yaml(cfg), "resolved.yaml"))
    assert again == cfg


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_shipped_config_loads(name):
    cfg = load_config(ROOT / "configs" / name)
    assert isinstance(cfg, Config) and cfg.checkpoint.run_name == name[:-5]


def test_the_shipped_recipes_are_nanogpts():
    baby = load_config(ROOT / "configs" / "shakespeare_char.yaml")
    assert (baby.model.n_layer, baby.model.n_head, baby.model.n_embd, baby.model.block_size,
            baby.train.batch_size, baby.model.dropout, baby.train.lr, baby.train.beta2,
            baby.train.warmup_iters, baby.train.max_iters, baby.train.lr_decay_iters,
            baby.train.min_lr, baby.eval.iters) == (4, 4, 128, 64, 12, 0.0, 1e-3, 0.99, 100,
                                                    2000, 2000, 1e-4, 20)
    gpu = load_config(ROOT / "configs" / "shakespeare_char_gpu.yaml")
    assert (gpu.model.n_layer, gpu.model.n_head, gpu.model.n_embd, gpu.model.block_size,
            gpu.train.batch_size, gpu.model.dropout, gpu.train.max_iters, gpu.system.dtype,
            gpu.system.device) == (6, 6, 384, 256, 64, 0.2, 5000, "bf16", "cuda")
