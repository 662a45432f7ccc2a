"""Write the type tables of real CuPy's ufuncs and reductions to a JSON file, so the
NumPy-backed CuPy stand-in (minitorch_gpu/backend/emulated_cuda/stand_in/) refuses exactly
the dtypes a GPU would refuse. NumPy with ml_dtypes runs more loops than CuPy has (bfloat16
in a bitwise op, say); a stand-in that trusted NumPy would hide an error that only shows on
a GPU. Reading the tables needs CuPy importable, not a GPU: `ufunc.types` and the `_ops` of
each kernel are host objects.

    python scripts/cupy_tables.py            # (re)write stand_in/cupy_tables.json
    python scripts/cupy_tables.py --check    # exit 1, with a diff, if the committed JSON
                                             # differs from what this CuPy reports
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from typing import Dict, List

TABLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "minitorch_gpu", "backend", "emulated_cuda", "stand_in",
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
            "reductions": reductions}


def dumps(tables: dict) -> str:
    return json.dumps(tables, indent=1, sort_keys=False) + "\n"


def _comparable(tables: dict) -> dict:
    """What --check compares: CuPy's tables, not the NumPy/ml_dtypes versions noted."""
    return {k: v for k, v in tables.items() if k != "generated_with"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 with a diff if the committed JSON is out of date")
    args = parser.parse_args(argv)
    try:
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
