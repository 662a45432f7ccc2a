"""How much memory a model run will take, counted from its shape before anything is
allocated: a GPT-2 or a Llama (``arch``).

A command that builds a model first estimates the bytes it is about to hold and compares
them with the memory this device has free; an estimate over it stops the command with one
line naming the estimate, the limit and the settings that drive it::

    workload = Workload(task="train", n_layer=1000, n_head=16, n_embd=1024, block_size=1024,
                        vocab_size=50304, batch=64)
    estimate = estimate_memory(workload)      # Python ints only: instant for any size
    check_memory(estimate, memory_limit(backend), names={"n_layer": "model.n_layer"})

Everything is arithmetic on Python ints, so an absurd size (``n_layer`` 10^9) is refused in
microseconds, never by allocating until the machine runs out. The count follows what the
code keeps (``nn/gpt.py``, ``nn/llama.py``, ``ops/``, ``optim/``), per layer, and errs on
the high side. C is n_embd, V the vocabulary, L the layers, F the MLP's width (4 C for
GPT-2, ffn_hidden for a Llama), K = n_kv_head x head_dim the width of a Llama's keys and
values (C when n_kv_head = n_head); the arrays themselves are listed by ``model_arrays.py``:

* parameters: GPT-2: P = V C + T_max C + L (4 C^2 + 2 C F + 9 C + F) + 2 C with biases
  (L (4 C^2 + 2 C F + 2 C) + C without); Llama: P = V C + L (2 C^2 + 2 C K + 3 C F + 2 C)
  + C, plus L (3 C + 2 K + 2 F) with biases, and no position table. An untied ``lm_head``
  (``tie_embeddings`` false, a Llama's default) adds V C; a tied one is counted once.
  Bytes w = 4 (float32, and bf16 mixed precision, whose master weights are float32) or 8
  (float64). A Llama keeps its rotary cos/sin tables too (T_max head_dim f);
* gradients: P w, one ``.grad`` per parameter (2 P w under data parallelism: the flat
  all-reduce buffer);
* AdamW: 4 P w, its two moments and the flat gradient and step arrays its update runs in
  (``optim/flat.py``);
* activations of one micro-batch, what forward saves for backward, per layer and token,
  in the activation dtype a (2 bytes under bf16 autocast, else w) unless said:
  GPT-2: the two layer norms' inputs on the residual stream (2 C w) and row statistics
  (4 f), the inputs of the four linears (C, C, C and F), the packed q, k, v (3 C),
  GELU's local derivative in float32 (F f);
  Llama: the two RMSNorms' inputs (2 C w) and rstd (2 f), the projections' inputs (the
  norms' outputs, C each, or under bf16 each projection's own copy: 3 C and 2 C;
  o_proj's C and down_proj's F), the rotated q (C) and k, v (2 K) the attention saves
  (the rotation saves nothing but its tables), SwiGLU's gate and up (2 F);
  with dropout a one-byte mask per dropped element; plus the attention's own, with
  n_head query heads: the (B, nh, T, T) probabilities in a on the full path (the CPU
  below ``TILED_FROM`` = 1,024 keys, or with dropout; CUDA's dense path within
  ``DENSE_MAX_BYTES``), or the float32 output and log-sum-exp on the tiled (CPU) and
  flash (CUDA) paths. Then the largest transient of one layer (the float32 (B, nh, T, T)
  scores or their gradient on the full and dense paths, else the MLP's float32 buffers:
  GELU's 3 F f per token, SwiGLU's backward 5 F f) and the residual stream's gradients
  (2 C w, and q, k and v's gradients: 3 C f, or for a Llama (C + 2 K) f, plus 2 C f for
  k's and v's per query head when n_kv_head < n_head); under bf16 the bf16 copies of the
  linear weights, which the products save. f is 4 bytes (8 for float64): the width the
  norms, softmax and the activations compute in;
* logits and the loss: B T V (a + 2 f): the logits, the loss's float32 probabilities and
  their gradient;
* generation: the KV cache, 2 L B T_max K w (n_kv_head heads; K = C for GPT-2), one
  forward pass of a whole window (no saved activations: the larger of a layer's attention
  and MLP buffers, beside the layer's input and output on the residual stream), the last
  position's logits and the sampler's sort; on a GPU the captured one-token step's CUDA
  Graph, which keeps every op result of a step as a one-position training pass saves
  its activations (the captured steps of the CPU, and the prompt's everywhere, allocate
  as eager ones do and keep nothing);
* building the model (on the host): the parameters, a tied ``lm_head``'s own matrix until
  it is tied to the embedding's and the draw that initialises the largest matrix (3 V C w
  for a large vocabulary), and a checkpoint's arrays, read before the model takes them
  (P w).

The estimate is the largest of building the model and running it (for training, the
larger of a micro-batch and an evaluation batch, ``eval.batch_size``). It is about 1.0 to
1.5 times the peak of real CPU runs (tracemalloc's, in ``tests/test_memory_guard.py``, for
GPTs and Llamas); the process's own code and libraries (about 100 MB) are not counted.

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
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from .model_arrays import (Shape, check_gpt_arrays, check_model_arrays, format_bytes,
                           gpt_parameter_count, gpt_state_count, gpt_state_shape,
                           gpt_state_shapes, model_parameter_count, model_shape,
                           model_state_count, model_state_shape, model_state_shapes)
from ..ops.attention import DENSE_MAX_BYTES, TILED_FROM

__all__ = ["Workload", "MemoryEstimate", "MemoryLimit", "MemoryLimitError",
           "estimate_memory", "memory_limit", "check_memory", "workload", "check_workload",
           "format_bytes",
           "gpt_state_shapes", "gpt_state_shape", "gpt_state_count", "gpt_parameter_count",
           "check_gpt_arrays", "LIMIT_VARIABLE", "model_state_shapes", "model_state_shape",
           "model_state_count", "model_parameter_count", "check_model_arrays"]

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


# --- the estimate ------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """What a command is about to run: a model's shape (a GPT or a Llama) and what it does
    with it. The arch's fields left None take the arch's defaults (GPTConfig's)."""

    task: str  # train | forward | forward+backward | generate
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int  # gpt2: rows of the position table; the KV cache's length
    vocab_size: int
    bias: Optional[bool] = None  # None: the arch's (gpt2 yes, llama no)
    dropout: float = 0.0
    batch: int = 1  # sequences per pass: one micro-batch
    seq_len: Optional[int] = None  # tokens per sequence; None: block_size
    eval_batch: Optional[int] = None  # train: the evaluation's batch; None: batch
    dtype: str = "float32"  # system.dtype: float32 | float64 | bf16 (fp32 master weights)
    device: str = "cpu"  # cpu | cuda | cuda:N: which attention path runs
    data_parallel: bool = False  # train under mpiexec: a flat gradient buffer to all-reduce
    from_checkpoint: bool = False  # the checkpoint's arrays are held while the model is built
    arch: str = "gpt2"  # gpt2 | llama
    n_kv_head: Optional[int] = None  # llama: key/value heads; None: n_head
    ffn_hidden: Optional[int] = None  # llama: the SwiGLU width; None: 8/3 C up to 64 (gpt2: 4 C)
    tie_embeddings: Optional[bool] = None  # None: the arch's (gpt2 tied, llama not)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"Workload: task must be one of {', '.join(TASKS)}, got "
                             f"{self.task!r}")
        shape = model_shape(self)  # the arch's defaults, resolved once
        for name in ("bias", "n_kv_head", "ffn_hidden", "tie_embeddings"):
            object.__setattr__(self, name, getattr(shape, name))


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
    return 4, (2 if dtype in ("bf16", "fp16") else 4), 4


