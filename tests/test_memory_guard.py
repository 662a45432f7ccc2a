"""The memory check before a model is built, the checkpoint's arrays against its metadata,
and out-of-memory errors as one line.

Sizes no machine can hold (10^9 layers, widths, positions or sequences) and a crafted
checkpoint claiming such a model go through the real CLI in a child process held to a
small address space (``RLIMIT_AS``): the refusal must come from arithmetic, before any
model is built, never from allocating. No test depends on this machine's free memory: where a
limit matters it is given (``system.memory_limit_gb`` or ``$MINITORCH_GPU_MEMORY_LIMIT_GB``).
"""
from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu import cli, nn
from minitorch_gpu.amp import autocast
from minitorch_gpu.backend import cpu
from minitorch_gpu.checkpoint import CheckpointError, save_checkpoint
from minitorch_gpu.train.config import ConfigError, load_config
from minitorch_gpu.data import CharTokenizer
from minitorch_gpu.pretrained.inference import load_for_inference
from minitorch_gpu.nn.memory import (LIMIT_VARIABLE, MemoryLimit, MemoryLimitError, Workload,
                                  check_gpt_arrays, check_memory, check_model_arrays,
                                  estimate_memory, format_bytes, gpt_parameter_count,
                                  gpt_state_count, gpt_state_shape, gpt_state_shapes,
                                  memory_limit, model_parameter_count, model_state_count,
                                  model_state_shape, model_state_shapes, workload)

ROOT = Path(__file__).resolve().parents[1]
HUGE = 10 ** 9
# the address space a refusing child may use: importing the package and its libraries
# with one BLAS thread peaks at about 135 MB of address space (VmPeak, measured on Linux
# x86-64 with NumPy's OpenBLAS); a GPT of 10^9 anything would need terabytes
CEILING = 512 << 20

CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, max_iters: 4, warmup_iters: 1, lr: 3.0e-3, log_interval: 2}}
eval: {{interval: 2, iters: 2}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7}}
"""

# the child: the CLI's own main() with every Module's construction counted, so a test can
# tell that a refusal came before any model was built (its last stdout line is the count)
COUNTED_MAIN = """\
import sys
from minitorch_gpu import cli
from minitorch_gpu.nn.module import Module
built = [0]
init = Module.__init__
def counted(self, *args, **kwargs):
    built[0] += 1
    init(self, *args, **kwargs)
Module.__init__ = counted
try:
    code = cli.main(sys.argv[1:])
finally:
    print(built[0])
