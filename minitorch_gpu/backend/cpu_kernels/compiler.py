"""The one place numba is imported, and what every CPU kernel shares: the ``jit``
decorator, a float32 ``exp`` the compiler can vectorise, and the split of a kernel's rows
over the cores.

numba compiles a Python function over NumPy arrays to machine code with its own LLVM, so
a user needs no C compiler. Every kernel is compiled with:

* ``nogil=True``: the compiled loop releases the GIL, so ``backend/threads.py``'s workers
  run pieces of one kernel on every core at once (numba's own ``parallel=True`` starts a
  thread pool of its own, and cost more than it saved on these sizes);
* ``error_model="numpy"``: a division by zero gives inf or nan as in NumPy instead of a
  check that raises, which would stop LLVM from vectorising any loop that divides;
* fast-math flags that let LLVM reorder sums into SIMD lanes and fuse multiply-adds, but
  not assume that no value is infinite or nan (the causal mask's -inf and a diverging
  step's nan must stay what they are);
* ``cache=True``: the machine code is kept beside the sources (or in NUMBA_CACHE_DIR), so
  only a process's first use on a machine compiles.

Where numba is missing (it is an optional dependency: ``pip install -e '.[fast]'``),
``jit`` returns the function unchanged, the package still imports, and ``unavailable_reason``
says why the kernels are off: the ops then run their NumPy code, which is the reference.
"""
from __future__ import annotations

import itertools
import struct
from typing import Any, Callable, Optional

import numpy as np

from ..threads import cpu_threads, run_split

INSTALL_HINT = "install numba for the fused CPU kernels: pip install -e '.[fast]'"

try:
    import numba
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic, overload
    _IMPORT_ERROR: Optional[str] = None
except Exception as exc:  # ImportError, or a numba that does not match this NumPy
    numba = None
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

# reassociate sums into SIMD lanes, fuse multiply-adds, reciprocals and signless zeros;
# never "nnan"/"ninf" (numba's fastmath=True would assume no inf or nan exists)
FAST_MATH = {"reassoc", "contract", "arcp", "nsz"}
# elements (rows x row length) from which a kernel's rows are split over the cores: below
# it, handing a piece to a worker thread costs more than the piece (measured, PERF.md)
SPLIT_FROM = 1 << 18


def unavailable_reason() -> Optional[str]:
    """None when the CPU kernels can be compiled, else a sentence saying why not."""
    if numba is None:
        return f"numba is not importable ({_IMPORT_ERROR}); {INSTALL_HINT}"
    return None


def jit(function: Callable) -> Callable:
    """``function`` compiled by numba as every kernel here is (module docstring), or
    unchanged where numba is missing."""
    if numba is None:
        return function
    return numba.njit(nogil=True, fastmath=FAST_MATH, error_model="numpy", cache=True,
                      boundscheck=False)(function)


def inline(function: Callable) -> Callable:
    """A helper the kernels call, compiled into each caller (so the caller's loop is
    vectorised through it)."""
    if numba is None:
        return function
    return numba.njit(inline="always", fastmath=FAST_MATH, error_model="numpy",
                      cache=True)(function)


if numba is not None:
    @intrinsic
    def _float_from_bits(typingctx: Any, bits: Any) -> Any:
        """The float32 whose IEEE bits are the low 32 bits of the integer ``bits`` (a
        reinterpretation, as C's memcpy into a float: one register move, vectorisable)."""
        if not isinstance(bits, types.Integer):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            value = args[0]
            if bits.bitwidth > 32:
                value = builder.trunc(value, ir.IntType(32))
            elif bits.bitwidth < 32:
                value = builder.zext(value, ir.IntType(32))
            return builder.bitcast(value, ir.FloatType())

        return types.float32(bits), codegen
else:
    def _float_from_bits(bits: int) -> np.float32:
        return np.float32(struct.unpack("<f", struct.pack("<I", int(bits) & 0xFFFFFFFF))[0])