def _attention(work: Workload, B: int, T: int, training: bool) -> Tuple[int, int]:
    """(bytes one layer's attention saves for backward, its largest transient) for B
    sequences of T tokens, on the path ``ops.attention._attend`` takes: n_head query heads
    (a Llama's keys and values, n_kv_head heads, are broadcast over the group, not copied)."""
    w, a, f = _widths(work.dtype)
    H, C, KV = work.n_head, work.n_embd, model_shape(work).kv_width
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
        widened = B * T * (C + 2 * KV) * f if a < f else 0  # bf16 q, k, v widened for tiles
        return (B * T * (C + H) * f if training else 0), B * H * _TILE * f * 4 + widened
    # full: the probabilities saved (and a one-byte dropout mask); the float32 scores, or
    # in backward their gradient, and with dropout the dropped-out copy and the draws;
    # the (T, T) causal mask with the two arrays NumPy's triu makes it from
    saved = scores * (a + (1 if dropout else 0)) if training else 0
    return saved, scores * (f + ((a + 4) if dropout else 0)) + 3 * T * T


def _linear_weights(s: Shape) -> int:
    """Elements of one layer's linear weights and biases (what bf16 autocast copies)."""
    C, F, KV = s.n_embd, s.ffn_hidden, s.kv_width
    if s.arch == "llama":
        return 2 * C * C + 2 * C * KV + 3 * C * F + \
            ((2 * C + 2 * KV + 2 * F + C) if s.bias else 0)
    return 4 * C * C + 2 * C * F + ((5 * C + F) if s.bias else 0)


