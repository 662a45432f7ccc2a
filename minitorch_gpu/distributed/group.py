"""The process-group interface the trainer calls, and the group of a process that trains
alone (rank 0 of 1), whose collectives do nothing."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterable, Iterator, List, NoReturn, Optional, Sequence

if TYPE_CHECKING:
    from ..tensor import Tensor

DEFAULT_TIMEOUT_S = 300.0  # how long a collective waits for the other ranks


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