def widen(x: Any) -> np.float32:
    """An element as float32: a float32 as it is, a uint16 as the bf16 whose bits it holds
    (a kernel reads bf16 arrays viewed as uint16: numba has no bf16; exact, as the CUDA
    kernels' widening on load)."""
    if isinstance(x, (int, np.integer)):
        return _float_from_bits(int(x) << 16)
    return np.float32(x)


if numba is not None:
    @overload(widen, inline="always")
    def _widen(x):  # noqa: ANN001 - numba's typing hook: names must match the impls'
        if isinstance(x, types.Integer):
            def from_bf16_bits(x):  # noqa: ANN001
                return _float_from_bits(np.uint32(x) << np.uint32(16))
            return from_bf16_bits

        def as_float32(x):  # noqa: ANN001
            return np.float32(x)
        return as_float32


# exp(x) = 2^n e^r with n = round(x / ln 2) and |r| <= ln 2 / 2; e^r by Cephes' expf
# polynomial (a minimax fit; within 3.1e-7 relative of e^x, about 2.5 float32 ulps), 2^n
# written into the exponent bits.
# Straight-line code, so LLVM vectorises a loop that calls it (libm's expf stays scalar:
# 8-20 ns an element against about 0.7 here)
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln 2 = HI + LO
_EXP_LOW, _EXP_HIGH = np.float32(-87.0), np.float32(88.0)  # 2^n stays a normal float32
_P0, _P1, _P2 = np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), \
    np.float32(8.3334519073e-3)
_P3, _P4, _P5 = np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), \
    np.float32(5.0000001201e-1)
_ONE, _HALF = np.float32(1.0), np.float32(0.5)


@inline
def exp32(x: float) -> float:
    """e^x in float32 to within 3.1e-7 relative for x in [-87, 88]; clamped outside (so never inf,
    and 1.6e-38 rather than 0 far below: callers that need an exact 0, as a mask, write it
    themselves)."""
    x = min(max(x, _EXP_LOW), _EXP_HIGH)
    n = np.floor(x * _LOG2E + _HALF)  # float32 (math.floor would give an int64)
    r = x - n * _LN2_HI - n * _LN2_LO
    p = _P0 * r + _P1
    p = p * r + _P2
    p = p * r + _P3
    p = p * r + _P4
    p = p * r + _P5
    p = p * r * r + r + _ONE
    return p * _float_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))


def split_rows(rows: int, row_size: int, run: Callable[[int, int], None]) -> None:
    """``run(start, stop)`` over ``range(rows)``: in one call, or for at least
    ``SPLIT_FROM`` elements in one contiguous range of rows per core, side by side on
    ``backend/threads.py``'s workers (the kernels release the GIL)."""
    parts = min(cpu_threads(), rows) if rows * row_size >= SPLIT_FROM else 1
    if parts <= 1:
        run(0, rows)
        return
    bounds = [rows * i // parts for i in range(parts + 1)]
    run_split(lambda span: run(*span), list(zip(bounds, bounds[1:])))


def split_chunks(units: int, unit_size: int, run: Callable[[int, int], None],
                 chunks_per_thread: int = 8) -> None:
    """``run(start, stop)`` over ``range(units)``: in one call, or for at least
    ``SPLIT_FROM`` elements (units x unit_size) in chunks that every core's thread takes
    in turn until none is left. Unlike ``split_rows``'s one range per core, a thread
    slowed by another process, or by OpenBLAS's worker still spinning after a BLAS call
    (it holds a core for about 2^28 cycles), takes fewer chunks instead of holding
    every other thread back: for work of tens of milliseconds (attention)."""
    parts = min(cpu_threads(), units) if units * unit_size >= SPLIT_FROM else 1
    if parts <= 1:
        run(0, units)
        return
    chunk = max(1, units // (parts * chunks_per_thread))
    taken = itertools.count()  # next() on it is atomic under the GIL

    def work(_: int) -> None:
        while True:
            start = next(taken) * chunk
            if start >= units:
                return
            run(start, min(units, start + chunk))
    run_split(work, list(range(parts)))
