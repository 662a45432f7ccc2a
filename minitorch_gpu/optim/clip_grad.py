"""Gradient clipping by total norm, as torch.nn.utils.clip_grad_norm_."""
from __future__ import annotations

import math
from typing import Iterable, List, Union

from ..backend import dtypes
from ..creation import zeros
from ..tensor import Tensor
from .optimizer import check_hyperparameter

_WIDE = frozenset({dtypes.float32, dtypes.float64})


def clip_grad_norm_(parameters: Union[Tensor, Iterable[Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
    """Scale the gradients in place so that their total norm is at most ``max_norm``.

    The total norm is the ``norm_type``-norm of all gradients taken as one vector (``inf``
    for the largest absolute value). When it exceeds ``max_norm`` every gradient is
    multiplied by ``max_norm / (total + 1e-6)``. Parameters whose grad is None are skipped.
    Returns the total norm before clipping, a 0-d float32 tensor on the first gradient's
    device (0 when no parameter has a gradient). Reading the norm costs one device sync.

    >>> loss.backward()
    >>> clip_grad_norm_(model.parameters(), 1.0)
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    check_hyperparameter("clip_grad_norm_", "max_norm", max_norm)
    norm_type = float(norm_type)
    if not (norm_type > 0):
        raise ValueError(f"clip_grad_norm_: invalid norm_type: expected a positive number or "
                         f"inf, got {norm_type!r}")
    grads: List[Tensor] = []
    for p in parameters:
        if not isinstance(p, Tensor):
            raise TypeError(f"clip_grad_norm_: expected Tensors, got {type(p).__name__}")
        if p.grad is not None:
            grads.append(p.grad)
    if not grads:
        return zeros((), dtype=dtypes.float32)

    total = _total_norm(grads, norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                           f"gradients is {total}, so they cannot be clipped; find the "
                           "non-finite gradient, or pass error_if_nonfinite=False to clip "
                           "anyway (the gradients then become nan)")
    clip_coef = max_norm / (total + 1e-6)
    if not clip_coef >= 1.0:  # also true for a nan norm: the gradients become nan, as torch's
        for g in grads:
            g.data *= clip_coef
    backend = grads[0].backend
    return Tensor._make(backend.asarray(total, dtype=dtypes.float32), backend, False)


def _total_norm(grads: List[Tensor], norm_type: float) -> float:
    """The ``norm_type``-norm of all gradients taken together, as a Python float."""
    parts: dict = {}  # device -> its gradients' sum (or max), kept on the device till the end
    for grad in grads:
        g = grad.data
        if g.size == 0:
            continue
        xp = grad.backend.xp
        if g.dtype not in _WIDE:
            g = g.astype(dtypes.float32)  # bf16/fp16: sum squares without overflow
        if norm_type == math.inf:
            # max |g| as max(max g, -min g): no array of absolute values is made
            part = xp.maximum(g.max(), -g.min())
        elif norm_type == 2.0:
            flat = g.ravel()  # a view when the grad is contiguous
            part = xp.vdot(flat, flat)  # the sum of squares without a squared copy
        elif norm_type == 1.0:
            part = xp.abs(g).sum()
        else:
            part = (xp.abs(g) ** norm_type).sum()
        previous = parts.get(grad.device)
        if previous is None:
            parts[grad.device] = part
        elif norm_type == math.inf:
            parts[grad.device] = xp.maximum(previous, part)  # nan propagates
        else:
            parts[grad.device] = previous + part
    values = [float(part) for part in parts.values()]  # one sync per device
    if not values:
        return 0.0
    if norm_type == math.inf:
        return math.nan if any(math.isnan(v) for v in values) else max(values)
    return math.fsum(values) ** (1.0 / norm_type)
