"""Fused CUDA kernels for the GPT's hot path, and the Python functions that launch them.

The CUDA C sources sit beside this file (``layernorm.cu``, ``gelu.cu``,
``cross_entropy.cu``, ``adamw.cu``, ``attention.cu``); each explains its algorithm and
which thread does what. They are compiled at first use with ``cupy.RawModule`` (NVRTC),
once per (device, source, compile-time constants) in this process; CuPy also keeps the
compiled binaries in its on-disk cache, so a later process only loads them.

Ops reach these functions through ``backend.fused_kernels()``, which is this module on a
CUDA backend and None on the CPU::

    kernels = ctx.backend.fused_kernels()
    if kernels is not None and kernels.supports_gelu(x):
        return kernels.gelu_forward(x, approximate)
    ... the NumPy-vectorised code, the reference ...

Each ``supports_*`` says exactly which inputs the kernel takes (float32, and bf16/fp16
where said; anything else falls back to the vectorised code); the launch functions raise
TypeError/ValueError naming the argument for anything else. Inputs may have any strides: a
non-contiguous input is copied once to a contiguous one (arrays updated in place must be
contiguous), except that flash attention reads its strided heads in place.

CuPy is imported lazily (through ``cupy_backend``, the one place that imports it), so this
module imports on machines without CuPy: ``source_text`` and the constants work anywhere.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Tuple

import ml_dtypes
import numpy as np

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("layernorm.cu", "gelu.cu", "cross_entropy.cu", "adamw.cu", "attention.cu",
           "attention_softmax.cu")
COMPILE_OPTIONS = ("-std=c++17",)  # NVRTC picks the architecture of the current device
MAX_HEAD_DIM = 128  # attention.cu's shared-memory tiles fit 48 KiB up to this head size

# launch shapes; each matches the #define of the same meaning in its .cu file
LAYERNORM_WARPS_PER_BLOCK = 8
LAYERNORM_COLUMN_THREADS = 256
LAYERNORM_ROWS_PER_CHUNK = 64  # rows summed per thread in the dweight/dbias partials
ELEMENTWISE_THREADS = 256  # gelu.cu and adamw.cu
CROSS_ENTROPY_THREADS = 256
ATTENTION_WARPS = 4
ATTENTION_FORWARD_ROWS = 4  # FWD_ROWS


def attention_backward_rows(head_dim: int) -> int:
    """attention.cu's BWD_ROWS: rows per warp in the backward kernels."""
    return 2 if head_dim > 64 else 4


_FLOAT32 = np.dtype(np.float32)
_INT64 = np.dtype(np.int64)
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


# --- sources and modules ------------------------------------------------------------------
def source_text(filename: str) -> str:
    """The CUDA C text of one of ``SOURCES``."""
    if filename not in SOURCES:
        raise ValueError(f"fused kernels: unknown source {filename!r}, expected one of "
                         f"{list(SOURCES)}")
    return (SOURCE_DIR / filename).read_text(encoding="utf-8")


def _cupy() -> Any:
    from ..cupy_backend import INSTALL_HINT, cupy
    if cupy is None:
        raise RuntimeError(f"fused kernels need CuPy; {INSTALL_HINT}")
    return cupy


@functools.lru_cache(maxsize=None)
def _module(device_id: int, filename: str, defines: Tuple[Tuple[str, int], ...]) -> Any:
    """The RawModule of ``filename`` with ``-DNAME=value`` for each of ``defines``, built
    for device ``device_id`` (compiled on its first ``get_function``)."""
    cupy = _cupy()
    options = COMPILE_OPTIONS + tuple(f"-D{name}={value}" for name, value in defines)
    with cupy.cuda.Device(device_id):
        return cupy.RawModule(code=source_text(filename), options=options)


def _kernel(like: Any, filename: str, name: str, **defines: int) -> Any:
    """Kernel ``name`` of ``filename``, for the device ``like`` lives on."""
    return _module(like.device.id, filename, tuple(sorted(defines.items()))).get_function(name)


def _on_device_of_first_array(launcher: Callable) -> Callable:
    """Run ``launcher`` with the device of its first argument current, so its outputs are
    allocated and its kernels launched where the inputs live (as CuPy's own ops need).
    A host array (the argument checks' tests) is passed through unchanged."""
    @functools.wraps(launcher)
    def on_device(first: Any, *args: Any, **kwargs: Any) -> Any:
        if not hasattr(first, "__cuda_array_interface__"):
            return launcher(first, *args, **kwargs)
        with _cupy().cuda.Device(first.device.id):
            return launcher(first, *args, **kwargs)
    return on_device


def _blocks(count: int, per_block: int) -> int:
    return (count + per_block - 1) // per_block


