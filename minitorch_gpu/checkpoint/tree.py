"""The tree encoding: nested containers of numbers, strings and arrays as JSON data plus a
list of the arrays taken out of it (what a checkpoint stores for optimizer state and
metadata).

>>> tree, arrays = encode_tree({"state": {0: {"step": 2, "exp_avg": np.zeros(3)}}})
>>> decode_tree(tree, arrays)["state"][0]["step"]
2
"""
from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from ..backend import backend_of_array
from ..tensor import Tensor

__all__ = ["array_of", "array_paths", "decode_tree", "encode_keeping_arrays", "encode_tree",
           "is_array", "to_host"]

# tags of the tree encoding: a JSON object with exactly one of these keys is not a dict
_ARRAY, _TUPLE, _DICT, _FLOAT = "__array__", "__tuple__", "__dict__", "__float__"
_TAGS = frozenset({_ARRAY, _TUPLE, _DICT, _FLOAT})
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def encode_tree(value: Any) -> Tuple[Any, List[np.ndarray]]:
    """``(tree, arrays)``: ``value`` as JSON data plus the arrays taken out of it.

    Dicts with str keys, lists, str, int (any size), finite float, bool and None stay as
    they are; every Tensor or array (NumPy, CuPy) becomes ``{"__array__": i}``, an index
    into ``arrays`` (NumPy, on the host; the same array object twice is one entry); a tuple
    becomes ``{"__tuple__": [...]}``, NaN and infinities ``{"__float__": "nan"}``, and a
    dict with a non-str key (or a key that is one of these tags) ``{"__dict__": [[key,
    value], ...]}``. NumPy scalars become Python numbers. ``decode_tree`` inverts it.

    >>> encode_tree({"state": {0: {"step": 2}}, "betas": (0.9, 0.95)})
    ({'state': {'__dict__': [[0, {'step': 2}]]}, 'betas': {'__tuple__': [0.9, 0.95]}}, [])
    """
    tree, found = encode_keeping_arrays(value, "encode_tree: value")
    return tree, [to_host(array) for array in found]


def encode_keeping_arrays(value: Any, where: str) -> Tuple[Any, List[Any]]:
    """``encode_tree`` leaving the arrays as they are (Tensors, CuPy arrays: no copy to the
    host yet); ``where`` names ``value`` in errors."""
    found: List[Any] = []
    return _encode(value, found, {}, where), found


def decode_tree(tree: Any, arrays: Sequence[Any] = ()) -> Any:
    """The value ``encode_tree`` encoded as ``tree``, with ``{"__array__": i}`` as
    ``arrays[i]``. Raises ValueError naming the place where ``tree`` is malformed."""
    return _decode(tree, arrays, "tree")


def array_paths(tree: Any) -> Dict[int, Tuple[str, ...]]:
    """Where each array of an encoded ``tree`` first appears (depth first, in order): its
    index -> the dict keys and list positions leading to it (a non-str key as its JSON).

    >>> array_paths(encode_tree({"state": {0: {"exp_avg": np.zeros(2)}}})[0])
    {0: ('state', '0', 'exp_avg')}
    """
    found: Dict[int, Tuple[str, ...]] = {}
    pending = [(tree, ())]  # a stack: children pushed in reverse, so popped in order
    while pending:
        node, path = pending.pop()
        children: List[Tuple[Any, Tuple[str, ...]]] = []
        if isinstance(node, list):
            children = [(item, (*path, str(i))) for i, item in enumerate(node)]
        elif isinstance(node, dict) and set(node) == {_ARRAY}:
            found.setdefault(node[_ARRAY], path)
        elif isinstance(node, dict) and set(node) == {_TUPLE}:
            children = [(item, (*path, str(i))) for i, item in enumerate(node[_TUPLE])]
        elif isinstance(node, dict) and set(node) == {_DICT}:
            children = [(item, (*path, key if isinstance(key, str) else json.dumps(key)))
                        for key, item in node[_DICT]]
        elif isinstance(node, dict):
            children = [(item, (*path, key)) for key, item in node.items()]
        pending.extend(reversed(children))
    return found


def is_array(value: Any) -> bool:
    return isinstance(value, (Tensor, np.ndarray)) or hasattr(value, "__cuda_array_interface__")


def array_of(value: Any) -> Any:
    """The raw array (NumPy or CuPy) of a Tensor or an array, without copying it."""
    return value.data if isinstance(value, Tensor) else value


def to_host(value: Any) -> np.ndarray:
    """A Tensor or an array as a NumPy array (CuPy arrays are copied to the host)."""
    if isinstance(value, Tensor):
        return value.backend.to_numpy(value.data)
    if isinstance(value, np.ndarray):
        return value
    return backend_of_array(value).to_numpy(value)


