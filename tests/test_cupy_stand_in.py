"""The CuPy stand-in (backend/emulated_cuda/stand_in) against real CuPy's API.

Where CuPy imports (no GPU is needed: names, signatures and ufunc objects live on the
host), every public name the stand-in offers must exist in CuPy, its declared parameters
must be CuPy's, its ufuncs must take as many operands, and stand_in/cupy_tables.json must
be what this CuPy reports. So the stand-in cannot drift into an API CuPy lacks, where code
passes on the emulated device and fails on a GPU. Without CuPy, the tests at the bottom
check that the stand-in refuses the calls CuPy's recorded signatures refuse.
"""
import importlib.util
import inspect
import json
import math
import os

import numpy as np
import pytest

from minitorch_gpu.backend.emulated_cuda import stand_in
from minitorch_gpu.backend.emulated_cuda.stand_in import array as stand_in_array
from minitorch_gpu.backend.emulated_cuda.stand_in import functions, reference, signatures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = os.path.join(ROOT, "minitorch_gpu", "backend", "emulated_cuda", "stand_in",
                      "cupy_tables.json")

# Public names the stand-in offers for its own use, which CuPy has not; each says why.
STAND_IN_ONLY = {
    "cupy.stand_in": "marker: tells the engine and tests that cupy is the stand-in",
    "cupy_backends.cuda.libs.cublas.calls": "every GEMM's sizes, for tests/test_blas_split.py",
}

# Declared parameters of the stand-in that differ from CuPy's, found by this test. The
# engine makes none of these calls in a way CuPy refuses (it passes them positionally, or
# as CuPy's keyword), but code that did would pass here and fail on a GPU: each is to be
# fixed in the stand-in and then removed from here (the comparison is exact, so a fixed
# entry left here fails too).
NOT_A_PARAMETER = "not a parameter of CuPy's"
KEYWORD_ONLY = "positional or keyword, CuPy's is keyword-only"
KNOWN_SIGNATURE_DRIFT = {
    # constructed by the stand-in itself (RawModule.get_function, ndarray.data), never by
    # the engine: their constructors are the stand-in's own
    "cupy.RawKernel": [f"kernel: {NOT_A_PARAMETER}"],
    "cupy.cuda.MemoryPointer": [f"owner: {NOT_A_PARAMETER}"],
    # made by Stream.end_capture (CuPy's Graph.from_stream), never by the engine
    "cupy.cuda.Graph": [f"calls: {NOT_A_PARAMETER}", f"device: {NOT_A_PARAMETER}"],
}


