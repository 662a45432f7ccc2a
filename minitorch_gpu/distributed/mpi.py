"""The ranks an MPI launcher started: MPI (mpi4py, handed in by ``world()``) for control
and CPU arrays, NCCL (``backend/nccl.py``) for GPU arrays."""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, NoReturn, Optional, Sequence, Tuple

import numpy as np

from ..backend.nccl import NcclTransport
from .flat_buffer import FlatBuffer
from .group import DEFAULT_TIMEOUT_S, ProcessGroup

if TYPE_CHECKING:
    from ..tensor import Tensor

OUTPUT_GRACE_S = 0.5  # how long rank 0 lets mpiexec forward its last lines before aborting
ABORT_GRACE_S = 3.0  # how long a failing rank other than 0 lets rank 0 finish its own end


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
        self._flat: Dict[Tuple[Any, ...], FlatBuffer] = {}  # per parameter list, reused
        self._nccl: Dict[int, NcclTransport] = {}  # per GPU index, made on first use
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
        from ..backend import get_backend
        from ..cuda import device_count
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

    def _flat_buffer(self, params: List[Tensor], what: str) -> "FlatBuffer":
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
            flat = FlatBuffer(backend, shapes, np.result_type(*(p.dtype for p in params)),
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

    def _nccl_for(self, backend: Any) -> "NcclTransport":
        transport = self._nccl.get(backend.device.index)
        if transport is None:
            transport = self._nccl[backend.device.index] = NcclTransport(self, backend)
        return transport


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
