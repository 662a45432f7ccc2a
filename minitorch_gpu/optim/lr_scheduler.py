"""Learning-rate schedules: pure functions of the iteration, and schedulers that apply them.

``cosine_lr`` is nanoGPT's ``get_lr``: a linear warmup to ``lr``, a cosine decay to
``min_lr`` at ``lr_decay_iters``, then ``min_lr``. A scheduler remembers each group's peak
learning rate in the group's ``"initial_lr"`` and writes the group's ``"lr"`` for the
current iteration: on construction (iteration 0) and on every ``step()``::

    scheduler = WarmupCosineLR(opt, warmup_iters=100, lr_decay_iters=5000, min_lr=6e-5)
    for it in range(max_iters):
        ...; opt.step(); opt.zero_grad()
        scheduler.step()
"""
from __future__ import annotations

import difflib
import math
import numbers
from typing import Any, Dict, List

from .optimizer import ParamGroup, check_hyperparameter


def _check_iteration(where: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__} "
                        f"{value!r}")
    if value < 0:
        raise ValueError(f"{where}: invalid {name}: expected {name} >= 0, got {value!r}")


def constant_lr(it: int, lr: float) -> float:
    """``lr`` at every iteration ``it`` (the schedule when decay is off)."""
    _check_iteration("constant_lr", "it", it)
    check_hyperparameter("constant_lr", "lr", lr)
    return lr


def _check_cosine(where: str, min_lr: float, warmup_iters: int, lr_decay_iters: int) -> None:
    """The settings of the warmup-cosine schedule, shared by cosine_lr and WarmupCosineLR."""
    check_hyperparameter(where, "min_lr", min_lr)
    _check_iteration(where, "warmup_iters", warmup_iters)
    _check_iteration(where, "lr_decay_iters", lr_decay_iters)
    if warmup_iters > lr_decay_iters:
        raise ValueError(f"{where}: expected warmup_iters <= lr_decay_iters, got "
                         f"warmup_iters={warmup_iters}, lr_decay_iters={lr_decay_iters}")


def cosine_lr(it: int, lr: float, min_lr: float, warmup_iters: int,
              lr_decay_iters: int) -> float:
    """nanoGPT's learning rate at iteration ``it``: linear warmup, cosine decay, floor.

    Iterations below ``warmup_iters`` rise as ``lr * (it + 1) / (warmup_iters + 1)``; from
    ``warmup_iters`` to ``lr_decay_iters`` the rate falls along a half cosine from ``lr``
    to ``min_lr``; after that it stays at ``min_lr``. When ``warmup_iters ==
    lr_decay_iters`` the decay has no length: that iteration gets ``lr``.

    >>> cosine_lr(0, 6e-4, 6e-5, warmup_iters=100, lr_decay_iters=5000)   # 6e-4 / 101
    """
    _check_iteration("cosine_lr", "it", it)
    check_hyperparameter("cosine_lr", "lr", lr)
    _check_cosine("cosine_lr", min_lr, warmup_iters, lr_decay_iters)
    if it < warmup_iters:
        return lr * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    if lr_decay_iters == warmup_iters:  # a decay of no length (nanoGPT divides by zero)
        return lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)  # in [0, 1]
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # from 1 down to 0
    return min_lr + coeff * (lr - min_lr)