sys.exit(code)
"""


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "corpus.txt").write_text("the king said good night to my lord.\n" * 200)
    (tmp_path / "tiny.yaml").write_text(CONFIG.format(corpus=tmp_path / "corpus.txt",
                                                      cache=tmp_path / "cache",
                                                      ckpts=tmp_path / "ckpts"))
    return tmp_path


def _env(**extra: str) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}
    return env


def _ceiling() -> None:  # runs in the child, before it execs Python
    resource.setrlimit(resource.RLIMIT_AS, (CEILING, CEILING))


def run_cli(*args: str, cwd: Path, limited: bool = False, counted: bool = False,
            env: dict = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``minitorch-gpu ARGS`` in a child process: with ``limited`` under CEILING, with
    ``counted`` through COUNTED_MAIN (its last stdout line is how many Modules were
    built)."""
    command = [sys.executable, "-c", COUNTED_MAIN] if counted else \
        [sys.executable, "-m", "minitorch_gpu"]
    return subprocess.run(command + [str(a) for a in args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env or _env(),
                          preexec_fn=_ceiling if limited else None)


def assert_one_line_refusal(done: subprocess.CompletedProcess, *phrases: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def tiny_gpt_checkpoint(path: Path, text: str = "abcdefgh \n", width: int = 8,
                        **claimed) -> nn.GPT:
    """A real checkpoint of a 1-layer GPT ``width`` wide over the characters of ``text``
    (every CRC valid) whose metadata claims the model_config fields in ``claimed``
    instead of the model's own."""
    tokenizer = CharTokenizer.from_text(text)
    config = nn.GPTConfig(block_size=width, vocab_size=tokenizer.vocab_size, n_layer=1,
                          n_head=2, n_embd=width)
    mt.manual_seed(0)
    model = nn.GPT(config)
    save_checkpoint(path, model.state_dict(), None,
                    {"model_config": {**dataclasses.asdict(config), **claimed},
                     "tokenizer": tokenizer.to_json(), "dtype": "float32"})
    return model


# --- the GPT's arrays from its shape ----------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_the_state_dict_is_derived_from_the_shape_alone(bias):
    config = nn.GPTConfig(block_size=8, vocab_size=11, n_layer=3, n_head=2, n_embd=8,
                          bias=bias)
    model = nn.GPT(config)
    state = model.state_dict()
    assert list(gpt_state_shapes(config)) == [(k, tuple(v.shape)) for k, v in state.items()]
    assert gpt_state_count(config) == len(state)
    assert gpt_parameter_count(config) == model.num_parameters()
    assert all(gpt_state_shape(config, key) == tuple(v.shape) for key, v in state.items())
    for key in ("transformer.h.3.ln_1.weight", "transformer.h.01.ln_1.weight",
                "transformer.h.0.attn.bias", "lm_head.bias"):
        assert gpt_state_shape(config, key) is None


def test_a_shape_of_a_billion_layers_is_counted_without_being_made():
    config = nn.GPTConfig(block_size=8, vocab_size=10, n_layer=HUGE, n_head=2, n_embd=8)
    assert gpt_state_count(config) == 5 + 12 * HUGE
    assert gpt_parameter_count(config) == 10 * 8 + 8 * 8 + HUGE * (12 * 64 + 13 * 8) + 16
    assert gpt_state_shape(config, f"transformer.h.{HUGE - 1}.mlp.c_fc.weight") == (32, 8)
    assert gpt_state_shape(config, f"transformer.h.{HUGE}.mlp.c_fc.weight") is None


@pytest.mark.parametrize("arch, fields", [
    ("llama", dict(n_kv_head=2)),
    ("llama", dict(n_kv_head=1, bias=True, tie_embeddings=True, ffn_hidden=24)),
    ("llama", dict(n_kv_head=4)),
    ("gpt2", dict(tie_embeddings=False)),
], ids=["llama-gqa", "llama-mqa-bias-tied", "llama-mha", "gpt2-untied"])
def test_every_architecture_s_state_dict_is_derived_from_the_shape_alone(arch, fields):
    config = nn.GPTConfig(arch=arch, block_size=8, vocab_size=11, n_layer=3, n_head=4,
                          n_embd=16, **fields)
    model = nn.model_for(config)
    state = model.state_dict()
    assert list(model_state_shapes(config)) == [(k, tuple(v.shape)) for k, v in state.items()]
    assert model_state_count(config) == len(state)
    assert model_parameter_count(config) == model.num_parameters()
    assert all(model_state_shape(config, key) == tuple(v.shape) for key, v in state.items())
    for key in ("model.layers.3.input_layernorm.weight", "model.layers.01.mlp.up_proj.weight",
                "transformer.h.0.ln_1.weight" if arch == "llama" else "model.norm.weight",
                "lm_head.bias"):
        assert model_state_shape(config, key) is None


def test_a_llama_of_a_billion_layers_is_counted_without_being_made():
    config = nn.LlamaConfig(block_size=8, vocab_size=10, n_layer=HUGE, n_head=4, n_kv_head=2,
                            n_embd=8, ffn_hidden=16)
    assert model_state_count(config) == 3 + 9 * HUGE
    # q, o: 8 x 8; k, v: 4 x 8; gate, up, down: 16 x 8; two norms; embed and lm_head untied
    assert model_parameter_count(config) == 2 * 10 * 8 + 8 + HUGE * (
        2 * 64 + 2 * 32 + 3 * 128 + 16)
    assert model_state_shape(config, f"model.layers.{HUGE - 1}.self_attn.k_proj.weight") == \
        (4, 8)
    assert model_state_shape(config, f"model.layers.{HUGE}.mlp.gate_proj.weight") is None


def test_a_workload_from_a_run_config_s_model_section_resolves_the_arch_defaults():
    from minitorch_gpu.train.config import ModelConfig
    section = ModelConfig(arch="llama", n_layer=2, n_head=4, n_embd=96, vocab_size=65)
    assert section.n_kv_head is None and section.ffn_hidden is None  # left to the arch
    work = workload("train", section, batch=2)
    resolved = nn.GPTConfig(arch="llama", block_size=64, vocab_size=65, n_layer=2, n_head=4,
                            n_embd=96)
    assert (work.arch, work.n_kv_head, work.ffn_hidden, work.bias, work.tie_embeddings) == \
        ("llama", 4, resolved.ffn_hidden, False, False) and work.ffn_hidden == 256
    assert estimate_memory(work).total == estimate_memory(workload("train", resolved,
                                                                   batch=2)).total
    gpt = workload("train", ModelConfig(n_layer=2, n_head=4, n_embd=96, vocab_size=65))
    assert (gpt.arch, gpt.n_kv_head, gpt.ffn_hidden, gpt.bias, gpt.tie_embeddings) == \
        ("gpt2", 4, 384, True, True)


# --- the estimate ---------------------------------------------------------------------
def test_the_estimate_of_a_tiny_gpt_is_its_hand_count():
    """n_layer 1, n_head 2, n_embd C = 8, block 4, vocab 10, batch 2, float32 on the CPU:
    every figure counted here from what the ops keep."""
    C, H, T, V, B = 8, 2, 4, 10, 2
    estimate = estimate_memory(Workload("train", 1, H, C, T, V, batch=B))
    params = V * C + T * C + (12 * C * C + 13 * C) + 2 * C  # wte (= lm_head), wpe, block, ln_f
    assert params == 1000
    tokens = B * T
    per_token = (C * 4 + 2 * 4  # ln_1: its input and (mean, rstd)
                 + C * 4 + 3 * C * 4  # c_attn's input, the q, k, v it made
                 + C * 4  # c_proj's input
                 + C * 4 + 2 * 4  # ln_2
                 + C * 4 + 4 * C * 4  # c_fc's input, GELU's local derivative
                 + 4 * C * 4)  # the MLP's c_proj's input
    probabilities = B * H * T * T * 4  # the full path's (B, nh, T, T), saved
    top = tokens * (3 * 8 + C * 4 + 2 * 4 + C * 4)  # ids, ln_f, lm_head's input
    gradients_in_flight = tokens * (2 * C * 4 + 3 * C * 4)
    transient = max(B * H * T * T * 4, tokens * 12 * C * 4)  # scores vs GELU's buffers
    assert estimate.parts == {
        "parameters": 4 * params, "gradients": 4 * params, "AdamW": 4 * 4 * params,
        "activations": tokens * per_token + probabilities + top + gradients_in_flight
        + transient,
        "logits": tokens * V * (4 + 4 + 4)}  # logits, probabilities, their gradient
    assert estimate.total == 34560
    generation = estimate_memory(Workload("generate", 1, H, C, T, V))
    assert generation.parts["KV cache"] == 2 * 1 * 1 * T * C * 4  # keys and values, (1, nh, T, hs)


@pytest.mark.parametrize("shape, dtype, dropout", [
    ((2, 4, 64, 128, 65, 4), "float32", 0.0),
    ((2, 4, 64, 128, 65, 4), "bf16", 0.0),
    ((1, 2, 64, 64, 65, 4), "float32", 0.1),
    ((1, 2, 32, 32, 3000, 8), "float32", 0.0),  # the logits dominate
], ids=["float32", "bf16", "dropout", "vocab"])
def test_the_estimate_bounds_the_peak_of_real_training_steps(shape, dtype, dropout):
    """NumPy reports its allocations to tracemalloc: the peak of building the model and
    two AdamW steps (the second with the optimizer's state in place) is below the
    estimate, and not far below: within a factor of two. (tracemalloc also counts the
    Python objects made meanwhile, a few hundred kB the estimate leaves out: hence 0.9.)"""
    L, H, C, T, V, B = shape
    peak = _training_peak(nn.GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H,
                                       n_embd=C, dropout=dropout), B, dtype)
    estimate = estimate_memory(Workload("train", L, H, C, T, V, batch=B, dtype=dtype,
                                        dropout=dropout)).total
    assert 0.9 * peak <= estimate <= 2 * peak, (format_bytes(peak), format_bytes(estimate))


def _training_peak(config, B: int, dtype: str) -> int:
    """tracemalloc's peak of building the model of ``config`` and two AdamW steps on a
    batch of B random sequences (under bf16 autocast for ``dtype`` bf16). A one-layer
    model of the same kind takes the steps first, untraced, so what happens once per
    process (the CPU kernels' first compile, say) is not counted, whatever ran before."""
    _train_two_steps(dataclasses.replace(config, n_layer=1), B, dtype)
    tracemalloc.start()
    try:
        _train_two_steps(config, B, dtype)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _train_two_steps(config, B: int, dtype: str) -> None:
    mt.manual_seed(0)
    rng = np.random.default_rng(0)
    x, y = (mt.tensor(rng.integers(0, config.vocab_size, (B, config.block_size)))
            for _ in range(2))
    model = nn.model_for(config)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99))
    for _ in range(2):
        with autocast("bf16", enabled=dtype == "bf16"):
            _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("shape, dtype, dropout, tie", [
    ((2, 4, 2, 128, 64, 65, 4), "float32", 0.0, None),
    ((2, 4, 2, 128, 64, 65, 4), "bf16", 0.0, None),
    ((1, 2, 1, 64, 64, 65, 4), "float32", 0.1, None),
    ((1, 2, 2, 32, 32, 3000, 8), "float32", 0.0, None),  # the logits dominate
    ((2, 4, 1, 128, 128, 65, 4), "float32", 0.0, True),  # multi-query, tied head
], ids=["float32", "bf16", "dropout", "vocab", "mqa-tied"])
def test_the_estimate_bounds_the_peak_of_real_llama_training_steps(shape, dtype, dropout,
                                                                   tie):
    """As for the GPT: the tracemalloc peak of building a Llama and two AdamW steps."""
    L, H, Hkv, C, T, V, B = shape
    config = nn.LlamaConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_kv_head=Hkv,
                            n_embd=C, dropout=dropout, tie_embeddings=tie)
    peak = _training_peak(config, B, dtype)
    estimate = estimate_memory(workload("train", config, batch=B, dtype=dtype)).total
    assert 0.9 * peak <= estimate <= 2 * peak, (format_bytes(peak), format_bytes(estimate))


