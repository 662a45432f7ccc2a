"""Dynamic loss scaling for fp16 training, with torch.amp.GradScaler's API and semantics.

fp16's smallest normal number is 6.1e-5 (subnormals reach 6e-8): the gradients of a
product's fp16 operands in backward flush to zero below that. So the loss is multiplied
by a large scale S before ``backward()`` (every gradient is then S times larger, out of
the flush zone), the float32 master gradients are divided by S before the optimizer sees
them, and S follows the gradients: a step whose gradients hold an inf or NaN (S was too
large, a product overflowed 65504) is skipped and S multiplied by ``backoff_factor``;
after ``growth_interval`` good steps in a row S is multiplied by ``growth_factor``.

    scaler = mt.amp.GradScaler()
    with mt.autocast("fp16"):
        _, loss = model(idx, targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)                  # before clipping, once per step
    clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)                      # skipped (None) on an inf/NaN gradient
    scaler.update()
    optimizer.zero_grad()

The scale and the count of good steps are 0-d arrays on the loss's device, updated there;
the inf/NaN check is one flag per device, also computed there. ``step`` reads that flag
(one host read per step, through the backend's ``to_numpy``, so ``host_reads`` counts it):
whether the optimizer runs is a decision of the host. ``get_scale`` and ``state_dict``
read the scale (one read each).
"""
from __future__ import annotations

import enum
import math
import numbers
from typing import Any, Dict, Optional

import numpy as np

from ..backend import dtypes, get_backend

__all__ = ["GradScaler"]

_MASTER_DTYPES = (dtypes.float32, dtypes.float64)  # gradients unscale_ may divide in place


class _Stage(enum.Enum):
    READY = 0  # nothing done for this optimizer since the last update()
    UNSCALED = 1  # unscale_ ran: its gradients are divided, their check is recorded
    STEPPED = 2  # step ran (or skipped)


class _OptimizerState:
    """Where one optimizer is in the current step, and its gradients' inf/NaN flags (one
    0-d bool array per device, not read)."""

    def __init__(self) -> None:
        self.stage = _Stage.READY
        self.found_inf: Dict[Any, Any] = {}  # Device -> 0-d bool array on it


