"""Data-parallel training: ranks started by MPI, gradients averaged over MPI (CPU) or NCCL (GPU).

    mpiexec -n 2 minitorch-gpu train configs/shakespeare_char.yaml

``mpiexec`` starts the ranks and connects them (mpi4py on the ``mpich`` wheel, both from
``pip install -e ".[dist]"``); nothing here opens a connection of its own. Every rank runs
the whole trainer on its own batches. After the backward pass of an optimizer step the
gradients are packed into one flat buffer and averaged across ranks with one all-reduce
per bucket of it: MPI ``Iallreduce`` on NumPy arrays on the CPU, NCCL (``cupy.cuda.nccl``)
on GPUs, one GPU per rank. Every rank then applies the same update to the same weights.

``world()`` is this process's ProcessGroup. A process that no MPI launcher started (or
``mpiexec -n 1``) gets the single-process group, whose collectives do nothing, and never
imports mpi4py; the trainer calls the same methods either way.

A rank that fails must not leave the others waiting forever in a collective:

- a rank killed outright is seen by ``mpiexec``, which ends the others itself;
- a rank that exits with an error ends the job with MPI_Abort (``abort_job``, called by
  the CLI), as does an uncaught exception;
- every collective waits with a deadline (``system.dist_timeout_s``): a rank that hangs
  makes the others end the job when it passes.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import (TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, NoReturn, Optional,
                    Sequence, Tuple)

import numpy as np

from .backend import dtypes

if TYPE_CHECKING:
    from .tensor import Tensor

__all__ = ["DEFAULT_TIMEOUT_S", "MPIProcessGroup", "ProcessGroup", "abort_job",
           "launched_world_size", "rank_seed", "world"]

DEFAULT_TIMEOUT_S = 300.0  # how long a collective waits for the other ranks
BUCKET_BYTES = 25 * 2 ** 20  # one all-reduce per 25 MiB of gradients, as PyTorch's DDP
OUTPUT_GRACE_S = 0.5  # how long rank 0 lets mpiexec forward its last lines before aborting
ABORT_GRACE_S = 3.0  # how long a failing rank other than 0 lets rank 0 finish its own end

# The number of ranks, as each launcher puts it in every rank's environment: MPICH's and
# Intel MPI's hydra (PMI_SIZE), Open MPI (OMPI_COMM_WORLD_SIZE), MVAPICH (MV2_COMM_WORLD_SIZE)
_WORLD_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_world_size() -> int:
    """The number of ranks an MPI launcher started this process among (1 without one)."""
    for name in _WORLD_SIZE_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 1


def rank_seed(seed: int, rank: int) -> int:
    """The seed of ``rank``'s own random streams (its training batches, its dropout).

    Rank 0 keeps ``seed``, so a one-rank run is the single-process run; every other rank
    gets an independent seed derived from (seed, rank). (``seed + rank`` would hand rank 1
    the stream the trainer's evaluation draws from, ``seed + 1``.)"""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


class ProcessGroup:
    """A process that trains alone: rank 0 of 1. Every collective is the identity (there
    is no one to wait for), so the trainer calls them without asking whether it runs
    distributed."""

    rank = 0
    world_size = 1
    local_rank = 0  # this rank among those on the same machine: the GPU it takes
    local_size = 1
    timeout_s = DEFAULT_TIMEOUT_S

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, writes metrics and saves checkpoints."""
        return self.rank == 0

    def rank_device(self, device: str) -> str:
        """The device this rank trains on, for the configured ``device``."""
        return device

    def cpu_threads(self) -> Optional[int]:
        """BLAS threads per rank when the config leaves them to us (None: the library's
        default, every core)."""
        return None

    def barrier(self, what: str = "a barrier") -> None:
        """Wait until every rank has arrived here."""

    @contextlib.contextmanager
    def main_first(self, what: str = "rank 0's preparation") -> Iterator[None]:
        """Run the block on rank 0, then on the others: rank 0 writes what the others
        then only read (the tokenized corpus in the data cache)."""
        if not self.is_main:
            self.barrier(what)
        yield
        if self.is_main:
            self.barrier(what)

    def broadcast_parameters(self, params: Iterable[Tensor]) -> None:
        """Copy rank 0's parameter values into every rank's parameters."""

    def allreduce_gradients(self, params: Iterable[Tensor]) -> None:
        """Replace each parameter's gradient by its mean over the ranks."""

    def allreduce_sum(self, values: Sequence[float]) -> List[float]:
        """Each of ``values`` summed over the ranks (a few floats: losses, flags)."""
        return [float(v) for v in values]

    def gather_object(self, obj: Any) -> Optional[List[Any]]:
        """Every rank's ``obj`` (JSON-like data, NumPy arrays too: MPI pickles it), in rank
        order, on rank 0; None elsewhere."""
        return [obj]

    def broadcast_object(self, obj: Any, what: str) -> Any:
        """Rank 0's ``obj`` on every rank (JSON-like data: MPI pickles it)."""
        return obj

    def abort(self, code: int) -> NoReturn:
        """End every rank of the job now with exit status ``code``."""
        raise SystemExit(code)


class MPIProcessGroup(ProcessGroup):
    """The ranks an MPI launcher started: MPI for control and CPU arrays, NCCL for GPU
    arrays. Every wait has a deadline of ``timeout_s`` seconds, after which this rank ends
    the job (MPI_Abort): a rank that died or hangs cannot stall the others forever."""

    def __init__(self, mpi: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.MPI = mpi
        self.comm = mpi.COMM_WORLD
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        local = self.comm.Split_type(mpi.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        local.Free()
        self.timeout_s = timeout_s
        self._flat: Dict[Tuple[Any, ...], _FlatBuffer] = {}  # per parameter list, reused
        self._nccl: Dict[int, _NcclTransport] = {}  # per GPU index, made on first use
        self._abort_on_uncaught_exception()

    def __repr__(self) -> str:
        return (f"MPIProcessGroup(rank {self.rank} of {self.world_size}, local rank "
                f"{self.local_rank} of {self.local_size}, timeout {self.timeout_s:g} s)")

    # --- ending the job -----------------------------------------------------------------
    def abort(self, code: int) -> NoReturn:
        """End every rank now with exit status ``code`` (MPI_Abort).

        When every rank fails at once (a bad config, an agreed Ctrl-C) the first to abort
        kills the others mid-sentence. So a rank other than 0 first waits ABORT_GRACE_S:
        rank 0, if it is ending too, prints its last lines and aborts the job meanwhile;
        if it is not (it waits for this rank in a collective), this rank ends it after."""
        for stream in (sys.stdout, sys.stderr):  # what this rank said must not be lost
            with contextlib.suppress(Exception):
                stream.flush()
        # MPI_Abort tears the job down at once, mpiexec's output forwarding with it: give
        # the lines just written a moment to pass through first
        time.sleep(ABORT_GRACE_S if not self.is_main else OUTPUT_GRACE_S)
        self.comm.Abort(code)
        raise SystemExit(code)  # not reached: MPI_Abort ends this process too

    def _abort_on_uncaught_exception(self) -> None:
        """An uncaught exception would end this rank normally, in MPI_Finalize, while the
        others wait for it in a collective: print it, then end the job."""
        previous = sys.excepthook

        def hook(kind: type, value: BaseException, traceback: Any) -> None:
            previous(kind, value, traceback)
            self.abort(1)

        sys.excepthook = hook

    def timed_out(self, what: str) -> NoReturn:
        print(f"minitorch-gpu: rank {self.rank} of {self.world_size}: {what} waited "
              f"{self.timeout_s:g} s for the other ranks (system.dist_timeout_s): one of them "
              f"has died or hangs; ending the job", file=sys.stderr)
        self.abort(1)

    # --- waiting ------------------------------------------------------------------------
    def _wait(self, requests: List[Any], what: str, *, spin: bool) -> None:
        """Wait for MPI ``requests`` until the deadline, then end the job.

        ``spin`` polls without pause, as a blocking MPI call does: MPI moves data only
        inside MPI calls, so a pause between polls would stretch every round of a large
        all-reduce. Otherwise (barriers, where another rank may be busy for seconds) polls
        pause 1 ms, leaving the core to a rank that is still working."""
        deadline = time.monotonic() + self.timeout_s
        while not self.MPI.Request.Testall(requests):
            if time.monotonic() > deadline:
                self.timed_out(what)
            if not spin:
                time.sleep(0.001)

    def barrier(self, what: str = "a barrier") -> None:
        self._wait([self.comm.Ibarrier()], what, spin=False)

    def allreduce_sum(self, values: Sequence[float]) -> List[float]:
        buffer = np.array(values, dtype=np.float64)
        self._wait([self.comm.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)],
                   "summing values over ranks", spin=True)
        return buffer.tolist()

    def gather_object(self, obj: Any) -> Optional[List[Any]]:
        # mpi4py's object collectives block without a deadline: a barrier with one first
        # makes sure every rank is there to take part
        self.barrier("gathering every rank's state")
        return self.comm.gather(obj, root=0)

    def broadcast_object(self, obj: Any, what: str) -> Any:
        """Rank 0's ``obj`` on every rank."""
        self.barrier(what)
        return self.comm.bcast(obj, root=0)

    # --- placement ----------------------------------------------------------------------
    def rank_device(self, device: str) -> str:
        """"cuda" means local rank i's GPU, cuda:i; a fixed "cuda:N" fits one rank per
        machine only (NCCL needs each rank on its own GPU). The GPU becomes this process's
        current device. ValueError when the ranks don't fit the GPUs, RuntimeError (naming
        the fix) when CUDA is unusable."""
        kind, _, index = device.partition(":")
        if kind != "cuda":
            return device
        if index and self.local_size > 1:
            raise ValueError(f"'{device}' would put all {self.local_size} ranks of this "
                             f"machine on one GPU; use 'cuda', which gives local rank i the "
                             f"GPU cuda:i")
        from .backend import get_backend
        from .cuda import device_count
        count = device_count()
        if 0 < count < self.local_size:
            raise ValueError(f"'cuda': {self.local_size} ranks run on this machine but it "
                             f"has {count} CUDA device(s); start at most {count} ranks per "
                             f"machine (one GPU each)")
        device = device if index else f"cuda:{self.local_rank}"
        backend = get_backend(device)
        # CuPy launches every kernel on the current device, whichever device its arrays
        # are on (0 unless told): this rank's GPU must be current for the whole run
        backend.xp.cuda.Device(backend.device.index).use()
        return device

    def cpu_threads(self) -> Optional[int]:
        """This machine's cores shared out among its ranks: left to itself every rank's
        BLAS would start a thread per core, and the ranks would fight over them."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1)
        return max(1, cores // self.local_size)

    # --- parameters and gradients -------------------------------------------------------
    def broadcast_parameters(self, params: Iterable[Tensor]) -> None:
        params = list(params)
        if not params:
            return
        flat = self._flat_buffer(params, "parameters")
        if self.is_main:
            flat.pack([p.data for p in params])
        flat.transport.broadcast(flat.buffer, flat.buckets, "broadcasting rank 0's parameters")
        if not self.is_main:
            flat.unpack([p.data for p in params])
        # used once, at the start: a model-sized buffer is not worth keeping for the run
        self._flat.pop(("parameters", *map(id, params)), None)

    def allreduce_gradients(self, params: Iterable[Tensor]) -> None:
        params = [p for p in params if p.requires_grad]
        if not params:
            return
        for i, p in enumerate(params):
            if p.grad is None:  # the layout of the flat buffer must be the same on all ranks
                raise RuntimeError(f"allreduce_gradients: parameter {i} (shape "
                                   f"{tuple(p.shape)}) has no gradient on rank {self.rank}; "
                                   f"every rank must compute a gradient for every parameter "
                                   f"before the all-reduce")
        flat = self._flat_buffer(params, "gradients")
        grads = [p.grad.data for p in params]
        flat.pack(grads)
        flat.transport.allreduce(flat.buffer, flat.buckets, "the gradient all-reduce")
        flat.unpack(grads, divide_by=self.world_size)  # the sum over ranks, made the mean

    def _flat_buffer(self, params: List[Tensor], what: str) -> "_FlatBuffer":
        """The flat buffer for this list of parameters, made on first use and kept."""
        key = (what, *map(id, params))
        flat = self._flat.get(key)
        if flat is None:
            devices = {str(p.device) for p in params}
            if len(devices) != 1:
                raise RuntimeError(f"data-parallel {what}: expected every parameter on one "
                                   f"device, got {', '.join(sorted(devices))}")
            backend = params[0].backend
            shapes = [tuple(p.shape) for p in params]
            self._check_same_everywhere(sum(int(np.prod(s)) for s in shapes), what)
            if backend.device.type == "cuda":
                transport: Any = self._nccl_for(backend)
            else:
                transport = _MpiTransport(self)
            flat = _FlatBuffer(backend, shapes, np.result_type(*(p.dtype for p in params)),
                               transport)
            flat.tensors = params  # kept alive, so that no other tensor takes on their ids
            self._flat[key] = flat
        return flat

    def _check_same_everywhere(self, count: int, what: str) -> None:
        """Every rank must hold the same number of values: the buckets must line up."""
        bounds = np.array([count, -count], dtype=np.int64)  # max of both: (max, -min)
        self._wait([self.comm.Iallreduce(self.MPI.IN_PLACE, bounds, op=self.MPI.MAX)],
                   f"checking the {what}' sizes", spin=False)
        if bounds[0] != -bounds[1]:
            raise RuntimeError(f"data-parallel {what}: the ranks hold between {-bounds[1]:,} "
                               f"and {bounds[0]:,} numbers; every rank must build the same "
                               f"model")

    def _nccl_for(self, backend: Any) -> "_NcclTransport":
        transport = self._nccl.get(backend.device.index)
        if transport is None:
            transport = self._nccl[backend.device.index] = _NcclTransport(self, backend)
        return transport


class _FlatBuffer:
    """One contiguous buffer that a list of tensors is packed into, cut into buckets of
    at most BUCKET_BYTES, one collective each.

    Buckets cut the buffer by size, not at tensor boundaries: the all-reduce starts after
    the whole backward pass (no per-tensor hooks to overlap with), so only the number of
    calls and the size of each matter."""

    def __init__(self, backend: Any, shapes: List[Tuple[int, ...]], dtype: Any,
                 transport: Any) -> None:
        self.shapes = shapes
        self.tensors: List[Any] = []  # those it was made for (see _flat_buffer)
        self.spans: List[Tuple[int, int]] = []  # each tensor's [start, stop) in the buffer
        start = 0
        for shape in shapes:
            size = int(np.prod(shape))
            self.spans.append((start, start + size))
            start += size
        self.xp = backend.xp
        self.buffer = backend.asarray(np.zeros(start, dtype=dtype))  # (total,)
        per_bucket = max(1, BUCKET_BYTES // np.dtype(dtype).itemsize)
        self.buckets = [(i, min(i + per_bucket, start)) for i in range(0, start, per_bucket)]
        self.transport = transport

    def pack(self, arrays: List[Any]) -> None:
        for array, shape, (start, stop) in zip(arrays, self.shapes, self.spans):
            self.buffer[start:stop].reshape(shape)[...] = array

    def unpack(self, arrays: List[Any], divide_by: int = 1) -> None:
        """Copy the buffer back into ``arrays``, divided by ``divide_by`` on the way (one
        pass over the memory, not two)."""
        for array, shape, (start, stop) in zip(arrays, self.shapes, self.spans):
            part = self.buffer[start:stop].reshape(shape)
            if divide_by == 1:
                array[...] = part
            else:
                self.xp.divide(part, divide_by, out=array)


class _MpiTransport:
    """Collectives on NumPy buffers over MPI: every bucket's call is started, then all are
    waited for together."""

    def __init__(self, group: MPIProcessGroup) -> None:
        self.group = group

    def allreduce(self, buffer: np.ndarray, buckets: List[Tuple[int, int]], what: str) -> None:
        MPI, comm = self.group.MPI, self.group.comm
        requests = [comm.Iallreduce(MPI.IN_PLACE, buffer[start:stop], op=MPI.SUM)
                    for start, stop in buckets]
        self.group._wait(requests, what, spin=True)

    def broadcast(self, buffer: np.ndarray, buckets: List[Tuple[int, int]], what: str) -> None:
        requests = [self.group.comm.Ibcast(buffer[start:stop], root=0)
                    for start, stop in buckets]
        self.group._wait(requests, what, spin=False)


class _NcclTransport:
    """Collectives on CuPy buffers of one GPU over NCCL, one GPU per rank.

    The only code that touches ``cupy.cuda.nccl``, imported when a rank first reduces GPU
    arrays, so CPU ranks never load it. (It is a transport between processes, not an array
    backend, hence here and not in ``backend/``; CuPy itself is reached through the
    backend's ``xp``.) NCCL's rendezvous id is made on rank 0 and sent to the others over
    MPI. The calls go on the stream the model's kernels run on, so they start after the
    backward pass without a host synchronisation; the wait for them has a deadline."""

    def __init__(self, group: MPIProcessGroup, backend: Any) -> None:
        from cupy.cuda import nccl
        if not getattr(nccl, "available", True):  # CuPy without the NCCL library
            raise RuntimeError("data-parallel training on GPUs needs NCCL, which CuPy can't "
                               "load here; install it (pip install nvidia-nccl-cu12, or "
                               "-cu13 for CUDA 13)")
        self.nccl = nccl
        self.group = group
        self.cupy = backend.xp
        self.device = self.cupy.cuda.Device(backend.device.index)
        unique_id = nccl.get_unique_id() if group.is_main else None
        unique_id = group.broadcast_object(unique_id, "NCCL's set-up")
        with self.device:  # ncclCommInitRank returns once every rank has called it
            self.comm = nccl.NcclCommunicator(group.world_size, unique_id, group.rank)
        self.types = {np.dtype(np.float32): nccl.NCCL_FLOAT32,
                      np.dtype(np.float64): nccl.NCCL_FLOAT64,
                      dtypes.bfloat16: nccl.NCCL_BFLOAT16, dtypes.float16: nccl.NCCL_FLOAT16}

    def _nccl_type(self, buffer: Any) -> int:
        nccl_type = self.types.get(np.dtype(buffer.dtype))
        if nccl_type is None:
            raise RuntimeError(f"NCCL all-reduce: expected float values, got "
                               f"{buffer.dtype}")
        return nccl_type

    def allreduce(self, buffer: Any, buckets: List[Tuple[int, int]], what: str) -> None:
        nccl_type, item = self._nccl_type(buffer), buffer.itemsize
        with self.device:
            stream = self.cupy.cuda.get_current_stream()
            self.nccl.groupStart()  # the buckets' calls launched as one
            for start, stop in buckets:
                pointer = buffer.data.ptr + start * item
                self.comm.allReduce(pointer, pointer, stop - start, nccl_type,
                                    self.nccl.NCCL_SUM, stream.ptr)
            self.nccl.groupEnd()
            self._wait(stream, what)

    def broadcast(self, buffer: Any, buckets: List[Tuple[int, int]], what: str) -> None:
        nccl_type, item = self._nccl_type(buffer), buffer.itemsize
        with self.device:
            stream = self.cupy.cuda.get_current_stream()
            self.nccl.groupStart()
            for start, stop in buckets:
                self.comm.bcast(buffer.data.ptr + start * item, stop - start, nccl_type, 0,
                                stream.ptr)
            self.nccl.groupEnd()
            self._wait(stream, what)

    def _wait(self, stream: Any, what: str) -> None:
        """Until the stream has run the collectives; past the deadline, abort NCCL's
        communicator (a kernel waiting on a dead peer never ends) and the job."""
        done = self.cupy.cuda.Event(block=False, disable_timing=True)
        done.record(stream)
        deadline = time.monotonic() + self.group.timeout_s
        while not done.done:
            self.comm.check_async_error()  # raises NcclError on a failed peer or network
            if time.monotonic() > deadline:
                self.comm.abort()
                self.group.timed_out(what)
            time.sleep(0.0001)


_world: Optional[ProcessGroup] = None


def world(timeout_s: float = DEFAULT_TIMEOUT_S) -> ProcessGroup:
    """This process's group: the ranks an MPI launcher started it among (mpi4py is
    imported, and MPI initialised, only then), else the single-process group. Made once;
    ``timeout_s`` sets how long its collectives wait from now on.

    RuntimeError when a launcher started several ranks but mpi4py is missing."""
    global _world
    if _world is None:
        size = launched_world_size()
        if size <= 1:
            _world = ProcessGroup()
        else:
            try:
                from mpi4py import MPI
            except ImportError as exc:
                raise RuntimeError(f"this process is one of {size} ranks an MPI launcher "
                                   f"started, but mpi4py can't be imported ({exc}); install "
                                   f"it with: pip install -e '.[dist]'") from None
            _world = MPIProcessGroup(MPI)
    _world.timeout_s = float(timeout_s)
    return _world


def abort_job(code: int) -> None:
    """End every rank with exit status ``code`` when this process is one of several MPI
    ranks (the others would wait for it in their next collective); else do nothing."""
    if isinstance(_world, MPIProcessGroup):
        _world.abort(code)
