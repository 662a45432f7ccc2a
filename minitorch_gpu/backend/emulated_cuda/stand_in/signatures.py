"""Real CuPy's call signatures, enforced on the stand-in's generic wrappers.

The stand-in hands most calls to NumPy (``functions._on_device``, the ndarray methods of
``array.FORWARDED_METHODS``), and NumPy takes keywords CuPy has no parameter for
(``cupy.sum`` has no ``initial=``, ``cupy.concatenate`` no ``casting=``): code that runs
here would raise TypeError on a GPU. So each such call is first bound against the
signature CuPy 14.2 declares, which ``scripts/cupy_tables.py`` recorded in
``cupy_tables.json`` ("api": one entry per public name the stand-in offers).

A signature is kept as text, as ``inspect`` renders it with every default shown as ``...``
(only whether a parameter has one matters to a call): ``(a, axis=..., *, out=...)``. The
same parser reads Cython's embedded signatures (``get_current_stream(int device_id=-1)``)
for the script, whose C types it drops.
"""
from __future__ import annotations

import ast
import functools
import inspect
from typing import Any, Dict, List, Optional, Tuple

from .ufunc_types import tables


class _Default:
    """The default of a CuPy parameter: that there is one, not its value."""

    def __repr__(self) -> str:
        return "..."


DEFAULT = _Default()


def _split_top_level(text: str, separator: str) -> List[str]:
    """``text`` split at ``separator`` outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote and text[i - 1] != "\\" else quote
        elif char in "'\"":
            quote = char
        elif char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _python_parameter(piece: str) -> str:
    """One parameter as Python spells it: Cython's C type and ``not None`` dropped, the
    default replaced by ``...`` (a Cython default need not be a Python expression)."""
    name, *default = _split_top_level(piece.strip(), "=")
    name = name.strip()
    if name.endswith(" not None"):
        name = name[:-len(" not None")]
    if name not in ("*", "/"):
        name = name.split()[-1]  # "long long strideA" -> "strideA"; "*shape" stays
    return name + ("=..." if default else "")


def parse(text: str) -> inspect.Signature:
    """``"(a, axis=..., *, out=...)"`` (or Cython's ``"(int device_id=-1)"``) as a
    Signature whose defaults are ``DEFAULT``. Raises ValueError on text that is no
    parameter list."""
    inner = text.strip()
    if not (inner.startswith("(") and inner.endswith(")")):
        raise ValueError(f"not a parameter list: {text!r}")
    pieces = [p for p in _split_top_level(inner[1:-1], ",") if p.strip()]
    source = "def f(%s): pass" % ", ".join(_python_parameter(p) for p in pieces)
    try:
        arguments = ast.parse(source).body[0].args
    except SyntaxError as e:
        raise ValueError(f"cannot read the parameters {text!r}: {e}") from None
    P = inspect.Parameter
    positional = [(a, P.POSITIONAL_ONLY) for a in arguments.posonlyargs] + \
                 [(a, P.POSITIONAL_OR_KEYWORD) for a in arguments.args]
    first_default = len(positional) - len(arguments.defaults)
    parameters = [P(a.arg, kind, default=DEFAULT if i >= first_default else P.empty)
                  for i, (a, kind) in enumerate(positional)]
    if arguments.vararg is not None:
        parameters.append(P(arguments.vararg.arg, P.VAR_POSITIONAL))
    parameters += [P(a.arg, P.KEYWORD_ONLY, default=P.empty if d is None else DEFAULT)
                   for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)]
    if arguments.kwarg is not None:
        parameters.append(P(arguments.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(parameters)


def render(signature: inspect.Signature) -> str:
    """The text ``parse`` reads back: every default as ``...``."""
    return str(signature.replace(
        parameters=[p.replace(default=DEFAULT if p.default is not p.empty else p.empty,
                              annotation=p.empty)
                    for p in signature.parameters.values()],
        return_annotation=inspect.Signature.empty))


@functools.lru_cache(maxsize=None)
def cupy_signature(path: str) -> Optional[inspect.Signature]:
    """CuPy's signature of ``path`` (``"cupy.sum"``, ``"cupy.ndarray.sum"``), parsed once;
    None where the JSON has no readable one (then the call goes unchecked)."""
    entry: Dict[str, Any] = tables().get("api", {}).get(path, {})
    text = entry.get("signature")
    return parse(text) if isinstance(text, str) and text.startswith("(") else None


def check_call(path: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
    """Raise TypeError where CuPy's ``path`` would refuse these arguments (an unknown
    keyword, too many positional arguments, a missing one), though NumPy takes them."""
    signature = cupy_signature(path)
    if signature is None:
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{path}(): {e}; CuPy {tables()['cupy_version']} declares "
                        f"{path.rsplit('.', 1)[-1]}{signature}") from None
