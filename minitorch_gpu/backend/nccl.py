"""NCCL's collectives for data-parallel training on GPUs: the transport that all-reduces
and broadcasts a rank's flat CuPy buffers (``distributed/mpi.py`` packs them).

``cupy.cuda.nccl`` is imported when a rank first reduces GPU arrays, so CPU ranks never
load it.
"""
from __future__ import annotations

import time
from typing import Any, List, Tuple

import numpy as np

from . import dtypes


class NcclTransport:
    """Collectives on CuPy buffers of one GPU over NCCL, one GPU per rank.

    ``group`` is the rank's process group (``distributed.MPIProcessGroup``): its rank,
    world_size, is_main, timeout_s, broadcast_object (NCCL's rendezvous id, made on rank 0,
    goes to the others through it) and timed_out (ends the job). ``backend`` is the CUDA
    backend of this rank's GPU. The calls go on the stream the model's kernels run on, so
    they start after the backward pass without a host synchronisation; the wait for them
    has a deadline."""

    def __init__(self, group: Any, backend: Any) -> None:
        from ._cupy import nccl as cupy_nccl
        nccl = cupy_nccl()
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
