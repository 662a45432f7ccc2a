"""What every backend provides: an array module, random numbers, timing and memory.

The backend knows nothing of autograd. Ops are written once against ``backend.xp``
(NumPy or CuPy); the few things the two array modules do differently live here.
"""
from __future__ import annotations

import contextlib
import reprlib
import time
from dataclasses import dataclass
from typing import Any, ClassVar, ContextManager, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

from . import dtypes
from .transfers import DeferredChecks, HostReadCount, Upload, check_extremes

DEFAULT_SEED = 67280421310721  # PyTorch's default initial seed: runs are repeatable by default
_NO_DEVICE_TO_SELECT = contextlib.nullcontext()  # on_device() where there is none (the CPU)


@dataclass(frozen=True, eq=False)
class Device:
    """A device: ``Device("cpu")`` or ``Device("cuda", 0)``. Compares equal to its string."""

    type: str
    index: Optional[int] = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = parse_device(other)
            except ValueError:
                return False
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))


def parse_device(device: Any) -> Device:
    """Parse "cpu", "cuda" or "cuda:N" (or a Device) into a Device; "cuda" means "cuda:0"."""
    if isinstance(device, Device):
        return device
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind == "cpu" and not index:
            return Device("cpu")
        if kind == "cuda":
            if not index:
                return Device("cuda", 0)
            if index.isdigit():
                return Device("cuda", int(index))
    raise ValueError(f"unknown device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


class Timer:
    """Wall-clock timer for a block: ``with backend.timer() as t: ...; t.elapsed_ms``."""

    def __init__(self) -> None:
        self._start = self._end = None

    def __enter__(self) -> "Timer":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._end = time.perf_counter()

    @property
    def elapsed_ms(self) -> float:
        if self._end is None:
            raise RuntimeError("Timer.elapsed_ms: the timed block has not finished")
        return (self._end - self._start) * 1e3


class Backend:
    """One device's array module and the operations NumPy and CuPy spell differently.

    Subclasses set ``xp`` (the array module) and ``device``.
    """

    xp: Any
    device: Device
    # Whether the host sees this backend's arrays without waiting: NumPy's are host memory,
    # so a value check runs at once and clipping can skip a multiply by 1. A GPU's are
    # not: reading one waits for every queued kernel, so checks stay on the device until
    # the next read and clipping always multiplies. Either way no such shortcut calls
    # to_numpy, so host_reads counts what the GPU would wait for, on the CPU too.
    reads_are_free: bool = False
    # The one Backend of each device made so far (get_backend fills it): how a backend
    # finds the owner of another device's array without importing the package above it.
    made: ClassVar[Dict[Device, "Backend"]] = {}
    # CuPy allocates and launches kernels on the *current* device, not on the device of the
    # arrays it is given: work for a GPU backend runs with its GPU made current, by this
    # context manager (the CUDA backend's cupy.cuda.Device). None on the CPU, which has no
    # current device. ``on_device()`` is the way to enter it; the per-op hot path
    # (Function.apply) tests it for None instead, so the CPU pays no `with` per op.
    _cuda_device: Any = None
    # capturing.py's recorder while a function is being captured: host reads and random
    # draws outside an op are refused (a replay would repeat their captured values)
    capture_hook: ClassVar[Any] = None

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        self.host_reads = 0  # calls of to_numpy: the device-to-host reads Python made
        self._deferred_checks = DeferredChecks()
        self.seed(seed)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device})"

    # One Backend per device per process: copies share it (and unpickled tensors, through
    # the reducer the backend package registers with copyreg, beside get_backend).
    def __copy__(self) -> "Backend":
        return self

    def __deepcopy__(self, memo: dict) -> "Backend":
        return self

    # --- arrays -----------------------------------------------------------------------
    def asarray(self, data: Any, dtype: Optional[np.dtype] = None) -> Any:
        """``data`` (Python numbers/lists, a NumPy or this backend's array) as an array here."""
        raise NotImplementedError

    def on_device(self) -> ContextManager[Any]:
        """``with backend.on_device():`` around work that allocates or launches on this
        backend (``xp.zeros``, ``xp.arange``, a kernel of arrays already here): on a GPU it
        makes this backend's GPU current for the block, so ``--device cuda:1`` computes on
        GPU 1 whatever was current before (else CuPy puts new arrays on the current GPU,
        or fails with "Peer access is unavailable"). A no-op on the CPU. Nests freely."""
        device = self._cuda_device
        return _NO_DEVICE_TO_SELECT if device is None else device

    # --- reading values back (see transfers.py) ----------------------------------------
    def to_numpy(self, array: Any) -> np.ndarray:
        """``array`` as a NumPy array: the one way values come back to the host for Python
        to look at (``item``, ``tolist``, ``float()``, printing, checkpoints), counted in
        ``host_reads``. On a GPU it waits for the queued work. The checks deferred on the
        device are read along with it, and one that failed raises here."""
        if Backend.capture_hook is not None:  # refused outside an op while capturing
            Backend.capture_hook.host_read(self)
        self.host_reads += 1
        host = self._to_host(array)
        if self._deferred_checks:
            with self.on_device():
                self._deferred_checks.read(self.xp, self._to_host, self.device)
        return host

    def _to_host(self, array: Any) -> np.ndarray:
        """The copy to the host itself, uncounted (``to_numpy`` counts)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def count_host_reads(self) -> Iterator[HostReadCount]:
        """Count this backend's host reads inside the block::

            with backend.count_host_reads() as reads:
                trainer_step()
            assert reads.count == 0  # the step never waited for the device
        """
        reads = HostReadCount(self)
        try:
            yield reads
        finally:
            reads.close()

    def check_in_range(self, values: Any, stop: int, before: str, after: str,
                       ignore: Optional[int] = None, *, start: int = 0,
                       error: type = ValueError) -> None:
        """``error`` (ValueError unless given) ``"{before} {bad} {after}"`` if an integer
        of ``values`` (other than ``ignore``) lies outside [start, stop): its min when
        below ``start``, else its max. (Index arrays, which may count from the end, check
        [-size, size) and raise IndexError, as NumPy does.)

        Where reads are free (the CPU) it raises here. On a GPU the min and max stay on
        the device, accumulated over the calls with the same message, and are read at the
        next host read (``to_numpy``: a log point, an evaluation) or by
        ``raise_deferred_errors``: a bad index is still reported, with its op, range and
        value, but a step never waits for the check.
        """
        if values.size == 0:
            return
        with self.on_device():
            if ignore is not None:  # where(), not a boolean mask: a mask's size needs a read
                values = self.xp.where(values != ignore, values, start)
            low, high = values.min(), values.max()
            if self.reads_are_free:
                check_extremes(int(low), int(high), stop, before, after, start=start,
                               error=error)
            else:
                self._deferred_checks.add(self.xp, low, high, stop, before, after,
                                          start=start, error=error)

    def raise_deferred_errors(self) -> None:
        """Read the checks still pending on the device (one counted host read; none when
        nothing is pending) and raise the first that failed."""
        if self._deferred_checks:
            self.host_reads += 1
            with self.on_device():
                self._deferred_checks.read(self.xp, self._to_host, self.device)

    # --- sending arrays -----------------------------------------------------------------
    def host_to_device_async(self, arrays: Sequence[np.ndarray],
                             dtype: Optional[np.dtype] = None) -> Upload:
        """Copies of the host ``arrays`` (cast to ``dtype`` unless None) on this device,
        started now; ``result()`` hands them over for the work queued after it. The
        caller may reuse ``arrays`` at once. Here (the CPU) a plain copy; the CUDA backend
        copies through page-locked buffers on a side stream, so that a batch crosses while
        the step before it runs, with no host wait."""
        return Upload([self.asarray(np.array(a, dtype=dtype, order="C")) for a in arrays])

    def data_ptr(self, array: Any) -> int:
        """Address of the array's first element (views of one buffer share the memory)."""
        raise NotImplementedError

    def scatter_add(self, target: Any, index: Any, values: Any) -> None:
        """``target[index] += values`` where repeated indices all add (unbuffered)."""
        raise NotImplementedError

    def erf(self, x: Any) -> Any:
        raise NotImplementedError

    def matmul(self, a: Any, b: Any, out: Any = None) -> Any:
        """``a @ b`` as the device does it best, accumulating bf16 operands in float32; the
        result may come back wider than the operands (float32 for bf16 on the CPU), and the
        op rounds it to its output dtype. With ``out`` (any strides, e.g. a transposed view
        into a bigger buffer) the product is written there, rounded to its dtype."""
        return self.xp.matmul(a, b, out=out)

    def stable_argsort(self, array: Any, axis: int) -> Any:
        """Indices that sort ``array`` ascending along ``axis``, equal elements keeping
        their order (a stable sort, as sort/topk/multinomial need to be repeatable)."""
        raise NotImplementedError

    def smallest_positions(self, keys: Any, k: int, axis: int) -> Any:
        """Positions along ``axis`` of the ``k`` smallest of the integer ``keys``, in no
        particular order (topk's selection)."""
        raise NotImplementedError

    def prepare_backward(self) -> None:
        """Called by autograd before every backward pass on this backend's tensors."""

    def prepare_to_capture(self) -> None:
        """Called before a CUDA Graph captures: makes now what the device may not create
        while a stream captures (a no-op on the CPU)."""

    def compute_capability(self) -> Optional[Tuple[int, int]]:
        """The GPU's CUDA compute capability as (major, minor), (7, 5) for a T4, (9, 0)
        for an H100; None on the CPU. bf16 arithmetic needs (8, 0) (Ampere) or newer."""
        return None

    def fused_kernels(self) -> Any:
        """The module of fused kernels (``backend/kernels``) that ops call instead of their
        vectorised code for the inputs it supports, or None: the CPU has none (NumPy's
        vectorised code is the reference the kernels are checked against)."""
        return None

    # --- random numbers ---------------------------------------------------------------
    rng_kind: str = ""  # the "kind" in this backend's get_rng_state(): "numpy" or "cupy"

    def seed(self, seed: int) -> None:
        raise NotImplementedError

    def get_rng_state(self) -> dict:
        """A snapshot of the random stream as JSON data (dicts, lists, ints, strs), in
        which a large binary state is a NumPy uint8 array (a GPU generator's bytes).

        ``set_rng_state`` of it, here or in another process, makes the draws that follow
        (randn, rand, randint, dropout) those that followed the snapshot. The dict's
        ``"kind"`` names the kind of backend it came from.
        """
        raise NotImplementedError

    def set_rng_state(self, state: dict) -> None:
        """Continue the random stream from ``get_rng_state()`` of the same kind of backend.

        Raises ValueError naming what was expected for a state of another kind or a
        malformed one; the stream is unchanged then.
        """
        self._install_rng_state(type(self).parse_rng_state(state))

    @classmethod
    def parse_rng_state(cls, state: Any) -> Any:
        """Check ``state`` (ValueError if it is not this kind's) and decode it for
        ``_install_rng_state``. Needs no device: a state can be checked before its
        backend exists."""
        raise NotImplementedError

    def _install_rng_state(self, parsed: Any) -> None:
        """Make the stream continue from a state ``parse_rng_state`` returned."""
        raise NotImplementedError

    @classmethod
    def _check_rng_state_keys(cls, state: Any, keys: "frozenset[str]") -> None:
        """ValueError unless ``state`` is a dict of this kind with exactly ``keys``."""
        where = f"{cls.__name__}.set_rng_state"
        expected = f"a dict from {cls.__name__}.get_rng_state() (kind {cls.rng_kind!r})"
        if not isinstance(state, dict):
            raise ValueError(f"{where}: expected {expected}, got {type(state).__name__}")
        kind = state.get("kind")
        if kind != cls.rng_kind:
            raise ValueError(f"{where}: expected {expected}, got kind {kind!r}")
        if set(state) != keys:
            raise ValueError(f"{where}: expected the keys {sorted(keys)}, got {sorted(state)}")

    @classmethod
    def _check_rng_int(cls, state: dict, key: str, low: int, high: int) -> int:
        """``state[key]`` if it is an int in [low, high), else ValueError naming the key."""
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
            got = f"{type(value).__name__} {reprlib.repr(value)}"
            raise ValueError(f"{cls.__name__}.set_rng_state: expected {key!r} to be an int in "
                             f"[{low}, {high}), got {got}")
        return value

    def random_stream(self) -> Any:
        """The object that holds the seeded stream now (``seed`` and ``set_rng_state``
        replace it): a CUDA Graph captured with one keeps drawing from it, so a capture
        is stale once it changed."""
        return getattr(self, "_rng", None)

    def _drawing(self, what: str) -> None:
        """Called by every random draw: refused outside an op while capturing."""
        if Backend.capture_hook is not None:
            Backend.capture_hook.random_draw(self, what)

    def randn(self, shape: tuple, dtype: np.dtype) -> Any:
        raise NotImplementedError

    def rand(self, shape: tuple, dtype: np.dtype) -> Any:
        raise NotImplementedError

    def randint(self, low: int, high: int, shape: tuple, dtype: np.dtype) -> Any:
        raise NotImplementedError

    # --- timing and memory ------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait until all queued work on the device is done (a no-op on the CPU)."""

    def timer(self) -> Timer:
        return Timer()

    def memory_stats(self) -> dict:
        raise NotImplementedError

    def free_memory(self) -> Tuple[int, str]:
        """(bytes a new allocation on this device can take now, where the number comes
        from, as a message would say it: "available (MemAvailable)"). For the memory check
        a command makes before it builds a model (``memory.py``)."""
        raise NotImplementedError

    # --- helpers shared by both backends -----------------------------------------------
    @staticmethod
    def _float_for_random(dtype: np.dtype) -> np.dtype:
        """Random floats are drawn in float32/float64 and rounded to narrower types."""
        if not dtypes.is_floating(dtype):
            raise TypeError(f"random floats need a floating dtype, got {dtype}")
        return dtype if dtype in (dtypes.float32, dtypes.float64) else dtypes.float32