def _encode(value: Any, arrays: List[Any], index_of: Dict[int, int], where: str,
            allow_arrays: bool = True) -> Any:
    """``value`` as JSON data; arrays are appended to ``arrays`` (``index_of``: id -> index)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)  # an int subclass (IntEnum) as a plain int
    if isinstance(value, float):  # np.float64 too
        number = float(value)
        return number if math.isfinite(number) else {_FLOAT: repr(number)}
    if isinstance(value, np.generic) and not isinstance(value, (np.void, np.flexible)):
        item = value.item()  # np.int64, np.bool_, np.float32, a bfloat16 scalar, ...
        if isinstance(item, (bool, int, float)):
            return _encode(item, arrays, index_of, where, allow_arrays)
    if is_array(value):
        if not allow_arrays:
            raise TypeError(f"{where} is a {type(value).__name__}; expected JSON data "
                            "(numbers, str, bool, None, lists, tuples, dicts), no arrays")
        array = array_of(value)
        if array.dtype.hasobject:
            raise TypeError(f"{where} is an array of Python objects (dtype object); only "
                            "numeric arrays can be saved")
        if id(array) not in index_of:
            index_of[id(array)] = len(arrays)
            arrays.append(value)
        return {_ARRAY: index_of[id(array)]}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(item, arrays, index_of, f"{where}[{i}]", allow_arrays)
                         for i, item in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(item, arrays, index_of, f"{where}[{i}]", allow_arrays)
                for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        if all(isinstance(key, str) for key in value) and not _TAGS.intersection(value):
            return {key: _encode(item, arrays, index_of, f"{where}[{key!r}]", allow_arrays)
                    for key, item in value.items()}
        pairs = []
        for key, item in value.items():
            _check_key(key, f"{where}: key {key!r}")
            pairs.append([_encode(key, arrays, index_of, where, allow_arrays=False),
                          _encode(item, arrays, index_of, f"{where}[{key!r}]", allow_arrays)])
        return {_DICT: pairs}
    raise TypeError(f"{where} is a {type(value).__name__}; expected a dict, list, tuple, str, "
                    "int, float, bool, None" + (", Tensor or array" if allow_arrays else ""))


def _check_key(key: Any, where: str) -> None:
    """TypeError unless ``key`` is a str, a number, a bool, None or a tuple of them."""
    if isinstance(key, tuple):
        for item in key:
            _check_key(item, where)
    elif not (key is None or isinstance(key, (str, int, float, bool, np.number, np.bool_))):
        raise TypeError(f"{where} is a {type(key).__name__}; expected a dict key that is a "
                        "str, a number, a bool, None or a tuple of them")


def _decode(node: Any, arrays: Sequence[Any], where: str) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(item, arrays, f"{where}[{i}]") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        raise ValueError(f"decode_tree: {where} is a {type(node).__name__}; expected JSON data")
    tags = _TAGS.intersection(node)
    if not tags:
        return {key: _decode(item, arrays, f"{where}[{key!r}]") for key, item in node.items()}
    if len(node) != 1:
        raise ValueError(f"decode_tree: {where} mixes the tag {sorted(tags)[0]!r} with other "
                         f"keys {sorted(node)}; expected the tag alone")
    (tag, body), = node.items()
    if tag == _ARRAY:
        if isinstance(body, bool) or not isinstance(body, int) or not 0 <= body < len(arrays):
            raise ValueError(f"decode_tree: {where}: expected an array index in "
                             f"[0, {len(arrays)}), got {body!r}")
        return arrays[body]
    if tag == _FLOAT:
        if not isinstance(body, str) or body not in _NON_FINITE:
            raise ValueError(f"decode_tree: {where}: expected one of {sorted(_NON_FINITE)}, "
                             f"got {body!r}")
        return _NON_FINITE[body]
    if not isinstance(body, list):
        raise ValueError(f"decode_tree: {where}: expected a list after {tag!r}, got "
                         f"{type(body).__name__}")
    if tag == _TUPLE:
        return tuple(_decode(item, arrays, f"{where}[{i}]") for i, item in enumerate(body))
    out = {}
    for i, pair in enumerate(body):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"decode_tree: {where}: item {i} of {_DICT!r}: expected a "
                             f"[key, value] pair, got {str(pair)[:80]}")
        key = _decode(pair[0], (), f"{where}: key {i}")
        try:
            hash(key)
        except TypeError:
            raise ValueError(f"decode_tree: {where}: key {i} is a {type(key).__name__}, "
                             "which can't be a dict key") from None
        out[key] = _decode(pair[1], arrays, f"{where}[{key!r}]")
    return out

