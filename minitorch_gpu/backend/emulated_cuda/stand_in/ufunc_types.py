"""CuPy 14.2's ufunc type resolution, run on the host from the tables scripts/cupy_tables.py
read out of real CuPy (cupy_tables.json beside this file).

Why not let NumPy pick the loop: NumPy with ml_dtypes has loops CuPy lacks (bfloat16 in
bitwise_and) and picks other loops for mixed inputs, so a stand-in that trusted NumPy would
run code a GPU refuses, or return another dtype. Here the loop is chosen the way CuPy
chooses it, from CuPy's own loop list, and a refusal raises CuPy's TypeError.

Rules mimicked, all from CuPy v14.2.0 (cited where each is applied below):
  * an operand's dtype: an array's dtype; a NumPy scalar's dtype (strong, like an array);
    Python bool -> bool (strong); Python int -> int64, or uint64 from 2**63 up (weak);
    Python float -> float64 (weak); Python complex -> complex128 (weak).
  * weak scalars take part only if no weak scalar is of a higher kind than the strong
    operands (bool < integer < inexact < anything else; bfloat16 counts as "anything
    else", since ml_dtypes' scalar type is not a numpy.inexact) and there are strong ones.
  * the first loop, in CuPy's order, that every operand reaches: numpy.can_cast (safe),
    or, for a weak scalar, numpy.result_type(weak_type(0), loop_dtype) == loop_dtype.
  * with dtype=, the first loop whose outputs all equal dtype (divide's own out loops).
"""
from __future__ import annotations

import difflib
import functools
import json
import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy

from ...dtypes import bfloat16, bool_, float64, int64

TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cupy_tables.json")

BFLOAT16, _BOOL, _INT64, _FLOAT64 = bfloat16, bool_, int64, float64
_UINT64 = numpy.dtype(numpy.uint64)
_COMPLEX128 = numpy.dtype(numpy.complex128)


class Loop(NamedTuple):
    """The loop CuPy runs: operands are cast to in_dtypes, results come out as out_dtypes."""
    in_dtypes: Tuple[numpy.dtype, ...]
    out_dtypes: Tuple[numpy.dtype, ...]
    signature: str  # as CuPy's ufunc.types spells it, e.g. "EE->E"


class _Ufunc(NamedTuple):
    name: str
    cupy_name: str  # the name CuPy's errors use ("cupy_add")
    nin: int
    loops: Tuple[Loop, ...]
    out_loops: Optional[Tuple[Loop, ...]]
    errors: Dict[str, str]
    resolutions: Dict[str, str]
    promote_weak_int: bool


def _char_dtype(char: str) -> numpy.dtype:
    """'E' is ml_dtypes.bfloat16's char; NumPy itself cannot look it up (dtype('E') fails)."""
    return BFLOAT16 if char == BFLOAT16.char else numpy.dtype(char)


def _parse(signature: str) -> Loop:
    ins, outs = signature.split("->")
    return Loop(tuple(_char_dtype(c) for c in ins), tuple(_char_dtype(c) for c in outs),
                signature)


@functools.lru_cache(maxsize=None)
def tables() -> Dict[str, Any]:
    """The JSON, read once. Missing file: the stand-in cannot know CuPy's loops, say so."""
    try:
        with open(TABLES) as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            "CuPy type tables missing: expected %s; write it with "
            "`python scripts/cupy_tables.py` on a machine with CuPy installed" % TABLES)