def _check_positive(name: str, value: Any, low: float, high: float = math.inf) -> float:
    """``value`` as a float in (low, high), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not (low < float(value) < high):
        bounds = f"> {low}" if high == math.inf else f"in ({low}, {high})"
        raise ValueError(f"GradScaler: {name} must be a finite number {bounds}, got {value!r}")
    return float(value)


def _check_interval(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"GradScaler: growth_interval must be a positive int, got {value!r}")
    return int(value)


class GradScaler:
    """Scales the loss up before backward and the gradients back down before the step,
    skipping steps whose gradients are not finite (see the module's docstring).

    ``enabled=False`` makes every method a pass-through (``scale`` returns its input,
    ``step`` calls ``optimizer.step()``), so one training loop serves every precision.
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"GradScaler: enabled must be a bool, got {enabled!r}")
        self._enabled = enabled
        self._init_scale = _check_positive("init_scale", init_scale, 0.0)
        self._growth_factor = _check_positive("growth_factor", growth_factor, 1.0)
        self._backoff_factor = _check_positive("backoff_factor", backoff_factor, 0.0, 1.0)
        self._growth_interval = _check_interval(growth_interval)
        self._init_growth_tracker = 0
        self._backend: Any = None  # that of the first output scale() saw
        self._scale: Any = None  # 0-d float32 on self._backend's device, made by scale()
        self._growth_tracker: Any = None  # 0-d int32: good steps in a row since a change
        self._optimizers: Dict[int, _OptimizerState] = {}  # id(optimizer) -> its state
        self._skipped = 0  # steps skipped since this scaler was made

    def __repr__(self) -> str:
        if not self._enabled:
            return "GradScaler(enabled=False)"
        return (f"GradScaler(growth_factor={self._growth_factor}, backoff_factor="
                f"{self._backoff_factor}, growth_interval={self._growth_interval})")

    # --- the step -------------------------------------------------------------------------
    def scale(self, outputs: Any) -> Any:
        """``outputs`` (a Tensor, or a list/tuple of them, nested) times the scale, as
        differentiable products: call ``backward()`` on the result."""
        if not self._enabled:
            return outputs
        from ..tensor import Tensor  # lazily: tensor -> ops -> amp.autocast_mode at import

        if isinstance(outputs, Tensor):
            if not dtypes.is_floating(outputs.dtype):
                raise TypeError(f"GradScaler.scale: expected a floating Tensor (the loss), "
                                f"got {outputs.dtype}")
            if self._scale is None:
                self._make_scale(outputs.backend)
            scale = self._scale if outputs.device == self._backend.device else \
                outputs.backend.asarray(self._scale)  # a copy on the output's device
            return outputs * Tensor._make(scale, outputs.backend, False)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(x) for x in outputs)
        raise TypeError(f"GradScaler.scale: expected a Tensor or a list/tuple of Tensors, "
                        f"got {type(outputs).__name__}")

    def _make_scale(self, backend: Any) -> None:
        self._backend = backend
        with backend.on_device():
            self._scale = backend.asarray(np.float32(self._init_scale))
            self._growth_tracker = backend.asarray(np.int32(self._init_growth_tracker))

    def _state(self, optimizer: Any) -> _OptimizerState:
        return self._optimizers.setdefault(id(optimizer), _OptimizerState())

    def unscale_(self, optimizer: Any) -> None:
        """Divide ``optimizer``'s gradients by the scale, in place, and record on the
        device whether any is inf or NaN. Call it once per step, after the last
        ``backward()`` and before clipping; ``step`` calls it when you did not."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state.stage is _Stage.UNSCALED:
            raise RuntimeError("GradScaler.unscale_: already called on this optimizer since "
                               "the last update(); expected one call per step, got a second")
        if state.stage is _Stage.STEPPED:
            raise RuntimeError("GradScaler.unscale_: called after step(); expected it before "
                               "step(), once per step (update() starts the next step)")
        if self._scale is None:
            raise RuntimeError("GradScaler.unscale_: the scale was never made; expected "
                               "scaler.scale(loss).backward() earlier in the step")
        state.found_inf = self._unscale_gradients(optimizer)
        state.stage = _Stage.UNSCALED

    def _unscale_gradients(self, optimizer: Any) -> Dict[Any, Any]:
        """Each gradient times 1 / scale (the reciprocal taken in float64, then rounded to
        float32, as PyTorch does; exact for a power of two), then each device's flag: any
        element of its gradients inf or NaN. Checked after the division, so a gradient
        that the division itself overflows (a scale below 1) counts too."""
        backend = self._backend
        with backend.on_device():
            inv_scale = (1.0 / self._scale.astype(dtypes.float64)).astype(dtypes.float32)
        inverses = {backend.device: inv_scale}
        found: Dict[Any, Any] = {}
        for g_index, group in enumerate(optimizer.param_groups):
            for p_index, p in enumerate(group["params"]):
                grad = p.grad
                if grad is None:
                    continue
                if grad.dtype not in _MASTER_DTYPES:
                    raise ValueError(
                        f"GradScaler.unscale_: parameter {p_index} of group {g_index} (shape "
                        f"{tuple(p.shape)}) has a {grad.dtype} gradient; expected float32 or "
                        f"float64 (master weights: keep the model in float32 and run its "
                        f"forward under autocast)")
                device, owner = grad.device, grad.backend
                with owner.on_device():
                    if device not in inverses:
                        inverses[device] = owner.asarray(inv_scale)
                    g = grad.data
                    g *= inverses[device]  # float64 gradients stay float64
                    bad = owner.xp.logical_not(owner.xp.isfinite(g).all())
                    found[device] = bad if device not in found else \
                        owner.xp.logical_or(found[device], bad)
        if not found:  # no gradient at all: nothing non-finite, on the scale's device
            with backend.on_device():
                found[backend.device] = backend.asarray(np.bool_(False))
        return found

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step(*args, **kwargs)`` unless a gradient is inf or NaN, in which
        case the step is skipped (the weights and the optimizer's state stay as they were)
        and None returned. Unscales first unless ``unscale_`` was called this step. Reads
        the inf/NaN flag: one host read (per device holding gradients)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("GradScaler.step: a closure is not supported (the closure's "
                               "backward would run unscaled); expected step(optimizer)")
        state = self._state(optimizer)
        if state.stage is _Stage.STEPPED:
            raise RuntimeError("GradScaler.step: already called since the last update(); "
                               "expected one step per update()")
        if state.stage is _Stage.READY:
            self.unscale_(optimizer)
        skip = self._read_found_inf(state.found_inf)
        state.stage = _Stage.STEPPED
        if skip:
            self._skipped += 1
            return None
        return optimizer.step(*args, **kwargs)

    @staticmethod
    def _read_found_inf(found: Dict[Any, Any]) -> bool:
        flags = []
        for device, flag in found.items():
            owner = get_backend(device)
            flags.append(bool(owner.to_numpy(flag)))  # waits for the step's kernels
        return any(flags)

    def update(self, new_scale: Optional[Any] = None) -> None:
        """End the step: the scale times ``backoff_factor`` if any optimizer's gradients
        held an inf or NaN, times ``growth_factor`` after ``growth_interval`` good steps in
        a row (unless that overflows float32), else unchanged; all on the device. With
        ``new_scale`` (a number, or a one-element Tensor) the scale is set to it instead."""
        if not self._enabled:
            return
        if self._scale is None:
            raise RuntimeError("GradScaler.update: the scale was never made; expected "
                               "scaler.scale(loss).backward() earlier in the step")
        backend, xp = self._backend, self._backend.xp
        with backend.on_device():
            if new_scale is not None:
                self._scale[...] = self._new_scale_array(new_scale)
            else:
                flags = [flag if device == backend.device else backend.asarray(flag)
                         for state in self._optimizers.values()
                         for device, flag in state.found_inf.items()]
                if not flags:
                    raise RuntimeError("GradScaler.update: no inf/NaN check was recorded "
                                       "since the last update(); expected unscale_(optimizer) "
                                       "or step(optimizer) first")
                found = flags[0]
                for flag in flags[1:]:
                    found = xp.logical_or(found, flag)
                self._update_scale(xp, found)
        self._optimizers = {}

    def _update_scale(self, xp: Any, found: Any) -> None:
        """PyTorch's rule (``_amp_update_scale_``) as device arrays: a bad step backs off
        and restarts the count; a good one counts, and the growth_interval-th grows the
        scale (kept where the product is not finite) and restarts it."""
        scale, tracker = self._scale, self._growth_tracker
        counted = tracker + 1
        grow = xp.logical_and(xp.logical_not(found), counted >= self._growth_interval)
        with np.errstate(over="ignore"):  # NumPy's warning: the overflow is handled here
            grown = scale * np.float32(self._growth_factor)
        grown = xp.where(xp.isfinite(grown), grown, scale)
        scale[...] = xp.where(found, scale * np.float32(self._backoff_factor),
                              xp.where(grow, grown, scale))
        tracker[...] = xp.where(xp.logical_or(found, grow), 0, counted)

    def _new_scale_array(self, new_scale: Any) -> Any:
        from ..tensor import Tensor

        if isinstance(new_scale, Tensor):
            if new_scale.numel() != 1 or new_scale.requires_grad:
                raise ValueError(f"GradScaler.update: new_scale must be a number or a "
                                 f"one-element Tensor without grad, got a Tensor of shape "
                                 f"{tuple(new_scale.shape)} (requires_grad="
                                 f"{new_scale.requires_grad})")
            value = new_scale.data.reshape(())
            if new_scale.device != self._backend.device:
                value = self._backend.asarray(value)
            return value.astype(dtypes.float32)
        if isinstance(new_scale, bool) or not isinstance(new_scale, numbers.Real):
            raise TypeError(f"GradScaler.update: new_scale must be a number or a "
                            f"one-element Tensor, got {type(new_scale).__name__}")
        return np.float32(new_scale)

    # --- reading and setting --------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    @property
    def skipped_steps(self) -> int:
        """How many steps ``step`` skipped since this scaler was made (counted on the host:
        no read)."""
        return self._skipped

    def get_scale(self) -> float:
        """The scale now, as a Python float (a host read once it lives on a device); 1.0
        when disabled."""
        if not self._enabled:
            return 1.0
        if self._scale is None:
            return self._init_scale
        return float(self._backend.to_numpy(self._scale))

    def _scale_and_tracker(self) -> tuple:
        """(scale, growth tracker) in one host read."""
        if self._scale is None:
            return self._init_scale, self._init_growth_tracker
        backend = self._backend
        with backend.on_device():
            both = backend.xp.stack([self._scale.astype(dtypes.float64),
                                     self._growth_tracker.astype(dtypes.float64)])
        scale, tracker = backend.to_numpy(both).tolist()
        return scale, int(tracker)

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = _check_positive("growth_factor", new_factor, 1.0)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = _check_positive("backoff_factor", new_factor, 0.0, 1.0)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = _check_interval(new_interval)

    # --- checkpoints ----------------------------------------------------------------------
    _STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval",
                   "_growth_tracker")

    def state_dict(self) -> Dict[str, Any]:
        """PyTorch's keys: ``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker`` (plain numbers: JSON as it is); ``{}``
        when disabled. One host read."""
        if not self._enabled:
            return {}
        scale, tracker = self._scale_and_tracker()
        return {"scale": scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": tracker}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Continue from ``state_dict()`` (this class's or PyTorch's). Nothing when
        disabled; RuntimeError for an empty one (saved by a disabled scaler)."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"GradScaler.load_state_dict: expected a dict, got "
                            f"{type(state_dict).__name__}")
        if not state_dict:
            raise RuntimeError("GradScaler.load_state_dict: the state dict is empty, which a "
                               "disabled GradScaler saves; expected the keys "
                               f"{list(self._STATE_KEYS)}")
        missing = [key for key in self._STATE_KEYS if key not in state_dict]
        if missing:
            raise ValueError(f"GradScaler.load_state_dict: expected the keys "
                             f"{list(self._STATE_KEYS)}, missing {missing}")
        scale = _check_positive("scale", state_dict["scale"], 0.0)
        tracker = state_dict["_growth_tracker"]
        if isinstance(tracker, bool) or not isinstance(tracker, numbers.Integral) \
                or tracker < 0:
            raise ValueError(f"GradScaler.load_state_dict: _growth_tracker must be an int "
                             f">= 0, got {tracker!r}")
        growth = _check_positive("growth_factor", state_dict["growth_factor"], 1.0)
        backoff = _check_positive("backoff_factor", state_dict["backoff_factor"], 0.0, 1.0)
        interval = _check_interval(state_dict["growth_interval"])
        self._init_scale, self._init_growth_tracker = scale, int(tracker)
        self._growth_factor, self._backoff_factor = growth, backoff
        self._growth_interval = interval
        if self._scale is not None:
            with self._backend.on_device():
                self._scale[...] = np.float32(scale)
                self._growth_tracker[...] = np.int32(tracker)