def _script():
    spec = importlib.util.spec_from_file_location(
        "_cupy_tables_script", os.path.join(ROOT, "scripts", "cupy_tables.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def real_cupy():
    """Real CuPy (``stand_in/reference.py``: the development set-up installs it beside the
    environment); skipped, naming the install, where there is none."""
    try:
        return reference.import_real_cupy()
    except ImportError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def real():
    """The script, with real CuPy importable (and not the stand-in itself)."""
    real_cupy()  # the tests below import it by name
    return _script()


@pytest.fixture(scope="module")
def entries(real):
    """CuPy's entry for every name the stand-in offers, read now from CuPy."""
    return {path: real._api_entry(path) for path in real.offered()}


def test_every_public_name_exists_in_cupy(real, entries):
    missing = sorted(p for p, e in entries.items()
                     if e["kind"] == "absent" and p not in STAND_IN_ONLY)
    assert not missing, f"the stand-in offers names CuPy lacks (make them private or " \
                        f"list them in STAND_IN_ONLY): {missing}"
    stale = sorted(p for p in STAND_IN_ONLY if entries.get(p, {}).get("kind") != "absent")
    assert not stale, f"STAND_IN_ONLY lists names CuPy has or the stand-in dropped: {stale}"


def _drift(ours: inspect.Signature, theirs: inspect.Signature) -> list:
    """How ``ours``'s declared parameters differ from CuPy's ``theirs``: a name CuPy
    lacks, another kind, another order, or a default CuPy does not give."""
    named = [p for p in ours.parameters.values()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    problems, order = [], list(theirs.parameters)
    for p in named:
        cupy_p = theirs.parameters.get(p.name)
        if cupy_p is None:
            problems.append(f"{p.name}: not a parameter of CuPy's")
        elif cupy_p.kind != p.kind:
            problems.append(f"{p.name}: {p.kind.description}, CuPy's is "
                            f"{cupy_p.kind.description}")
        elif p.default is not p.empty and cupy_p.default is cupy_p.empty:
            problems.append(f"{p.name}: has a default, CuPy's is required")
    positions = [order.index(p.name) for p in named if p.name in order]
    if positions != sorted(positions):
        problems.append(f"order {[p.name for p in named]} is not CuPy's {order}")
    return problems


def test_declared_parameters_match_cupy(real, entries):
    drift = {}
    for path, value in real.offered().items():
        text = entries[path].get("signature", "")
        if not callable(value) or isinstance(value, functions.ufunc) or \
                not text.startswith("("):
            continue
        try:
            ours = inspect.signature(value)
        except (TypeError, ValueError):
            continue
        problems = _drift(ours, signatures.parse(text))
        if problems:
            drift[path] = problems
    assert drift == KNOWN_SIGNATURE_DRIFT, \
        "stand-in signatures that differ from CuPy's: %s" % json.dumps(drift, indent=1)


def test_every_ufunc_takes_as_many_operands_as_cupys(real, entries):
    ufuncs = {p: v for p, v in real.offered().items() if isinstance(v, functions.ufunc)}
    assert len(ufuncs) > 50
    wrong = {p: ((v.nin, v.nout), entries[p]) for p, v in ufuncs.items()
             if entries[p].get("kind") != "ufunc" or
             (entries[p]["nin"], entries[p]["nout"]) != (v.nin, v.nout)}
    assert not wrong, wrong


def test_ndarray_attributes_all_exist_on_cupy_ndarray(real):
    import cupy
    public = [n for n in dir(stand_in.ndarray) if not n.startswith("_")]
    assert set(stand_in_array.FORWARDED_METHODS) <= set(public)
    assert [n for n in public if not hasattr(cupy.ndarray, n)] == []


def test_dtype_names_are_numpys_objects_as_in_cupy(real):
    import cupy
    names = [n for n in dir(stand_in.cupy) if hasattr(np, n) and
             getattr(stand_in.cupy, n) is getattr(np, n)]
    assert {"float32", "int64", "bool_", "dtype", "inf", "newaxis"} <= set(names)
    for name in names:
        ours, theirs = getattr(stand_in.cupy, name), getattr(cupy, name)
        if isinstance(ours, float):
            assert ours == theirs or math.isnan(ours) and math.isnan(theirs), name
        else:
            assert ours is theirs, f"cupy.{name} is {theirs!r}, the stand-in's {ours!r}"


def test_committed_tables_match_cupy(real, capsys):
    assert real.main(["--check"]) == 0, \
        "stand_in/cupy_tables.json is stale: run scripts/cupy_tables.py\n" + \
        capsys.readouterr().out[-3000:]


# ---- without CuPy: the recorded signatures are enforced -----------------------------------

def _api():
    with open(TABLES) as f:
        return json.load(f)["api"]


def test_every_generic_wrapper_has_cupys_signature_recorded():
    api = _api()
    paths = ["cupy." + n for n in functions.FUNCTIONS] + \
            ["cupy.ndarray." + n for n in stand_in_array.FORWARDED_METHODS]
    unrecorded = [p for p in paths if p not in api]
    assert not unrecorded, f"run scripts/cupy_tables.py: no CuPy entry for {unrecorded}"
    assert all(signatures.cupy_signature(p) is not None for p in paths), \
        [p for p in paths if signatures.cupy_signature(p) is None]


def _keywords_numpy_takes_and_cupy_lacks():
    """(function, keyword) for every generic wrapper whose NumPy function names a
    keyword CuPy's lacks (found by comparing the two signatures, not by hand)."""
    found = []
    for name in functions.FUNCTIONS:
        cupy_signature = signatures.cupy_signature("cupy." + name)
        try:
            numpy_signature = inspect.signature(getattr(np, name))
        except (TypeError, ValueError):
            continue
        if cupy_signature is None or any(p.kind == p.VAR_KEYWORD
                                         for p in cupy_signature.parameters.values()):
            continue
        for p in numpy_signature.parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and \
                    p.name not in cupy_signature.parameters:
                found.append((name, p.name))
    return found


EXTRA_KEYWORDS = _keywords_numpy_takes_and_cupy_lacks()


def test_numpy_takes_keywords_cupy_lacks():
    # the reason the enforcement exists: these calls run on NumPy and fail on a GPU
    assert {("sum", "initial"), ("sum", "where"), ("mean", "where"),
            ("reshape", "shape"), ("unique", "sorted")} <= set(EXTRA_KEYWORDS)


@pytest.mark.parametrize("name,keyword", EXTRA_KEYWORDS,
                         ids=[f"{n}-{k}" for n, k in EXTRA_KEYWORDS])
def test_a_keyword_cupy_lacks_is_refused(name, keyword):
    required = [p for p in signatures.cupy_signature("cupy." + name).parameters.values()
                if p.default is p.empty and p.kind == p.POSITIONAL_OR_KEYWORD]
    x = stand_in.cupy.zeros((2, 3))
    with pytest.raises(TypeError, match=rf"cupy\.{name}\(\).*'{keyword}'"):
        getattr(stand_in.cupy, name)(*[x] * len(required), **{keyword: None})


def test_refusals_name_the_function_and_the_parameter():
    x = stand_in.cupy.ones((2, 3), dtype=np.float32)
    with pytest.raises(TypeError, match=r"cupy\.sum\(\): got an unexpected keyword "
                                        r"argument 'initial'.*declares sum\(a, axis="):
        stand_in.cupy.sum(x, initial=0.0)  # NumPy would add 0.0
    with pytest.raises(TypeError, match=r"cupy\.ndarray\.sum\(\).*'initial'"):
        x.sum(initial=0.0)
    with pytest.raises(TypeError, match=r"cupy\.ndarray\.max\(\).*'initial'"):
        x.max(initial=-1.0)
    with pytest.raises(TypeError, match=r"cupy\.ndarray\.astype\(\).*'device'"):
        x.astype(np.float64, device="cpu")  # NumPy 2's ndarray.astype takes device=
    with pytest.raises(TypeError, match=r"cupy\.tril\(\): too many positional"):
        stand_in.cupy.tril(x, 0, 1)
    with pytest.raises(TypeError, match=r"cupy\.reshape\(\): missing .*'newshape'"):
        stand_in.cupy.reshape(x, shape=(3, 2))  # NumPy 2.1's name; CuPy's is newshape


def test_calls_cupy_takes_still_run():
    x = stand_in.cupy.ones((2, 3), dtype=np.float32)
    assert stand_in.cupy.sum(x, axis=0, keepdims=True).shape == (1, 3)
    assert stand_in.cupy.reshape(x, (3, 2), order="C").shape == (3, 2)
    assert x.reshape(3, 2).shape == x.reshape((3, 2)).shape == (3, 2)
    assert x.astype(np.float64, copy=False).dtype == np.float64
    assert x.transpose(1, 0).shape == (3, 2)


def test_no_implicit_conversion_to_numpy():
    x = stand_in.cupy.ones((2,), dtype=np.float32)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
        np.asarray(x)


def test_signature_text_round_trips_and_reads_cython():
    for text in ["(a, axis=..., *, out=...)", "(self, *shape, order=..., copy=...)",
                 "(a, /, b, *args, c, d=..., **kwargs)", "()"]:
        assert signatures.render(signatures.parse(text)) == text
    cython = signatures.parse("(intptr_t handle, long long strideA, str code=None, "
                              "*, tuple options=(), NcclConfig config=None)")
    assert signatures.render(cython) == "(handle, strideA, code=..., *, options=..., " \
                                        "config=...)"
    with pytest.raises(ValueError, match="not a parameter list"):
        signatures.parse("a, b")