def _pass(work: Workload, B: int, T: int, training: bool) -> Tuple[int, int]:
    """(activation bytes, logits bytes) of one pass of B sequences of T tokens: with
    ``training``, what forward saves plus one layer's transients; without, a forward
    pass under no_grad (one layer's buffers at a time)."""
    w, a, f = _widths(work.dtype)
    s = model_shape(work)
    L, C, V, F, KV = s.n_layer, s.n_embd, s.vocab_size, s.ffn_hidden, s.kv_width
    llama = s.arch == "llama"
    tokens = B * T
    saved, transient = _attention(work, B, T, training)
    if llama:  # SwiGLU's float32 output and scratch; backward's grads of gate, up and out,
        mlp = tokens * 5 * F * f  # the sigmoid and silu
    else:  # GELU's float32 buffers (input, tanh, output), or backward's
        mlp = tokens * 3 * F * f
    logits = tokens * V * (a + 2 * f)  # the logits, the loss's probabilities and gradient
    if training:
        mask = 2 * C if work.dropout > 0 else 0  # the residual branches' dropout masks
        if llama:
            # the two RMSNorms' inputs (C w) and rstd (f); the linears' inputs: the norms'
            # outputs (under bf16 each projection casts its own copy: 3 and 2 of them),
            # o_proj's and down_proj's; the rotated q and k and v, which attention saves;
            # SwiGLU's gate and up
            k_in, k_mlp = (3, 2) if a < w else (1, 1)
            per_token = 2 * C * w + 2 * f + a * (C * (k_in + 2 + k_mlp) + 2 * KV + 3 * F) \
                + mask
            statistics = f  # the final norm's rstd
            # the residual gradient, q's, k's and v's gradients, and with G > 1 query heads
            # per key head k's and v's per query head before they are summed
            stream = tokens * (2 * C * w + (C + 2 * KV) * f + (2 * C * f if KV < C else 0))
        else:
            # the two layer norms' inputs and statistics, the four linears' inputs, the
            # packed q, k, v, GELU's local derivative
            per_token = 2 * C * w + 4 * f + (6 * C + F) * a + F * f + mask
            statistics = 2 * f  # ln_f's mean and rstd
            stream = tokens * (2 * C * w + 3 * C * f)  # the residual gradient and grad_qkv
        layers = L * (tokens * per_token + saved)
        # the embeddings' ids and dropout mask, the final norm's input and statistics,
        # lm_head's input
        top = tokens * (3 * 8 + C * w + statistics + C * a + (C if work.dropout > 0 else 0))
        copies = 0
        if a < w:  # bf16: each linear's weight (and bias) cast once per pass and saved
            copies = (L * _linear_weights(s) + V * C) * a
        activations = layers + top + stream + max(transient, mlp) + copies
    else:  # the larger of a layer's two halves: the attention's and the MLP's buffers
        # the residual stream: the layer's input (held by the caller's loop) and the sum
        # it makes, and the norm's output
        stream = tokens * (2 * C * w + C * a)
        if llama:
            # q, k, v, the rotated q and k, the output; the products' copies of q and k
            # and their result; the attention's own transient
            attention = stream + tokens * ((3 * C + 3 * KV) * a + (2 * C + KV) * f) + \
                transient
            # gate and up, SwiGLU's float32 output and scratch (both gone before down_proj)
            feed_forward = stream + tokens * 2 * F * (a + f)
        else:
            # q, k, v and the output, the products' copies of q and k and their result, and
            # the attention's own transient
            attention = stream + tokens * (4 * C * a + 3 * C * f) + transient
            feed_forward = stream + tokens * (C + F) * a + mlp
        activations = max(attention, feed_forward)
    return activations, logits