class LRScheduler:
    """Base class: sets every group's "lr" to ``lr_at(iteration, group)``.

    Each group's peak rate is kept in its "initial_lr" (set from its "lr" when the group is
    first seen), so the schedule never compounds on the rate it wrote last time.
    """

    _config: tuple = ()  # names of the attributes that state_dict saves besides last_iter

    def __init__(self, optimizer: Any) -> None:
        if not hasattr(optimizer, "param_groups"):
            raise TypeError(f"{type(self).__name__}: expected an optimizer (with "
                            f"param_groups), got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.last_iter = 0
        self._last_lr: List[float] = []
        self._apply()

    def lr_at(self, it: int, group: ParamGroup) -> float:
        """The learning rate of ``group`` at iteration ``it``."""
        raise NotImplementedError

    def step(self) -> None:
        """Move to the next iteration and set its learning rates."""
        self.last_iter += 1
        self._apply()

    def get_last_lr(self) -> List[float]:
        """The learning rate of each group at the current iteration."""
        return list(self._last_lr)

    def _apply(self) -> None:
        lrs = []
        for group in self.optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = self.lr_at(self.last_iter, group)
            lrs.append(group["lr"])
        self._last_lr = lrs

    def state_dict(self) -> Dict[str, Any]:
        """The iteration and the schedule's settings (the optimizer is not included)."""
        return {"last_iter": self.last_iter, **{name: getattr(self, name)
                                                 for name in self._config}}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore ``state_dict()`` and set the learning rates of the restored iteration."""
        where = f"{type(self).__name__}.load_state_dict"
        expected = {"last_iter", *self._config}
        for key in state_dict:
            if key not in expected:
                near = difflib.get_close_matches(key, sorted(expected), n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ValueError(f"{where}: unknown key {key!r}, expected keys "
                                 f"{sorted(expected)}{hint}")
        missing = expected - set(state_dict)
        if missing:
            raise ValueError(f"{where}: missing keys {sorted(missing)}, expected keys "
                             f"{sorted(expected)}")
        _check_iteration(where, "last_iter", state_dict["last_iter"])
        previous = {name: getattr(self, name) for name in self._config}
        for name in self._config:
            setattr(self, name, state_dict[name])
        try:
            self._check_config()
        except (TypeError, ValueError):
            for name, value in previous.items():
                setattr(self, name, value)
            raise
        self.last_iter = state_dict["last_iter"]
        self._apply()

    def _check_config(self) -> None:
        """Raise for invalid settings; subclasses with settings override this."""


class ConstantLR(LRScheduler):
    """torch.optim.lr_scheduler.ConstantLR: each group's initial rate times ``factor`` for
    the first ``total_iters`` iterations, then the initial rate itself. The constant
    schedule (no decay) is ``ConstantLR(opt, factor=1.0)``.

    >>> scheduler = ConstantLR(opt, factor=1.0)          # lr stays where it started
    """

    _config = ("factor", "total_iters")

    def __init__(self, optimizer: Any, factor: float = 1.0 / 3, total_iters: int = 5) -> None:
        self.factor = factor
        self.total_iters = total_iters
        self._check_config()
        super().__init__(optimizer)

    def _check_config(self) -> None:
        where = type(self).__name__
        check_hyperparameter(where, "factor", self.factor)
        if self.factor > 1.0:
            raise ValueError(f"{where}: invalid factor: expected 0 <= factor <= 1, got "
                             f"{self.factor!r}")
        _check_iteration(where, "total_iters", self.total_iters)

    def lr_at(self, it: int, group: ParamGroup) -> float:
        factor = self.factor if it < self.total_iters else 1.0
        return constant_lr(it, group["initial_lr"]) * factor


class WarmupCosineLR(LRScheduler):
    """nanoGPT's schedule (``cosine_lr``) from each group's initial learning rate.

    ``min_lr`` is absolute and the same for every group, unless a group has its own
    "min_lr" key.

    >>> scheduler = WarmupCosineLR(opt, warmup_iters=2000, lr_decay_iters=600000, min_lr=6e-5)
    """

    _config = ("warmup_iters", "lr_decay_iters", "min_lr")

    def __init__(self, optimizer: Any, warmup_iters: int, lr_decay_iters: int,
                 min_lr: float) -> None:
        self.warmup_iters = warmup_iters
        self.lr_decay_iters = lr_decay_iters
        self.min_lr = min_lr
        self._check_config()
        super().__init__(optimizer)

    def _check_config(self) -> None:
        _check_cosine(type(self).__name__, self.min_lr, self.warmup_iters, self.lr_decay_iters)

    def lr_at(self, it: int, group: ParamGroup) -> float:
        return cosine_lr(it, group["initial_lr"], group.get("min_lr", self.min_lr),
                         self.warmup_iters, self.lr_decay_iters)
