"""``minitorch_gpu.nn.functional``: the same functions as ``minitorch_gpu.functional``,
where PyTorch users look for them (``import minitorch_gpu.nn.functional as F``)."""
from ..functional import *  # noqa: F401,F403
from ..functional import __all__  # noqa: F401
