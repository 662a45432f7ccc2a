"""A list of tensors packed into one flat buffer, cut into buckets: what one collective
per bucket moves between ranks."""
from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np

BUCKET_BYTES = 25 * 2 ** 20  # one all-reduce per 25 MiB of gradients, as PyTorch's DDP


class FlatBuffer:
    """One contiguous buffer that a list of tensors is packed into, cut into buckets of
    at most BUCKET_BYTES, one collective each.

    Buckets cut the buffer by size, not at tensor boundaries: the all-reduce starts after
    the whole backward pass (no per-tensor hooks to overlap with), so only the number of
    calls and the size of each matter."""

    def __init__(self, backend: Any, shapes: List[Tuple[int, ...]], dtype: Any,
                 transport: Any) -> None:
        self.shapes = shapes
        self.tensors: List[Any] = []  # those it was made for (MPIProcessGroup._flat_buffer)
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
