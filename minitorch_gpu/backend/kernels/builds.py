"""Every module the launchers can ask ``loader.load_kernel`` to build: what the real
compiler is run on (``nvrtc.py``, ``scripts/kernel_resources.py``)."""
from __future__ import annotations

from typing import List, Tuple

from .attention import ATTENTION_INPUT_DTYPES, MAX_HEAD_DIM
from .loader import INPUT_DTYPES

__all__ = ["every_build"]


def every_build() -> List[Tuple[str, Tuple[Tuple[str, int], ...]]]:
    """(source, defines) of every module the launchers can ask ``load_kernel`` for, with
    the defines they pass (sorted, as the loader keys them): the sources without
    compile-time constants as they are; attention.cu at every head size 1..128 in each
    storage dtype; the softmax with float32 or bf16 probabilities; the Llama kernels
    reading float32 or bf16."""
    builds: List[Tuple[str, Tuple[Tuple[str, int], ...]]] = [
        (name, ()) for name in ("layernorm.cu", "gelu.cu", "cross_entropy.cu", "adamw.cu")]
    builds += [("attention.cu", (("HEAD_DIM", d), ("INPUT_DTYPE", code)))
               for code in ATTENTION_INPUT_DTYPES.values()
               for d in range(1, MAX_HEAD_DIM + 1)]
    builds += [("attention_softmax.cu", (("PROB_BF16", flag),)) for flag in (0, 1)]
    builds += [(name, (("INPUT_DTYPE", code),)) for name in ("rmsnorm.cu", "rotary.cu",
                                                             "swiglu.cu")
               for code in INPUT_DTYPES.values()]
    return builds