def test_the_estimate_bounds_the_peak_of_llama_generation():
    L, H, Hkv, C, T, V = 2, 4, 2, 128, 256, 500
    mt.manual_seed(0)
    config = nn.LlamaConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_kv_head=Hkv,
                            n_embd=C)
    tracemalloc.start()
    try:
        model = nn.Llama(config).eval()
        model.generate(mt.tensor([[1, 2, 3]]), T + 5, 1.0, top_k=200)  # past the window
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    estimate = estimate_memory(workload("generate", config))
    assert estimate.parts["KV cache"] == 2 * L * T * Hkv * (C // H) * 4  # n_kv_head heads
    assert 0.9 * peak <= estimate.total <= 2 * peak, (format_bytes(peak),
                                                      format_bytes(estimate.total))


def test_the_estimate_bounds_the_peak_of_generation():
    L, H, C, T, V = 2, 4, 128, 256, 500
    mt.manual_seed(0)
    tracemalloc.start()
    try:
        model = nn.GPT(nn.GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H,
                                    n_embd=C)).eval()
        model.generate(mt.tensor([[1, 2, 3]]), T + 5, 1.0, top_k=200)  # past the window
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    estimate = estimate_memory(Workload("generate", L, H, C, T, V)).total
    assert 0.9 * peak <= estimate <= 2 * peak, (format_bytes(peak), format_bytes(estimate))


