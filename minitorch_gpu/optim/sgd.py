"""SGD with momentum, dampening, Nesterov and L2 weight decay: torch.optim.SGD's update.

With d = grad + weight_decay * param, the momentum buffer is b = d on the first step and
b = momentum * b + (1 - dampening) * d after; the step direction is b (or d + momentum * b
with Nesterov, or d without momentum), and param -= lr * direction.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from .optimizer import Optimizer, Params, check_hyperparameter


def sgd_update_(xp: Any, param: Any, grad: Any, momentum_buffer: Optional[Any], scratch: Any,
                *, lr: float, momentum: float, dampening: float, weight_decay: float,
                nesterov: bool, first_step: bool) -> None:
    """One SGD step on raw arrays, in place: ``param`` and ``momentum_buffer`` are updated.

    ``scratch`` is a buffer of the parameter's shape (in the state dtype) whose contents
    are overwritten; ``grad`` is only read. ``momentum_buffer`` is None without momentum.
    """
    direction = grad
    if weight_decay != 0:
        # d = grad + weight_decay * param: the L2 penalty folded into the gradient
        xp.multiply(param, weight_decay, out=scratch, dtype=scratch.dtype)
        xp.add(scratch, grad, out=scratch, dtype=scratch.dtype)
        direction = scratch
    if momentum != 0:
        if first_step:
            xp.copyto(momentum_buffer, direction)                # b = d
        else:
            xp.multiply(momentum_buffer, momentum, out=momentum_buffer)  # b = momentum * b
            if dampening != 0:
                # Nesterov forbids dampening, so d is not needed after this and may be scaled
                xp.multiply(direction, 1.0 - dampening, out=scratch, dtype=scratch.dtype)
                direction = scratch                              # (1 - dampening) * d
            xp.add(momentum_buffer, direction, out=momentum_buffer)  # b += (1 - dampening) d
        if nesterov:
            # param -= lr * (d + momentum * b), as two subtractions so that no second
            # buffer is needed: param -= lr * d, then param -= lr * momentum * b
            xp.multiply(direction, lr, out=scratch, dtype=scratch.dtype)
            xp.subtract(param, scratch, out=param)
            direction = momentum_buffer
            lr = lr * momentum
        else:
            direction = momentum_buffer
    xp.multiply(direction, lr, out=scratch, dtype=scratch.dtype)  # lr * direction
    xp.subtract(param, scratch, out=param)                       # param -= lr * direction


class SGD(Optimizer):
    """Stochastic gradient descent, as torch.optim.SGD.

    State per parameter (with momentum only): "momentum_buffer", a Tensor of its shape
    (float32 for bf16/fp16 parameters).

    >>> opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    _state_keys = frozenset({"momentum_buffer"})

    def __init__(self, params: Params, lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov)
        super().__init__(params, defaults)

    def _check_hyperparameters(self, group: Dict[str, Any], where: str) -> None:
        super()._check_hyperparameters(group, where)
        check_hyperparameter(where, "momentum", group["momentum"])
        check_hyperparameter(where, "dampening", group["dampening"])
        check_hyperparameter(where, "weight_decay", group["weight_decay"])
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(f"{where}: nesterov=True expects momentum > 0 and dampening = 0, "
                             f"got momentum={group['momentum']!r}, "
                             f"dampening={group['dampening']!r}")

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One update of every parameter whose grad is set; returns ``closure()`` if given."""
        loss = self._evaluate(closure)
        for group in self.param_groups:
            momentum = float(group["momentum"])
            for p, grad in self._params_with_grad(group):
                buffer = None
                first_step = False
                if momentum != 0:
                    state = self.state.setdefault(p, {})
                    if state.get("momentum_buffer") is None:
                        state["momentum_buffer"] = self._new_state_tensor(p)
                        first_step = True
                    buffer = state["momentum_buffer"].data
                sgd_update_(p.backend.xp, p.data, grad, buffer,
                            self._scratch_for(p, self._state_dtype(p)),
                            lr=float(group["lr"]), momentum=momentum,
                            dampening=float(group["dampening"]),
                            weight_decay=float(group["weight_decay"]),
                            nesterov=bool(group["nesterov"]), first_step=first_step)
                p._bump()  # the parameter changed in place: autograd's version counter
        return loss
