"""Optimizer: parameter groups, per-parameter state and the state dict, as torch.optim has them.

An optimizer holds ``param_groups`` (a list of dicts, each a ``"params"`` list plus every
hyperparameter, so one group can override the defaults) and ``state`` (parameter tensor ->
dict of that parameter's state). Updates work on the raw arrays in place, written once
against ``xp = param.backend.xp``, so a model's parameter tensors keep their storage.

``weight_decay_groups`` splits a model's parameters into the two groups nanoGPT uses: decay
for matmul weights and embeddings, none for biases and layer-norm gains.
"""
from __future__ import annotations

import copy
import math
import numbers
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np

from ..autograd import enable_grad
from ..backend import dtypes
from ..creation import zeros
from ..tensor import Tensor

ParamGroup = Dict[str, Any]
Params = Union[Iterable[Tensor], Iterable[ParamGroup]]

_LOW_PRECISION = frozenset({dtypes.bfloat16, dtypes.float16})


class Optimizer:
    """Base class: holds the parameter groups and state; subclasses define ``step``.

    ``params`` is an iterable of tensors (one group) or of dicts, each with a ``"params"``
    list and any hyperparameters that override ``defaults`` for that group::

        AdamW([{"params": weights, "weight_decay": 0.1},
               {"params": biases, "weight_decay": 0.0}], lr=3e-4)
    """

    _state_keys: frozenset = frozenset()  # the keys of a parameter's state (subclasses set)

    def __init__(self, params: Params, defaults: Dict[str, Any]) -> None:
        self.defaults: Dict[str, Any] = dict(defaults)
        self.param_groups: List[ParamGroup] = []
        self.state: Dict[Tensor, Dict[str, Any]] = {}
        # flat buffers for an update's intermediates, one per (device, dtype): see _scratch_for
        self._scratch: Dict[tuple, Any] = {}
        self._check_hyperparameters(self.defaults, self._name)

        if isinstance(params, Tensor):
            raise TypeError(f"{self._name}: params must be an iterable of Tensors or of dicts "
                            "(parameter groups), got a single Tensor; wrap it in a list")
        if isinstance(params, dict):
            params = [params]
        groups = list(params)
        if not groups:
            raise ValueError(f"{self._name}: got an empty parameter list; expected at least "
                             "one tensor with requires_grad=True")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    @property
    def _name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        lines = [f"{self._name} ("]
        for index, group in enumerate(self.param_groups):
            settings = ", ".join(f"{k}={v!r}" for k, v in group.items() if k != "params")
            lines.append(f"  group {index}: {len(group['params'])} params, {settings}")
        return "\n".join(lines + [")"])

    # --- parameter groups ---------------------------------------------------------------
    def add_param_group(self, param_group: ParamGroup) -> None:
        """Add a group of parameters; hyperparameters it omits come from ``defaults``."""
        index = len(self.param_groups)
        where = f"{self._name}: parameter group {index}"
        if not isinstance(param_group, dict):
            raise TypeError(f"{where}: expected a dict with a 'params' key, got "
                            f"{type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError(f"{where}: expected a 'params' key, got keys "
                             f"{sorted(param_group)}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError(f"{where}: params must be an ordered sequence (a list), got a "
                            "set, whose order changes from run to run")
        else:
            params = list(params)
        if not params:
            raise ValueError(f"{where}: got an empty parameter list; expected at least one "
                             "tensor with requires_grad=True")

        seen = {id(p): (g, i) for g, group in enumerate(self.param_groups)
                for i, p in enumerate(group["params"])}
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"{where}: parameter {i} is a {type(p).__name__}; expected "
                                "a Tensor")
            # a frozen parameter (requires_grad=False) is accepted, as PyTorch does: its
            # grad stays None, so step() skips it until it is unfrozen
            if not p.is_leaf:
                raise ValueError(f"{where}: parameter {i} (shape {tuple(p.shape)}) is not a "
                                 f"leaf (it has grad_fn {p.grad_fn!r}); optimize the leaf "
                                 "tensors the computation starts from")
            if id(p) in seen:
                g, j = seen[id(p)]
                raise ValueError(f"{where}: parameter {i} (shape {tuple(p.shape)}) was "
                                 f"already given as parameter {j} of group {g}; each "
                                 "parameter may appear only once")
            seen[id(p)] = (index, i)

        group = {"params": params}
        group.update((k, v) for k, v in param_group.items() if k != "params")
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self._check_hyperparameters(group, where)
        self.param_groups.append(group)

    def _check_hyperparameters(self, group: Dict[str, Any], where: str) -> None:
        """Raise ValueError/TypeError for an invalid hyperparameter; subclasses extend this."""
        if "lr" in group:
            check_hyperparameter(where, "lr", group["lr"])

    # --- the update -----------------------------------------------------------------------
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Update every parameter that has a gradient; returns ``closure()`` if given."""
        raise NotImplementedError(f"{self._name}.step is not implemented")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's gradient (``set_to_none``) or fill it with zeros."""
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.data.fill(0)

    def _evaluate(self, closure: Optional[Callable[[], Any]]) -> Any:
        """Run ``closure`` (which recomputes the loss and calls backward) with grad on."""
        if closure is None:
            return None
        with enable_grad():
            return closure()

    def _params_with_grad(self, group: ParamGroup) -> Iterator[Tuple[Tensor, Any]]:
        """(parameter, raw gradient array) for each parameter of ``group`` whose grad is set."""
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            if grad.shape != p.shape:
                raise RuntimeError(f"{self._name}.step: a parameter of shape "
                                   f"{tuple(p.shape)} has a grad of shape {tuple(grad.shape)}")
            if grad.backend is not p.backend:
                raise RuntimeError(f"{self._name}.step: a parameter on {p.device} has a grad "
                                   f"on {grad.device}")
            yield p, grad.data

    @staticmethod
    def _state_dtype(param: Tensor) -> Any:
        """The dtype of a parameter's state: float32 for bf16/fp16 parameters, else theirs."""
        return dtypes.float32 if param.dtype in _LOW_PRECISION else param.dtype

    def _new_state_tensor(self, param: Tensor) -> Tensor:
        """Zeros of the parameter's shape, in its state dtype, on its device."""
        return zeros(param.shape, dtype=self._state_dtype(param), device=param.device)

    def _scratch_for(self, param: Tensor, dtype: Any) -> Any:
        """A reusable buffer of ``param``'s shape in ``dtype`` for an update's intermediates.

        One flat buffer per (device, dtype), sized to the largest parameter on that device,
        is shared by all updates: a step allocates no temporaries. Its contents are garbage
        between uses.
        """
        key = (param.device, dtype)
        flat = self._scratch.get(key)
        n = param.numel()
        if flat is None or flat.size < n:
            largest = max(p.numel() for group in self.param_groups for p in group["params"]
                          if p.device == param.device)
            flat = self._scratch[key] = param.backend.xp.empty(max(n, largest), dtype=dtype)
        return flat[:n].reshape(param.shape)

    # --- state dict ---------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}``.

        Parameters are numbered 0, 1, ... in group order. As in PyTorch, the state tensors
        are the optimizer's own, not copies: deep-copy or save the dict for a snapshot.
        """
        index_of: Dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            indices = []
            for p in group["params"]:
                index_of[id(p)] = len(index_of)
                indices.append(index_of[id(p)])
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = indices
            groups.append(packed)
        state = {index_of[id(p)]: dict(self.state[p])
                 for group in self.param_groups for p in group["params"] if p in self.state}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore hyperparameters and state from ``state_dict()`` of a matching optimizer.

        Groups and their sizes must match, and every state tensor must have its parameter's
        shape. Floating state is copied to the parameter's device and state dtype; nothing
        in ``state_dict`` is aliased. Nothing changes unless the whole dict is valid.
        """
        where = f"{self._name}.load_state_dict"
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            got = sorted(state_dict) if isinstance(state_dict, dict) else \
                type(state_dict).__name__
            raise ValueError(f"{where}: expected a dict with keys ['param_groups', 'state'], "
                             f"got {got}")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"{where}: expected {len(self.param_groups)} parameter groups "
                             f"(the optimizer's), got {len(saved_groups)} in the state dict")
        param_of: Dict[Any, Tensor] = {}
        for index, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"{where}: parameter group {index}: expected "
                                 f"{len(group['params'])} parameters (the optimizer's), got "
                                 f"{len(saved['params'])} in the state dict")
            param_of.update(zip(saved["params"], group["params"]))

        new_state: Dict[Tensor, Dict[str, Any]] = {}
        for index, saved in state_dict["state"].items():
            if index not in param_of:
                raise ValueError(f"{where}: the state dict has state for parameter {index!r}, "
                                 "which none of its parameter groups lists")
            param = param_of[index]
            if not isinstance(saved, dict) or (saved and not self._state_keys <= set(saved)) \
                    or not set(saved) <= self._state_keys:
                got = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
                raise ValueError(f"{where}: the state of parameter {index!r} must have the "
                                 f"keys {sorted(self._state_keys)} ({self._name}'s), got {got}")
            new_state[param] = {key: self._load_state_value(value, param, f"{where}: state "
                                                            f"{key!r} of parameter {index!r}")
                                for key, value in saved.items()}
        new_groups = []
        for group, saved in zip(self.param_groups, saved_groups):
            merged = dict(group)  # the optimizer's params, the state dict's hyperparameters
            merged.update((k, copy.deepcopy(v)) for k, v in saved.items() if k != "params")
            self._check_hyperparameters(merged, where)
            new_groups.append(merged)

        self.state = new_state
        self.param_groups = new_groups

    def _load_state_value(self, value: Any, param: Tensor, where: str) -> Any:
        """A copy of one saved state value: arrays on the parameter's device, numbers as-is."""
        if hasattr(value, "detach") and not isinstance(value, Tensor):
            value = value.detach()  # another framework's tensor (torch's): its array below
        is_array = hasattr(value, "__array_interface__") or \
            hasattr(value, "__cuda_array_interface__") or hasattr(value, "__array__")
        if value is None or isinstance(value, numbers.Number):
            return value
        if not isinstance(value, Tensor) and not is_array:
            raise TypeError(f"{where}: expected a tensor, an array or a number, got "
                            f"{type(value).__name__}")
        array = value.data if isinstance(value, Tensor) else value
        if not hasattr(array, "dtype") or not hasattr(array, "shape"):
            array = np.asarray(array)
        if tuple(array.shape) != tuple(param.shape):
            raise ValueError(f"{where}: expected shape {tuple(param.shape)} (the parameter's), "
                             f"got {tuple(array.shape)}")
        dtype = self._state_dtype(param) if dtypes.is_floating(array.dtype) else array.dtype
        copied = param.backend.asarray(array, dtype=dtype)
        if copied is array or copied.base is not None:  # asarray returned it, or a view
            copied = copied.copy()
        return Tensor._make(copied, param.backend, False)


