"""Mixed precision: ``autocast`` (which ops run in bf16 or fp16, ``autocast_mode.py``) and
``GradScaler`` (dynamic loss scaling for fp16, ``grad_scaler.py``), as torch.amp has them.

    scaler = mt.amp.GradScaler()             # fp16; bf16 needs no scaler
    with mt.autocast("fp16"):
        _, loss = model(idx, targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer); scaler.update()

Engine layer, with the top-level modules: may import ``backend/`` and the engine (the
scaler's Tensor, lazily: ``ops/promotion.py`` imports ``autocast_mode`` while ``tensor``
is still being imported); never ``optim`` (the scaler takes any object with
``param_groups`` and ``step``) or anything above.
"""
from .autocast_mode import autocast, autocast_dtype
from .grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast", "autocast_dtype"]
