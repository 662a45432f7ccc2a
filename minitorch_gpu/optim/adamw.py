"""AdamW: Adam with decoupled weight decay, torch.optim.AdamW's update.

Per parameter, at its step t (counted from 1)::

    param *= 1 - lr * weight_decay                       # decoupled decay
    m = beta1 * m + (1 - beta1) * g                      # first moment
    v = beta2 * v + (1 - beta2) * g^2                    # second moment
    param -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

``adamw_update_`` does this on raw arrays as a chain of in-place ops into one scratch
buffer, so a step allocates nothing. When every parameter of a group has a gradient,
the chain for the moments runs once over the whole group (``flat.py``: the moments live in
one flat array per group, the gradients are copied into another), and each parameter then
subtracts its slice of the step: a dozen array calls per group instead of per parameter.
On a CUDA backend, float32 parameters are updated one by one by the fused kernel
``backend/kernels/adamw.cu`` instead (one pass over the arrays).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

from ..backend.threads import cpu_threads, run_split
from ..tensor import Tensor
from .flat import FlatGroup
from .optimizer import Optimizer, Params, check_hyperparameter, weight_decay_groups

SPLIT_FROM = 1 << 18  # elements from which a flat group's update is split over the cores
BLOCK = 1 << 17  # elements per pass of the flat chain: 512 KiB of float32 per array


def adamw_update_(xp: Any, param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any,
                  scratch: Any, *, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, step: int) -> None:
    """One AdamW step on raw arrays, in place: ``param``, ``exp_avg``, ``exp_avg_sq``.

    ``step`` is this parameter's step count including this one (1 on the first call).
    ``scratch`` is a buffer of the parameter's shape in the state dtype (float32 for
    bf16/fp16 parameters) whose contents are overwritten; ``grad`` is only read. The
    moments are computed in the state dtype; ``param`` is rounded to its own dtype.
    """
    adamw_direction_(xp, grad, exp_avg, exp_avg_sq, scratch, lr=lr, beta1=beta1, beta2=beta2,
                     eps=eps, step=step)
    apply_update_(xp, param, scratch, lr=lr, weight_decay=weight_decay)


def adamw_direction_(xp: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, out: Any, *,
                     lr: float, beta1: float, beta2: float, eps: float, step: int) -> None:
    """The moments' update, in place, and the step to subtract, into ``out``:
    ``out = lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``."""
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    s = out
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


def apply_update_(xp: Any, param: Any, update: Any, *, lr: float, weight_decay: float) -> None:
    """``param = param * (1 - lr * weight_decay) - update``, in place (decoupled decay)."""
    if weight_decay != 0:
        xp.multiply(param, 1.0 - lr * weight_decay, out=param)  # param *= 1 - lr * wd
    xp.subtract(param, update, out=param)                      # param -= s


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
        self._flat: Dict[int, FlatGroup] = {}  # group index -> its flat arrays (optim/flat.py)

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
        for index, group in enumerate(self.param_groups):
            beta1, beta2 = (float(b) for b in group["betas"])
            with_grad = list(self._params_with_grad(group))
            for p, _ in with_grad:
                if not self.state.get(p):
                    self.state[p] = {"step": 0, "exp_avg": self._new_state_tensor(p),
                                     "exp_avg_sq": self._new_state_tensor(p)}
                self.state[p]["step"] += 1

            def hyper(p: Tensor) -> Dict[str, Any]:
                return dict(lr=float(group["lr"]), beta1=beta1, beta2=beta2,
                            eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
                            step=self.state[p]["step"])

            if self._fused_group(with_grad, hyper):
                pass  # the kernels' adamw_step took the whole group
            elif (flat := self._flat_group(index, group, with_grad)) is not None:
                # the moments of the whole group in one chain
                self._update_flat(flat, [grad for _, grad in with_grad], hyper(with_grad[0][0]))
            else:
                for p, grad in with_grad:
                    self._update_one(p, grad, hyper(p))
            for p, _ in with_grad:
                p._bump()  # the parameter changed in place: autograd's version counter
        return loss

    def _fused_group(self, with_grad: list, hyper: Callable[[Tensor], Dict[str, Any]]) -> bool:
        """The group's update by the backend's kernels in one call (``adamw_step``: on the
        CPU its parameters split over the cores) when they take every parameter of it;
        False (nothing done) otherwise."""
        if not with_grad:
            return False
        kernels = with_grad[0][0].backend.fused_kernels()
        if kernels is None or any(p.backend is not with_grad[0][0].backend or not
                                  kernels.supports_adamw(p.data, grad,
                                                         self.state[p]["exp_avg"].data,
                                                         self.state[p]["exp_avg_sq"].data)
                                  for p, grad in with_grad):
            return False
        settings = hyper(with_grad[0][0])
        del settings["step"]
        params = [p for p, _ in with_grad]
        kernels.adamw_step([p.data for p in params], [grad for _, grad in with_grad],
                           [self.state[p]["exp_avg"].data for p in params],
                           [self.state[p]["exp_avg_sq"].data for p in params],
                           [self.state[p]["step"] for p in params], **settings)
        return True

    def _update_one(self, p: Tensor, grad: Any, hyper: Dict[str, Any]) -> None:
        state = self.state[p]
        exp_avg, exp_avg_sq = state["exp_avg"].data, state["exp_avg_sq"].data
        kernels = p.backend.fused_kernels()  # CUDA: backend/kernels/adamw.cu
        if kernels is not None and kernels.supports_adamw(p.data, grad, exp_avg, exp_avg_sq):
            kernels.adamw_update(p.data, grad, exp_avg, exp_avg_sq, **hyper)
        else:
            adamw_update_(p.backend.xp, p.data, grad, exp_avg, exp_avg_sq,
                          self._scratch_for(p, exp_avg.dtype), **hyper)

    def _flat_group(self, index: int, group: Dict[str, Any], with_grad: list) -> Any:
        """The group's FlatGroup when every parameter has a grad and they share a device, a
        dtype and a step count, else None (then they are updated one by one)."""
        params = group["params"]
        first = params[0]
        if first.backend.device.type != "cpu":  # CUDA: the fused kernel per parameter
            return None
        if len(with_grad) != len(params) or len(params) < 2 or any(
                p.backend is not first.backend or p.dtype != first.dtype
                or self.state[p]["step"] != self.state[first]["step"] for p in params):
            return None
        states = [self.state[p] for p in params]
        flat = self._flat.get(index)
        if flat is None or not flat.holds(params, states):
            flat = self._flat[index] = FlatGroup(params, states, self._state_dtype(first))
        return flat

    def _update_flat(self, flat: FlatGroup, grads: list, hyper: Dict[str, Any]) -> None:
        """The moments and the step over the group's flat arrays, then each parameter's
        slice of the step subtracted from it; long groups split over the cores (NumPy runs
        a loop on its calling thread only), at parameter boundaries."""
        flat.gather_grads(grads)
        backend = flat.params[0].backend
        xp = backend.xp
        parts = cpu_threads() if flat.grad.size >= SPLIT_FROM and backend.device.type == \
            "cpu" else 1
        decay = dict(lr=hyper["lr"], weight_decay=hyper["weight_decay"])
        moments = {k: v for k, v in hyper.items() if k != "weight_decay"}

        def update(piece: range) -> None:
            # in blocks that stay in the core's cache through the chain's dozen passes
            for start in range(flat.offsets[piece.start], flat.offsets[piece.stop], BLOCK):
                span = slice(start, min(start + BLOCK, flat.offsets[piece.stop]))
                adamw_direction_(xp, flat.grad[span], flat.exp_avg[span],
                                 flat.exp_avg_sq[span], flat.scratch[span], **moments)
            for i in piece:
                apply_update_(xp, flat.params[i].data, flat.step_of(i), **decay)

        run_split(update, flat.pieces(parts))


def configure_adamw(module: Any, weight_decay: float, lr: float,
                    betas: Tuple[float, float], eps: float = 1e-8) -> AdamW:
    """nanoGPT's ``configure_optimizers``: AdamW with decay on dim >= 2 parameters only.

    >>> opt = configure_adamw(model, weight_decay=0.1, lr=6e-4, betas=(0.9, 0.95))
    """
    return AdamW(weight_decay_groups(module, weight_decay), lr=lr, betas=betas, eps=eps,
                 weight_decay=weight_decay)
