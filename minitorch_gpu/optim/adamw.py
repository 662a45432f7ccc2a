"""AdamW: Adam with decoupled weight decay, torch.optim.AdamW's update.

Per parameter, at its step t (counted from 1)::

    param *= 1 - lr * weight_decay                       # decoupled decay
    m = beta1 * m + (1 - beta1) * g                      # first moment
    v = beta2 * v + (1 - beta2) * g^2                    # second moment
    param -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

``adamw_update_`` does this on raw arrays as a chain of in-place ops into one scratch
buffer, so a step allocates nothing. On a CUDA backend, float32 parameters are updated by
the fused kernel ``backend/kernels/adamw.cu`` instead (one pass over the arrays).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

from .optimizer import Optimizer, Params, check_hyperparameter, weight_decay_groups


def adamw_update_(xp: Any, param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any,
                  scratch: Any, *, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, step: int) -> None:
    """One AdamW step on raw arrays, in place: ``param``, ``exp_avg``, ``exp_avg_sq``.

    ``step`` is this parameter's step count including this one (1 on the first call).
    ``scratch`` is a buffer of the parameter's shape in the state dtype (float32 for
    bf16/fp16 parameters) whose contents are overwritten; ``grad`` is only read. The
    moments are computed in the state dtype; ``param`` is rounded to its own dtype.
    """
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    s = scratch
    if weight_decay != 0:
        xp.multiply(param, 1.0 - lr * weight_decay, out=param)  # param *= 1 - lr * wd
    xp.multiply(exp_avg, beta1, out=exp_avg)                   # m = beta1 * m
    xp.multiply(grad, 1.0 - beta1, out=s, dtype=s.dtype)       # s = (1 - beta1) * g
    xp.add(exp_avg, s, out=exp_avg)                            # m += s
    xp.multiply(exp_avg_sq, beta2, out=exp_avg_sq)             # v = beta2 * v
    xp.multiply(grad, grad, out=s, dtype=s.dtype)              # s = g * g
    xp.multiply(s, 1.0 - beta2, out=s)                         # s *= 1 - beta2
    xp.add(exp_avg_sq, s, out=exp_avg_sq)                      # v += s
    xp.sqrt(exp_avg_sq, out=s)                                 # s = sqrt(v)
    xp.divide(s, math.sqrt(bias_correction2), out=s)           # s /= sqrt(1 - beta2^t)
    xp.add(s, eps, out=s)                                      # s += eps: the denominator
    xp.divide(exp_avg, s, out=s)                               # s = m / denominator
    xp.multiply(s, lr / bias_correction1, out=s)               # s *= lr / (1 - beta1^t)
    xp.subtract(param, s, out=param)                           # param -= s


class AdamW(Optimizer):
    """Adam with decoupled weight decay, as torch.optim.AdamW (no amsgrad).

    State per parameter: "step" (int), "exp_avg" and "exp_avg_sq" (Tensors of its shape
    on its device; float32 for bf16/fp16 parameters, else the parameter's dtype).

    >>> opt = AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    _state_keys = frozenset({"step", "exp_avg", "exp_avg_sq"})

    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    def _check_hyperparameters(self, group: Dict[str, Any], where: str) -> None:
        super()._check_hyperparameters(group, where)
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"{where}: betas must be a pair (beta1, beta2), got {betas!r}")
        check_hyperparameter(where, "betas[0]", betas[0], below=1.0)
        check_hyperparameter(where, "betas[1]", betas[1], below=1.0)
        check_hyperparameter(where, "eps", group["eps"])
        check_hyperparameter(where, "weight_decay", group["weight_decay"])

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One update of every parameter whose grad is set; returns ``closure()`` if given."""
        loss = self._evaluate(closure)
        for group in self.param_groups:
            beta1, beta2 = (float(b) for b in group["betas"])
            for p, grad in self._params_with_grad(group):
                state = self.state.get(p)
                if not state:
                    state = self.state[p] = {"step": 0,
                                             "exp_avg": self._new_state_tensor(p),
                                             "exp_avg_sq": self._new_state_tensor(p)}
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"].data, state["exp_avg_sq"].data
                hyper = dict(lr=float(group["lr"]), beta1=beta1, beta2=beta2,
                             eps=float(group["eps"]),
                             weight_decay=float(group["weight_decay"]), step=state["step"])
                kernels = p.backend.fused_kernels()  # CUDA: backend/kernels/adamw.cu
                if kernels is not None and kernels.supports_adamw(p.data, grad, exp_avg,
                                                                  exp_avg_sq):
                    kernels.adamw_update(p.data, grad, exp_avg, exp_avg_sq, **hyper)
                else:
                    adamw_update_(p.backend.xp, p.data, grad, exp_avg, exp_avg_sq,
                                  self._scratch_for(p, exp_avg.dtype), **hyper)
                p._bump()  # the parameter changed in place: autograd's version counter
        return loss


def configure_adamw(module: Any, weight_decay: float, lr: float,
                    betas: Tuple[float, float], eps: float = 1e-8) -> AdamW:
    """nanoGPT's ``configure_optimizers``: AdamW with decay on dim >= 2 parameters only.

    >>> opt = configure_adamw(model, weight_decay=0.1, lr=6e-4, betas=(0.9, 0.95))
    """
    return AdamW(weight_decay_groups(module, weight_decay), lr=lr, betas=betas, eps=eps,
                 weight_decay=weight_decay)
