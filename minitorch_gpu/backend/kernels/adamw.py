"""AdamW's launcher (``adamw.cu``): one parameter's update in place, in one kernel."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import loader
from .loader import (ELEMENTWISE_THREADS, check_float32, check_shape, elementwise_grid,
                     is_float32, on_device_of_first_array)


def supports_adamw(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any) -> bool:
    """float32 parameter, gradient and moments of one shape; the three arrays updated in
    place (param, exp_avg, exp_avg_sq) C-contiguous."""
    return (is_float32(param, grad, exp_avg, exp_avg_sq) and param.size > 0
            and param.shape == grad.shape == exp_avg.shape == exp_avg_sq.shape
            and all(a.flags.c_contiguous for a in (param, exp_avg, exp_avg_sq)))


@on_device_of_first_array
def adamw_update(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, *, lr: float,
                 beta1: float, beta2: float, eps: float, weight_decay: float,
                 step: int) -> None:
    """One AdamW step of one float32 parameter, in place (``param``, ``exp_avg``,
    ``exp_avg_sq``): the update of ``optim.adamw.adamw_update_`` in one kernel.
    ``step`` counts this step (1 on the first)."""
    op = "adamw_update"
    check_float32(op, param=param, grad=grad, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    for name, a in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        check_shape(op, name, a, param.shape)
    for name, a in (("param", param), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if not a.flags.c_contiguous:
            raise ValueError(f"{op}: {name} is updated in place and must be C-contiguous")
    if step < 1:
        raise ValueError(f"{op}: step counts from 1, got {step}")
    if not param.size:
        return
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    kernel = loader.load_kernel(param, "adamw.cu", "adamw_update")
    kernel((elementwise_grid(param.size),), (ELEMENTWISE_THREADS,),
           (param, loader.contiguous(grad), exp_avg, exp_avg_sq, np.int64(param.size),
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
