"""The CUDA backend: CuPy arrays on one GPU.

CuPy comes from ``_cupy.py``, which says why CUDA can't be used where it can't.
"""
from __future__ import annotations

import base64
import binascii
import collections
import weakref
from typing import Any, Optional, Tuple

import numpy as np

from . import gemm
from . import _cupy
from ._cupy import cupy, cupy_special, cupyx
from .base import Backend, Device, Timer
from .transfers import Upload
from .dtypes import NARROW_FLOATS, bfloat16, float32
from . import kernels as fused_kernel_module


_cublas = None  # cupy_backends.cuda.libs.cublas (_cupy.cublas()), loaded at the first product


def _element_strides(array: Any) -> tuple:
    return tuple(s // array.itemsize for s in array.strides)


def _launch_gemm(plan: "gemm.GemmPlan", first: Any, second: Any, c: Any) -> None:
    """One cuBLAS call of ``plan`` (``gemm.call_cublas``) on the current device and stream."""
    global _cublas
    if _cublas is None:
        _cublas = _cupy.cublas()
    gemm.call_cublas(_cublas, cupy.cuda.device.get_cublas_handle(), plan, first, second, c)


_MAX_RESEED = (1 << 63) - 1  # "reseed" mode draws its seed in [0, 2**63 - 1)
_RNG_KEYS = {  # the keys of get_rng_state() in each mode
    "exact": frozenset({"kind", "bit_generator", "mode", "size", "nbytes", "encoding", "data"}),
    "reseed": frozenset({"kind", "bit_generator", "mode", "seed"}),
}


class CudaTimer(Timer):
    """Times a block with CUDA events, so queued GPU work is counted, not just its launch."""

    def __enter__(self) -> "CudaTimer":
        self._start_event = cupy.cuda.Event()
        self._end_event = cupy.cuda.Event()
        self._start_event.record()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._end_event.record()
        self._end = True

    @property
    def elapsed_ms(self) -> float:
        if self._end is None:
            raise RuntimeError("Timer.elapsed_ms: the timed block has not finished")
        self._end_event.synchronize()
        return cupy.cuda.get_elapsed_time(self._start_event, self._end_event)


PINNED_SLOTS = 4  # page-locked buffers per batch shape: copies that may be in flight at once


def _event_on(stream: Any) -> Any:
    """An event recorded on ``stream`` now (no timing: cheaper to record and wait on)."""
    event = cupy.cuda.Event(disable_timing=True)
    event.record(stream)
    return event


class _PinnedSlot:
    """Page-locked host arrays of one upload's layout (from CuPy's pinned memory pool),
    the event of the last copy out of them and the arrays that copy writes."""

    def __init__(self, layout: tuple) -> None:
        self.host = []
        for shape, dtype in layout:
            count = int(np.prod(shape))
            memory = cupy.cuda.alloc_pinned_memory(count * dtype.itemsize)
            self.host.append(np.frombuffer(memory, dtype, count).reshape(shape))
        self.copied: Any = None
        self.device: Any = None


class _StreamUpload(Upload):
    """Arrays a side stream is copying: ``result()`` makes the current stream wait for
    the copy (a device-side wait: the host goes on)."""

    def __init__(self, arrays: list, copied: Any, cuda_device: Any) -> None:
        super().__init__(arrays)
        self._copied = copied
        self._cuda_device = cuda_device

    def result(self) -> list:
        with self._cuda_device:
            cupy.cuda.get_current_stream().wait_event(self._copied)
        return super().result()


class CupyBackend(Backend):
    """Arrays on ``cuda:index``. Every call that allocates runs under that device."""

    rng_kind = "cupy"
    # False makes every op run its vectorised CuPy code instead of the fused CUDA kernels
    # (to compare the two, or to rule the kernels out)
    use_fused_kernels = True

    def __init__(self, index: int, seed: int) -> None:
        self.xp = cupy
        self.device = Device("cuda", index)
        self._cuda_device = cupy.cuda.Device(index)
        # the CUDA Graphs captured here and alive (capturing's _GraphCapture), whose
        # private memory pools memory_stats counts
        self.graph_captures: "weakref.WeakSet[Any]" = weakref.WeakSet()
        super().__init__(seed)

    def asarray(self, data: Any, dtype: Optional[np.dtype] = None) -> Any:
        """``data`` on this GPU: host data copied in, an array already here kept as it is,
        and an array on another GPU always copied (``_copy_from_device``)."""
        if isinstance(data, cupy.ndarray):
            if data.device.id != self.device.index:
                return self._copy_from_device(data, dtype)
        elif Backend.capture_hook is not None and np.ndim(data) and \
                cupy.cuda.get_current_stream().is_capturing():
            Backend.capture_hook.host_upload(self, np.shape(data))  # CUDA refuses it
        with self._cuda_device:
            return cupy.asarray(data, dtype=dtype)

    def _copy_from_device(self, data: Any, dtype: Optional[np.dtype]) -> Any:
        """A copy on this GPU of ``data``, which lives on another one, ordered on both.

        Not left to ``cupy.asarray``: CuPy 14 (``ndarray.copy`` across devices) refuses a
        view that is neither C- nor F-contiguous (a permuted (B, nh, T, hs) head view),
        and queues the copy on this GPU's stream alone, so it neither waits for the
        kernels still writing the source nor holds back later writes to it. Here the
        source is made C-contiguous on its own GPU, then copied (``cudaMemcpyAsync``
        between the two GPUs' memory, peer to peer where the GPUs allow it) on this GPU's
        current stream after an event that waits for the source's queued work; the
        source's stream then waits for the copy, so a later write to the source, or the
        reuse of its memory, can't race it. No host synchronisation."""
        source = data.device
        with source:
            contiguous = cupy.ascontiguousarray(data)
            source_stream = cupy.cuda.get_current_stream()
            written = source_stream.record()  # the source's queued writes, this copy's too
        with self._cuda_device:
            stream = cupy.cuda.get_current_stream()
            stream.wait_event(written)
            out = cupy.empty(contiguous.shape, dtype=contiguous.dtype)
            out.data.copy_from_device_async(contiguous.data, contiguous.nbytes, stream)
            copied = stream.record()
            if dtype is not None:
                out = out.astype(dtype, copy=False)
        with source:
            source_stream.wait_event(copied)
        return out

    def _to_host(self, array: Any) -> np.ndarray:
        return cupy.asnumpy(array)  # waits for the kernels queued before it

    # --- batches to the device: page-locked buffers, a side stream ----------------------
    _copy_stream: Any = None  # made at the first upload
    _pinned_slots: Optional[dict] = None  # (shape, dtype) of each array -> deque of slots

    def host_to_device_async(self, arrays: Any, dtype: Optional[np.dtype] = None) -> Upload:
        """The host ``arrays`` written into page-locked (pinned) host buffers and copied
        to this GPU on a side stream with ``cudaMemcpyAsync``: neither the host nor the
        compute stream waits, and the copy runs beside the kernels already queued.

        Ordering, all on the device: the destination arrays come from the memory pool of
        the current (compute) stream, whose earlier users of that memory may still be
        queued, so the side stream first waits for an event recorded on the compute stream
        now; ``result()`` makes the compute stream wait for the copy's event. A pinned
        buffer is reused once its copy is done (``PINNED_SLOTS`` per shape; past that the
        host waits for the oldest copy, which only a host running that many batches ahead
        of the GPU meets). The slot keeps its destination arrays until its copy is done,
        so an upload dropped unused (the sampler's lookahead at a resume) can't hand the
        pool memory the copy is still writing."""
        arrays = [np.asarray(a) for a in arrays]
        if any(a.size == 0 for a in arrays):
            return super().host_to_device_async(arrays, dtype)
        layout = tuple((a.shape, np.dtype(dtype if dtype is not None else a.dtype))
                       for a in arrays)
        with self._cuda_device:
            compute = cupy.cuda.get_current_stream()
            if self._copy_stream is None:
                # non-blocking: no implicit ordering with the legacy default stream
                self._copy_stream = cupy.cuda.Stream(non_blocking=True)
            slot = self._pinned_slot(layout)
            for host, array in zip(slot.host, arrays):
                host[...] = array  # the cast, straight into page-locked memory
            device = [cupy.empty(host.shape, dtype=host.dtype) for host in slot.host]
            self._copy_stream.wait_event(_event_on(compute))
            for target, host in zip(device, slot.host):
                target.set(host, stream=self._copy_stream)  # cudaMemcpyAsync
            slot.copied, slot.device = _event_on(self._copy_stream), device
        return _StreamUpload(device, slot.copied, self._cuda_device)

    def _pinned_slot(self, layout: tuple) -> "_PinnedSlot":
        """A slot of page-locked buffers for ``layout`` whose last copy is done."""
        if self._pinned_slots is None:
            self._pinned_slots = {}
        slots = self._pinned_slots.setdefault(layout, collections.deque())
        if slots and (slots[0].copied is None or slots[0].copied.done
                      or len(slots) >= PINNED_SLOTS):
            slot = slots.popleft()
            if slot.copied is not None and not slot.copied.done:
                slot.copied.synchronize()  # only with PINNED_SLOTS copies still queued
        else:
            slot = _PinnedSlot(layout)
        slot.copied = slot.device = None
        slots.append(slot)
        return slot

    def data_ptr(self, array: Any) -> int:
        return array.data.ptr

    def compute_capability(self) -> Tuple[int, int]:
        """(major, minor) from ``cudaGetDeviceProperties``."""
        properties = cupy.cuda.runtime.getDeviceProperties(self.device.index)
        return int(properties["major"]), int(properties["minor"])

    def scatter_add(self, target: Any, index: Any, values: Any) -> None:
        if target.dtype in NARROW_FLOATS:  # cupyx.scatter_add has no bf16/fp16 loop
            wide = target.astype(cupy.float32)
            cupyx.scatter_add(wide, index, values.astype(cupy.float32))
            target[...] = wide.astype(target.dtype)
            return
        cupyx.scatter_add(target, index, values)

    def matmul(self, a: Any, b: Any, out: Any = None) -> Any:
        """bf16/fp16 products go to cuBLAS directly (``_gemm``): tensor cores, float32
        accumulation and a float32 result (or ``out``'s dtype, rounded once by cuBLAS), 2-D
        and batched alike, reading transposed and strided views in place. Other dtypes use
        ``cupy.matmul`` (cuBLAS too). ``out`` receives the product, rounded to its dtype."""
        if a.dtype == b.dtype and a.dtype in NARROW_FLOATS:
            return self._gemm(a, b, out)
        if out is not None and a.dtype == b.dtype == out.dtype:
            return cupy.matmul(a, b, out=out)
        product = cupy.matmul(a, b)
        if out is None:
            return product
        out[...] = product
        return out

    def _gemm(self, a: Any, b: Any, out: Any) -> Any:
        """``a @ b`` for bf16/fp16 operands as one cuBLAS call (``gemmEx``, or
        ``gemmStridedBatchedEx`` for a batch) with float32 compute, its arguments from
        ``gemm.plan_gemm``. CuPy's own matmul can't be used here: it returns the operands'
        dtype (a bf16 linear would be rounded before its bias and again after), and CuPy 14
        refuses batched bf16 products (cupy/cupy#10317). An operand cuBLAS can't read as it
        is (GPT's (B, nh) head views, a partly broadcast batch) is copied contiguous first."""
        a2 = a[None, :] if a.ndim == 1 else a  # (1, K): a row
        b2 = b[:, None] if b.ndim == 1 else b  # (K, 1): a column
        batch = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
        (M, K), N = a2.shape[-2:], b2.shape[-1]
        shape = batch + (M, N)
        result_shape = batch + ((M,) if a.ndim > 1 else ()) + ((N,) if b.ndim > 1 else ())
        # cuBLAS writes C in float32 or the operands' own dtype (bf16 -> fp16 is refused)
        direct = (out is not None and out.dtype in (float32, a.dtype) and a.ndim > 1
                  and b.ndim > 1 and out.shape == shape and gemm.expressible(
                      out.shape, _element_strides(out)))
        with self._cuda_device:
            c = out if direct else cupy.empty(shape, dtype=np.float32)
            if c.size and K == 0:
                c.fill(0)
            elif c.size:
                operands = {}
                for name, x, rows_cols in (("a", a2, (M, K)), ("b", b2, (K, N))):
                    x = cupy.broadcast_to(x, batch + rows_cols)  # stride 0 over the batch
                    if not gemm.expressible(x.shape, _element_strides(x)):
                        x = cupy.ascontiguousarray(x)
                    operands[name] = x
                plan = gemm.plan_gemm(operands["a"].shape, _element_strides(operands["a"]),
                                      operands["b"].shape, _element_strides(operands["b"]),
                                      c.shape, _element_strides(c))
                if plan is None:  # only past cuBLAS's int sizes
                    raise ValueError(f"matmul: {tuple(a.shape)} @ {tuple(b.shape)} is too "
                                     f"large for one cuBLAS call")
                _launch_gemm(plan, operands[plan.first], operands[plan.second], c)
        result = c.reshape(result_shape)
        if out is None or direct:
            return result if out is None else out
        out[...] = result  # rounded to out's dtype
        return out

    def erf(self, x: Any) -> Any:
        return cupy_special.erf(x)

    def stable_argsort(self, array: Any, axis: int) -> Any:
        with self._cuda_device:  # CuPy's argsort is always stable and accepts no other kind
            if array.dtype == bfloat16:
                # Thrust, which CuPy's argsort runs, has no bf16 type (cupy/cuda/common.pyx
                # refuses it): sort float32, which holds every bf16 exactly and in the
                # same order (the conversion moves bits; NaN stays NaN, sorted last)
                array = array.astype(float32)
            return cupy.argsort(array, axis=axis)

    def smallest_positions(self, keys: Any, k: int, axis: int) -> Any:
        """The first ``k`` of a whole stable sort: Thrust's radix sort runs on the stream
        without a host wait (``par_nosync``), so a CUDA Graph captures it, where CuPy
        14.2's argpartition reads the positions back twice (two ``.any()``) and a
        capturing stream refuses that."""
        index = (slice(None),) * (axis % keys.ndim) + (slice(0, k),)
        return self.stable_argsort(keys, axis)[index]

    def fused_kernels(self) -> Any:
        return fused_kernel_module if self.use_fused_kernels else None

    def seed(self, seed: int) -> None:
        with self._cuda_device:
            self._rng = cupy.random.default_rng(seed)

    # --- random-number state ------------------------------------------------------------
    # ``cupy.random.default_rng(seed)`` is ``Generator(XORWOW(seed))``. In CuPy's source
    # (cupy/random/_bit_generator.pyx, class ``_cuRANDGenerator``, v14.0 to v14.2) the bit
    # generator's whole state is one device buffer ``_state``: int8, holding ``_size``
    # cuRAND ``curandState`` records of 48 bytes (one per GPU thread, Box-Muller cache
    # included). ``_size`` defaults to ``8 * 256 * runtime.deviceGetAttribute(
    # cudaDevAttrMultiProcessorCount, device)``: 2048 threads per SM of the device, so
    # 96 KiB of state per SM: 13.0 MB on a 132-SM H100 (270,336 threads), 10.6 MB on a
    # 108-SM A100. Every draw
    # (cupy/random/_generator_api.pyx, ``_launch_dist``) reads and advances those records
    # and nothing else. The Generator itself keeps only a binomial cache, which randn,
    # rand and randint never use. So copying ``_state``'s bytes out and into a new
    # XORWOW of the same ``_size`` restores the stream exactly. CuPy has no public API
    # for this: where ``_state``/``_size`` are missing (a CuPy that reorganised them),
    # get_rng_state falls back to "reseed" (see below).
    def get_rng_state(self) -> dict:
        """The XORWOW stream as JSON data and one NumPy array, in one of two modes:

        - ``"exact"`` (CuPy 14 and the versions that keep ``XORWOW._state``): the bytes
          of every per-thread cuRAND state as a uint8 array in ``"data"`` (``"encoding":
          "array"``): 96 KiB per SM with CuPy's default thread count, 13 MB on an H100,
          which ``save_checkpoint`` stores as a tensor of its own (as base64 inside
          JSON, as versions before this one wrote it, it was 17 MB of text). Taking it is
          one copy to the host, which waits for the queued work. Restoring it continues
          the stream exactly, and taking it changes nothing.
        - ``"reseed"`` (a CuPy without ``_state``): a 63-bit seed drawn from the stream,
          which is then reseeded with it here too. Guarantee: the draws after restoring
          are those this process makes after the snapshot; but taking the snapshot
          changed this process's stream (it is not the one an unsnapshotted run sees).

        Restore on any GPU (the thread count is saved) with the same CuPy and CUDA
        versions: cuRAND does not promise one state layout across versions.
        """
        bit_generator = self._rng.bit_generator
        device_state = getattr(bit_generator, "_state", None)
        size = getattr(bit_generator, "_size", None)
        name = type(bit_generator).__name__
        if isinstance(device_state, cupy.ndarray) and isinstance(size, (int, np.integer)) \
                and size > 0:
            with self._cuda_device:
                raw = self.to_numpy(device_state).view(np.uint8)  # a counted read
            return {"kind": self.rng_kind, "bit_generator": name, "mode": "exact",
                    "size": int(size), "nbytes": raw.size, "encoding": "array", "data": raw}
        with self._cuda_device:
            seed = int(self._rng.integers(0, _MAX_RESEED, size=(), dtype=np.int64))
        self.seed(seed)
        return {"kind": self.rng_kind, "bit_generator": name, "mode": "reseed", "seed": seed}

    @classmethod
    def parse_rng_state(cls, state: Any) -> tuple:
        """``("exact", size, raw bytes)`` or ``("reseed", seed)``; ValueError if malformed.
        Runs without CuPy, so a GPU's state can be checked on a CPU-only machine. An exact
        state's ``"data"`` is a uint8 array (``"encoding": "array"``) or, in checkpoints
        written before the array form, a base64 str (``"encoding": "base64"``)."""
        where = f"{cls.__name__}.set_rng_state"
        mode = state.get("mode") if isinstance(state, dict) else None
        if not isinstance(mode, str) or mode not in _RNG_KEYS:
            cls._check_rng_state_keys(state, _RNG_KEYS["exact"])  # names the kind or keys
            raise ValueError(f"{where}: expected mode 'exact' or 'reseed', got {mode!r}")
        cls._check_rng_state_keys(state, _RNG_KEYS[mode])
        if state["bit_generator"] != "XORWOW":
            raise ValueError(f"{where}: expected bit_generator 'XORWOW' (cupy.random."
                             f"default_rng's), got {state['bit_generator']!r}")
        if mode == "reseed":
            return ("reseed", cls._check_rng_int(state, "seed", 0, _MAX_RESEED))
        size = cls._check_rng_int(state, "size", 1, 1 << 32)
        nbytes = cls._check_rng_int(state, "nbytes", 1, 1 << 40)
        if nbytes % size:
            raise ValueError(f"{where}: expected 'nbytes' to be a multiple of 'size' ({size} "
                             f"equal per-thread states), got {nbytes}")
        encoding, data = state["encoding"], state["data"]
        if encoding == "array":
            if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1):
                got = (f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray)
                       else type(data).__name__)
                raise ValueError(f"{where}: expected 'data' to be a 1-D uint8 NumPy array in "
                                 f"encoding 'array', got a {got}")
            raw = data.tobytes()
        elif encoding == "base64":
            if not isinstance(data, str):
                raise ValueError(f"{where}: expected 'data' to be a str in encoding 'base64', "
                                 f"got a {type(data).__name__}")
            try:
                raw = base64.b64decode(data, validate=True)
            except binascii.Error as exc:
                raise ValueError(f"{where}: 'data' is not base64 ({exc})") from None
        else:
            raise ValueError(f"{where}: expected encoding 'array' (a uint8 array) or, as older "
                             f"checkpoints hold, encoding 'base64', got {encoding!r}")
        if len(raw) != nbytes:
            raise ValueError(f"{where}: expected 'data' to decode to {nbytes} bytes "
                             f"('nbytes'), got {len(raw)}")
        return ("exact", size, raw)

    def _install_rng_state(self, parsed: tuple) -> None:
        if parsed[0] == "reseed":
            self.seed(parsed[1])
            return
        _, size, raw = parsed
        bit_generator_type = type(self._rng.bit_generator)
        with self._cuda_device:
            bit_generator = bit_generator_type(0, size=size)  # same thread count as saved
            device_state = getattr(bit_generator, "_state", None)
            if not isinstance(device_state, cupy.ndarray):
                raise RuntimeError(
                    f"{type(self).__name__}.set_rng_state: this CuPy ({cupy.__version__}) "
                    "keeps no XORWOW._state buffer, so an 'exact' state can't be restored; "
                    "restore it with the CuPy version that saved it")
            if device_state.nbytes != len(raw):
                raise ValueError(
                    f"{type(self).__name__}.set_rng_state: expected {device_state.nbytes} "
                    f"bytes of XORWOW state for {size} threads (this CuPy's "
                    f"{device_state.nbytes // size} per thread), got {len(raw)} "
                    f"({len(raw) // size} per thread); save and restore with one CuPy")
            device_state.set(np.frombuffer(raw, dtype=np.int8))
            self._rng = type(self._rng)(bit_generator)

    def randn(self, shape: tuple, dtype: np.dtype) -> Any:
        self._drawing("randn")
        draw = self._float_for_random(dtype)
        with self._cuda_device:
            return self._rng.standard_normal(shape, dtype=draw).astype(dtype, copy=False)

    def rand(self, shape: tuple, dtype: np.dtype) -> Any:
        self._drawing("rand")
        draw = self._float_for_random(dtype)
        with self._cuda_device:
            return self._rng.random(shape, dtype=draw).astype(dtype, copy=False)

    def randint(self, low: int, high: int, shape: tuple, dtype: np.dtype) -> Any:
        self._drawing("randint")
        with self._cuda_device:
            return self._rng.integers(low, high, size=shape, dtype=dtype)

    def synchronize(self) -> None:
        self._cuda_device.synchronize()

    def timer(self) -> CudaTimer:
        return CudaTimer()

    def memory_stats(self) -> dict:
        """This GPU's bytes (CuPy's pools count the current device's), the private pools
        of the CUDA Graphs alive on it included (``bytes_in_graphs``, part of both)."""
        with self._cuda_device:
            pool = cupy.get_default_memory_pool()
            used, reserved = pool.used_bytes(), pool.total_bytes()
            graphs = sum(c.pool.total_bytes() for c in list(self.graph_captures))
            graphs_used = sum(c.pool.used_bytes() for c in list(self.graph_captures))
        return {"bytes_in_use": used + graphs_used, "bytes_reserved": reserved + graphs,
                "bytes_in_graphs": graphs}

    def prepare_to_capture(self) -> None:
        """cuBLAS's handle of this GPU, made at its first GEMM, is made now: cublasCreate
        allocates on the device, which a capturing stream does not allow."""
        with self._cuda_device:
            cupy.cuda.device.get_cublas_handle()

    def free_memory(self) -> Tuple[int, str]:
        """The GPU's free memory (``cudaMemGetInfo``) plus what CuPy's pool holds unused
        (freed arrays it keeps for reuse, not free to the driver but free to us)."""
        with self._cuda_device:
            free, _ = cupy.cuda.runtime.memGetInfo()
            unused = cupy.get_default_memory_pool().free_bytes()
        return free + unused, f"free on {self.device}"
