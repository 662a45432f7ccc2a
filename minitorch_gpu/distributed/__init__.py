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
imports mpi4py; the trainer calls the same methods either way. ``group.py`` holds the
interface and that group, ``mpi.py`` the MPI ranks' group, ``flat_buffer.py`` the bucketed
buffer the collectives move, and ``backend/nccl.py`` NCCL's transport.

A rank that fails must not leave the others waiting forever in a collective:

- a rank killed outright is seen by ``mpiexec``, which ends the others itself;
- a rank that exits with an error ends the job with MPI_Abort (``abort_job``, called by
  the CLI), as does an uncaught exception;
- every collective waits with a deadline (``system.dist_timeout_s``): a rank that hangs
  makes the others end the job when it passes.

Inputs-and-outputs layer: may import ``nn``/``optim``, the engine and the foundation;
nothing beside it, and never ``train/``, ``profiler/``, ``bench/`` or the CLI above.
"""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

from .group import DEFAULT_TIMEOUT_S, ProcessGroup
from .mpi import MPIProcessGroup

__all__ = ["DEFAULT_TIMEOUT_S", "MPIProcessGroup", "ProcessGroup", "abort_job",
           "launched_world_size", "rank_seed", "world"]

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