def test_the_refusal_names_the_estimate_the_limit_and_what_drives_it():
    work = Workload("train", 1000, 16, 1024, 1024, 50304, batch=64)
    names = {"n_layer": "model.n_layer", "n_embd": "model.n_embd",
             "block_size": "model.block_size", "batch": "train.batch_size",
             "vocab_size": "model.vocab_size"}
    with pytest.raises(MemoryLimitError) as info:
        check_memory(estimate_memory(work), MemoryLimit(22_800_000_000, "available"), names)
    message = str(info.value)
    assert message.startswith("the model and one micro-batch need about ")
    assert "over the 22.8 GB available; lower them, or pass --ignore-memory-check" in message
    assert "model.n_layer=1000, model.n_embd=1024, model.block_size=1024, " \
           "train.batch_size=64" in message
    assert "model.vocab_size" not in message  # halving it would save little
    assert "\n" not in message
    check_memory(estimate_memory(work), MemoryLimit(10 ** 15, "available"), names)  # fits


def test_an_evaluation_batch_larger_than_the_training_batch_is_what_counts():
    train = Workload("train", 1, 2, 16, 64, 20000, batch=1)
    assert estimate_memory(train).what == "the model and one micro-batch need"
    evaluation = estimate_memory(dataclasses.replace(train, eval_batch=64))
    assert evaluation.what == "the model and one evaluation batch need"
    assert evaluation.total > estimate_memory(train).total


