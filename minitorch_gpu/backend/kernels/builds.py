"""Every module the launchers can ask ``loader.load_kernel`` to build: what the real
compiler is run on (``nvrtc.py``, ``scripts/kernel_resources.py``)."""
from __future__ import annotations

from typing import List, Tuple

from .attention import ATTENTION_INPUT_DTYPES, MAX_HEAD_DIM
from .loader import SOURCES

__all__ = ["every_build"]


def every_build() -> List[Tuple[str, Tuple[Tuple[str, int], ...]]]:
    """(source, defines) of every module the launchers can ask ``load_kernel`` for: each
    source as it is, attention.cu at every head size 1..128 in each storage dtype, the
    softmax with bf16 probabilities, the Llama kernels reading bf16."""
    builds: List[Tuple[str, Tuple[Tuple[str, int], ...]]] = [
        (name, ()) for name in SOURCES if name != "attention.cu"]
    builds += [("attention.cu", (("HEAD_DIM", d), ("INPUT_DTYPE", code)))
               for code in ATTENTION_INPUT_DTYPES.values()
               for d in range(1, MAX_HEAD_DIM + 1)]
    builds += [("attention_softmax.cu", (("PROB_BF16", 1),))]
    builds += [(name, (("INPUT_DTYPE", 1),)) for name in ("rmsnorm.cu", "rotary.cu",
                                                          "swiglu.cu")]
    return builds
