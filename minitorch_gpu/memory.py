"""How much memory a GPT run will take, counted from its shape before anything is allocated.

A command that builds a GPT first estimates the bytes it is about to hold and compares
them with the memory this device has free; an estimate over it stops the command with one
line naming the estimate, the limit and the settings that drive it::

    workload = Workload(task="train", n_layer=1000, n_head=16, n_embd=1024, block_size=1024,
                        vocab_size=50304, batch=64)
    estimate = estimate_memory(workload)      # Python ints only: instant for any size
    check_memory(estimate, memory_limit(backend), names={"n_layer": "model.n_layer"})

Everything is arithmetic on Python ints, so an absurd size (``n_layer`` 10^9) is refused in
microseconds, never by allocating until the machine runs out. The count follows what the
code keeps (``nn/gpt.py``, ``ops/``, ``optim/``), per layer, and errs on the high side:

* parameters: P = V C + T_max C + L (12 C^2 + 13 C) + 2 C with biases (L (12 C^2 + 2 C) + C
  without), the tied ``wte``/``lm_head`` matrix once; bytes w = 4 (float32, and bf16 mixed
  precision, whose master weights are float32) or 8 (float64);
* gradients: P w, one ``.grad`` per parameter (2 P w under data parallelism: the flat
  all-reduce buffer);
* AdamW: 4 P w, its two moments and the flat gradient and step arrays its update runs in
  (``optim/flat.py``);
* activations of one micro-batch, what forward saves for backward, per layer and token:
  the two layer norms' inputs on the residual stream (2 C w) and row statistics (4 f),
  the inputs of the four linears (C, C, C and 4 C, in the activation dtype a: 2 bytes
  under bf16 autocast, else w), the packed q, k, v (3 C a), GELU's local derivative in
  float32 (4 C f); with dropout a one-byte mask per dropped element; plus the attention's
  own: the (B, nh, T, T) probabilities in a on the full path (the CPU below ``TILED_FROM``
  = 1,024 keys, or with dropout; CUDA's dense path within ``DENSE_MAX_BYTES``), or the
  float32 output and log-sum-exp on the tiled (CPU) and flash (CUDA) paths. Then the
  largest transient of one layer (the float32 (B, nh, T, T) scores or their gradient on
  the full and dense paths, else GELU's float32 buffers, 12 C f per token) and the
  residual stream's gradients; under bf16 the bf16 copies of the linear weights, which
  the products save. f is 4 bytes (8 for float64): the width layer norm, softmax and GELU
  compute in;
* logits and the loss: B T V (a + 2 f): the logits, the loss's float32 probabilities and
  their gradient;
* generation: the KV cache, 2 L B T_max C w, one forward pass of a whole window (no
  saved activations: the larger of a layer's attention and MLP buffers), the last
  position's logits and the sampler's sort;
* building the model (on the host): the parameters, ``lm_head``'s own matrix until it
  is tied to ``wte``'s and the draw that initialises the largest matrix (3 V C w for a
  large vocabulary), and a checkpoint's arrays, read before the model takes them (P w).

The estimate is the largest of building the model and running it (for training, the
larger of a micro-batch and an evaluation batch, ``eval.batch_size``). It is about 1.0 to
1.5 times the peak of real CPU runs (tracemalloc's, in ``tests/test_memory_guard.py``);
the process's own code and libraries (about 100 MB) are not counted.

The memory available is the device's: on the CPU ``MemAvailable`` from /proc/meminfo
(``os.sysconf`` elsewhere), lowered by a cgroup's limit or an address-space limit
(``ulimit -v``) when one is set; on CUDA the GPU's free memory (``memGetInfo``) plus what
CuPy's pool holds unused. ``system.memory_limit_gb`` or the environment variable
``MINITORCH_GPU_MEMORY_LIMIT_GB`` replaces it with a fixed number.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

import numpy as np

from .backend import dtypes
from .ops.attention import DENSE_MAX_BYTES, TILED_FROM

__all__ = ["Workload", "MemoryEstimate", "MemoryLimit", "MemoryLimitError",
           "estimate_memory", "memory_limit", "check_memory", "workload", "check_workload",
           "format_bytes",
           "gpt_state_shapes", "gpt_state_shape", "gpt_state_count", "gpt_parameter_count",
           "check_gpt_arrays", "LIMIT_VARIABLE"]

LIMIT_VARIABLE = "MINITORCH_GPU_MEMORY_LIMIT_GB"  # a fixed limit in GB, for every command
GB = 10 ** 9  # decimal, as system.memory_limit_gb and the messages count

TASKS = ("train", "forward", "forward+backward", "generate")
# what each task holds, as the messages say it
_WHAT = {"train": "the model and one micro-batch need",
         "eval": "the model and one evaluation batch need",
         "forward": "the model and one forward pass need",
         "forward+backward": "the model and one forward and backward pass need",
         "generate": "the model and its KV cache need", "build": "building the model needs"}
_TILE = 128 * 256  # attention_tiled.py's (block_q, block_k) tile


class MemoryLimitError(RuntimeError):
    """The estimate of what a command would allocate is over the memory available."""


# --- the arrays of a GPT, from its shape -------------------------------------------------
# one block's state dict: (name, shape as multiples of n_embd, a bias?), in state-dict order
_LAYER = (("ln_1.weight", (1,), False), ("ln_1.bias", (1,), True),
          ("attn.c_attn.weight", (3, 1), False), ("attn.c_attn.bias", (3,), True),
          ("attn.c_proj.weight", (1, 1), False), ("attn.c_proj.bias", (1,), True),
          ("ln_2.weight", (1,), False), ("ln_2.bias", (1,), True),
          ("mlp.c_fc.weight", (4, 1), False), ("mlp.c_fc.bias", (4,), True),
          ("mlp.c_proj.weight", (1, 4), False), ("mlp.c_proj.bias", (1,), True))
_LAYER_KEY = re.compile(r"transformer\.h\.(0|[1-9][0-9]*)\.(.+)\Z")


def _layer_arrays(bias: bool) -> Dict[str, Tuple[int, ...]]:
    return {name: factors for name, factors, is_bias in _LAYER if bias or not is_bias}


def gpt_state_shapes(config: Any) -> Iterator[Tuple[str, Tuple[int, ...]]]:
    """(key, shape) of every entry of ``GPT(config).state_dict()``, in its order, made
    lazily (a GPT of 10^9 layers costs nothing until iterated). ``config``: anything with
    GPTConfig's fields."""
    C, V = config.n_embd, config.vocab_size
    yield "transformer.wte.weight", (V, C)
    yield "transformer.wpe.weight", (config.block_size, C)
    layer = _layer_arrays(config.bias)
    for i in range(config.n_layer):
        for name, factors in layer.items():
            yield f"transformer.h.{i}.{name}", tuple(k * C for k in factors)
    yield "transformer.ln_f.weight", (C,)
    if config.bias:
        yield "transformer.ln_f.bias", (C,)
    yield "lm_head.weight", (V, C)  # the same array as wte's


