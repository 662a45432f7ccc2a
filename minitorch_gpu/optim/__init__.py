"""``minitorch_gpu.optim``: optimizers, gradient clipping and learning-rate schedules.

The API follows torch.optim: an optimizer takes parameters (or parameter groups, dicts
that override its defaults), ``step()`` updates them in place from their ``.grad``, and
``zero_grad()`` clears the gradients. Updates run on the raw arrays of either backend.

>>> import minitorch_gpu.optim as optim
>>> opt = optim.configure_adamw(model, weight_decay=0.1, lr=6e-4, betas=(0.9, 0.95))
>>> scheduler = optim.WarmupCosineLR(opt, warmup_iters=100, lr_decay_iters=5000, min_lr=6e-5)
>>> loss.backward()
>>> optim.clip_grad_norm_(model.parameters(), 1.0)
>>> opt.step(); opt.zero_grad(); scheduler.step()

Model layer, beside ``nn/``: may import the engine and the foundation, never ``nn``.
"""
from .optimizer import Optimizer, weight_decay_groups
from .sgd import SGD
from .adamw import AdamW, configure_adamw
from .clip_grad import clip_grad_norm_
from .lr_scheduler import ConstantLR, WarmupCosineLR, constant_lr, cosine_lr

__all__ = ["Optimizer", "SGD", "AdamW", "clip_grad_norm_", "constant_lr", "cosine_lr",
           "ConstantLR", "WarmupCosineLR", "weight_decay_groups", "configure_adamw"]