@functools.lru_cache(maxsize=None)
def _ufunc(name: str) -> _Ufunc:
    ufuncs = tables()["ufuncs"]
    if name not in ufuncs:
        near = difflib.get_close_matches(name, list(ufuncs), n=3)
        raise KeyError("no CuPy %s ufunc named %r; expected one of the %d in %s%s"
                       % (tables()["cupy_version"], name, len(ufuncs),
                          os.path.basename(TABLES),
                          " (did you mean %s?)" % ", ".join(near) if near else ""))
    e = ufuncs[name]
    out_types = e["out_types"]
    promote = e["promote_types"]
    if promote not in (None, "promote_weak_int"):
        raise NotImplementedError("ufunc %r: CuPy's promote_types %r is not modelled here"
                                  % (name, promote))
    return _Ufunc(name, e["cupy_name"], e["nin"], tuple(_parse(t) for t in e["types"]),
                  None if out_types is None else tuple(_parse(t) for t in out_types),
                  dict(e["error_loops"]), dict(e["resolution_funcs"]),
                  promote == "promote_weak_int")


def ufunc_names() -> List[str]:
    """Every ufunc in the tables: the `cupy` namespace's (aliases such as `pow` included,
    each under its own name) and "cupyx.scipy.special.erf"."""
    return sorted(tables()["ufuncs"])


def _operand(x: Any) -> Tuple[numpy.dtype, Optional[type]]:
    """(dtype, weak type or None) of one operand, as CuPy sees it.

    CuPy v14.2.0, cupy/_core/_scalar.pyx, numpy_dtype_from_pyscalar and CScalar.__init__:
    Python bool is a strong bool; int, float and complex are weak, with int64 / uint64
    (from 2**63 up) / float64 / complex128 as their dtype; a NumPy scalar keeps its dtype
    and is strong. The value is then stored in that dtype (CScalar._store_c_value), so an
    int beyond uint64 or below int64 fails there with NumPy's OverflowError.
    """
    typ = type(x)
    if typ is bool:
        return _BOOL, None
    if typ is int:
        descr = _UINT64 if x >= 0x8000000000000000 else _INT64
        numpy.array(x, dtype=descr)  # raises NumPy's OverflowError, as CuPy's packing does
        return descr, int
    if typ is float:
        return _FLOAT64, float
    if typ is complex:
        return _COMPLEX128, complex
    if isinstance(x, numpy.dtype):
        return x, None
    if isinstance(x, type) and issubclass(x, numpy.generic):
        return numpy.dtype(x), None
    if isinstance(x, str):
        return numpy.dtype(x), None
    dtype = getattr(x, "dtype", None)  # arrays, NumPy scalars: strong
    if isinstance(dtype, numpy.dtype):
        return dtype, None
    # CuPy v14.2.0, cupy/_core/_scalar.pyx, CScalar.__init__ refuses anything else so
    raise TypeError(f"Unsupported type {typ}")


def _kind_score(t: type) -> int:
    """CuPy v14.2.0, cupy/_core/_kernel.pyx, _get_kind_score: bool 0, integer 1, inexact
    (and Python float/complex) 2, any other scalar type 3 (bfloat16 among them)."""
    if issubclass(t, numpy.bool_):
        return 0
    if issubclass(t, (numpy.integer, int)):
        return 1
    if issubclass(t, (numpy.inexact, float, complex)):
        return 2
    return 3


def _weak_scalars_count(dtypes: Sequence[numpy.dtype], weaks: Sequence[Optional[type]]) -> bool:
    """CuPy v14.2.0, cupy/_core/_kernel.pyx, _check_should_use_weak_scalar: weak scalars
    are honoured only beside strong operands of at least their kind (so uint8 + 0.0 does
    not land on a float64 loop by way of a weak float); else all count as strong."""
    strong = [_kind_score(d.type) for d, w in zip(dtypes, weaks) if w is None]
    weak = [_kind_score(w) for w in weaks if w is not None]
    if not strong or not weak:
        return False
    return max(strong) >= max(weak)


def _promote_weak_int(dtypes, weaks):
    """CuPy v14.2.0, cupy/_core/_routines_logic.pyx, promote_weak_int (the comparisons,
    logical_and, logical_or): a weak Python int facing a strong integer array of the
    other operand is made strong, so int32 == 2**32 compares by value instead of failing
    to fit 2**32 into int32."""
    first, second = weaks
    if first is int and second is None and dtypes[1].kind in "iu":
        return (None, second)
    if second is int and first is None and dtypes[0].kind in "iu":
        return (first, None)
    return weaks