def gpt_state_shape(config: Any, key: str) -> Optional[Tuple[int, ...]]:
    """The shape of ``key`` in ``GPT(config).state_dict()``, or None if it has no such key;
    without enumerating the layers."""
    C, V = config.n_embd, config.vocab_size
    top = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (config.block_size, C),
           "transformer.ln_f.weight": (C,), "lm_head.weight": (V, C)}
    if config.bias:
        top["transformer.ln_f.bias"] = (C,)
    if key in top:
        return top[key]
    match = _LAYER_KEY.match(key)
    if match is None or int(match.group(1)) >= config.n_layer:
        return None
    factors = _layer_arrays(config.bias).get(match.group(2))
    return None if factors is None else tuple(k * C for k in factors)


def gpt_state_count(config: Any) -> int:
    """Entries in ``GPT(config).state_dict()`` (the tied matrix under both its names)."""
    return 4 + bool(config.bias) + config.n_layer * len(_layer_arrays(config.bias))


def gpt_parameter_count(config: Any) -> int:
    """Elements of the GPT's parameters, the tied ``wte``/``lm_head`` matrix once (what
    ``GPT.num_parameters()`` counts)."""
    C = config.n_embd
    per_layer = 12 * C * C + (13 * C if config.bias else 2 * C)
    return (config.vocab_size * C + config.block_size * C + config.n_layer * per_layer
            + (2 * C if config.bias else C))


