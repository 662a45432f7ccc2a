"""Fused CUDA kernels for the GPT's hot path, and the Python functions that launch them.

Each CUDA C source sits beside the module that launches its kernels, as llm.c keeps a
kernel and its launcher together: ``layernorm``, ``gelu``, ``cross_entropy``, ``adamw``,
``attention`` (flash attention, grouped-query too), ``attention_softmax`` (the dense
path's softmax between two cuBLAS products) and Llama's ``rmsnorm``, ``rotary`` (RoPE) and
``swiglu``; each .cu explains its algorithm and which thread does what.
``loader`` holds what they share: the sources, compiling them with ``cupy.RawModule``,
launch shapes and argument checks.

This package is the set of kernels a CUDA backend offers: ops reach these functions
through ``backend.fused_kernels()``, which is this package on a CUDA backend and None on
the CPU::

    kernels = ctx.backend.fused_kernels()
    if kernels is not None and kernels.supports_gelu(x):
        return kernels.gelu_forward(x, approximate)
    ... the NumPy-vectorised code, the reference ...

Each ``supports_*`` says exactly which inputs the kernel takes (float32, and bf16/fp16
where said; anything else falls back to the vectorised code); the launch functions raise
TypeError/ValueError naming the argument for anything else. Inputs may have any strides: a
non-contiguous input is copied once to a contiguous one (arrays updated in place must be
contiguous), except that flash attention reads its strided heads in place and rotary its
strided (B, T, H, D) views.

Everything here imports on machines without CuPy (``backend/_cupy.py`` guards the import):
``source_text`` and the constants work anywhere.
"""
# every launcher and constant as kernels.NAME: the object fused_kernels() hands the ops
from .adamw import adamw_step, adamw_update, supports_adamw
from .attention import (ATTENTION_FORWARD_ROWS, ATTENTION_INPUT_DTYPES, ATTENTION_WARPS,
                        MAX_GRID_X, MAX_HEAD_DIM, MAX_SEQUENCE, attention_backward_rows,
                        attention_group, attention_head_split, attention_input_code,
                        attention_layout, attention_strides,
                        flash_attention_backward, flash_attention_forward,
                        supports_flash_attention)
from .attention_softmax import (DROPOUT_BITS, SOFTMAX_THREADS, attention_softmax_backward,
                                attention_softmax_forward, supports_attention_softmax)
from .cross_entropy import (CROSS_ENTROPY_THREADS, cross_entropy_backward,
                            cross_entropy_forward, supports_cross_entropy)
from .gelu import gelu_backward, gelu_forward, supports_gelu
from .layernorm import (LAYERNORM_COLUMN_THREADS, LAYERNORM_ROWS_PER_CHUNK,
                        LAYERNORM_WARPS_PER_BLOCK, layer_norm_backward, layer_norm_forward,
                        supports_layer_norm)
from .loader import (COMPILE_OPTIONS, ELEMENTWISE_THREADS, INPUT_DTYPES, SOURCE_DIR, SOURCES,
                     source_text)
from .rmsnorm import (RMS_NORM_COLUMN_THREADS, RMS_NORM_ROWS_PER_CHUNK,
                      RMS_NORM_WARPS_PER_BLOCK, rms_norm_backward, rms_norm_chunks,
                      rms_norm_forward, supports_rms_norm)
from .rotary import rotary_forward, rotary_strides, supports_rotary
from .swiglu import supports_swiglu, swiglu_backward, swiglu_forward

__all__ = [
    "ATTENTION_FORWARD_ROWS", "ATTENTION_INPUT_DTYPES", "ATTENTION_WARPS",
    "COMPILE_OPTIONS", "CROSS_ENTROPY_THREADS", "DROPOUT_BITS", "ELEMENTWISE_THREADS",
    "INPUT_DTYPES", "LAYERNORM_COLUMN_THREADS", "LAYERNORM_ROWS_PER_CHUNK",
    "LAYERNORM_WARPS_PER_BLOCK", "MAX_GRID_X", "MAX_HEAD_DIM", "MAX_SEQUENCE",
    "RMS_NORM_COLUMN_THREADS", "RMS_NORM_ROWS_PER_CHUNK", "RMS_NORM_WARPS_PER_BLOCK",
    "SOFTMAX_THREADS", "SOURCES",
    "SOURCE_DIR", "adamw_step", "adamw_update", "attention_backward_rows",
    "attention_group", "attention_head_split", "attention_input_code", "attention_layout",
    "attention_softmax_backward",
    "attention_softmax_forward", "attention_strides", "cross_entropy_backward",
    "cross_entropy_forward", "flash_attention_backward", "flash_attention_forward",
    "gelu_backward", "gelu_forward", "layer_norm_backward", "layer_norm_forward",
    "rms_norm_backward", "rms_norm_chunks", "rms_norm_forward", "rotary_forward",
    "rotary_strides", "source_text", "supports_adamw", "supports_attention_softmax",
    "supports_cross_entropy", "supports_flash_attention", "supports_gelu",
    "supports_layer_norm", "supports_rms_norm", "supports_rotary", "supports_swiglu",
    "swiglu_backward", "swiglu_forward",
]
