"""AdamW over float32 parameters, one pass each: param, grad and both moments read once,
param and the moments written once (NumPy's chain of a dozen ufuncs reads and writes
them a dozen times). A list of parameters is split over the cores, each thread a run of
whole parameters of about equal size.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..threads import cpu_threads, run_split
from .activations import _is_float32
from .compiler import SPLIT_FROM, jit


def supports_adamw(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any) -> bool:
    """float32 NumPy parameter, gradient and moments of one shape, the three updated in
    place C-contiguous."""
    return (_is_float32(param, grad, exp_avg, exp_avg_sq) and param.size > 0
            and param.shape == grad.shape == exp_avg.shape == exp_avg_sq.shape
            and all(a.flags.c_contiguous for a in (param, exp_avg, exp_avg_sq)))


@jit
def _adamw(p, g, m, v, decay, beta1, beta2, eps, step_size, root_correction2):
    # pragma: no cover - compiled
    one = np.float32(1.0)
    for i in range(p.size):
        gi = g[i]
        mi = beta1 * m[i] + (one - beta1) * gi
        vi = beta2 * v[i] + (one - beta2) * (gi * gi)
        m[i] = mi
        v[i] = vi
        p[i] = p[i] * decay - step_size * (mi / (np.sqrt(vi) / root_correction2 + eps))


def adamw_update(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, *, lr: float,
                 beta1: float, beta2: float, eps: float, weight_decay: float,
                 step: int) -> None:
    """One AdamW step of one float32 parameter, in place: ``optim.adamw.adamw_update_``'s
    arithmetic (decoupled decay, then lr / (1 - beta1^t) m / (sqrt(v / (1 - beta2^t)) +
    eps)) in one loop. ``step`` counts this step (1 on the first)."""
    op = "adamw_update"
    if not supports_adamw(param, grad, exp_avg, exp_avg_sq):
        raise TypeError(f"{op}: expected float32 NumPy param, grad, exp_avg, exp_avg_sq of "
                        f"one shape, the three updated in place C-contiguous")
    if step < 1:
        raise ValueError(f"{op}: step counts from 1, got {step}")
    f32 = np.float32
    _adamw(param.reshape(-1), np.ascontiguousarray(grad).reshape(-1), exp_avg.reshape(-1),
           exp_avg_sq.reshape(-1), f32(1.0 - lr * weight_decay), f32(beta1), f32(beta2),
           f32(eps), f32(lr / (1.0 - beta1 ** step)), f32(math.sqrt(1.0 - beta2 ** step)))


def adamw_step(params: Sequence[Any], grads: Sequence[Any], exp_avgs: Sequence[Any],
               exp_avg_sqs: Sequence[Any], steps: Sequence[int], **hyperparameters: Any) -> None:
    """``adamw_update`` over lists of parameters with the same hyperparameters (lr, beta1,
    beta2, eps, weight_decay) and each its own step count; from ``SPLIT_FROM`` elements in
    all, the list is cut into one run of parameters per core."""
    lists = (params, grads, exp_avgs, exp_avg_sqs, steps)
    if len({len(items) for items in lists}) != 1:
        raise ValueError(f"adamw_step: params, grads, exp_avgs, exp_avg_sqs and steps must "
                         f"have one length, got {[len(items) for items in lists]}")

    def update(run: range) -> None:
        for i in run:
            adamw_update(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], step=steps[i],
                         **hyperparameters)

    sizes = [p.size for p in params]
    total = sum(sizes)
    parts = min(cpu_threads(), len(params)) if total >= SPLIT_FROM else 1
    cuts, done, start = [], 0, 0  # runs of whole parameters, about total / parts each
    for i, size in enumerate(sizes):
        done += size
        if len(cuts) < parts - 1 and done >= total * (len(cuts) + 1) / parts:
            cuts.append(range(start, i + 1))
            start = i + 1
    cuts.append(range(start, len(params)))
    run_split(update, [run for run in cuts if len(run)])