def _elementwise_grid(n: int) -> int:
    """Blocks for a grid-stride loop over n elements: enough to fill any GPU, no more."""
    return max(1, min(_blocks(n, ELEMENTWISE_THREADS), 65536))


# --- argument checks ----------------------------------------------------------------------
def _is_float32(*arrays: Any) -> bool:
    return all(a is not None and a.dtype == _FLOAT32 for a in arrays)


def _is_float32_or_narrower(*arrays: Any) -> bool:
    """float32, or bf16/fp16 that the op widens to float32 for the kernel (the kernels
    compute in float32 either way, as autocast wants)."""
    from ..dtypes import NARROW_FLOATS
    return all(a is not None and (a.dtype == _FLOAT32 or a.dtype in NARROW_FLOATS)
               for a in arrays)


def _check_float32(op: str, **arrays: Any) -> None:
    for name, a in arrays.items():
        if a.dtype != _FLOAT32:
            raise TypeError(f"{op}: {name} must be float32, got {a.dtype}")


def _check_shape(op: str, name: str, array: Any, expected: tuple) -> None:
    if tuple(array.shape) != tuple(expected):
        raise ValueError(f"{op}: {name} has shape {tuple(array.shape)}, expected "
                         f"{tuple(expected)}")


def _contiguous(array: Any) -> Any:
    return _cupy().ascontiguousarray(array)


# --- layer norm ---------------------------------------------------------------------------
def supports_layer_norm(x: Any, weight: Optional[Any], bias: Optional[Any]) -> bool:
    """float32 input, weight and bias (either may be None), at least one element."""
    return (x.size > 0 and _is_float32(x) and (weight is None or _is_float32(weight))
            and (bias is None or _is_float32(bias)))


def _layer_norm_rows(x: Any, normalized_dims: int) -> Tuple[int, int]:
    if not 1 <= normalized_dims <= x.ndim:
        raise ValueError(f"layer_norm kernel: normalized_dims must be in [1, {x.ndim}] for an "
                         f"input of shape {tuple(x.shape)}, got {normalized_dims}")
    columns = math.prod(x.shape[x.ndim - normalized_dims:])
    return x.size // columns if columns else 0, columns


def _affine(op: str, x: Any, weight: Optional[Any], bias: Optional[Any],
            normalized_dims: int) -> Tuple[Any, Any]:
    """weight and bias as flat contiguous (C,) arrays; ones/zeros where not given."""
    cupy = _cupy()
    shape = tuple(x.shape[x.ndim - normalized_dims:])
    columns = math.prod(shape)
    flat = []
    for name, p, fill in (("weight", weight, 1.0), ("bias", bias, 0.0)):
        if p is None:
            flat.append(cupy.full((columns,), fill, dtype=_FLOAT32))
        else:
            _check_float32(op, **{name: p})
            _check_shape(op, name, p, shape)
            flat.append(_contiguous(p).reshape(columns))
    return flat[0], flat[1]


@_on_device_of_first_array
def layer_norm_forward(x: Any, weight: Optional[Any], bias: Optional[Any], eps: float,
                       normalized_dims: int = 1) -> Tuple[Any, Any, Any]:
    """Layer norm over the trailing ``normalized_dims`` dims of float32 ``x``.

    Returns ``(y, mean, rstd)``: y of x's shape; mean and 1/std per row, of shape
    ``x.shape[:-normalized_dims]``, as ``layer_norm_backward`` needs them.
    """
    op = "layer_norm_forward"
    _check_float32(op, x=x)
    rows, columns = _layer_norm_rows(x, normalized_dims)
    w, b = _affine(op, x, weight, bias, normalized_dims)
    cupy = _cupy()
    x = _contiguous(x)
    y = cupy.empty_like(x)
    mean = cupy.empty(x.shape[:x.ndim - normalized_dims], dtype=_FLOAT32)
    rstd = cupy.empty_like(mean)
    if rows:
        kernel = _kernel(x, "layernorm.cu", "layernorm_forward")
        kernel((_blocks(rows, LAYERNORM_WARPS_PER_BLOCK),), (LAYERNORM_WARPS_PER_BLOCK * 32,),
               (x, w, b, y, mean, rstd, np.int32(rows), np.int32(columns), np.float32(eps)))
    return y, mean, rstd