def test_the_limit_is_the_config_key_then_the_variable_then_the_device(monkeypatch):
    monkeypatch.setenv(LIMIT_VARIABLE, "2.5")
    assert memory_limit(cpu, 1.5) == MemoryLimit(1_500_000_000, "set by system.memory_limit_gb")
    assert memory_limit(cpu) == MemoryLimit(2_500_000_000, f"set by ${LIMIT_VARIABLE}")
    monkeypatch.setenv(LIMIT_VARIABLE, "lots")
    with pytest.raises(ValueError, match=f"{LIMIT_VARIABLE}: expected a number of GB > 0"):
        memory_limit(cpu)
    monkeypatch.delenv(LIMIT_VARIABLE)
    free = memory_limit(cpu)  # whatever this machine has: only its form is checked
    assert free.bytes > 0 and free.source


def test_the_cpu_counts_an_address_space_limit_as_memory():
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
            "from minitorch_gpu.backend import cpu; print(*cpu.free_memory(), sep='|')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), timeout=120)
    room, source = done.stdout.strip().split("|")
    assert 0 < int(room) < 1 << 30 and source == "left under the address-space limit (ulimit -v)"


@pytest.mark.parametrize("value", [0, -1, ".inf", "lots"])
def test_the_config_key_is_checked(workdir, value):
    with pytest.raises(ConfigError, match="system.memory_limit_gb"):
        load_config(workdir / "tiny.yaml", [f"system.memory_limit_gb={value}"])


def test_format_bytes():
    assert [format_bytes(n) for n in (512, 41_234_000_000, 3 * 10 ** 15, 48 * 10 ** 18,
                                      10 ** 30)] == ["512 B", "41.2 GB", "3.0 PB", "48.0 EB",
                                                     "1e+12 EB"]


# --- absurd sizes through the CLI -------------------------------------------------------
@pytest.mark.parametrize("setting", ["model.n_layer", "model.n_embd", "model.block_size",
                                     "train.batch_size"])
def test_absurd_sizes_are_refused_before_building_under_a_small_memory_ceiling(workdir,
                                                                               setting):
    done = run_cli("train", "tiny.yaml", "--set", f"{setting}={HUGE}", cwd=workdir,
                   limited=True, counted=True, env=_env(**{LIMIT_VARIABLE: "8"}))
    assert_one_line_refusal(done, "minitorch-gpu train: error: the model and one "
                                  "micro-batch need about", f"{setting}={HUGE}",
                            f"over the 8.0 GB set by ${LIMIT_VARIABLE}",
                            "--ignore-memory-check")
    assert done.stdout.strip().splitlines()[-1] == "0"  # refused before building a model
    assert not (workdir / "cache").exists()  # refused before the data was read


