"""Neural-network modules: ``Module``/``Parameter``, containers, the GPT's layers and GPT.

>>> import minitorch_gpu.nn as nn
>>> layer = nn.Linear(4, 3)
>>> [name for name, _ in layer.named_parameters()]
['weight', 'bias']

Model layer: may import the engine and the foundation; ``optim/`` beside it only
lazily (``CausalLM.configure_optimizers``).
"""
from . import functional, init, utils
from .containers import ModuleDict, ModuleList, Sequential
from .causal_lm import CausalLM
from .gpt import GPT, MLP, Block, CausalSelfAttention, GPTConfig, KVCache
from .lm_config import LlamaConfig
from .layers import (GELU, CrossEntropyLoss, Dropout, Embedding, Identity, LayerNorm, Linear,
                     PackedCausalAttention, ReLU, ScaledDotProductAttention, Tanh)
from .layers import ELU, Hardtanh, LeakyReLU, LogSigmoid, Mish, SiLU, Softplus
from .module import IncompatibleKeys, Module, RemovableHandle
from .parameter import Parameter
from .sampling import sample_next_token

__all__ = ["GELU", "GPT", "Block", "CausalSelfAttention", "CrossEntropyLoss", "Dropout",
           "Embedding", "GPTConfig", "Identity", "IncompatibleKeys", "KVCache", "LayerNorm",
           "Linear", "MLP", "Module", "ModuleDict", "ModuleList", "PackedCausalAttention",
           "Parameter", "ReLU", "RemovableHandle", "ScaledDotProductAttention", "Sequential",
           "Tanh", "functional", "init", "sample_next_token", "utils"]
__all__ += ["ELU", "Hardtanh", "LeakyReLU", "LogSigmoid", "Mish", "SiLU", "Softplus"]
from .layers import LogSoftmax, RMSNorm, Softmax
__all__ += ["LogSoftmax", "RMSNorm", "Softmax"]
__all__ += ["CausalLM", "LlamaConfig"]
from .layers import SwiGLU
__all__ += ["SwiGLU"]
from .llama import (GroupedCausalAttention, Llama, LlamaAttention, LlamaDecoderLayer,
                    LlamaMLP, Rotary)
__all__ += ["GroupedCausalAttention", "Llama", "LlamaAttention", "LlamaDecoderLayer",
            "LlamaMLP", "Rotary", "MODELS", "model_for"]

MODELS = {"gpt2": GPT, "llama": Llama}  # model.arch -> the class that builds it


def model_for(config: GPTConfig) -> CausalLM:
    """The model ``config.arch`` names, built from ``config``: a GPT or a Llama."""
    if not isinstance(config, GPTConfig):
        raise TypeError(f"model_for: expected a GPTConfig, got {type(config).__name__}")
    return MODELS[config.arch](config)
