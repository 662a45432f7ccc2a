"""minitorch_gpu: a from-scratch tensor/autograd engine on NumPy (CPU) or CuPy (GPU).

>>> import minitorch_gpu as mt
>>> x = mt.randn(3, 4, requires_grad=True)
>>> (x.tanh() ** 2).sum().backward()
>>> x.grad.shape
(3, 4)
"""
from .backend import Device, get_backend, manual_seed
from .backend import parse_device as device  # noqa: F401  - mt.device("cuda") -> cuda:0
from .backend.dtypes import (bfloat16, bool_, float16, float32, float64, int32, int64,
                             uint8)
from .tensor import Tensor
from .autograd import (Function, enable_grad, is_grad_enabled, no_grad, set_grad_enabled)
from .amp import autocast
from .capturing import CaptureError, capture
from .ops import *  # noqa: F401,F403 - the functional API: mt.add, mt.matmul, mt.softmax, ...
from .creation import (arange, empty, empty_like, from_numpy, full, full_like, ones, ones_like,
                       rand, randint, randn, randn_like, tensor, zeros, zeros_like)
from .creation import eye, linspace
from . import cuda, functional, testing  # noqa: E402
from . import nn, optim  # noqa: E402  (modules and optimizers build on everything above)

float = float32  # noqa: A001 - torch.float
double = float64
half = float16
long = int64
int = int32  # noqa: A001 - torch.int
bool = bool_  # noqa: A001 - torch.bool

__version__ = "0.1.0"


def from_pretrained(source: "str | os.PathLike", device: str = "cpu",
                    **options: "typing.Any") -> "nn.CausalLM":
    """A model ready for ``model(idx)`` from a Hugging Face model folder, ``hf:NAME`` on
    the Hub, or one of this project's run directories or checkpoint files (see
    ``minitorch_gpu.pretrained``, imported only when this is called)."""
    from .pretrained import from_pretrained as load
    return load(source, device, **options)
