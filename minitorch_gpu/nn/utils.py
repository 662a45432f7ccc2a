"""``minitorch_gpu.nn.utils``: where PyTorch users look for gradient clipping
(``torch.nn.utils.clip_grad_norm_``); it lives with the optimizers."""
from ..optim.clip_grad import clip_grad_norm_

__all__ = ["clip_grad_norm_"]