def test_the_counting_child_counts_the_modules_a_command_builds(workdir):
    """The control for the refusals' zero: the same child, not refused, counts the model's
    Modules (a GPT of one layer is more than a dozen)."""
    done = run_cli("profile", "tiny.yaml", "--iters", "1", "--warmup", "0", cwd=workdir,
                   counted=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip().splitlines()[-1]) > 10


def test_profile_refuses_an_absurd_size_before_building(workdir):
    done = run_cli("profile", "tiny.yaml", "--set", f"model.n_layer={HUGE}", cwd=workdir,
                   limited=True, counted=True, env=_env(**{LIMIT_VARIABLE: "8"}))
    assert_one_line_refusal(done, "the model and one forward pass need about",
                            f"model.n_layer={HUGE}")
    assert done.stdout.strip().splitlines()[-1] == "0"  # refused before building a model


# --- the checkpoint's arrays against its metadata ----------------------------------------
@pytest.mark.parametrize("claimed", [dict(n_layer=HUGE), dict(n_embd=HUGE),
                                     dict(block_size=HUGE), dict(vocab_size=HUGE)],
                         ids=["n_layer", "n_embd", "block_size", "vocab_size"])
def test_a_crafted_checkpoint_claiming_a_huge_model_is_refused_in_one_line(tmp_path,
                                                                          claimed):
    tiny_gpt_checkpoint(tmp_path / "crafted.ckpt", **claimed)
    done = run_cli("generate", "crafted.ckpt", cwd=tmp_path, limited=True, counted=True)
    (key, value), = claimed.items()
    assert_one_line_refusal(done, "minitorch-gpu generate: error: crafted.ckpt: the weights "
                                  "do not fit the model it describes", f"{key} {value}",
                            "but the whole file is")
    assert done.stdout.strip().splitlines()[-1] == "0"  # refused before building a model


@pytest.mark.parametrize("claimed, width, message", [
    (dict(n_layer=HUGE), 16, f"holds a model with n_layer {HUGE}; the config asks for "
                             "n_layer 1"),
    (dict(n_embd=16, block_size=16), 8, "the weights do not fit the model it describes "
                                        "(the metadata describes a GPT (n_layer 1, n_head 2, "
                                        "n_embd 16, block_size 16, vocab_size 18)"),
], ids=["n_layer", "arrays"])
def test_resuming_from_a_crafted_checkpoint_is_refused_before_its_arrays_are_read(
        workdir, claimed, width, message):
    """last.ckpt claims the config's model with 10^9 layers, or claims the config's model
    exactly while holding a narrower one's arrays."""
    run_dir = workdir / "ckpts" / "tiny"
    run_dir.mkdir(parents=True)
    tiny_gpt_checkpoint(run_dir / "last.ckpt", (workdir / "corpus.txt").read_text(), width,
                        **claimed)
    done = run_cli("train", "tiny.yaml", "--resume", cwd=workdir, limited=True,
                   env=_env(**{LIMIT_VARIABLE: "8"}))
    assert_one_line_refusal(done, "minitorch-gpu train: error: train.resume: ", message)


def _table(model: nn.GPT, **changes):
    table = {key: (np.dtype(v.dtype), tuple(v.shape)) for key, v in model.state_dict().items()}
    for key, value in changes.items():
        if value is None:
            del table[key]
        else:
            table[key] = value
    return table


