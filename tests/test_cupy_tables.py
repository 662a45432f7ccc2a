"""The CuPy stand-in's type resolver (stand_in/ufunc_types.py) against CuPy 14.2 itself.

Where CuPy imports, the oracle is CuPy's own resolver, `_Ops.guess_routine`, fed arrays
that own no device memory (UnownedMemory of size 0) and CuPy's own scalar wrappers: both
live on the host, so every ufunc is checked on every pair of operand kinds without a GPU.
Without CuPy the hand-checked cases below, derived from CuPy v14.2.0's _kernel.pyx, run.
"""
import importlib.util
import json
import os

import ml_dtypes
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAND_IN = os.path.join(ROOT, "minitorch_gpu", "backend", "emulated_cuda", "stand_in")


def _load(name, path):
    """By file path: the script and reference.py are not imported as package modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


from minitorch_gpu.backend.emulated_cuda.stand_in import ufunc_types as ut  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
ARRAY_DTYPES = [np.dtype(c) for c in "?bBhHiIlLefdFD"] + [BF16]
SCALARS = [True, 3, -3, 2 ** 63, 1.5, 1j, np.float32(2), np.int8(1), ml_dtypes.bfloat16(1)]
OPERANDS = ARRAY_DTYPES + SCALARS


def _dt(chars):
    return tuple(BF16 if c == "E" else np.dtype(c) for c in chars)


# (ufunc, inputs, expected in dtypes, expected out dtypes), read off CuPy v14.2.0's
# _kernel.pyx (_Ops.guess_routine, _check_should_use_weak_scalar) and the loop tables
HAND_CHECKED = [
    ("add", [BF16, BF16], _dt("EE"), _dt("E")),
    ("add", [BF16, np.float32], _dt("ff"), _dt("f")),
    ("add", [BF16, 1.5], _dt("EE"), _dt("E")),       # weak float stays bfloat16
    ("add", [BF16, 2], _dt("EE"), _dt("E")),
    ("add", [BF16, np.float32(1.5)], _dt("ff"), _dt("f")),  # NumPy scalars are strong
    ("add", [np.int64, 1.5], _dt("dd"), _dt("d")),
    ("add", [np.uint8, 1.5], _dt("dd"), _dt("d")),   # weak float ignored beside ints
    ("add", [np.float16, 1.5], _dt("ee"), _dt("e")),
    ("add", [np.int8, 300], _dt("bb"), _dt("b")),    # weak int keeps int8 (value checked later)
    ("add", [np.int8, BF16], _dt("EE"), _dt("E")),
    ("add", [np.int16, BF16], _dt("ff"), _dt("f")),
    ("add", [np.float16, BF16], _dt("ff"), _dt("f")),
    ("add", [np.int32, 2 ** 63], _dt("ii"), _dt("i")),  # weak: fits by kind, the value
                                                        # overflows later, at packing
    ("add", [True, np.int8], _dt("bb"), _dt("b")),   # Python bool is strong
    ("multiply", [BF16, 1j], _dt("FF"), _dt("F")),
    ("divide", [np.int32, np.int32], _dt("qq"), _dt("d")),
    ("divide", [BF16, BF16], _dt("EE"), _dt("E")),
    ("equal", [np.int32, 2 ** 32], _dt("qq"), _dt("?")),  # promote_weak_int
    ("less", [BF16, 0.5], _dt("EE"), _dt("?")),
    ("logical_not", [BF16], _dt("f"), _dt("?")),     # no bf16 loop, but float32 takes it
    ("logical_xor", [BF16, BF16], _dt("ff"), _dt("?")),
    ("float_power", [BF16, BF16], _dt("dd"), _dt("d")),
    ("divmod", [BF16, BF16], _dt("ff"), _dt("ff")),
    ("sqrt", [np.int8], _dt("e"), _dt("e")),
    ("exp", [BF16], _dt("E"), _dt("E")),
    ("cupyx.scipy.special.erf", [BF16], _dt("f"), _dt("f")),
]


@pytest.mark.parametrize("name,inputs,ins,outs", HAND_CHECKED,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(HAND_CHECKED)])
def test_hand_checked(name, inputs, ins, outs):
    loop = ut.resolve(name, inputs)
    assert (loop.in_dtypes, loop.out_dtypes) == (ins, outs), loop.signature


@pytest.mark.parametrize("name,inputs,message", [
    ("bitwise_and", [BF16, BF16],
     "Wrong type ((dtype(bfloat16), dtype(bfloat16))) of arguments for cupy_bitwise_and"),
    ("bitwise_and", [BF16, 1],
     "Wrong type ((dtype(bfloat16), dtype('int64'))) of arguments for cupy_bitwise_and"),
    ("invert", [BF16], "Wrong type ((dtype(bfloat16),)) of arguments for cupy_invert"),
    ("gcd", [np.float32, np.int32],
     "Wrong type ((dtype('float32'), dtype('int32'))) of arguments for cupy_gcd"),
    ("subtract", [np.bool_, np.bool_], "cupy boolean subtract"),
    ("negative", [True], "cupy boolean negative"),
])
def test_refusals_raise_cupys_type_error(name, inputs, message):
    with pytest.raises(TypeError) as info:
        ut.resolve(name, inputs)
    assert message in str(info.value)


def test_dtype_argument_picks_by_output():
    assert ut.resolve("add", [np.int8, np.int8], dtype=np.float32).signature == "ff->f"
    assert ut.resolve("divide", [np.int8, np.int8], dtype=BF16).signature == "EE->E"
    with pytest.raises(TypeError, match=r"Wrong type \(bfloat16\) of arguments for "
                                        r"cupy_bitwise_and"):
        ut.resolve("bitwise_and", [np.int8, np.int8], dtype=BF16)


def test_bad_calls_name_what_was_wrong():
    with pytest.raises(KeyError, match="did you mean add"):
        ut.resolve("addd", [np.int8, np.int8])
    with pytest.raises(TypeError, match="takes 2 inputs; got 1"):
        ut.resolve("add", [np.int8])
    with pytest.raises(TypeError, match="Unsupported type"):
        ut.resolve("add", [np.int8, None])
    with pytest.raises(OverflowError):
        ut.resolve("add", [np.int8, 2 ** 64])


def test_accepts_and_has_loop_for_bfloat16():
    names = ut.ufunc_names()
    assert len(names) == 104 and "cupyx.scipy.special.erf" in names
    without_loop = {n for n in names if not ut.has_loop(n, BF16)}
    assert len(names) - len(without_loop) == 86
    refused = {n for n in names if not ut.accepts(n, BF16)}
    assert refused == {"bitwise_and", "bitwise_count", "bitwise_invert", "bitwise_left_shift",
                       "bitwise_not", "bitwise_or", "bitwise_right_shift", "bitwise_xor",
                       "gcd", "invert", "lcm", "left_shift", "right_shift",
                       "ldexp"}  # bf16 as the exponent too; ldexp(bf16, int32) runs
    assert ut.resolve("ldexp", [BF16, np.int32]).signature == "Ei->E"
    # a loop that takes bf16 through a wider float: present in CuPy, not in `types`
    assert {"float_power", "logical_not", "divmod"} <= without_loop - refused


# ---- against real CuPy -------------------------------------------------------------------

def _real_cupy():
    """Real CuPy (the development set-up installs it beside the environment, see
    stand_in/reference.py); skipped, naming the install, where there is none."""
    reference = _load("_cupy_reference", os.path.join(STAND_IN, "reference.py"))
    try:
        return reference.import_real_cupy()
    except ImportError as exc:
        pytest.skip(str(exc))


def _cupy_resolver():
    cupy = _real_cupy()
    import cupyx.scipy.special
    from cupy._core import _scalar

    memory = cupy.cuda.UnownedMemory(0, 0, None, 0)

    def wrap(x):
        if isinstance(x, np.dtype):  # an empty array on no memory: host-only
            return cupy.ndarray((0,), x, memptr=cupy.cuda.MemoryPointer(memory, 0))
        return _scalar.CScalar(x)

    def ufunc(name):
        if name == "cupyx.scipy.special.erf":
            return cupyx.scipy.special.erf
        return getattr(cupy, name)

    def resolve(name, inputs, dtype=None):
        u = ufunc(name)
        args = [wrap(x) for x in inputs]
        op = u._ops.guess_routine(u.name, {}, args, dtype, u._out_ops)
        ins, outs = op.resolve_dtypes(args, [None] * u.nout)
        return tuple(ins), tuple(outs)
    return resolve


def _outcome(fn):
    try:
        return fn()
    except TypeError as e:
        return ("TypeError", str(e))


def test_resolver_matches_cupy_on_every_operand_pair():
    cupy_resolve = _cupy_resolver()
    mismatches = []
    for name in ut.ufunc_names():
        nin = ut._ufunc(name).nin
        cases = ([[a] for a in OPERANDS] if nin == 1
                 else [[a, b] for a in OPERANDS for b in OPERANDS])
        for inputs in cases:
            if all(not isinstance(x, np.dtype) for x in inputs):
                continue  # CuPy ufuncs take at least one array
            ours = _outcome(lambda: tuple(ut.resolve(name, inputs)[:2]))
            theirs = _outcome(lambda: cupy_resolve(name, inputs))
            if ours != theirs:
                mismatches.append((name, inputs, ours, theirs))
    assert not mismatches, "%d mismatches, first: %r" % (len(mismatches), mismatches[:5])


def test_resolver_matches_cupy_with_dtype_argument():
    cupy_resolve = _cupy_resolver()
    mismatches = []
    for name in ut.ufunc_names():
        inputs = [np.dtype(np.int8)] * ut._ufunc(name).nin
        for dtype in ARRAY_DTYPES:
            ours = _outcome(lambda: tuple(ut.resolve(name, inputs, dtype=dtype)[:2]))
            theirs = _outcome(lambda: cupy_resolve(name, inputs, dtype))
            if ours != theirs:
                mismatches.append((name, dtype, ours, theirs))
    assert not mismatches, "%d mismatches, first: %r" % (len(mismatches), mismatches[:5])


def test_committed_tables_match_cupy():
    _real_cupy()
    script = _load("_cupy_tables_script", os.path.join(ROOT, "scripts", "cupy_tables.py"))
    with open(os.path.join(STAND_IN, "cupy_tables.json")) as f:
        committed = json.load(f)
    assert script._comparable(committed) == script._comparable(script.build()), \
        "stand_in/cupy_tables.json is stale: run scripts/cupy_tables.py"
