"""``cupy.random`` of the stand-in: ``default_rng(seed)``, a Generator over an XORWOW whose
whole state is one device buffer, as CuPy 14's (``cupy/random/_bit_generator.pyx``:
``_state``, int8, ``_size`` records of 48 bytes; ``_size`` is 2048 threads per SM).

The numbers are not cuRAND's: each draw seeds NumPy's PCG64 from a hash of the whole
state and writes 32 fresh bytes back. What matters to the engine holds: the stream is a
function of the state's bytes alone, so saving ``_state`` and writing it into a new
XORWOW of the same ``_size`` continues the stream exactly (``CupyBackend.get_rng_state``).
"""
from __future__ import annotations

import hashlib
import weakref
from typing import Any

import numpy as np

from . import cuda
from .array import ndarray
from .functions import empty

STATE_BYTES = 48  # sizeof(curandStateXORWOW)


live = weakref.WeakSet()  # every XORWOW: a graph capture restores their states (graphs.py)


class XORWOW:
    def __init__(self, seed: Any = None, *, size: int = -1) -> None:
        live.add(self)
        if size <= 0:
            size = 2048 * cuda.runtime.deviceGetAttribute(
                cuda.runtime.cudaDevAttrMultiProcessorCount, cuda.current_device_id())
        self._size = int(size)
        self._state = empty((self._size * STATE_BYTES,), np.int8)
        seed = 0 if seed is None else int(seed)
        head = np.random.default_rng(seed).integers(-128, 128, self._size * STATE_BYTES,
                                                    dtype=np.int8)
        self._state._view[...] = head

    def _numpy_generator(self) -> np.random.Generator:
        """A NumPy generator seeded by a hash of the whole state (so a restore that damaged
        any byte of it changes the draws), and the state moved on."""
        digest = hashlib.blake2b(self._state._view.tobytes(), digest_size=32).digest()
        generator = np.random.default_rng(np.random.SeedSequence(
            np.frombuffer(digest, np.uint64).tolist()))
        self._state._view[:32] = generator.integers(-128, 128, 32, dtype=np.int8)
        return generator


class Generator:
    """``cupy.random.Generator``: the draws the engine makes, on the current device."""

    def __init__(self, bit_generator: XORWOW) -> None:
        self.bit_generator = bit_generator

    def _draw(self, values: np.ndarray, dtype: Any) -> ndarray:
        from .array import wrap
        return wrap(np.asarray(values, dtype=dtype))

    def standard_normal(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> ndarray:
        self._check_float(dtype, "standard_normal")
        draw = self.bit_generator._numpy_generator().standard_normal(size, dtype=np.float64)
        return self._draw(draw, dtype)

    def random(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> ndarray:
        self._check_float(dtype, "random")
        draw = self.bit_generator._numpy_generator().random(size, dtype=np.float64)
        values = np.asarray(draw, dtype=dtype)
        values[values >= 1] = np.nextafter(np.asarray(1, dtype), np.asarray(0, dtype))
        return self._draw(values, dtype)

    def integers(self, low: int, high: Any = None, size: Any = None, dtype: Any = np.int64,
                 endpoint: bool = False) -> ndarray:
        draw = self.bit_generator._numpy_generator().integers(low, high, size, dtype=dtype,
                                                             endpoint=endpoint)
        return self._draw(draw, dtype)

    @staticmethod
    def _check_float(dtype: Any, what: str) -> None:
        """CuPy draws float32 and float64 only (``_generator_api.pyx``)."""
        if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"{what}: dtype must be float32 or float64, got "
                            f"{np.dtype(dtype)}")


def default_rng(seed: Any = None) -> Generator:
    return Generator(XORWOW(seed))
