"""Write the type tables of real CuPy's ufuncs and reductions to a JSON file, so the
NumPy-backed CuPy stand-in (minitorch_gpu/backend/emulated_cuda/stand_in/) refuses exactly
the dtypes a GPU would refuse. NumPy with ml_dtypes runs more loops than CuPy has (bfloat16
in a bitwise op, say); a stand-in that trusted NumPy would hide an error that only shows on
a GPU. Reading the tables needs CuPy importable, not a GPU: `ufunc.types` and the `_ops` of
each kernel are host objects.

It also records, under "api", what real CuPy declares for every public name the stand-in
offers (its cupy, cupy.cuda, cupy.random, cupyx, cupyx.scipy.special, cuBLAS and NCCL
module objects, and the attributes of the classes among them, cupy.ndarray's included):
whether CuPy has the name, what it is (function, class, ufunc with nin/nout, attribute)
and its signature where one can be read. The stand-in binds its generic wrappers' calls
against these (stand_in/signatures.py), so a keyword NumPy takes and CuPy lacks fails here.

    python scripts/cupy_tables.py            # (re)write stand_in/cupy_tables.json
    python scripts/cupy_tables.py --check    # exit 1, with a diff, if the committed JSON
                                             # differs from what this CuPy reports
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import types
from typing import Any, Dict, Iterator, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = os.path.join(ROOT, "minitorch_gpu", "backend", "emulated_cuda", "stand_in",
                      "cupy_tables.json")

# Reductions the engine calls, and where CuPy 14.2.0 keeps each one's type table.
# cupy.sum(a) runs sum_auto_dtype, cupy.sum(a, dtype=...) runs _sum_keep_dtype
# (cupy/_core/_routines_math.pyx, _ndarray_sum); prod likewise.
READABLE_REDUCTIONS = {
    "sum": [("cupy._core._routines_math", "sum_auto_dtype", "dtype=None"),
            ("cupy._core._routines_math", "_sum_keep_dtype", "dtype given")],
    "prod": [("cupy._core._routines_math", "prod_auto_dtype", "dtype=None"),
             ("cupy._core._routines_math", "_prod_keep_dtype", "dtype given")],
    "max": [("cupy._core._routines_statistics", "amax", "always")],
    "min": [("cupy._core._routines_statistics", "amin", "always")],
    "any": [("cupy._core._routines_logic", "any", "always")],
    "all": [("cupy._core._routines_logic", "all", "always")],
}
# These have no type table reachable from Python in CuPy 14.2.0: the kernel objects are
# `cdef` module globals (not attributes), or the dtype is chosen in compiled code.
UNREADABLE_REDUCTIONS = {
    "argmax": "cdef _argmax in cupy/_core/_routines_statistics.pyx: not a module attribute",
    "argmin": "cdef _argmin in cupy/_core/_routines_statistics.pyx: not a module attribute",
    "mean": "cdef _mean_core in cupy/_core/_routines_statistics.pyx: not a module attribute",
    "var": "cdef _var_core_* ReductionKernels in cupy/_core/_routines_statistics.pyx: "
           "not module attributes",
    "cumsum": "a scan (scan_core in cupy/_core/_routines_math.pyx): the dtype is picked in "
              "compiled code, no type table",
    "cumprod": "a scan (scan_core in cupy/_core/_routines_math.pyx): the dtype is picked in "
               "compiled code, no type table",
}


def _signature(op) -> str:
    """One loop as `ufunc.types` spells it (dtype chars; bfloat16 is ml_dtypes' 'E')."""
    import numpy
    ins = "".join(numpy.dtype(t).char for t in op.in_types)
    outs = "".join(numpy.dtype(t).char for t in op.out_types)
    return "%s->%s" % (ins, outs)


def _error_message(op) -> str:
    """The TypeError a loop registered as an error raises (bool subtract, for one)."""
    try:
        op.error_func()
    except TypeError as e:
        return str(e)
    raise RuntimeError("error loop %s of CuPy did not raise TypeError" % _signature(op))


def _ufunc_entry(u) -> dict:
    ops = u._ops.ops
    types = list(u.types)
    if types != [_signature(op) for op in ops]:
        raise RuntimeError("%s: ufunc.types and its _ops disagree; expected the same loops"
                           % u.name)
    entry = {"cupy_name": u.name, "nin": u.nin, "nout": u.nout, "types": types,
             "error_loops": {_signature(op): _error_message(op)
                             for op in ops if op.error_func is not None},
             "resolution_funcs": {_signature(op): op._resolution_func.__name__
                                  for op in ops if op._resolution_func is not None},
             "promote_types": (None if u._ops.promote_types is None
                               else u._ops.promote_types.__name__),
             "out_types": (None if u._out_ops is None
                           else [_signature(op) for op in u._out_ops.ops])}
    return entry


def _ufuncs() -> Dict[str, dict]:
    import cupy
    import cupyx.scipy.special
    from cupy._core._kernel import ufunc
    found = {}
    for name in sorted(dir(cupy)):
        obj = getattr(cupy, name, None)
        if isinstance(obj, ufunc):
            found[name] = _ufunc_entry(obj)
    found["cupyx.scipy.special.erf"] = _ufunc_entry(cupyx.scipy.special.erf)
    return found


def _reductions() -> Dict[str, dict]:
    import importlib
    out: Dict[str, dict] = {}
    for name, kernels in READABLE_REDUCTIONS.items():
        entries = []
        for module, attr, when in kernels:
            k = getattr(importlib.import_module(module), attr)
            entries.append({"kernel": "%s.%s" % (module, attr), "cupy_name": k.name,
                            "when": when, "types": [_signature(op) for op in k._ops.ops]})
        out[name] = {"readable": True, "kernels": entries}
    for name, why in UNREADABLE_REDUCTIONS.items():
        out[name] = {"readable": False, "why": why}
    return dict(sorted(out.items()))


def _legend(ufuncs: Dict[str, dict], reductions: Dict[str, dict]) -> Dict[str, str]:
    """Each type char the tables use and the dtype it stands for; 'E' is not a char NumPy
    itself resolves (numpy.dtype('E') fails), it is ml_dtypes.bfloat16's dtype.char."""
    import ml_dtypes
    import numpy
    sigs: List[str] = [t for u in ufuncs.values() for t in u["types"]]
    sigs += [t for r in reductions.values() for k in r.get("kernels", []) for t in k["types"]]
    chars = sorted(set("".join(sigs).replace("->", "")))
    bf16 = numpy.dtype(ml_dtypes.bfloat16)
    return {c: (bf16.name if c == bf16.char else numpy.dtype(c).name) for c in chars}


# ---- the API the stand-in offers, as real CuPy declares it -----------------------------

STAND_IN_PACKAGE = "minitorch_gpu.backend.emulated_cuda.stand_in"
# Modules whose Cython extension needs a CUDA library to load (libcublas, libnccl), and the
# extension that defines their names. Where it cannot load, its names and its embedded
# signatures are read from the extension file's text: the same docstrings a loaded module
# shows, so the tables come out alike with or without the libraries.
EXTENSIONS = {"cupy_backends.cuda.libs.cublas": "cupy_backends.cuda.libs.cublas",
              "cupy.cuda.nccl": "cupy_backends.cuda.libs.nccl"}  # nccl.py: import *


def stand_in_modules() -> Dict[str, Any]:
    """The stand-in's module objects, by the CuPy module each stands for."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    stand_in = importlib.import_module(STAND_IN_PACKAGE)
    return {"cupy": stand_in.cupy, "cupyx": stand_in.cupyx,
            "cupy_backends.cuda.libs.cublas": stand_in.cublas_module}


def _from_stand_in(value: Any) -> bool:
    module = getattr(value if isinstance(value, type) else type(value), "__module__", "")
    return module.startswith(STAND_IN_PACKAGE)


def _members(obj: Any) -> Iterator[Tuple[str, Any]]:
    """The public names ``obj`` offers: a namespace's members; of a file module (cuBLAS),
    what it defines itself, not what it imports; a stand-in class's own attributes (not
    those of object or RuntimeError); a stand-in namespace object's (``runtime``, ``nccl``)."""
    if isinstance(obj, types.ModuleType):
        for name, value in vars(obj).items():
            if name.startswith("_") or isinstance(value, types.ModuleType) and \
                    getattr(value, "__file__", None):
                continue
            if getattr(obj, "__file__", None) and not _defined_in(value, obj.__name__):
                continue  # imported into the file (typing's Any, numpy): not offered
            yield name, value
        return
    cls = obj if isinstance(obj, type) else type(obj)
    seen = set()
    for klass in cls.__mro__:
        if not _from_stand_in(klass):
            continue
        own = dict(vars(klass))
        if not isinstance(obj, type):
            own.update(getattr(obj, "__dict__", {}))
        for name in own:
            if not name.startswith("_") and name not in seen:
                seen.add(name)
                yield name, getattr(obj, name)