def check_hyperparameter(where: str, name: str, value: Any, at_least: float = 0.0,
                         below: Optional[float] = None) -> None:
    """Raise unless ``value`` is a real number with ``at_least <= value`` (``< below``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: {name} must be a real number, got "
                        f"{type(value).__name__} {value!r}")
    too_high = below is not None and not value < below
    if math.isnan(value) or value < at_least or too_high:
        expected = f"{at_least} <= {name}" + (f" < {below}" if below is not None else "")
        raise ValueError(f"{where}: invalid {name}: expected {expected}, got {value!r}")


# --- nanoGPT's parameter groups -------------------------------------------------------------
def weight_decay_groups(module_or_named_params: Any, weight_decay: float) -> List[ParamGroup]:
    """Split parameters into nanoGPT's two groups: decay for dim >= 2, none for dim < 2.

    Matmul weights and embeddings (2-d and up) get ``weight_decay``; biases and layer-norm
    gains (1-d) get 0.0. Takes anything with ``named_parameters()`` or an iterable of
    (name, tensor) pairs. A tensor shared under two names (tied embeddings) is listed once;
    tensors that do not require grad are left out, and so is a group that would be empty.

    >>> optim.AdamW(weight_decay_groups(model, 0.1), lr=6e-4, betas=(0.9, 0.95))
    """
    check_hyperparameter("weight_decay_groups", "weight_decay", weight_decay)
    if hasattr(module_or_named_params, "named_parameters"):
        named = module_or_named_params.named_parameters()
    else:
        named = module_or_named_params
    decay: List[Tensor] = []
    no_decay: List[Tensor] = []
    seen = set()
    for item in named:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Tensor)):
            raise TypeError("weight_decay_groups: expected a module or (name, Tensor) pairs, "
                            f"got an item of type {type(item).__name__}")
        name, p = item
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]
