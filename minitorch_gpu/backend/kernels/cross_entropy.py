"""Softmax + cross-entropy's launchers (``cross_entropy.cu``): per-row loss and
log-sum-exp forward, dL/dlogits backward, the probabilities never stored.
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from . import loader
from .loader import (FLOAT32, INT64, check_float32, check_shape, is_float32,
                     on_device_of_first_array)

CROSS_ENTROPY_THREADS = 256  # cross_entropy.cu's CE_THREADS: one block per row


def supports_cross_entropy(logits: Any, targets: Any) -> bool:
    """float32 (M, C) logits with M, C >= 1 and C < 2^31, integer (M,) targets."""
    return (logits.ndim == 2 and logits.size > 0 and logits.shape[1] < 2 ** 31
            and is_float32(logits) and targets.ndim == 1 and targets.dtype.kind in "iu")


def _check_cross_entropy(op: str, logits: Any, targets: Any) -> Any:
    check_float32(op, logits=logits)
    if logits.ndim != 2:
        raise ValueError(f"{op}: logits must be (M, C), got shape {tuple(logits.shape)}")
    if targets.dtype.kind not in "iu":
        raise TypeError(f"{op}: targets must hold integer class ids, got {targets.dtype}")
    check_shape(op, "targets", targets, logits.shape[:1])
    return loader.contiguous(targets.astype(INT64, copy=False))


@on_device_of_first_array
def cross_entropy_forward(logits: Any, targets: Any, ignore_index: int = -100,
                          label_smoothing: float = 0.0) -> Tuple[Any, Any]:
    """Per-row cross-entropy of float32 logits (M, C) against class ids (M,).

    Returns ``(loss, lse)``, both (M,) float32: loss is 0 on rows whose target is
    ``ignore_index``; lse is each row's log-sum-exp, what ``cross_entropy_backward``
    needs (the probabilities are never stored). Targets are not range-checked here.
    """
    op = "cross_entropy_forward"
    targets = _check_cross_entropy(op, logits, targets)
    cupy = loader.require_cupy()
    logits = loader.contiguous(logits)
    rows, classes = logits.shape
    loss = cupy.empty((rows,), dtype=FLOAT32)
    lse = cupy.empty((rows,), dtype=FLOAT32)
    if logits.size:
        kernel = loader.load_kernel(logits, "cross_entropy.cu", "cross_entropy_forward")
        kernel((rows,), (CROSS_ENTROPY_THREADS,),
               (logits, targets, loss, lse, np.int32(classes), np.int64(ignore_index),
                np.float32(label_smoothing)))
    return loss, lse


@on_device_of_first_array
def cross_entropy_backward(logits: Any, targets: Any, lse: Any, dloss: Any,
                           ignore_index: int = -100, label_smoothing: float = 0.0) -> Any:
    """dL/dlogits (M, C) float32, given ``lse`` from the forward and ``dloss``, dL/d(each
    row's loss): an (M,) array or anything that broadcasts to it (a scalar for a mean).
    Ignored rows get zeros."""
    op = "cross_entropy_backward"
    targets = _check_cross_entropy(op, logits, targets)
    cupy = loader.require_cupy()
    logits = loader.contiguous(logits)
    rows, classes = logits.shape
    check_float32(op, lse=lse)
    check_shape(op, "lse", lse, (rows,))
    dloss = loader.contiguous(cupy.broadcast_to(cupy.asarray(dloss, dtype=FLOAT32), (rows,)))
    dlogits = cupy.empty_like(logits)
    if logits.size:
        kernel = loader.load_kernel(logits, "cross_entropy.cu", "cross_entropy_backward")
        kernel((rows,), (CROSS_ENTROPY_THREADS,),
               (logits, targets, loader.contiguous(lse), dloss, dlogits, np.int32(classes),
                np.int64(ignore_index), np.float32(label_smoothing)))
    return dlogits
