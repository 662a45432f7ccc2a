"""Checking gradients: analytic backward against central differences, in float64."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .autograd import no_grad
from .tensor import Tensor


def _outputs(result: Any) -> list:
    items = result if isinstance(result, (tuple, list)) else [result]
    return [t for t in items if isinstance(t, Tensor) and t.requires_grad]


def gradcheck(fn: Callable[..., Any], inputs: Sequence[Any], eps: float = 1e-6,
              atol: float = 1e-5, rtol: float = 1e-4, seed: int = 0,
              raise_exception: bool = True) -> bool:
    """Check ``fn``'s backward against central differences.

    Every Tensor in ``inputs`` that requires grad must be float64. The outputs are
    projected on a fixed random direction ``v`` and the scalar ``sum(v * fn(x))`` is
    differentiated both ways: backward gives ``v^T J`` in one pass, central differences
    ``(f(x + eps e_i) - f(x - eps e_i)) / 2 eps`` one input element at a time.

    >>> x = minitorch_gpu.randn(3, dtype="float64", requires_grad=True)
    >>> gradcheck(lambda t: t.tanh(), [x])
    True
    """
    targets = [t for t in inputs if isinstance(t, Tensor) and t.requires_grad]
    if not targets:
        raise ValueError("gradcheck: no input requires grad")
    for t in targets:
        if t.dtype != np.float64:
            raise TypeError(f"gradcheck: inputs that require grad must be float64 (finite "
                            f"differences need the precision), got {t.dtype}")

    outputs = _outputs(fn(*inputs))
    if not outputs:
        raise ValueError("gradcheck: fn returned no tensor that requires grad")
    rng = np.random.default_rng(seed)
    directions = [rng.standard_normal(o.shape) for o in outputs]

    def projected() -> float:
        with no_grad():
            result = fn(*inputs)
        items = result if isinstance(result, (tuple, list)) else [result]
        outs = [t for t in items if isinstance(t, Tensor)][:len(directions)]
        return float(sum(np.sum(np.asarray(o.detach().cpu().data, dtype=np.float64) * v)
                         for o, v in zip(outs, directions)))

    for t in targets:
        t.grad = None
    total = None
    for o, v in zip(outputs, directions):
        term = (o * Tensor(v, device=o.device)).sum()
        total = term if total is None else total + term
    total.backward()

    for index, t in enumerate(targets):
        analytic = (np.zeros(t.shape) if t.grad is None
                    else np.asarray(t.grad.detach().cpu().data, dtype=np.float64))
        numeric = np.zeros(t.shape)
        for i in range(t.numel()):  # one element at a time: this is a test, not a kernel
            position = np.unravel_index(i, t.shape)
            original = t.data[position].item()
            t.data[position] = original + eps
            plus = projected()
            t.data[position] = original - eps
            minus = projected()
            t.data[position] = original
            numeric[position] = (plus - minus) / (2 * eps)
        if not np.allclose(analytic, numeric, atol=atol, rtol=rtol):
            worst = np.unravel_index(np.argmax(np.abs(analytic - numeric)), t.shape)
            message = (f"gradcheck: input {index} (shape {tuple(t.shape)}): backward and "
                       f"central differences disagree; worst at {tuple(int(i) for i in worst)}: "
                       f"analytic {analytic[worst]:.8g}, numeric {numeric[worst]:.8g}")
            if raise_exception:
                raise AssertionError(message)
            return False
    return True