def check_gpt_arrays(config: Any, dtype: Any, table: Mapping[str, Tuple[Any, Tuple[int, ...]]],
                     file_size: int) -> None:
    """ValueError (one line) unless ``table`` (state-dict key -> (dtype, shape), as a
    checkpoint's header declares them) is the state dict of a GPT of ``config``:
    the same keys and shapes, every dtype ``dtype`` (any floating dtype when None), and
    the weights' bytes within ``file_size``. Costs O(len(table)) whatever ``config``
    claims: a metadata of 10^9 layers is refused by arithmetic."""
    smallest = np.dtype(dtype).itemsize if dtype is not None else 2  # bf16 at the least
    weights = gpt_parameter_count(config) * smallest
    shape_text = (f"n_layer {config.n_layer}, n_head {config.n_head}, n_embd "
                  f"{config.n_embd}, block_size {config.block_size}, vocab_size "
                  f"{config.vocab_size}")
    if weights > file_size:
        held = f"{format_bytes(weights)} in {np.dtype(dtype).name}" if dtype is not None \
            else f"at least {format_bytes(weights)}"
        raise ValueError(f"the metadata describes a GPT ({shape_text}) of "
                         f"{gpt_parameter_count(config):,} parameters, {held}, but the whole "
                         f"file is {format_bytes(file_size)}")
    expected = gpt_state_count(config)
    if len(table) != expected:
        missing = None
        if len(table) < expected:  # one of the first len(table) + 1 expected keys is absent
            for key, _ in gpt_state_shapes(config):
                if key not in table:
                    missing = key
                    break
        what = f"{missing!r} is missing" if missing is not None else \
            f"{next(k for k in table if gpt_state_shape(config, k) is None)!r} is not one " \
            f"of its arrays"
        raise ValueError(f"the metadata describes a GPT ({shape_text}) of {expected:,} "
                         f"arrays, the file holds {len(table):,}: {what}")
    for key, (found_dtype, shape) in table.items():
        wanted = gpt_state_shape(config, key)
        if wanted is None:
            raise ValueError(f"the file holds {key!r}, which a GPT ({shape_text}) has not")
        if tuple(shape) != wanted:
            raise ValueError(f"{key} is {tuple(shape)} in the file, {wanted} in a GPT "
                             f"({shape_text})")
        found_dtype = np.dtype(found_dtype)
        if dtype is not None and found_dtype != np.dtype(dtype):
            raise ValueError(f"{key} is {found_dtype.name} in the file, "
                             f"{np.dtype(dtype).name} by the metadata's dtype")
        if dtype is None and not dtypes.is_floating(found_dtype):
            raise ValueError(f"{key} is {found_dtype.name} in the file, expected a floating "
                             f"dtype")