def estimate_memory(work: Workload) -> MemoryEstimate:
    """The bytes ``work`` holds at its peak, by part (see the module's docstring for the
    count): the larger of building the model and running it. Python ints only: instant
    for any size."""
    w, a, f = _widths(work.dtype)
    P = model_parameter_count(work) * w
    s = model_shape(work)
    L, C, V = work.n_layer, work.n_embd, work.vocab_size
    T = work.seq_len or work.block_size
    parts: Dict[str, int] = {"parameters": P}
    if s.arch == "llama":  # cos and sin of every position, kept once made (ops/rotary.py)
        parts["rotary tables"] = work.block_size * (C // work.n_head) * f
    what = _WHAT[work.task]
    if work.task == "generate":
        # keys and values of n_kv_head heads, (B, n_kv_head, block_size, head_dim) per layer
        parts["KV cache"] = 2 * L * work.batch * work.block_size * s.kv_width * w
        parts["activations"], _ = _pass(work, work.batch, work.block_size, training=False)
        parts["logits"] = work.batch * V * (a + 4 * f + 8)  # softmax, sort and its order
        if work.device.startswith("cuda"):
            # the one-token step's CUDA Graph (nn/decoder.py) keeps every op's result, as
            # a training pass of one position saves its activations, and its logits
            graph, logits = _pass(work, work.batch, 1, training=True)
            parts["CUDA Graph"] = graph + logits
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
        # building: a tied lm_head's own matrix until it is tied to the embedding's, and
        # the draw that initialises the largest matrix (the draw and its scaled copy); a
        # checkpoint's arrays, read first, are held
        largest = max(V * C, s.ffn_hidden * C, 3 * C * C if s.arch == "gpt2" else C * C,
                      work.block_size * C if s.arch == "gpt2" else 0)
        own = V * C if s.tie_embeddings else 0
        building = {"parameters": P, "initialisation": (own + 2 * largest) * w}
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
    """A Workload of ``task`` on the model of ``config`` (a GPTConfig, or a ModelConfig with
    its vocab_size set, whose n_kv_head, ffn_hidden, bias and tie_embeddings may be None:
    the arch's defaults, resolved as GPTConfig resolves them); ``settings`` are the
    Workload's other fields."""
    s = model_shape(config)
    return Workload(task, s.n_layer, s.n_head, s.n_embd, s.block_size, s.vocab_size,
                    bias=s.bias, dropout=config.dropout, arch=s.arch, n_kv_head=s.n_kv_head,
                    ffn_hidden=s.ffn_hidden, tie_embeddings=s.tie_embeddings, **settings)


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