@_on_device_of_first_array
def layer_norm_backward(dy: Any, x: Any, weight: Optional[Any], mean: Any, rstd: Any,
                        normalized_dims: int = 1) -> Tuple[Any, Any, Any]:
    """Gradients of ``layer_norm_forward``: ``(dx, dweight, dbias)``, dweight and dbias of
    the normalized shape (computed even when weight/bias were None)."""
    op = "layer_norm_backward"
    _check_float32(op, dy=dy, x=x, mean=mean, rstd=rstd)
    _check_shape(op, "dy", dy, x.shape)
    rows, columns = _layer_norm_rows(x, normalized_dims)
    _check_shape(op, "mean", mean, x.shape[:x.ndim - normalized_dims])
    _check_shape(op, "rstd", rstd, x.shape[:x.ndim - normalized_dims])
    w, _ = _affine(op, x, weight, None, normalized_dims)
    cupy = _cupy()
    dy, x, mean, rstd = (_contiguous(a) for a in (dy, x, mean, rstd))
    dx = cupy.empty_like(x)
    shape = tuple(x.shape[x.ndim - normalized_dims:])
    if not rows:
        zeros = cupy.zeros(shape, dtype=_FLOAT32)
        return dx, zeros, zeros.copy()
    kernel = _kernel(x, "layernorm.cu", "layernorm_backward_dx")
    kernel((_blocks(rows, LAYERNORM_WARPS_PER_BLOCK),), (LAYERNORM_WARPS_PER_BLOCK * 32,),
           (dy, x, w, mean, rstd, dx, np.int32(rows), np.int32(columns)))
    # dweight/dbias: per-chunk column sums on the GPU, then one sum over the chunks
    rows_per_chunk = max(LAYERNORM_ROWS_PER_CHUNK, _blocks(rows, 65535))  # grid.y <= 65535
    chunks = _blocks(rows, rows_per_chunk)
    dweight_partial = cupy.empty((chunks, columns), dtype=_FLOAT32)
    dbias_partial = cupy.empty((chunks, columns), dtype=_FLOAT32)
    kernel = _kernel(x, "layernorm.cu", "layernorm_backward_dweight_dbias")
    kernel((_blocks(columns, LAYERNORM_COLUMN_THREADS), chunks), (LAYERNORM_COLUMN_THREADS,),
           (dy, x, mean, rstd, dweight_partial, dbias_partial, np.int32(rows),
            np.int32(columns), np.int32(rows_per_chunk)))
    return (dx, dweight_partial.sum(axis=0).reshape(shape),
            dbias_partial.sum(axis=0).reshape(shape))


# --- GELU ---------------------------------------------------------------------------------
def supports_gelu(x: Any) -> bool:
    """A float32 (or bf16/fp16, widened by the op) input with at least one element
    (either form, tanh or erf)."""
    return x.size > 0 and _is_float32_or_narrower(x)


def _approximate_flag(op: str, approximate: str) -> np.int32:
    if approximate not in ("tanh", "none"):
        raise ValueError(f"{op}: approximate must be 'tanh' or 'none', got {approximate!r}")
    return np.int32(approximate == "tanh")


@_on_device_of_first_array
def gelu_forward(x: Any, approximate: str = "tanh") -> Any:
    """GELU of float32 ``x``: ``approximate="tanh"`` (GPT-2's) or ``"none"`` (erf)."""
    op = "gelu_forward"
    _check_float32(op, x=x)
    flag = _approximate_flag(op, approximate)
    x = _contiguous(x)
    y = _cupy().empty_like(x)
    if x.size:
        kernel = _kernel(x, "gelu.cu", "gelu_forward")
        kernel((_elementwise_grid(x.size),), (ELEMENTWISE_THREADS,),
               (x, y, np.int64(x.size), flag))
    return y


@_on_device_of_first_array
def gelu_backward(x: Any, dy: Any, approximate: str = "tanh") -> Any:
    """``dy * gelu'(x)``, both float32 of one shape."""
    op = "gelu_backward"
    _check_float32(op, x=x, dy=dy)
    _check_shape(op, "dy", dy, x.shape)
    flag = _approximate_flag(op, approximate)
    x, dy = _contiguous(x), _contiguous(dy)
    dx = _cupy().empty_like(x)
    if x.size:
        kernel = _kernel(x, "gelu.cu", "gelu_backward")
        kernel((_elementwise_grid(x.size),), (ELEMENTWISE_THREADS,),
               (x, dy, dx, np.int64(x.size), flag))
    return dx


# --- softmax + cross-entropy --------------------------------------------------------------
def supports_cross_entropy(logits: Any, targets: Any) -> bool:
    """float32 (M, C) logits with M, C >= 1 and C < 2^31, integer (M,) targets."""
    return (logits.ndim == 2 and logits.size > 0 and logits.shape[1] < 2 ** 31
            and _is_float32(logits) and targets.ndim == 1 and targets.dtype.kind in "iu")


