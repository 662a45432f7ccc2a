"""YAML as run configs read it: floats as everyone writes them, no key given twice.

``load_config`` reads files through ``Loader``; ``--set section.key=value`` values go
through ``parse_yaml_value``; ``yaml_error_text`` puts PyYAML's errors on one line.
"""
from __future__ import annotations

import re
from typing import Any, Dict

import yaml

__all__ = ["Loader", "parse_yaml_value", "yaml_error_text"]


class Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``3e-4`` and ``-.5`` as strings (it wants ``3.0e-4``); this loader reads
    them as the floats everyone means. A key given twice in one mapping is an error: YAML
    keeps the last silently, so a second ``lr:`` further down a section would win unseen."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
        seen: Dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the base class reports it
                break
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first on line "
                    f"{first.start_mark.line + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def yaml_error_text(exc: Exception) -> str:
    """A YAML error on one line: where, then what (PyYAML's own spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(exc).split())


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def parse_yaml_value(text: str) -> Any:
    """A command-line value as YAML: ``3e-4`` -> 0.0003, ``true`` -> True, ``null`` -> None."""
    return yaml.load(text, Loader=Loader) if text.strip() else ""
