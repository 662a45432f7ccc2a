"""Gradient clipping by total norm, as torch.nn.utils.clip_grad_norm_."""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Union

from ..backend import dtypes
from ..creation import zeros
from ..tensor import Tensor
from .optimizer import check_hyperparameter

_WIDE = frozenset({dtypes.float32, dtypes.float64})


def clip_grad_norm_(parameters: Union[Tensor, Iterable[Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
    """Scale the gradients in place so that their total norm is at most ``max_norm``.

    The total norm is the ``norm_type``-norm of all gradients taken as one vector (``inf``
    for the largest absolute value). Every gradient is multiplied by
    ``min(1, max_norm / (total + 1e-6))``, computed on the device as PyTorch does: nothing
    is read back to the host, so a training step does not wait for the GPU here (on the
    CPU, where reading costs nothing, a scale of exactly 1 skips the multiply). A nan or
    infinite norm makes the gradients nan, as torch's. Parameters whose grad is None are
    skipped. Returns the total norm before clipping, a 0-d float32 tensor on the first
    gradient's device (0 when no parameter has a gradient), not read: ``.item()`` reads it
    (a wait for the GPU). ``error_if_nonfinite=True`` reads it here.

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

    backend = grads[0].backend
    with backend.on_device():  # CuPy launches on the current GPU: make it the gradients'
        return _clip(grads, backend, max_norm, norm_type, error_if_nonfinite)


def _clip(grads: List[Tensor], backend: Any, max_norm: float, norm_type: float,
          error_if_nonfinite: bool) -> Tensor:
    """clip_grad_norm_ of the gradients ``grads``, with ``backend`` (the first one's) the
    current device."""
    xp = backend.xp
    total = _total_norm(grads, norm_type)  # 0-d, on the first gradient's device
    if error_if_nonfinite:
        value = float(backend.to_numpy(total))  # a read, as torch's check is
        if not math.isfinite(value):
            raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                               f"gradients is {value}, so they cannot be clipped; find the "
                               "non-finite gradient, or pass error_if_nonfinite=False to clip "
                               "anyway (the gradients then become nan)")
    scale = xp.minimum(max_norm / (total + 1e-6), 1.0)  # nan stays nan
    if not (backend.reads_are_free and scale == 1.0):  # the CPU skips a multiply by 1
        # the scale rounded to each gradient's dtype, the product then in that dtype
        factors: Dict[Any, Any] = {}
        for g in grads:
            key = (g.device, g.data.dtype)
            if key not in factors:
                factors[key] = g.backend.asarray(scale, dtype=g.data.dtype)
            with g.backend.on_device():  # a gradient on another GPU is scaled there
                g.data *= factors[key]
    return Tensor._make(total.astype(dtypes.float32), backend, False)


def _total_norm(grads: List[Tensor], norm_type: float) -> Any:
    """The ``norm_type``-norm of all gradients taken together: a 0-d array on the first
    gradient's device (float32, float64 for float64 gradients), never read."""
    backend = grads[0].backend
    xp = backend.xp
    parts: dict = {}  # device -> its gradients' sum (or max), kept on the device
    for grad in grads:
        g = grad.data
        if g.size == 0:
            continue
        with grad.backend.on_device():  # each part is summed where its gradient lives
            part = _norm_part(grad.backend.xp, g, norm_type, parts.get(grad.device))
        parts[grad.device] = part
    if not parts:
        return xp.zeros((), dtype=dtypes.float32)
    # every device's part on the first one (a copy between devices: a host read only
    # where the first device is the CPU and a part comes from a GPU)
    values = [part if device == backend.device else backend.asarray(part)
              for device, part in parts.items()]
    total = values[0]
    for value in values[1:]:
        total = xp.maximum(total, value) if norm_type == math.inf else total + value
    if norm_type == math.inf:
        return xp.asarray(total)
    return xp.asarray(total ** (1.0 / norm_type))


def _norm_part(xp: Any, g: Any, norm_type: float, previous: Any) -> Any:
    """The sum of ``|g| ** norm_type`` (the max of ``|g|`` for inf) combined with
    ``previous``, the part of the gradients before it on its device (or None)."""
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
    if previous is None:
        return part
    if norm_type == math.inf:
        return xp.maximum(previous, part)  # nan propagates
    return previous + part