def _defined_in(value: Any, module: str) -> bool:
    """A class or function ``module`` defines, or plain data (an int, a list) it holds."""
    if isinstance(value, type) or callable(value):
        return getattr(value, "__module__", None) == module
    return type(value).__module__ == "builtins"


def _walks_into(value: Any) -> bool:
    """Namespaces, stand-in classes and stand-in namespace objects; not a ufunc or other
    callable instance, not NumPy's dtypes."""
    if isinstance(value, types.ModuleType):
        return True
    if isinstance(value, type):
        return _from_stand_in(value)
    return _from_stand_in(value) and not callable(value)


def offered() -> Dict[str, Any]:
    """Every public name the stand-in offers, dotted as CuPy spells it, with its value."""
    found: Dict[str, Any] = {}

    def visit(path: str, value: Any, depth: int) -> None:
        found[path] = value
        if depth < 4 and _walks_into(value):
            for name, member in _members(value):
                visit(path + "." + name, member, depth + 1)
    for root, module in stand_in_modules().items():
        visit(root, module, 0)
    return dict(sorted(found.items()))


class _Extension:
    """A Cython module that cannot load here: its names and embedded signatures, read
    from the extension file's text (Cython's ``embedsignature`` docstrings and the
    qualified names it keeps for each function and class)."""

    def __init__(self, module: str) -> None:
        origin = importlib.util.find_spec(module).origin
        with open(origin, "rb") as f:
            self.text = f.read().decode("latin-1")
        self.module = module

    def _embedded(self, qualname: str) -> Optional[str]:
        """The docstring line ``qualname(params)`` Cython embedded, if any."""
        line = re.search(r"(?:^|[\x00\n])(%s\([^\x00\n]*\)[^\x00\n]*)" % re.escape(qualname),
                         self.text)
        return line.group(1) if line else None

    def entry(self, qualname: str) -> dict:
        qualified = "%s.%s" % (self.module, qualname)
        if qualified + ".__reduce_cython__" in self.text or qualified + ".__init__" in self.text:
            # a class: its docstring's signature, else its __init__'s without self (as
            # inspect.signature gives a Python class's)
            line = self._embedded(qualname) or self._embedded(qualname + ".__init__")
            if line and ".__init__(" in line:
                line = re.sub(r"\.__init__\(self,?\s*", "(", line)
            return dict(kind="class", **_read_signature(None, line))
        line = self._embedded(qualname)
        if line or qualified in self.text:
            return dict(kind="function", **_read_signature(None, line))
        if "." not in qualname and re.search(r"(?:^|\x00)%s\x00" % re.escape(qualname),
                                             self.text):
            return {"kind": "attribute"}  # an enum value or constant: its name is all that shows
        return {"kind": "absent"}


