"""Module: the base of every layer. It owns parameters, buffers and child modules by name.

Assigning a ``Parameter`` or a ``Module`` to an attribute registers it, so names follow the
attribute path: ``model.transformer.h[0].attn.c_attn.weight`` is the parameter
``"transformer.h.0.attn.c_attn.weight"`` of ``model.state_dict()``. Forward hooks let a
tool (the profiler) watch every module's calls from one place.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

from .. import autograd
from ..autograd import no_grad
from ..backend import Device, dtypes
from ..tensor import Tensor, _is_dtype_name
from .parameter import Parameter


class RemovableHandle:
    """What ``register_forward_hook`` returns: ``handle.remove()`` takes the hook off again
    (also usable as a context manager)."""

    _next_id = 0

    def __init__(self, hooks: dict) -> None:
        self._hooks = hooks
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(strict=False)`` returns."""

    missing_keys: List[str]
    unexpected_keys: List[str]


class Module:
    """Base class of layers and models: subclass it, assign sub-modules and Parameters in
    ``__init__`` (after ``super().__init__()``), and define ``forward``.

    >>> class TwoLayer(Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc1, self.fc2 = Linear(4, 8), Linear(8, 2)
    ...     def forward(self, x):
    ...         return self.fc2(self.fc1(x).relu())
    """

    training: bool

    def __init__(self) -> None:
        # object.__setattr__: our own __setattr__ needs these dicts to exist first
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no forward(); define it in the "
                                  "subclass")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if autograd._recorder is not None:  # capturing: train/eval is fixed in the capture
            autograd._recorder.module_called(self)
        if not (self._forward_pre_hooks or self._forward_hooks):  # the common case
            return self.forward(*args, **kwargs)
        for hook in list(self._forward_pre_hooks.values()):
            result = hook(self, args)
            if result is not None:  # a pre-hook may replace the positional arguments
                args = result if isinstance(result, tuple) else (result,)
        output = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            result = hook(self, args, output)
            if result is not None:  # a hook may replace the output
                output = result
        return output

    # --- hooks ----------------------------------------------------------------------------
    def register_forward_pre_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        """``hook(module, args)`` runs before each forward; returning a value replaces args."""
        handle = RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[handle.id] = hook
        return handle

    def register_forward_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        """``hook(module, args, output)`` runs after each forward; a returned value replaces
        the output."""
        handle = RemovableHandle(self._forward_hooks)
        self._forward_hooks[handle.id] = hook
        return handle

    # --- registration ---------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:  # before Module.__init__: plain values only
            if isinstance(value, (Parameter, Module)):
                raise AttributeError(f"cannot assign {name!r} before Module.__init__() call "
                                     f"(call super().__init__() first in "
                                     f"{type(self).__name__}.__init__)")
            object.__setattr__(self, name, value)
            return
        params, modules, buffers = self._parameters, self._modules, self._buffers
        if isinstance(value, Parameter):
            self._unregister(name)
            params[name] = value
        elif isinstance(value, Module):
            self._unregister(name)
            modules[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} as parameter {name!r} "
                                "(nn.Parameter or None expected)")
            params[name] = None
        elif name in modules:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} as child module {name!r} "
                                "(nn.Module or None expected)")
            modules[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign {type(value).__name__} as buffer {name!r} "
                                "(Tensor or None expected)")
            buffers[name] = value
        # also a plain attribute, so that reading self.weight costs no __getattr__ call
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._unregister(name)
        object.__delattr__(self, name)

    def _check_new_name(self, name: str, kind: str) -> None:
        """A name a parameter, buffer or child may take: a non-empty string without dots
        that is not already a plain attribute or another kind of registered thing."""
        if not isinstance(name, str):
            raise TypeError(f"{kind} name must be a string, got {type(name).__name__}")
        if not name or "." in name:
            raise KeyError(f"{kind} name can't be empty or contain '.', got {name!r}")
        taken = {"parameter": self._parameters, "buffer": self._buffers,
                 "module": self._modules}
        for other, registry in taken.items():
            if other != kind and name in registry:
                raise KeyError(f"{kind} {name!r}: the name is already a {other} of "
                               f"{type(self).__name__}")
        if name not in taken[kind] and hasattr(self, name):
            raise KeyError(f"{kind} {name!r}: {type(self).__name__} already has an attribute "
                           "of that name")

    def _unregister(self, name: str) -> None:
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers.pop(name, None)
        self._non_persistent_buffers.discard(name)

    def _register(self, op: str, kind: str, registry: dict, name: str, value: Any,
                  cls: type) -> None:
        """What register_parameter, register_buffer and add_module share: check the value's
        type and the name, then file the value under ``name`` (also as a plain attribute)."""
        if value is not None and not isinstance(value, cls):
            raise TypeError(f"{op}: {name!r} must be a {cls.__name__} or None, got "
                            f"{type(value).__name__}")
        self._check_new_name(name, kind)
        self._unregister(name)
        registry[name] = value
        object.__setattr__(self, name, value)

    def register_parameter(self, name: str, param: Optional[Parameter]) -> None:
        """Register ``param`` (or None: an optional parameter that is absent, like a bias)."""
        self._register("register_parameter", "parameter", self._parameters, name, param,
                       Parameter)

    def register_buffer(self, name: str, tensor: Optional[Tensor], persistent: bool = True) -> None:
        """A tensor the module keeps and moves with ``to()`` but does not train (a mask, a
        running statistic). Persistent buffers are part of ``state_dict``."""
        self._register("register_buffer", "buffer", self._buffers, name, tensor, Tensor)
        if not persistent:
            self._non_persistent_buffers.add(name)

    def add_module(self, name: str, module: Optional["Module"]) -> None:
        self._register("add_module", "module", self._modules, name, module, Module)

    # --- traversal ------------------------------------------------------------------------
    def named_modules(self, prefix: str = "", remove_duplicate: bool = True,
                      _memo: Optional[set] = None) -> Iterator[Tuple[str, "Module"]]:
        """This module and every module below it, depth first, with dotted names."""
        memo = set() if _memo is None else _memo
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is not None:
                yield from module.named_modules(f"{prefix}.{name}" if prefix else name,
                                                remove_duplicate, memo)

    def get_submodule(self, target: str) -> "Module":
        """The module at dotted path ``target`` ("transformer.h.0.attn"); "" is self."""
        module = self
        for part in target.split(".") if target else []:
            child = module._modules.get(part)
            if child is None:
                raise AttributeError(f"get_submodule: {type(module).__name__} has no child "
                                     f"module {part!r} (looking for {target!r})")
            module = child
        return module

    def modules(self) -> Iterator["Module"]:
        return (module for _, module in self.named_modules())

    def named_children(self) -> Iterator[Tuple[str, "Module"]]:
        return ((name, m) for name, m in self._modules.items() if m is not None)

    def children(self) -> Iterator["Module"]:
        return (module for _, module in self.named_children())

    def _named_members(self, registry: str, prefix: str, recurse: bool,
                       remove_duplicate: bool) -> Iterator[Tuple[str, Tensor]]:
        seen = set()
        modules = self.named_modules(prefix, remove_duplicate) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in getattr(module, registry).items():
                if value is None:
                    continue
                if remove_duplicate:
                    if id(value) in seen:
                        continue
                    seen.add(id(value))
                yield (f"{module_prefix}.{name}" if module_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[Tuple[str, Parameter]]:
        """(name, parameter) pairs; a parameter shared by two modules (tied weights) comes
        once, under its first name, unless ``remove_duplicate=False``."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[Tuple[str, Tensor]]:
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        return (b for _, b in self.named_buffers(recurse=recurse))

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of scalar parameters, each shared parameter counted once."""
        return sum(p.numel() for p in self.parameters()
                   if p.requires_grad or not trainable_only)

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        """Call ``fn`` on every child module (recursively), then on this one."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # --- modes and gradients --------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """Training mode (dropout active) for this module and all below it."""
        if not isinstance(mode, bool):
            raise ValueError(f"train: mode must be a bool, got {type(mode).__name__}")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> "Module":
        """Evaluation mode: ``train(False)``."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget every parameter's gradient (``None``), or zero it in place."""
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                with no_grad():
                    p.grad.zero_()

    # --- devices and dtypes ---------------------------------------------------------------
    def _apply(self, convert: Callable[[Tensor], Tensor]) -> "Module":
        """Replace each parameter's and buffer's array by ``convert``'s, in place: the
        Parameter objects stay the same, so optimizers and tied weights keep working."""
        with no_grad():
            for p in self.parameters():
                p.set_(convert(p))
                if p.grad is not None:
                    p.grad.set_(convert(p.grad))
            for module in self.modules():
                for name, b in list(module._buffers.items()):
                    if b is not None:
                        setattr(module, name, convert(b))  # __setattr__ files the buffer
        return self

    def to(self, *args: Any, device: Any = None, dtype: Any = None) -> "Module":
        """``to("cuda")``, ``to(mt.float64)``, ``to("cpu", mt.float32)``: moves parameters and
        buffers in place; a dtype applies to floating-point tensors only."""
        for arg in args:
            if isinstance(arg, (str, Device)) and not _is_dtype_name(arg):
                device = arg  # as Tensor.to tells them apart
            else:
                dtype = arg
        target_dtype = None if dtype is None else dtypes.as_dtype(dtype)
        if target_dtype is not None and not dtypes.is_floating(target_dtype):
            raise TypeError(f"Module.to: only floating-point dtypes can be used, got "
                            f"{target_dtype}")

        def convert(t: Tensor) -> Tensor:
            if device is not None:
                t = t.to(device)
            if target_dtype is not None and dtypes.is_floating(t.dtype):
                t = t.to(target_dtype)
            return t

        return self._apply(convert)

    def cpu(self) -> "Module":
        return self.to("cpu")

    def cuda(self, index: int = 0) -> "Module":
        return self.to(f"cuda:{index}")

    def float(self) -> "Module":
        return self.to(dtypes.float32)

    def double(self) -> "Module":
        return self.to(dtypes.float64)

    def half(self) -> "Module":
        return self.to(dtypes.float16)

    def bfloat16(self) -> "Module":
        return self.to(dtypes.bfloat16)

    # --- state ----------------------------------------------------------------------------
    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> "OrderedDict[str, Tensor]":
        """Every parameter and persistent buffer by dotted name, tied ones under each name
        (as PyTorch, so the keys match nanoGPT's and GPT-2's), each key after ``prefix``
        as given (``prefix="encoder."``). The tensors share memory with the model; they are
        detached unless ``keep_vars``."""
        out: "OrderedDict[str, Tensor]" = OrderedDict()
        for module_name, module in self.named_modules(remove_duplicate=False):
            dot = prefix + (f"{module_name}." if module_name else "")  # prefix as given
            for name, p in module._parameters.items():
                if p is not None:
                    out[dot + name] = p if keep_vars else p.detach()
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent_buffers:
                    out[dot + name] = b if keep_vars else b.detach()
        return out

    def load_state_dict(self, state_dict: Dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy ``state_dict``'s values (Tensors or arrays, any device) into the parameters
        and buffers in place, converting device and dtype. Everything is checked before
        anything is copied: a shape mismatch (always) or, with ``strict``, a missing or an
        unexpected key raises a RuntimeError that lists them all by name, and the model is
        left as it was. A parameter shared by several names (a tied embedding) is copied
        once when its names are given the same value object."""
        if not hasattr(state_dict, "items"):
            raise TypeError(f"load_state_dict: expected a dict of name -> tensor, got "
                            f"{type(state_dict).__name__}")
        own = self.state_dict(keep_vars=True)
        missing = [key for key in own if key not in state_dict]
        unexpected = [key for key in state_dict if key not in own]
        errors, values = [], {}
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            shape = getattr(value, "shape", None)
            if shape is None:
                errors.append(f"{key}: expected a tensor or an array, got "
                              f"{type(value).__name__}")
            elif tuple(shape) != tuple(target.shape):
                errors.append(f"size mismatch for {key}: copying a param with shape "
                              f"{tuple(shape)} from checkpoint, the shape in current model is "
                              f"{tuple(target.shape)}")
            else:
                values[key] = value
        if strict:
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: " + ", ".join(missing))
            if unexpected:
                errors.insert(int(bool(missing)),
                              "Unexpected key(s) in state_dict: " + ", ".join(unexpected))
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n  "
                               + "\n  ".join(errors))
        copied: Dict[int, Any] = {}  # id(parameter) -> the value copied into it
        with no_grad():
            for key, value in values.items():
                target = own[key]
                if copied.get(id(target)) is value:  # a tied name given the same value
                    continue  # (a tied lm_head): copied once
                copied[id(target)] = value
                if not isinstance(value, Tensor) and hasattr(value, "detach"):
                    value = value.detach()  # another framework's tensor (torch's parameters)
                source = value if isinstance(value, Tensor) else Tensor(value)
                if source.device != target.device:
                    source = source.to(target.device)
                target.copy_(source)  # casts to the target's dtype
        return IncompatibleKeys(missing, unexpected)

    # --- printing -------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The text inside this module's parentheses in ``repr`` (layers override it)."""
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): {_indent(repr(module))}" for name, module in self._modules.items()]
        return _format(type(self).__name__, self.extra_repr(), lines)

    def __dir__(self) -> list:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._modules)
                      | set(self._buffers))


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def _format(name: str, extra: str, child_lines: list) -> str:
    """``Name(extra)`` or, with children, one indented ``(child): ...`` line each."""
    if not child_lines:
        return f"{name}({extra})"
    body = ([extra] if extra else []) + child_lines
    return f"{name}(\n  " + "\n  ".join(body) + "\n)"
