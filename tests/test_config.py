"""Config: YAML into typed sections, overrides, and the errors for each kind of bad input."""
from __future__ import annotations

from pathlib import Path

import pytest

from minitorch_gpu.train.config import (Config, ConfigError, apply_overrides, config_from_dict,
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
     r"'model.n_embd': n_embd \(130\) must be divisible by n_head \(4\)"),
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
    # the Llama's fields
    ({"model": {"arch": "lama"}}, r"'model.arch': expected one of gpt2, llama, got 'lama'; "
                                  r"did you mean 'llama'"),
    ({"model": {"n_kv_head": 2}}, r"'model.n_kv_head': n_kv_head \(2\) must be null \(or "
                                  r"n_head, 4\) under arch gpt2"),
    ({"model": {"ffn_hidden": 256}}, r"'model.ffn_hidden': ffn_hidden must be null under "
                                     r"arch gpt2"),
    ({"model": {"arch": "llama", "n_kv_head": 3}},
     r"'model.n_kv_head': n_kv_head \(3\) must divide n_head \(4\)"),
    ({"model": {"arch": "llama", "n_embd": 12, "n_head": 4}},
     r"'model.n_embd': n_embd // n_head, the head size 3, must be even"),
    ({"model": {"arch": "llama", "rope_theta": -1.0}},
     r"'model.rope_theta': rope_theta must be a positive number, got -1.0"),
    ({"model": {"arch": "llama", "ffn_hidden": 0}},
     r"'model.ffn_hidden': ffn_hidden must be a positive int or null, got 0"),
])
def test_bad_configs_name_the_key_the_expected_and_the_actual(raw, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


@pytest.mark.parametrize("override, message", [
    ("train.lr", r"expected section.key=value"),
    ("lr=3e-4", r"expected section.key=value"),
    ("trainn.lr=1", r"unknown config section 'trainn'; did you mean 'train'"),
    ("train.rl=1", r"unknown config key 'train.rl'; did you mean 'train.lr'"),
    ("train.lr=[1", r"not valid YAML \(line 1, column 3: expected ',' or '\]'"),
    ("train.max_iters=0x_", r"not valid YAML"),  # YAML's int pattern takes it, int() refuses
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


# --- what a nanoGPT / PyTorch user writes ------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    (".5e-3", 5e-4), (".5e3", 500.0), ("-.5", -0.5), ("+.5e3", 500.0), ("1_000", 1000)])
def test_numbers_with_a_leading_dot_or_an_unsigned_exponent_are_numbers(text, expected):
    value = parse_yaml_value(text)
    assert value == expected and isinstance(value, type(expected))


def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path):
    """YAML keeps the last of two equal keys silently: a second `lr:` lower in a long
    section would win unseen."""
    path = write(tmp_path, "train:\n  lr: 1.0e-3\n  batch_size: 4\n  lr: 3.0e-4\n")
    with pytest.raises(ConfigError, match=r"line 4, column 3: key 'lr' is given twice "
                                          r"\(first on line 2\)"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"key 'model' is given twice"):
        load_config(write(tmp_path, "model:\n  n_layer: 2\nmodel:\n  n_head: 2\n"))


@pytest.mark.parametrize("text", ["model: [1,\n", "model:\n  a: 1\n b: 2\n",
                                  "train:\n  lr: 1e-3\n  lr: 2e-3\n"])
def test_a_file_that_is_not_yaml_is_one_line_naming_the_place(tmp_path, text):
    with pytest.raises(ConfigError, match=r"is not valid YAML") as info:
        load_config(write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00model")
    with pytest.raises(ConfigError, match=r"binary.yaml' is not valid YAML: .*utf-8"):
        load_config(path)


@pytest.mark.parametrize("raw, message", [
    ({"train": {"lr": float("inf")}}, r"'train.lr': expected a finite number, got inf"),
    ({"train": {"weight_decay": float("inf")}}, r"'train.weight_decay': expected a finite"),
    ({"system": {"seed": -1}}, r"'system.seed': expected an int >= 0, got -1"),
    ({"train": {"lr": 1e-5, "min_lr": 1e-4}},
     r"'train.min_lr': expected a number <= train.lr \(1e-05\)"),
    ({"data": {"source": "tinyshakespeare", "path": ["a.txt", "b.txt"]}},
     r"'data.path': expected a single path for source tinyshakespeare"),
    ({"data": {"source": "text_files", "path": {"a": 1}}},
     r"'data.path': expected a string or a list of strings or null, got dict"),
    ({"data": {"paths": {"a": 1}}}, r"'data.paths': expected a list of strings, got"),
])
def test_more_impossible_values_name_the_key(raw, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


def test_a_warmup_longer_than_a_short_run_names_max_iters_and_needs_a_schedule():
    """`--set train.max_iters=10` on a config with warmup_iters 50 and lr_decay_iters null:
    the error says where 10 came from; with decay_lr false there is no schedule to break."""
    with pytest.raises(ConfigError, match=r"'train.lr_decay_iters': expected an int >= "
                                          r"train.warmup_iters \(50\), got 10 \(null, so "
                                          r"train.max_iters\); set train.lr_decay_iters"):
        config_from_dict({"train": {"max_iters": 10, "warmup_iters": 50}})
    cfg = config_from_dict({"train": {"max_iters": 10, "warmup_iters": 50, "decay_lr": False,
                                      "lr": 1e-5}})
    assert cfg.train.max_iters == 10


def test_data_path_takes_the_list_its_comment_promises_and_null_paths_is_none():
    cfg = config_from_dict({"data": {"source": "text_files", "path": ["a.txt", "b/*.txt"],
                                     "paths": None}})
    assert cfg.data.path == ["a.txt", "b/*.txt"] and cfg.data.paths == []


@pytest.mark.parametrize("override, expected", [
    ("checkpoint.run_name=007", "007"), ("checkpoint.run_name=1e3", "1e3"),
    ("checkpoint.run_name=on", "on"), ("checkpoint.run_name=1.10", "1.10"),
    ("checkpoint.run_name=null", "run")])
def test_a_string_override_keeps_the_text_as_typed(tmp_path, override, expected):
    """YAML reads 007 as 7, 1e3 as 1000.0 and on as true; a run name means the text."""
    cfg = load_config(write(tmp_path, "model: {n_layer: 2}\n"), [override])
    assert cfg.checkpoint.run_name == expected


def test_an_override_into_a_section_that_is_not_a_mapping_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"run.yaml: config section 'train': expected a "
                                          r"mapping of keys to values, got int 5"):
        load_config(write(tmp_path, "train: 5\n"), ["train.lr=1e-3"])


@pytest.mark.parametrize("raw, overrides, message", [
    ({}, ["batch_size=8"], r"override 'batch_size=8': expected section.key=value; did you "
                           r"mean 'train.batch_size' or 'eval.batch_size'\?"),
    ({}, ["learning_rate=3e-4"], r"expected section.key=value; did you mean 'train.lr'\?"),
    ({}, ["train.dropout=0.1"], r"unknown config key 'train.dropout'; did you mean "
                                r"'model.dropout'\?"),
    ({}, ["train.gradient_accumulation_steps=4"], r"did you mean 'train.grad_accum_steps'\?"),
    ({"max_iters": 100}, [], r"unknown config section 'max_iters'; did you mean "
                             r"'train.max_iters'\?"),
    ({"train": {"eval_interval": 50}}, [], r"unknown config key 'train.eval_interval'; did "
                                           r"you mean 'eval.interval'\?"),
])
def test_a_key_in_the_wrong_section_or_in_nanogpts_spelling_names_its_home(raw, overrides,
                                                                          message):
    """What a nanoGPT user types first: `--set batch_size=8`, `learning_rate`, a flat file."""
    with pytest.raises(ConfigError, match=message):
        config_from_dict(apply_overrides(raw, overrides))