def _check_cross_entropy(op: str, logits: Any, targets: Any) -> Any:
    _check_float32(op, logits=logits)
    if logits.ndim != 2:
        raise ValueError(f"{op}: logits must be (M, C), got shape {tuple(logits.shape)}")
    if targets.dtype.kind not in "iu":
        raise TypeError(f"{op}: targets must hold integer class ids, got {targets.dtype}")
    _check_shape(op, "targets", targets, logits.shape[:1])
    return _contiguous(targets.astype(_INT64, copy=False))


@_on_device_of_first_array
def cross_entropy_forward(logits: Any, targets: Any, ignore_index: int = -100,
                          label_smoothing: float = 0.0) -> Tuple[Any, Any]:
    """Per-row cross-entropy of float32 logits (M, C) against class ids (M,).

    Returns ``(loss, lse)``, both (M,) float32: loss is 0 on rows whose target is
    ``ignore_index``; lse is each row's log-sum-exp, what ``cross_entropy_backward``
    needs (the probabilities are never stored). Targets are not range-checked here.
    """
    op = "cross_entropy_forward"
    targets = _check_cross_entropy(op, logits, targets)
    cupy = _cupy()
    logits = _contiguous(logits)
    rows, classes = logits.shape
    loss = cupy.empty((rows,), dtype=_FLOAT32)
    lse = cupy.empty((rows,), dtype=_FLOAT32)
    if logits.size:
        kernel = _kernel(logits, "cross_entropy.cu", "cross_entropy_forward")
        kernel((rows,), (CROSS_ENTROPY_THREADS,),
               (logits, targets, loss, lse, np.int32(classes), np.int64(ignore_index),
                np.float32(label_smoothing)))
    return loss, lse


@_on_device_of_first_array
def cross_entropy_backward(logits: Any, targets: Any, lse: Any, dloss: Any,
                           ignore_index: int = -100, label_smoothing: float = 0.0) -> Any:
    """dL/dlogits (M, C) float32, given ``lse`` from the forward and ``dloss``, dL/d(each
    row's loss): an (M,) array or anything that broadcasts to it (a scalar for a mean).
    Ignored rows get zeros."""
    op = "cross_entropy_backward"
    targets = _check_cross_entropy(op, logits, targets)
    cupy = _cupy()
    logits = _contiguous(logits)
    rows, classes = logits.shape
    _check_float32(op, lse=lse)
    _check_shape(op, "lse", lse, (rows,))
    dloss = _contiguous(cupy.broadcast_to(cupy.asarray(dloss, dtype=_FLOAT32), (rows,)))
    dlogits = cupy.empty_like(logits)
    if logits.size:
        kernel = _kernel(logits, "cross_entropy.cu", "cross_entropy_backward")
        kernel((rows,), (CROSS_ENTROPY_THREADS,),
               (logits, targets, _contiguous(lse), dloss, dlogits, np.int32(classes),
                np.int64(ignore_index), np.float32(label_smoothing)))
    return dlogits


# --- AdamW --------------------------------------------------------------------------------
def supports_adamw(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any) -> bool:
    """float32 parameter, gradient and moments of one shape; the three arrays updated in
    place (param, exp_avg, exp_avg_sq) C-contiguous."""
    return (_is_float32(param, grad, exp_avg, exp_avg_sq) and param.size > 0
            and param.shape == grad.shape == exp_avg.shape == exp_avg_sq.shape
            and all(a.flags.c_contiguous for a in (param, exp_avg, exp_avg_sq)))


