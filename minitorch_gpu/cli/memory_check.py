"""The memory check the commands run before they build a model: a workload's estimate
against the memory the device has (one line, MemoryLimitError, when it does not fit)."""
from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = ["workload", "check_workload"]


def workload(task: str, config: Any, **settings: Any):
    """A memory.Workload of ``task`` on a GPT of ``config`` (a GPTConfig)."""
    from ..memory import Workload
    return Workload(task, config.n_layer, config.n_head, config.n_embd, config.block_size,
                    config.vocab_size, bias=config.bias, dropout=config.dropout, **settings)


def check_workload(work: Any, backend: Any, limit_gb: Optional[float],
                   names: Dict[str, str], advice: str) -> None:
    """MemoryLimitError (one line) when ``work`` is estimated past the memory limit
    (``limit_gb``, else $MINITORCH_GPU_MEMORY_LIMIT_GB, else what ``backend`` has free)."""
    from ..memory import MemoryLimitError, check_memory, estimate_memory, memory_limit
    try:
        limit = memory_limit(backend, limit_gb)
    except ValueError as exc:  # a malformed $MINITORCH_GPU_MEMORY_LIMIT_GB
        raise MemoryLimitError(str(exc)) from None
    check_memory(estimate_memory(work), limit, names, advice)