@pytest.mark.parametrize("changes, dtype, message", [
    ({"transformer.h.0.mlp.c_proj.bias": None}, np.float32,
     "of 17 arrays, the file holds 16: 'transformer.h.0.mlp.c_proj.bias' is missing"),
    ({"transformer.h.1.ln_1.weight": (np.dtype(np.float32), (8,))}, np.float32,
     "of 17 arrays, the file holds 18: 'transformer.h.1.ln_1.weight' is not one of its"),
    ({"transformer.wpe.weight": (np.dtype(np.float32), (9, 8))}, np.float32,
     r"transformer.wpe.weight is \(9, 8\) in the file, \(8, 8\) in a GPT"),
    ({"transformer.ln_f.bias": (np.dtype(np.float64), (8,))}, np.float32,
     "transformer.ln_f.bias is float64 in the file, float32 by the metadata's dtype"),
    ({"transformer.ln_f.bias": (np.dtype(np.int32), (8,))}, None,
     "transformer.ln_f.bias is int32 in the file, expected a floating dtype"),
], ids=["missing", "extra", "shape", "dtype", "not-float"])
def test_the_array_table_check_names_what_differs(changes, dtype, message):
    config = nn.GPTConfig(block_size=8, vocab_size=10, n_layer=1, n_head=2, n_embd=8)
    table = _table(nn.GPT(config), **changes)
    with pytest.raises(ValueError, match=message):
        check_gpt_arrays(config, dtype, table, 10 ** 9)
    check_gpt_arrays(config, np.float32, _table(nn.GPT(config)), 10 ** 9)  # the real one


@pytest.mark.parametrize("changes, message", [
    ({"model.layers.0.self_attn.k_proj.weight": (np.dtype(np.float32), (8, 8))},
     r"model.layers.0.self_attn.k_proj.weight is \(8, 8\) in the file, \(4, 8\) in a Llama "
     r"\(n_layer 1, n_head 4, n_kv_head 2, n_embd 8, ffn_hidden 64, block_size 8, "
     r"vocab_size 10\)"),
    ({"lm_head.weight": None},
     "describes a Llama .* of 12 arrays, the file holds 11: 'lm_head.weight' is missing"),
    ({"transformer.wpe.weight": (np.dtype(np.float32), (8, 8))},
     "of 12 arrays, the file holds 13: 'transformer.wpe.weight' is not one of its arrays"),
], ids=["kv-shape", "missing-head", "a-gpt-array"])
def test_the_array_table_check_knows_a_llama(changes, message):
    config = nn.LlamaConfig(block_size=8, vocab_size=10, n_layer=1, n_head=4, n_kv_head=2,
                            n_embd=8)
    with pytest.raises(ValueError, match=message):
        check_model_arrays(config, np.float32, _table(nn.Llama(config), **changes), 10 ** 9)
    check_model_arrays(config, np.float32, _table(nn.Llama(config)), 10 ** 9)  # the real one
    with pytest.raises(ValueError, match="the metadata describes a Llama .* but the whole "
                                         "file is"):
        check_model_arrays(config, np.float32, _table(nn.Llama(config)), 100)


def test_a_checkpoint_whose_arrays_are_another_models_is_refused_before_loading(tmp_path):
    """The metadata says 2 layers, the file holds a 1-layer model's arrays (and enough
    bytes for 2 layers' parameters, padded by an optimizer state): named, one line."""
    tokenizer = CharTokenizer.from_text("abcdefgh \n")
    small = nn.GPT(nn.GPTConfig(block_size=8, vocab_size=tokenizer.vocab_size, n_layer=1,
                                n_head=2, n_embd=8))
    claimed = nn.GPTConfig(block_size=8, vocab_size=tokenizer.vocab_size, n_layer=2,
                           n_head=2, n_embd=8)
    save_checkpoint(tmp_path / "x.ckpt", small.state_dict(), {"padding": np.zeros(10_000)},
                    {"model_config": dataclasses.asdict(claimed),
                     "tokenizer": tokenizer.to_json(), "dtype": "float32"})
    with pytest.raises(CheckpointError, match="of 29 arrays, the file holds 17: "
                                              "'transformer.h.1.ln_1.weight' is missing"):
        load_for_inference(tmp_path / "x.ckpt")


def test_the_memory_check_of_a_checkpoint_runs_before_its_arrays_are_read(tmp_path,
                                                                        monkeypatch):
    tiny_gpt_checkpoint(tmp_path / "ok.ckpt")
    read = []
    import minitorch_gpu.checkpoint.load as checkpoint_load
    real = checkpoint_load.read_tensor
    monkeypatch.setattr(checkpoint_load, "read_tensor",
                        lambda file, header, name: read.append(name) or
                        real(file, header, name))

    def refuse(config, meta):
        assert config.n_layer == 1 and meta["dtype"] == "float32" and not read
        raise MemoryLimitError("too big")

    with pytest.raises(MemoryLimitError, match="too big"):
        load_for_inference(tmp_path / "ok.ckpt", check_memory=refuse)
    assert read == []