_MISSING = object()


def _real_object(path: str) -> Tuple[Any, Optional[Tuple[_Extension, str]]]:
    """Real CuPy's object at ``path``, or _MISSING; with the extension to read instead
    where the module's CUDA library is missing."""
    for prefix, extension in EXTENSIONS.items():
        if path == prefix or path.startswith(prefix + "."):
            try:
                module = importlib.import_module(prefix)
                if getattr(module, "available", True) is False:
                    raise ImportError(prefix + " loaded without its library")
                return _walk_attributes(module, path[len(prefix) + 1:]), None
            except ImportError:
                if path == prefix:
                    return types.ModuleType(prefix), None
                if importlib.util.find_spec(prefix) is not None and prefix != extension:
                    live = _walk_attributes(importlib.import_module(prefix),
                                            path[len(prefix) + 1:])
                    if live is not _MISSING:  # nccl.py's own names (available)
                        return live, None
                return _MISSING, (_Extension(extension), path[len(prefix) + 1:])
    root = "cupyx" if path.startswith("cupyx") else "cupy"
    if root == "cupyx":
        importlib.import_module("cupyx.scipy.special")
    return _walk_attributes(importlib.import_module(root), path[len(root) + 1:]), None


def _walk_attributes(obj: Any, dotted: str) -> Any:
    for name in filter(None, dotted.split(".")):
        obj = getattr(obj, name, _MISSING)
        if obj is _MISSING:
            break
    return obj