# --- the estimate ------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """What a command is about to run: a GPT's shape and what it does with it."""

    task: str  # train | forward | forward+backward | generate
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int  # rows of the position table; the KV cache's length
    vocab_size: int
    bias: bool = True
    dropout: float = 0.0
    batch: int = 1  # sequences per pass: one micro-batch
    seq_len: Optional[int] = None  # tokens per sequence; None: block_size
    eval_batch: Optional[int] = None  # train: the evaluation's batch; None: batch
    dtype: str = "float32"  # system.dtype: float32 | float64 | bf16 (fp32 master weights)
    device: str = "cpu"  # cpu | cuda | cuda:N: which attention path runs
    data_parallel: bool = False  # train under mpiexec: a flat gradient buffer to all-reduce
    from_checkpoint: bool = False  # the checkpoint's arrays are held while the model is built

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"Workload: task must be one of {', '.join(TASKS)}, got "
                             f"{self.task!r}")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per part of what a workload holds at its peak; ``total`` is their sum."""

    what: str  # "the model and one micro-batch need", "building the model needs", ...
    parts: Dict[str, int]  # "parameters", "gradients", "AdamW", "activations", "logits", ...
    workload: Workload

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def _widths(dtype: str) -> Tuple[int, int, int]:
    """(weight bytes w, activation bytes a, compute bytes f) for a system.dtype."""
    if dtype == "float64":
        return 8, 8, 8
    return 4, (2 if dtype == "bf16" else 4), 4


def _attention(work: Workload, B: int, T: int, training: bool) -> Tuple[int, int]:
    """(bytes one layer's attention saves for backward, its largest transient) for B
    sequences of T tokens, on the path ``ops.attention._attend`` takes."""
    w, a, f = _widths(work.dtype)
    H, C = work.n_head, work.n_embd
    scores = B * H * T * T  # elements of the (B, nh, T, T) matrix
    dropout = training and work.dropout > 0
    on_cuda = work.device.startswith("cuda")
    if on_cuda and work.dtype != "float64":
        if scores * (4 + 2 * a) <= DENSE_MAX_BYTES:  # dense: cuBLAS + fused softmax
            saved = scores * a * (2 if dropout else 1) if training else 0
            return saved, scores * 4
        if not dropout:  # flash: the float32 output and the log-sum-exp
            return (B * T * (C + H) * 4 if training else 0), B * T * C * 4
    elif not dropout and T >= TILED_FROM:  # tiled (CPU): tiles, never the whole matrix
        widened = 3 * B * T * C * f if a < f else 0  # bf16 q, k, v widened for the tiles
        return (B * T * (C + H) * f if training else 0), B * H * _TILE * f * 4 + widened
    # full: the probabilities saved (and a one-byte dropout mask); the float32 scores, or
    # in backward their gradient, and with dropout the dropped-out copy and the draws;
    # the (T, T) causal mask with the two arrays NumPy's triu makes it from
    saved = scores * (a + (1 if dropout else 0)) if training else 0
    return saved, scores * (f + ((a + 4) if dropout else 0)) + 3 * T * T


def _pass(work: Workload, B: int, T: int, training: bool) -> Tuple[int, int]:
    """(activation bytes, logits bytes) of one pass of B sequences of T tokens: with
    ``training``, what forward saves plus one layer's transients; without, a forward
    pass under no_grad (one layer's buffers at a time)."""
    w, a, f = _widths(work.dtype)
    L, C, V = work.n_layer, work.n_embd, work.vocab_size
    tokens = B * T
    saved, transient = _attention(work, B, T, training)
    mlp = tokens * 12 * C * f  # GELU's float32 buffers (input, tanh, output), or backward's
    if training:
        mask = 2 * C if work.dropout > 0 else 0  # the residual branches' dropout masks
        per_token = 2 * C * w + 4 * f + 10 * C * a + 4 * C * f + mask
        layers = L * (tokens * per_token + saved)
        # the embeddings' ids and dropout mask, ln_f's input and statistics, lm_head's input
        top = tokens * (3 * 8 + C * w + 2 * f + C * a + (C if work.dropout > 0 else 0))
        stream = tokens * (2 * C * w + 3 * C * f)  # the residual gradient and grad_qkv
        copies = 0
        if a < w:  # bf16: each linear's weight (and bias) cast once per pass and saved
            linear = 12 * C * C + (9 * C if work.bias else 0)
            copies = (L * linear + V * C) * a
        activations = layers + top + stream + max(transient, mlp) + copies
        logits = tokens * V * (a + 2 * f)
    else:  # the larger of a layer's two halves: the attention's and the MLP's buffers
        stream = tokens * (C * w + C * a)  # the residual stream and its layer norm
        # q, k, v and the output, the products' copies of q and k and their result, and
        # the attention's own transient
        attention = stream + tokens * (4 * C * a + 3 * C * f) + transient
        feed_forward = stream + tokens * 5 * C * a + mlp
        activations = max(attention, feed_forward)
        logits = tokens * V * (a + 2 * f)
    return activations, logits


def estimate_memory(work: Workload) -> MemoryEstimate:
    """The bytes ``work`` holds at its peak, by part (see the module's docstring for the
    count): the larger of building the model and running it. Python ints only: instant
    for any size."""
    w, a, f = _widths(work.dtype)
    P = gpt_parameter_count(work) * w
    L, C, V = work.n_layer, work.n_embd, work.vocab_size
    T = work.seq_len or work.block_size
    parts: Dict[str, int] = {"parameters": P}
    what = _WHAT[work.task]
    if work.task == "generate":
        parts["KV cache"] = 2 * L * work.batch * work.block_size * C * w
        parts["activations"], _ = _pass(work, work.batch, work.block_size, training=False)
        parts["logits"] = work.batch * V * (a + 4 * f + 8)  # softmax, sort and its order
    elif work.task == "forward":
        parts["activations"], parts["logits"] = _pass(work, work.batch, T, training=False)
    else:
        parts["gradients"] = P * (2 if work.data_parallel else 1)
        if work.task == "train":
            parts["AdamW"] = 4 * P
        parts["activations"], parts["logits"] = _pass(work, work.batch, T, training=True)
        if work.task == "train" and work.eval_batch and work.eval_batch > work.batch:
            activations, logits = _pass(work, work.eval_batch, T, training=False)
            if activations + logits > parts["activations"] + parts["logits"]:
                parts["activations"], parts["logits"] = activations, logits
                what = _WHAT["eval"]
    if not work.device.startswith("cuda"):  # on CUDA the model is built on the host
        # building: lm_head's own matrix until it is tied to wte's, and the draw that
        # initialises the largest matrix (the draw and its scaled copy); a checkpoint's
        # arrays, read first, are held
        largest = max(V * C, work.block_size * C, 4 * C * C)
        building = {"parameters": P, "initialisation": (V * C + 2 * largest) * w}
        if work.from_checkpoint:
            building["checkpoint arrays"] = P
        if sum(building.values()) > sum(parts.values()):
            return MemoryEstimate(what=_WHAT["build"], parts=building, workload=work)
    return MemoryEstimate(what=what, parts=parts, workload=work)


# --- the memory available ----------------------------------------------------------------
@dataclass(frozen=True)
class MemoryLimit:
    """The bytes a command may use, and where that number came from (for the message)."""

    bytes: int
    source: str  # "available (MemAvailable)", "free on cuda:0", "set by system.memory_limit_gb"

    def describe(self) -> str:
        return f"{format_bytes(self.bytes)} {self.source}"


def memory_limit(backend: Any, configured_gb: Optional[float] = None) -> MemoryLimit:
    """The limit to check against: ``configured_gb`` (system.memory_limit_gb) when given,
    else ``$MINITORCH_GPU_MEMORY_LIMIT_GB`` when set, else what ``backend``'s device has
    free now (``Backend.free_memory``). ValueError for a malformed variable."""
    if configured_gb is not None:
        return MemoryLimit(int(configured_gb * GB), "set by system.memory_limit_gb")
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    if text:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"${LIMIT_VARIABLE}: expected a number of GB > 0, got {text!r}")
        return MemoryLimit(int(value * GB), f"set by ${LIMIT_VARIABLE}")
    free, source = backend.free_memory()
    return MemoryLimit(int(free), source)


def check_memory(estimate: MemoryEstimate, limit: MemoryLimit,
                 names: Optional[Mapping[str, str]] = None,
                 advice: str = "lower them, or pass --ignore-memory-check") -> None:
    """MemoryLimitError, one line, when ``estimate`` is over ``limit``: the estimate by
    part, the settings that drive it (those whose halving would cut it by a tenth or more,
    named as ``names`` maps Workload fields to settings, in its order: ``{"n_layer":
    "model.n_layer"}``; fields not in ``names`` are not offered) and ``advice``."""
    total = estimate.total
    if total <= limit.bytes:
        return
    shown = [f"{name} {format_bytes(size)}" for name, size in estimate.parts.items()
             if size >= total // 100 and size > 0]
    drivers = _drivers(estimate, names or {})
    driven = f": {', '.join(drivers)}" if drivers else ""
    raise MemoryLimitError(f"{estimate.what} about {format_bytes(total)} "
                           f"({', '.join(shown)}{driven}), over the {limit.describe()}; "
                           f"{advice}")


def workload(task: str, config: Any, **settings: Any) -> Workload:
    """A Workload of ``task`` on a GPT of ``config`` (a GPTConfig, or a ModelConfig with its
    vocab_size set); ``settings`` are the Workload's other fields."""
    return Workload(task, config.n_layer, config.n_head, config.n_embd, config.block_size,
                    config.vocab_size, bias=config.bias, dropout=config.dropout, **settings)


def check_workload(work: Workload, backend: Any, limit_gb: Optional[float],
                   names: Mapping[str, str],
                   advice: str = "lower them, or pass --ignore-memory-check") -> None:
    """MemoryLimitError (one line) when ``work`` is estimated past the memory limit
    (``limit_gb``, else $MINITORCH_GPU_MEMORY_LIMIT_GB, else what ``backend`` has free),
    a malformed limit included: what every command runs before it builds a model."""
    try:
        limit = memory_limit(backend, limit_gb)
    except ValueError as exc:  # a malformed $MINITORCH_GPU_MEMORY_LIMIT_GB
        raise MemoryLimitError(str(exc)) from None
    check_memory(estimate_memory(work), limit, names, advice)


def _drivers(estimate: MemoryEstimate, names: Mapping[str, str]) -> list:
    """``name=value`` of the settings whose halving would cut the estimate by a tenth or
    more, in the order of ``names``."""
    work, total = estimate.workload, estimate.total
    found = []
    for field, name in names.items():
        value = getattr(work, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 2:
            continue
        halved = estimate_memory(dataclasses.replace(work, **{field: value // 2})).total
        if total - halved >= total // 10:
            separator = "=" if "." in name or name.startswith("--") else " "
            found.append(f"{name}{separator}{value}")
    return found


def format_bytes(n: int) -> str:
    """``n`` bytes in decimal units: 512 B, 41.2 GB, 3.2 PB."""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        value /= 1000
        if value < 999.95:
            return f"{value:.1f} {unit}"
    value /= 1000
    return f"{value:.1f} EB" if value < 1e4 else f"{value:.3g} EB"