@functools.lru_cache(maxsize=None)
def _can_cast(source: numpy.dtype, target: numpy.dtype) -> bool:
    return bool(numpy.can_cast(source, target))


@functools.lru_cache(maxsize=None)
def _weak_fits(weak: type, target: numpy.dtype) -> bool:
    """A weak scalar reaches a loop dtype if NumPy (NEP 50) keeps that dtype when it
    meets the scalar (CuPy v14.2.0, _kernel.pyx, _Ops._guess_routine_from_in_types)."""
    try:
        return numpy.result_type(weak(0), target) == target
    except TypeError:
        return False


def _first_loop(u: _Ufunc, dtypes, weaks) -> Optional[Loop]:
    """CuPy v14.2.0, cupy/_core/_kernel.pyx, _Ops._guess_routine_from_in_types: CuPy's
    loops in order; the first one every operand reaches by a safe cast, or as a weak
    scalar NumPy would not promote past the loop's dtype."""
    if u.promote_weak_int and weaks is not None:
        weaks = _promote_weak_int(dtypes, weaks)
    for loop in u.loops:
        for dtype, weak, want in zip(dtypes, weaks or (None,) * len(dtypes), loop.in_dtypes):
            if _can_cast(dtype, want):
                continue
            if weak is None or not _weak_fits(weak, want):
                break
        else:
            return loop
    return None


def _no_loop(cupy_name: str, what) -> TypeError:
    # the message CuPy v14.2.0 raises from _kernel.pyx, _Ops.guess_routine
    return TypeError("Wrong type (%s) of arguments for %s" % (what, cupy_name))


def _compare_voids(u: _Ufunc, dtypes) -> Loop:
    """CuPy v14.2.0, cupy/_core/_routines_logic.pyx, struct_compare_resolution, for the
    VV->? loop of equal/not_equal: unstructured voids compare when their sizes match."""
    first, second = dtypes
    if first.fields is None and second.fields is None:
        if first.itemsize == second.itemsize and first.itemsize > 0:
            return Loop((first, first), (_BOOL,), "VV->?")
        raise TypeError("cannot compare unstructured voids of different size "
                        f"({first.itemsize} vs {second.itemsize})")
    if first.fields is None or second.fields is None:
        raise TypeError("Cannot compare structured and non-structured dtypes")
    raise NotImplementedError(
        "%s of structured dtypes %s and %s: CuPy aligns a common structured dtype "
        "(cupy.make_aligned_dtype); the stand-in does not model it" % (u.name, first, second))


def _checked(u: _Ufunc, loop: Loop, dtypes) -> Loop:
    """Loops CuPy registers only to refuse (bool subtract, bool negative) raise their
    message (CuPy v14.2.0, _kernel.pyx, _Op.check_valid); a loop with a resolution
    function gets its dtypes from it (_Op.resolve_dtypes)."""
    message = u.errors.get(loop.signature)
    if message is not None:
        raise TypeError(message)
    resolution = u.resolutions.get(loop.signature)
    if resolution is None:
        return loop
    if resolution == "struct_compare_resolution":
        return _compare_voids(u, dtypes)
    raise NotImplementedError("ufunc %r: CuPy's resolution function %r is not modelled here"
                              % (u.name, resolution))