def _read_signature(obj: Any, embedded: Optional[str]) -> dict:
    """``inspect.signature`` where it reads; else Cython's embedded one (the docstring's
    first line, ``name(params) -> type``); else "unreadable" and why."""
    sig = __import__(STAND_IN_PACKAGE + ".signatures", fromlist=["parse"])
    doc = (getattr(obj, "__doc__", None) or "").strip().split("\n", 1)[0]
    if isinstance(obj, type) and re.match(r"^(?:%s|__init__)\(" % obj.__name__, doc):
        embedded = doc  # a Cython class's own line: inspect sees only (*args, **kwargs)
    elif obj is not None:
        try:
            return {"signature": sig.render(inspect.signature(obj)),
                    "signature_from": "inspect"}
        except (TypeError, ValueError):
            embedded = (getattr(obj, "__doc__", None) or "").split("\n", 1)[0]
    name = getattr(obj, "__name__", None)
    match = re.match(r"^(?:[\w.]+\.)?(\w+)(\(.*\))(?:\s*->.*)?$", (embedded or "").strip())
    if match and (name is None or match.group(1) in (name, "__init__")):
        try:
            return {"signature": sig.render(sig.parse(match.group(2))),
                    "signature_from": "embedded"}
        except ValueError as e:
            return {"signature": "unreadable: %s" % e}
    return {"signature": "unreadable: inspect finds none and its docstring embeds none"}


def _api_entry(path: str) -> dict:
    from cupy._core._kernel import ufunc
    real, extension = _real_object(path)
    if extension is not None:
        return extension[0].entry(extension[1])
    if real is _MISSING:
        return {"kind": "absent"}
    if isinstance(real, ufunc):
        return {"kind": "ufunc", "nin": real.nin, "nout": real.nout}
    if isinstance(real, types.ModuleType):
        return {"kind": "module"}
    if not callable(real):
        return {"kind": "attribute"}
    entry = {"kind": "class" if isinstance(real, type) else "function"}
    entry.update(_read_signature(real, None))
    return entry


def api() -> Dict[str, dict]:
    """CuPy's entry for every public name the stand-in offers (sorted)."""
    return {path: _api_entry(path) for path in offered()}


def build() -> dict:
    import cupy
    import ml_dtypes
    import numpy
    ufuncs = _ufuncs()
    reductions = _reductions()
    return {"cupy_version": cupy.__version__,
            # bfloat16 loops exist only with ml_dtypes and NumPy >= 2.1.2
            # (cupy/_util.pyx, bf16_loop): the versions say which loops were seen
            "generated_with": {"numpy": numpy.__version__, "ml_dtypes": ml_dtypes.__version__},
            "type_chars": _legend(ufuncs, reductions),
            "ufuncs": ufuncs,
            "reductions": reductions,
            "api": api()}


def dumps(tables: dict) -> str:
    return json.dumps(tables, indent=1, sort_keys=True) + "\n"


def _comparable(tables: dict) -> dict:
    """What --check compares: CuPy's tables, not the NumPy/ml_dtypes versions noted, nor
    where each signature was read from (a Cython function of cuBLAS read from its
    extension file here may read through inspect where the library loads)."""
    out = {k: v for k, v in tables.items() if k != "generated_with"}
    out["api"] = {path: {k: v for k, v in entry.items() if k != "signature_from"}
                  for path, entry in tables.get("api", {}).items()}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 with a diff if the committed JSON is out of date")
    args = parser.parse_args(argv)
    try:
        sys.path.insert(0, ROOT)
        from minitorch_gpu.backend.emulated_cuda.stand_in import reference
        reference.import_real_cupy()  # the environment's CuPy, else the one beside it
        tables = build()
    except ImportError as e:
        print("cupy_tables: needs CuPy (and ml_dtypes) importable; no GPU is needed: %s" % e,
              file=sys.stderr)
        return 2
    if not args.check:
        os.makedirs(os.path.dirname(TABLES), exist_ok=True)
        with open(TABLES, "w") as f:
            f.write(dumps(tables))
        print("wrote %s: %d ufuncs, CuPy %s" % (TABLES, len(tables["ufuncs"]),
                                                 tables["cupy_version"]))
        return 0
    try:
        with open(TABLES) as f:
            committed = json.load(f)
    except FileNotFoundError:
        print("cupy_tables --check: %s is missing; run scripts/cupy_tables.py" % TABLES,
              file=sys.stderr)
        return 1
    if _comparable(committed) == _comparable(tables):
        print("cupy_tables: %s matches CuPy %s" % (TABLES, tables["cupy_version"]))
        return 0
    diff = difflib.unified_diff(dumps(_comparable(committed)).splitlines(),
                                dumps(_comparable(tables)).splitlines(),
                                "committed " + os.path.basename(TABLES),
                                "CuPy " + tables["cupy_version"], lineterm="")
    print("\n".join(diff))
    print("cupy_tables --check: the committed tables differ from CuPy %s; "
          "rerun scripts/cupy_tables.py" % tables["cupy_version"], file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
