"""The differentiable ops, one family per module; this package re-exports their functions.

Engine layer, with the top-level modules (tensor and its method families, autograd,
creation, amp, functional, testing, cuda): may import ``backend/`` and ``system/``, never
``nn``; the tensor <-> ops join is the package's one import circle.
"""
from types import ModuleType as _ModuleType

from .arithmetic import abs, add, clamp, div, maximum, minimum, mul, neg, pow, sub
from .activations import gelu, relu, sigmoid, tanh
from .comparison import eq, ge, gt, le, logical_and, logical_not, logical_or, lt, ne
from .bitwise import bitwise_and, bitwise_not, bitwise_or, bitwise_xor
from .selection import masked_fill, tril, triu, where
from .elementwise_math import (acos, acosh, asin, asinh, atan, atan2, atanh, cos, cosh, erf, exp,
                               exp2, isclose, isfinite, isinf, isnan, lerp, log, log2, log10,
                               logaddexp, rsqrt, sin, sinh, sqrt, tan)
from .rounding import ceil, floor, floor_divide, fmod, remainder, round, sign, trunc
from .views import (chunk, expand, flatten, narrow, permute, reshape, split, squeeze, transpose,
                    unsqueeze, view)
from .indexing import gather, getitem, index_key
from .join import cat, stack
from .conversions import clone, contiguous, to_device, to_dtype
from .reduce import (all, amax, amin, any, argmax, argmin, cumsum, max, mean, min, std, sum,
                     var)
from .sorting import multinomial, sort, topk
from .reduce import cumprod, logsumexp, prod, std_mean, var_mean
from .sorting import argsort
from .rearrange import (flip, masked_select, nonzero, one_hot, pad, repeat, repeat_interleave,
                        roll, unflatten)
from .scatter import scatter, scatter_add, scatter_reduce
from .matmul import linear, matmul
from .softmax import log_softmax, softmax
from .normalization import layer_norm, normalize, rms_norm
from .einsum import einsum
from .loss import (binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy,
                   nll_loss)
from .embedding import embedding
from .dropout import dropout
from .attention import scaled_dot_product_attention
from .attention_heads import (cached_grouped_attention, grouped_causal_attention,
                              packed_causal_attention)
from .rotary import apply_rotary, rotary_tables
from .activations import swiglu

# axis= and keepdims= as aliases of dim= and keepdim=, as PyTorch takes them (keep this
# after the imports above: it wraps every op imported by then)
from ._util import accept_numpy_names as _accept_numpy_names  # noqa: E402
globals().update({_name: _accept_numpy_names(_fn) for _name, _fn in list(globals().items())
                  if callable(_fn) and not _name.startswith("_")
                  and not isinstance(_fn, (_ModuleType, type))})

# the functions only: the submodules (views, reduce, ...) must not land in ``minitorch_gpu``
__all__ = [name for name, value in globals().items()
           if not name.startswith("_") and not isinstance(value, _ModuleType)]