def resolve(name: str, inputs: Sequence[Any], dtype: Any = None) -> Loop:
    """The loop CuPy 14.2's ufunc `name` runs for `inputs`, or CuPy's TypeError.

    inputs: one entry per ufunc input (nin of them). An entry is an operand as it would
    reach CuPy (an array or anything with a numpy `.dtype`, a NumPy scalar, a Python
    bool/int/float/complex) or a dtype standing for an array of it (numpy.dtype, a NumPy
    scalar type such as ml_dtypes.bfloat16, a dtype name).
    dtype: the ufunc's dtype= argument; when given the loop is the first whose outputs all
    equal it (CuPy v14.2.0, _kernel.pyx, _Ops._guess_routine_from_dtype; divide and
    true_divide search their own out loops), whatever the inputs are.
    Returns Loop(in_dtypes, out_dtypes, signature): the dtypes CuPy casts the inputs to
    and the dtypes of the outputs.
    """
    u = _ufunc(name)
    if len(inputs) != u.nin:
        raise TypeError("ufunc %r takes %d inputs; got %d" % (name, u.nin, len(inputs)))
    operands = [_operand(x) for x in inputs]
    dtypes = tuple(d for d, _ in operands)
    if dtype is not None:
        dtype = numpy.dtype(dtype)
        for loop in (u.out_loops or u.loops):
            if all(out == dtype for out in loop.out_dtypes):
                return _checked(u, loop, dtypes)
        raise _no_loop(u.cupy_name, dtype)
    # CuPy v14.2.0, _kernel.pyx, _Ops.guess_routine: weaks is None when no operand is weak,
    # and every operand counts as strong when the weak ones may not take part
    weaks: Optional[Tuple[Optional[type], ...]] = tuple(w for _, w in operands)
    if all(w is None for w in weaks) or not _weak_scalars_count(dtypes, weaks):
        weaks = None
    loop = _first_loop(u, dtypes, weaks)
    if loop is None:
        raise _no_loop(u.cupy_name, dtypes)
    return _checked(u, loop, dtypes)


def accepts(name: str, dtype: Any) -> bool:
    """Whether CuPy runs ufunc `name` on arrays of `dtype` in every input, possibly by
    casting to a wider loop: float_power and logical_not take bfloat16 that way (float64 and
    float32 loops) though their `types` list no bfloat16 loop. False where CuPy raises,
    ldexp among them: its exponent must be an integer, though ldexp(bf16, int32) runs."""
    u = _ufunc(name)
    try:
        resolve(name, [numpy.dtype(dtype)] * u.nin)
    except TypeError:
        return False
    return True


def has_loop(name: str, dtype: Any) -> bool:
    """Whether one of CuPy's loops for `name` takes `dtype` itself as an input (the
    question `ufunc.types` answers: 86 of the 104 ufuncs in 14.2 have a bfloat16 loop,
    ldexp's "Ei->E" among them). accepts() says whether CuPy runs the dtype at all."""
    dtype = numpy.dtype(dtype)
    return any(dtype in loop.in_dtypes for loop in _ufunc(name).loops)


def resolve_reduction(name: str, array_dtype: Any, dtype: Any = None) -> Optional[Loop]:
    """The loop CuPy 14.2's reduction ``name`` (sum, prod, max, min, any, all) runs over an
    array of ``array_dtype``, or CuPy's TypeError; None where CuPy's table could not be
    read (``reductions[name].readable`` false: argmax, mean, var, cumsum... whose kernels
    CuPy builds inside its compiled code).

    CuPy v14.2.0 reduces through ``_SimpleReductionKernel`` (``_reduction.pyx``), whose
    ``_ops.guess_routine`` is the ufunc rule above with one operand: the first loop the
    array's dtype reaches by a safe cast; with ``dtype=`` given, sum and prod use their
    ``*_keep_dtype`` kernels (``when: dtype given``) at that dtype."""
    entry = tables()["reductions"].get(name)
    if entry is None or not entry.get("readable"):
        return None
    kernels = entry["kernels"]
    wanted = "dtype given" if dtype is not None else "dtype=None"
    kernel = next((k for k in kernels if k.get("when") in (wanted, None)), kernels[0])
    source = numpy.dtype(dtype) if dtype is not None else numpy.dtype(array_dtype)
    loops = [_parse(t) for t in kernel["types"]]
    for loop in loops:
        if _can_cast(source, loop.in_dtypes[0]):
            return loop
    raise _no_loop(kernel["cupy_name"], (source,))
