"""Every module the launchers can ask ``loader.load_kernel`` to build, and a representative
set of them: what the real compiler is run on (``nvrtc.py``, ``scripts/kernel_resources.py``).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

from .architectures import ARCHITECTURES, EVERY_BUILD_ARCHITECTURES
from .attention import ATTENTION_INPUT_DTYPES, MAX_HEAD_DIM
from .loader import INPUT_DTYPES

__all__ = ["Build", "builds_for", "every_build", "representative_builds"]

Build = Tuple[str, Tuple[Tuple[str, int], ...]]  # (source, sorted defines)
# attention's head sizes in the representative set: those models use, where the check
# also refuses a spill


REPRESENTATIVE_HEAD_DIMS = (32, 64, 128)


def every_build() -> List[Build]:
    """(source, defines) of every module the launchers can ask ``load_kernel`` for, with
    the defines they pass (sorted, as the loader keys them): the sources without
    compile-time constants as they are; attention.cu at every head size 1..128 in each
    storage dtype; the softmax with float32 or bf16 probabilities; the Llama kernels
    reading float32 or bf16."""
    builds: List[Build] = [
        (name, ()) for name in ("layernorm.cu", "gelu.cu", "cross_entropy.cu", "adamw.cu")]
    builds += [("attention.cu", (("HEAD_DIM", d), ("INPUT_DTYPE", code)))
               for code in ATTENTION_INPUT_DTYPES.values()
               for d in range(1, MAX_HEAD_DIM + 1)]
    builds += [("attention_softmax.cu", (("PROB_BF16", flag),)) for flag in (0, 1)]
    builds += [(name, (("INPUT_DTYPE", code),)) for name in ("rmsnorm.cu", "rotary.cu",
                                                             "swiglu.cu")
               for code in INPUT_DTYPES.values()]
    return builds


def representative_builds(head_dims: Sequence[int] = REPRESENTATIVE_HEAD_DIMS) -> List[Build]:
    """Every kernel at least once in each storage dtype it reads: ``every_build`` but
    attention.cu only at ``head_dims`` (its 384 builds differ in HEAD_DIM alone, the
    other sources' 12 builds are all kept)."""
    return [(name, defines) for name, defines in every_build()
            if dict(defines).get("HEAD_DIM") in (None, *head_dims)]


def builds_for(arch: str) -> List[Build]:
    """What ``scripts/kernel_resources.py --check`` compiles for sm_``arch``: every build
    for ``architectures.EVERY_BUILD_ARCHITECTURES``, the representative set for the
    others."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"kernel builds: sm_{arch} is not checked, expected one of "
                         f"{', '.join('sm_' + a for a in ARCHITECTURES)}")
    return every_build() if arch in EVERY_BUILD_ARCHITECTURES else representative_builds()
