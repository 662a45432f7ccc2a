"""Modules that hold other modules: Sequential, ModuleList, ModuleDict."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, Iterable, Iterator, Optional, Union

from .module import Module, _format, _indent


class _IndexedModules(Module):
    """Children kept in order and reached by position (what Sequential and ModuleList
    share); a slice is a new container of the same kind."""

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, index: Union[int, slice]) -> Any:
        modules = list(self._modules.values())
        if isinstance(index, slice):
            return self._of(list(self._modules.items())[index])
        return modules[_index(index, len(modules), type(self).__name__)]

    @classmethod
    def _of(cls, named: list) -> "_IndexedModules":
        """A container of the (name, module) pairs of a slice."""
        raise NotImplementedError

    def append(self, module: Module) -> Any:
        self.add_module(str(len(self)), module)
        return self


class Sequential(_IndexedModules):
    """Modules applied one after the other: ``Sequential(Linear(4, 8), GELU(), Linear(8, 2))``
    (children named "0", "1", ...) or ``Sequential(OrderedDict(fc=..., act=...))``."""

    def __init__(self, *modules: Any) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(modules):
                self.add_module(str(i), module)

    def forward(self, x: Any) -> Any:
        for module in self._modules.values():
            x = module(x)
        return x

    @classmethod
    def _of(cls, named: list) -> "Sequential":
        return cls(OrderedDict(named))  # a slice keeps the children's names, as PyTorch's

    def extend(self, modules: Iterable[Module]) -> "Sequential":
        for module in modules:
            self.append(module)
        return self


class ModuleList(_IndexedModules):
    """A list of modules, registered as children "0", "1", ... (a GPT's blocks)."""

    def __init__(self, modules: Optional[Iterable[Module]] = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    @classmethod
    def _of(cls, named: list) -> "ModuleList":
        return cls(module for _, module in named)  # renumbered from 0, as PyTorch's

    def insert(self, index: int, module: Module) -> None:
        """Put ``module`` before position ``index``; the later ones move up by one."""
        modules = list(self._modules.values())
        modules.insert(index, module)
        for name in list(self._modules):
            delattr(self, name)
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def __setitem__(self, index: int, module: Module) -> None:
        self.add_module(str(_index(index, len(self), "ModuleList")), module)

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for module in modules:
            self.append(module)
        return self

    def forward(self, *args: Any) -> Any:
        raise NotImplementedError("ModuleList has no forward(); iterate over it and call its "
                                  "modules")

    def __repr__(self) -> str:
        """Runs of identical children print once: ``(0-11): 12 x Block(...)``."""
        lines, reprs = [], [repr(m) for m in self._modules.values()]
        start = 0
        while start < len(reprs):
            end = start
            while end + 1 < len(reprs) and reprs[end + 1] == reprs[start]:
                end += 1
            label = f"{start}" if end == start else f"{start}-{end}"
            count = "" if end == start else f"{end - start + 1} x "
            lines.append(f"({label}): {count}{_indent(reprs[start])}")
            start = end + 1
        return _format("ModuleList", "", lines)


class ModuleDict(Module):
    """Modules by name (nanoGPT keeps its ``transformer`` part in one)."""

    def __init__(self, modules: Optional[Dict[str, Module]] = None) -> None:
        super().__init__()
        for name, module in (modules or {}).items():
            self.add_module(name, module)

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __setitem__(self, name: str, module: Module) -> None:
        self.add_module(name, module)

    def __contains__(self, name: str) -> bool:
        return name in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def update(self, modules: Dict[str, Module]) -> None:
        for name, module in dict(modules).items():
            self.add_module(name, module)

    def pop(self, name: str) -> Module:
        module = self._modules[name]
        delattr(self, name)
        return module

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def values(self) -> Iterable[Module]:
        return self._modules.values()

    def items(self) -> Iterable:
        return self._modules.items()

    def forward(self, *args: Any) -> Any:
        raise NotImplementedError("ModuleDict has no forward(); call its modules by name")


def _index(index: int, length: int, container: str) -> int:
    if not -length <= index < length:
        raise IndexError(f"{container}: index {index} is out of range for {length} modules")
    return index % length
