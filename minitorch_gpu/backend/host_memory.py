"""Keep freed host memory for the next array instead of handing it back to the kernel.

A training step allocates and frees the same activation-sized arrays every time. glibc's
malloc serves each large one (above ``M_MMAP_THRESHOLD``, 128 KiB to start with) by a fresh
``mmap`` and returns it with ``munmap`` when NumPy frees it, so the next step's array of the
same size starts as untouched pages: one page fault (and the kernel zeroing 4 KiB) per
page, about 10,000 faults per step of the small Shakespeare GPT and a third of its time.

``cache_freed_memory()`` raises the mmap threshold to glibc's largest (32 MiB on 64-bit
machines) and stops malloc from trimming the heap, so freed blocks stay mapped in this
process and are reused: the same idea as PyTorch's caching allocator on the GPU, done by
the C allocator's own settings. The cost is that the resident size no longer shrinks after
a peak (the peak itself is what it was). Arrays above 32 MiB are still mapped each time.
On a C library without ``mallopt`` (not glibc) it does nothing and returns False.

The CPU backend calls it at the first backward pass (``Backend.prepare_backward``), not at
import: a process that only imports the package (say, to read a checkpoint beside other
work) keeps its C library's defaults.
"""
from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["MMAP_THRESHOLD", "cache_freed_memory"]

# mallopt's parameter numbers, from glibc's <malloc.h>
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's HEAP_MAX_SIZE / 2: the largest it accepts
_TRIM_THRESHOLD = 2 ** 31 - 1  # the largest int: in effect, never give the heap's top back

_applied = None


def cache_freed_memory() -> bool:
    """Make malloc keep and reuse freed blocks up to MMAP_THRESHOLD (once per process).
    True where glibc accepted the settings."""
    global _applied
    if _applied is None:
        _applied = _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and \
            _mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    return _applied


def _mallopt(parameter: int, value: int) -> bool:
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):  # no C library by that name, or no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(parameter, value) == 1
