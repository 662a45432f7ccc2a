"""Fused CPU kernels for the hot path, compiled by numba: the CPU's counterpart of
``backend/kernels`` (CUDA), with the same launchers, so an op's kernel branch serves both.

NumPy runs an op as a chain of whole-array passes (GELU's tanh form: nine), each a sweep
over memory, with float32 ``exp``/``tanh`` at scalar speed on some builds; a fused kernel
reads its inputs once and writes its outputs once, with a float32 ``exp`` the compiler
turns into SIMD (``compiler.exp32``). Each module says what it fuses:

* ``activations``: GELU (tanh form) and SwiGLU, forward and backward;
* ``normalization``: layer norm and RMS norm, forward and backward, a row at a time;
* ``attention``: flash attention, forward and backward (the ops' "kernel" path): query
  tiles against key tiles with an online softmax, heads read in place, grouped-query
  attention, dropout by the CUDA kernels' hash; the ops take it where it is faster than
  the dense path (``fused_is_faster``, measured);
* ``softmax``: attention's scale, causal mask, softmax and dropout between its two BLAS
  products (the ops' "dense" path) and its backward; cross-entropy;
* ``rotary``: rotary position embedding, one pass per head (its backward is the same
  rotation by minus the angle);
* ``adamw``: AdamW, one pass per parameter, parameters split over the cores.

Ops reach them through ``backend.fused_kernels()``, which on the CPU is this package when
numba is importable and ``NumpyBackend.use_fused_kernels`` is on (the default), else None:

    kernels = ctx.backend.fused_kernels()
    if kernels is not None and kernels.supports_gelu(x):
        return kernels.gelu_forward(x, approximate)
    ... the NumPy-vectorised code, the reference ...

``supports_*`` take float32 NumPy arrays (flash attention bf16 too; float64 and the forms
not fused here stay with the NumPy code). The kernels agree with the NumPy code to 1e-5
relative (``tests/test_cpu_kernels.py``, ``tests/test_cpu_attention.py``).
"""
from .activations import (gelu_backward, gelu_forward, supports_gelu, supports_swiglu,
                          swiglu_backward, swiglu_forward)
from .adamw import adamw_step, adamw_update, supports_adamw
from .attention import (flash_attention_backward, flash_attention_forward,
                        supports_flash_attention)
from .compiler import INSTALL_HINT, SPLIT_FROM, exp32, unavailable_reason
from .dropout import DROPOUT_BITS
from .normalization import (layer_norm_backward, layer_norm_forward, rms_norm_backward,
                            rms_norm_forward, supports_layer_norm, supports_rms_norm)
from .rotary import rotary_forward, supports_rotary
from .softmax import (attention_softmax_backward, attention_softmax_forward,
                      cross_entropy_backward, cross_entropy_forward,
                      supports_attention_softmax, supports_cross_entropy)


def available() -> bool:
    """Whether the kernels can run here (numba importable)."""
    return unavailable_reason() is None


__all__ = [
    "DROPOUT_BITS", "INSTALL_HINT", "SPLIT_FROM", "adamw_step", "adamw_update",
    "attention_softmax_backward", "attention_softmax_forward", "available",
    "cross_entropy_backward", "cross_entropy_forward", "exp32", "flash_attention_backward",
    "flash_attention_forward", "gelu_backward",
    "gelu_forward", "layer_norm_backward", "layer_norm_forward", "rms_norm_backward",
    "rms_norm_forward", "rotary_forward", "supports_adamw", "supports_attention_softmax",
    "supports_cross_entropy", "supports_flash_attention", "supports_gelu",
    "supports_layer_norm", "supports_rms_norm", "supports_rotary", "supports_swiglu",
    "swiglu_backward", "swiglu_forward", "unavailable_reason",
]