@_on_device_of_first_array
def adamw_update(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, *, lr: float,
                 beta1: float, beta2: float, eps: float, weight_decay: float,
                 step: int) -> None:
    """One AdamW step of one float32 parameter, in place (``param``, ``exp_avg``,
    ``exp_avg_sq``): the update of ``optim.adamw.adamw_update_`` in one kernel.
    ``step`` counts this step (1 on the first)."""
    op = "adamw_update"
    _check_float32(op, param=param, grad=grad, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    for name, a in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        _check_shape(op, name, a, param.shape)
    for name, a in (("param", param), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if not a.flags.c_contiguous:
            raise ValueError(f"{op}: {name} is updated in place and must be C-contiguous")
    if step < 1:
        raise ValueError(f"{op}: step counts from 1, got {step}")
    if not param.size:
        return
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    kernel = _kernel(param, "adamw.cu", "adamw_update")
    kernel((_elementwise_grid(param.size),), (ELEMENTWISE_THREADS,),
           (param, _contiguous(grad), exp_avg, exp_avg_sq, np.int64(param.size),
            np.float32(1.0 - lr * weight_decay), np.float32(beta1), np.float32(beta2),
            np.float32(eps), np.float32(lr / bias_correction1),
            np.float32(math.sqrt(bias_correction2))))


def adamw_step(params: Sequence[Any], grads: Sequence[Any], exp_avgs: Sequence[Any],
               exp_avg_sqs: Sequence[Any], steps: Sequence[int], **hyperparameters: Any) -> None:
    """``adamw_update`` over lists of parameters (one launch each), with the same
    hyperparameters (lr, beta1, beta2, eps, weight_decay) and each its own step count."""
    lists = (params, grads, exp_avgs, exp_avg_sqs, steps)
    if len({len(items) for items in lists}) != 1:
        raise ValueError(f"adamw_step: params, grads, exp_avgs, exp_avg_sqs and steps must "
                         f"have one length, got {[len(items) for items in lists]}")
    for param, grad, exp_avg, exp_avg_sq, step in zip(*lists):
        adamw_update(param, grad, exp_avg, exp_avg_sq, step=step, **hyperparameters)


# --- attention softmax (between attention's two cuBLAS products) ---------------------------
SOFTMAX_THREADS = 256  # attention_softmax.cu's SOFTMAX_THREADS: one block per row
DROPOUT_BITS = 24  # attention_softmax.cu's kept(): the hash's top 24 bits against p 2^24
_PROB_TYPES = (_FLOAT32, _BFLOAT16)  # PROB_BF16 = 0, 1


def supports_attention_softmax(q: Any, k: Any, v: Any, mask: Optional[Any]) -> bool:
    """float32 or bf16 q, k, v of one dtype, at least 2-D, no attn_mask (causal or not,
    dropout or not), v's batch dims no wider than the scores' (q's and k's broadcast), at
    most 2^31 - 1 rows of scores (one block each) of < 2^31 keys."""
    if mask is not None or not q.dtype == k.dtype == v.dtype or q.dtype not in _PROB_TYPES:
        return False
    if min(q.ndim, k.ndim, v.ndim) < 2 or q.size == 0 or k.size == 0:
        return False
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    # v may not widen the batch: backward's dA = dO V^T would then outgrow the saved P
    if np.broadcast_shapes(batch, v.shape[:-2]) != batch:
        return False
    rows = math.prod(batch) * q.shape[-2]
    return rows <= 2 ** 31 - 1 and k.shape[-2] <= 2 ** 31 - 1


def _dropout_arguments(op: str, dropout_p: float, seed: Optional[Any]) -> tuple:
    """(threshold, keep_scale, seed) as the kernels take them: dropout keeps an element when
    its hash's top 24 bits reach threshold = round(p 2^24)."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
    threshold = int(round(dropout_p * (1 << DROPOUT_BITS)))
    if threshold and (seed is None or seed.dtype != np.uint64 or seed.shape != (1,)):
        raise ValueError(f"{op}: dropout needs seed, a (1,) uint64 device array, got "
                         f"{None if seed is None else (seed.dtype, tuple(seed.shape))}")
    if not threshold:
        seed = _unused_seed(_cupy())
    return np.uint32(threshold), np.float32(1.0 / (1.0 - dropout_p)), seed


def _unused_seed(cupy: Any) -> Any:
    """A (1,) uint64 array on the current device for the seed argument without dropout
    (never read then), made once per device."""
    device = cupy.cuda.Device().id if hasattr(cupy, "cuda") else -1
    if device not in _UNUSED_SEEDS:
        _UNUSED_SEEDS[device] = cupy.zeros(1, dtype=np.uint64)
    return _UNUSED_SEEDS[device]


_UNUSED_SEEDS: dict = {}


@_on_device_of_first_array
def attention_softmax_forward(scores: Any, causal: bool, scale: float, dropout_p: float,
                              seed: Optional[Any], dtype: Any) -> Tuple[Any, Any]:
    """``(P, A)``: P = softmax(scores * scale), keys after each query masked when ``causal``
    (top-left aligned), and A = dropout(P) with the mask drawn from ``seed`` (A is P when
    ``dropout_p`` is 0), both (..., L, S) in ``dtype`` (float32 or bf16).

    scores: (..., L, S) float32, as cuBLAS writes Q K^T. seed: a (1,) uint64 device array
    (the backward recomputes the mask from it), or None without dropout."""
    op = "attention_softmax_forward"
    _check_float32(op, scores=scores)
    dtype = np.dtype(dtype)
    if dtype not in _PROB_TYPES or scores.ndim < 2 or scores.size == 0:
        raise ValueError(f"{op}: expected non-empty scores (..., L, S) and dtype float32 or "
                         f"bfloat16, got {tuple(scores.shape)} and {dtype}")
    threshold, keep_scale, seed = _dropout_arguments(op, dropout_p, seed)
    cupy = _cupy()
    scores = _contiguous(scores)
    L, S = scores.shape[-2:]
    probs = cupy.empty(scores.shape, dtype=dtype)
    attended = cupy.empty_like(probs) if threshold else probs
    kernel = _kernel(scores, "attention_softmax.cu", "attention_softmax_forward",
                     PROB_BF16=int(dtype == _BFLOAT16))
    kernel((scores.size // S,), (SOFTMAX_THREADS,),
           (scores, probs, attended, np.int32(L), np.int32(S), np.float32(scale),
            np.int32(causal), threshold, keep_scale, seed))
    return probs, attended


@_on_device_of_first_array
def attention_softmax_backward(d_attended: Any, probs: Any, scale: float, dropout_p: float,
                               seed: Optional[Any]) -> Any:
    """dS, the gradient of the scores (before scaling), in P's dtype, from dA = dO V^T
    (..., L, S) float32 and the forward's P, ``dropout_p`` and ``seed``:
    dS = scale * P * (dP - rowsum(dP * P)) with dP = dA * keep / (1 - p)."""
    op = "attention_softmax_backward"
    _check_float32(op, d_attended=d_attended)
    if probs.dtype not in _PROB_TYPES:
        raise TypeError(f"{op}: probs must be float32 or bfloat16, got {probs.dtype}")
    _check_shape(op, "probs", probs, d_attended.shape)
    threshold, keep_scale, seed = _dropout_arguments(op, dropout_p, seed)
    cupy = _cupy()
    d_attended, probs = _contiguous(d_attended), _contiguous(probs)
    S = probs.shape[-1]
    d_scores = cupy.empty(probs.shape, dtype=probs.dtype)
    kernel = _kernel(probs, "attention_softmax.cu", "attention_softmax_backward",
                     PROB_BF16=int(probs.dtype == _BFLOAT16))
    kernel((probs.size // S,), (SOFTMAX_THREADS,),
           (d_attended, probs, d_scores, np.int32(S), np.float32(scale), threshold,
            keep_scale, seed))
    return d_scores


# --- flash attention ----------------------------------------------------------------------
MAX_GRID_X = 2 ** 31 - 1  # CUDA's limit on gridDim.x: attention's flat row of blocks
MAX_SEQUENCE = 2 ** 30  # attention.cu holds positions as int, with room for a tile past them
# attention.cu's INPUT_DTYPE: the storage dtypes it reads q, k, v and dO in, widened to
# float32 on load (so the op passes bf16 under autocast as it is, no widened copies)
ATTENTION_INPUT_DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}


def attention_input_code(dtype: Any) -> Optional[int]:
    """attention.cu's INPUT_DTYPE for inputs of ``dtype``; None for a dtype it cannot read."""
    return ATTENTION_INPUT_DTYPES.get(np.dtype(dtype).name)


def _attention_blocks(bh: int, L: int, S: int, head_dim: int) -> int:
    """The most blocks any attention kernel launches (one flat row: gridDim.x)."""
    rows_per_block = ATTENTION_WARPS * min(ATTENTION_FORWARD_ROWS,
                                           attention_backward_rows(head_dim))
    return _blocks(max(L, S), rows_per_block) * bh


def supports_flash_attention(q: Any, k: Any, v: Any, mask: Optional[Any],
                             dropout_p: float) -> bool:
    """q (..., L, E), k (..., S, E), v (..., S, E) of one dtype, float32, bf16 or fp16 (the
    kernels read each as stored), with the same batch dims (no broadcasting) and any strides
    (heads that are strided views are read in place; see ``attention_head_split``),
    1 <= E <= MAX_HEAD_DIM, 1 <= L, S <= MAX_SEQUENCE, at most MAX_GRID_X blocks
    (ceil(max(L, S) / 16 or 8) * batch * heads), no attn_mask and no dropout. Causal or not.
    """
    if not (mask is None and dropout_p == 0.0 and q.dtype == k.dtype == v.dtype
            and attention_input_code(q.dtype) is not None and q.ndim >= 2
            and q.ndim == k.ndim == v.ndim and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
            and q.shape[-1] == k.shape[-1] == v.shape[-1]
            and 1 <= q.shape[-1] <= MAX_HEAD_DIM and k.shape[-2] == v.shape[-2]
            and q.size > 0 and k.size > 0):
        return False
    L, S, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    bh = q.size // (L * head_dim)
    return max(L, S) <= MAX_SEQUENCE and _attention_blocks(bh, L, S, head_dim) <= MAX_GRID_X


def _attention_shapes(op: str, q: Any, k: Any, v: Any) -> Tuple[int, int, int, int]:
    """(BH, L, S, E) after checking the dtypes and shapes; raises naming the argument."""
    if attention_input_code(q.dtype) is None:
        raise TypeError(f"{op}: q must be float32, bfloat16 or float16, got {q.dtype}")
    for name, a in (("k", k), ("v", v)):
        if a.dtype != q.dtype:
            raise TypeError(f"{op}: q, k, v must share one dtype, got {name} {a.dtype} with q "
                            f"{q.dtype}")
    if q.ndim < 2 or not q.ndim == k.ndim == v.ndim:
        raise ValueError(f"{op}: q, k, v must be (..., seq, head_dim) with one rank, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"{op}: q, k, v must share their batch dims (no broadcasting), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    head_dim = q.shape[-1]
    if not (k.shape[-1] == v.shape[-1] == head_dim and k.shape[-2] == v.shape[-2]):
        raise ValueError(f"{op}: expected k and v of shape (..., S, {head_dim}), got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"{op}: head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    L, S = q.shape[-2], k.shape[-2]
    if not (1 <= L <= MAX_SEQUENCE and 1 <= S <= MAX_SEQUENCE):
        raise ValueError(f"{op}: needs 1 to {MAX_SEQUENCE} queries and keys, got L={L}, "
                         f"S={S}")
    bh = q.size // (L * head_dim)
    if _attention_blocks(bh, L, S, head_dim) > MAX_GRID_X:
        raise ValueError(f"{op}: at most {MAX_GRID_X} blocks of rows per launch, got "
                         f"{_attention_blocks(bh, L, S, head_dim)} for q of shape "
                         f"{tuple(q.shape)} and k of shape {tuple(k.shape)}")
    return bh, L, S, head_dim


def _element_strides(a: Any) -> Optional[Tuple[int, ...]]:
    """a's strides in elements; None when one is not a whole number of them."""
    if any(s % a.itemsize for s in a.strides):
        return None
    return tuple(s // a.itemsize for s in a.strides)


def _batch_breaks(batch: tuple, strides: tuple) -> set:
    """The dims j of ``batch`` (of size > 1) that do not flatten with the previous dim of
    size > 1: where index (i, j) is not at stride(j) * (i * n_j + j)."""
    dims = [d for d, n in enumerate(batch) if n != 1]
    return {j for i, j in zip(dims, dims[1:]) if strides[i] != strides[j] * batch[j]}


def attention_head_split(arrays: Sequence[Any]) -> Tuple[int, Tuple[bool, ...]]:
    """How the attention kernels read ``arrays`` (q, k, v[, dO]: (..., n, E), one batch
    shape) in place: ``(split, copy)``. The batch dims before ``split`` flatten into the
    kernels' outer (batch) index, those from ``split`` on into the inner (head) index, each
    with one stride per array (``attention_strides``); ``copy[i]`` says array i must be made
    contiguous first, because its last dim is strided or its batch dims need more than the
    two strides the others leave. GPT's heads, (B, nh, T, hs) views of (B, T, 3C), give
    split 1 and no copies::

        >>> qkv = np.zeros((2, 5, 3, 4, 8), np.float32)  # (B, T, 3, nh, hs)
        >>> q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        >>> attention_head_split([q, k, v])
        (1, (False, False, False))
    """
    batch = tuple(arrays[0].shape[:-2])
    strides = [_element_strides(a) for a in arrays]
    copy = [s is None or (a.shape[-1] != 1 and s[-1] != 1) for a, s in zip(arrays, strides)]
    breaks = [set() if c else _batch_breaks(batch, s[:-2]) for c, s in zip(copy, strides)]
    while len(set().union(*breaks)) > 1:  # more than two strides: copy the worst offender
        worst = max(range(len(arrays)), key=lambda i: len(breaks[i]))
        copy[worst], breaks[worst] = True, set()
    union = set().union(*breaks)
    return (min(union) if union else 0), tuple(copy)


def attention_strides(a: Any, split: int) -> Tuple[int, int, int]:
    """(batch, head, row) strides in elements with which the kernels read ``a`` (..., n, E)
    split at ``split`` (``attention_head_split``): each group's flat index steps by the
    stride of its last dim of size > 1 (0 for a group of ones)."""
    shape, strides = a.shape, _element_strides(a)

    def step(dims: range) -> int:
        return next((strides[d] for d in reversed(dims) if shape[d] != 1), 0)
    return step(range(split)), step(range(split, a.ndim - 2)), strides[-2]


def _attention_layout(arrays: Sequence[Any]) -> Tuple[list, int, tuple]:
    """``(arrays, heads, strides)`` for the kernels: the arrays (copied only where
    ``attention_head_split`` says), the inner (head) count and every array's three strides
    as int64 scalars, in order."""
    split, copy = attention_head_split(arrays)
    arrays = [_contiguous(a) if c else a for a, c in zip(arrays, copy)]
    strides = tuple(np.int64(s) for a in arrays for s in attention_strides(a, split))
    return arrays, math.prod(arrays[0].shape[split:-2]), strides


@_on_device_of_first_array
def flash_attention_forward(q: Any, k: Any, v: Any, causal: bool,
                            scale: float) -> Tuple[Any, Any]:
    """softmax(q k^T * scale [causal]) v without storing the (L, S) scores.

    q (..., L, E), k and v (..., S, E): one dtype, float32, bf16 or fp16, read as stored
    and where they are (strided heads in place; a copy only where ``attention_head_split``
    asks for one); computed in float32. Returns ``(o, lse)``, contiguous float32: o
    (..., L, E) and each query's log-sum-exp of scores lse (..., L), which the backward
    needs.
    """
    op = "flash_attention_forward"
    bh, L, S, head_dim = _attention_shapes(op, q, k, v)
    cupy = _cupy()
    (q, k, v), heads, strides = _attention_layout((q, k, v))
    o = cupy.empty(q.shape, dtype=_FLOAT32)
    lse = cupy.empty(q.shape[:-1], dtype=_FLOAT32)
    rows_per_block = ATTENTION_WARPS * ATTENTION_FORWARD_ROWS
    kernel = _kernel(q, "attention.cu", "flash_attention_forward", HEAD_DIM=head_dim,
                     INPUT_DTYPE=attention_input_code(q.dtype))
    kernel((_blocks(L, rows_per_block) * bh,), (ATTENTION_WARPS * 32,),
           (q, k, v, o, lse, np.int32(L), np.int32(S), np.int32(heads), np.float32(scale),
            np.int32(causal), *strides))
    return o, lse


@_on_device_of_first_array
def flash_attention_backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any,
                             causal: bool, scale: float) -> Tuple[Any, Any, Any]:
    """Gradients ``(dq, dk, dv)``, contiguous float32, of ``flash_attention_forward`` given
    ``do`` = dL/do, recomputing the attention weights from the saved ``lse``. q, k, v and
    do are read as stored and in place, as in the forward (do in q's dtype: another float
    dtype is cast once); o and lse are the forward's float32 outputs."""
    op = "flash_attention_backward"
    bh, L, S, head_dim = _attention_shapes(op, q, k, v)
    _check_float32(op, o=o, lse=lse)
    _check_shape(op, "o", o, q.shape)
    _check_shape(op, "do", do, q.shape)
    _check_shape(op, "lse", lse, q.shape[:-1])
    if do.dtype != q.dtype:  # one module reads q, k, v and do: do in q's dtype
        if attention_input_code(do.dtype) is None and do.dtype != np.float64:
            raise TypeError(f"{op}: do must be float64, float32, bfloat16 or float16, got "
                            f"{do.dtype}")
        do = do.astype(q.dtype)
    cupy = _cupy()
    (q, k, v, do), heads, strides = _attention_layout((q, k, v, do))
    o, lse = _contiguous(o), _contiguous(lse)
    delta = cupy.empty(lse.shape, dtype=_FLOAT32)  # D = rowsum(dO * O), (..., L)
    dq = cupy.empty(q.shape, dtype=_FLOAT32)
    dk = cupy.empty(k.shape, dtype=_FLOAT32)
    dv = cupy.empty(v.shape, dtype=_FLOAT32)
    threads = (ATTENTION_WARPS * 32,)
    defines = dict(HEAD_DIM=head_dim, INPUT_DTYPE=attention_input_code(q.dtype))
    kernel = _kernel(q, "attention.cu", "flash_attention_backward_preprocess", **defines)
    kernel((max(1, min(_blocks(bh * L, ATTENTION_WARPS), 65536)),), threads,
           (o, do, delta, np.int64(bh * L), np.int32(L), np.int32(heads),
            *strides[-3:]))  # do's strides
    rows_per_block = ATTENTION_WARPS * attention_backward_rows(head_dim)
    sizes = (np.int32(L), np.int32(S), np.int32(heads), np.float32(scale), np.int32(causal))
    kernel = _kernel(q, "attention.cu", "flash_attention_backward_dq", **defines)
    kernel((_blocks(L, rows_per_block) * bh,), threads,
           (q, k, v, do, lse, delta, dq, *sizes, *strides))
    kernel = _kernel(q, "attention.cu", "flash_attention_backward_dkdv", **defines)
    kernel((_blocks(S, rows_per_block) * bh,), threads,
           (q, k, v, do, lse, delta, dk, dv, *sizes, *strides))
    return dq, dk, dv