# --- the override -------------------------------------------------------------------------
def test_the_flag_lets_a_run_the_limit_refuses_go_ahead(workdir):
    tight = ("--set", "system.memory_limit_gb=0.000001")  # 1 kB
    refused = run_cli("train", "tiny.yaml", *tight, cwd=workdir)
    assert_one_line_refusal(refused, "over the 1.0 kB set by system.memory_limit_gb")
    done = run_cli("train", "tiny.yaml", *tight, "--overwrite", "--ignore-memory-check",
                   cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert (workdir / "ckpts" / "tiny" / "last.ckpt").exists()

    tight_env = _env(**{LIMIT_VARIABLE: "0.000001"})
    run_dir = workdir / "ckpts" / "tiny"
    refused = run_cli("generate", run_dir, "--max-new-tokens", "5", cwd=workdir,
                      env=tight_env)
    assert_one_line_refusal(refused, "minitorch-gpu generate: error: ",
                            f"over the 1.0 kB set by ${LIMIT_VARIABLE}",
                            "pass --ignore-memory-check")
    done = run_cli("generate", run_dir, "--max-new-tokens", "5", "--ignore-memory-check",
                   cwd=workdir, env=tight_env)
    assert done.returncode == 0 and len(done.stdout) > 1, done.stderr


def test_a_refused_first_run_leaves_no_run_directory_and_a_refused_rerun_keeps_its_run(
        workdir):
    tight = ("--set", "system.memory_limit_gb=0.000001")  # 1 kB
    run_dir = workdir / "ckpts" / "tiny"
    refused = run_cli("train", "tiny.yaml", *tight, cwd=workdir)
    assert_one_line_refusal(refused, "over the 1.0 kB set by system.memory_limit_gb")
    assert not run_dir.exists()
    assert (workdir / "ckpts").is_dir()  # checkpoint.dir itself may hold other runs
    done = run_cli("train", "tiny.yaml", cwd=workdir)
    assert done.returncode == 0, done.stderr
    before = sorted(p.name for p in run_dir.iterdir())
    refused = run_cli("train", "tiny.yaml", *tight, "--overwrite", cwd=workdir)
    assert_one_line_refusal(refused, "over the 1.0 kB set by system.memory_limit_gb")
    assert sorted(p.name for p in run_dir.iterdir()) == before


# --- MemoryError as one line ----------------------------------------------------------------
def test_an_allocation_past_the_ceiling_in_train_is_one_line(workdir):
    """--ignore-memory-check lets a 40,000-wide model through; the first weight matrix
    (120000 x 40000 floats) is past the child's address space."""
    done = run_cli("train", "tiny.yaml", "--set", "model.n_embd=40000",
                   "--ignore-memory-check", cwd=workdir, limited=True)
    assert_one_line_refusal(done, "minitorch-gpu train: out of memory: Unable to allocate")


@pytest.mark.parametrize("command, target, argv", [
    ("generate", "minitorch_gpu.pretrained.load_pretrained", ["generate", "x.ckpt"]),
    ("prepare", "minitorch_gpu.data.prepare", ["prepare", "tiny.yaml"]),
    ("bench", "minitorch_gpu.bench.runner.run_bench", ["bench", "--quick", "--ignore-memory-check"]),
])
def test_a_memory_error_in_any_command_is_one_line(workdir, monkeypatch, capsys, command,
                                                   target, argv):
    def out_of_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.45 GiB for an array with shape (1000000000, "
                          "2) and data type float32")

    module, name = target.rsplit(".", 1)
    monkeypatch.setattr(sys.modules[module] if module in sys.modules else
                        __import__(module, fromlist=[name]), name, out_of_memory)
    monkeypatch.chdir(workdir)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"minitorch-gpu {command}: out of memory: "
                                               "Unable to allocate 7.45 GiB"), err
