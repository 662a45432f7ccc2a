"""``profile_model``: a model profiled end to end, with a reference timed without hooks;
what ``minitorch-gpu profile`` runs."""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..amp import autocast as autocast_context
from ..autograd import enable_grad, no_grad
from ..nn import Module
from ..tensor import Tensor
from .recording import Profile
from .roofline import Roofline
from .rows import median

__all__ = ["profile_model"]


def profile_model(model: Module, idx: Tensor, targets: Optional[Tensor] = None, *,
                  warmup: int = 2, iters: int = 10, backward: bool = False,
                  autocast: Optional[str] = None,
                  roofline: Optional[Roofline] = None) -> Profile:
    """Warm up, time ``iters`` passes without hooks (the reference), then profile ``iters``
    passes. Forward only runs in eval mode under no_grad; with ``backward`` in training
    mode, each pass also runs ``loss.backward()`` (the loss is ``model(idx, targets)``'s
    second output). ``autocast="bf16"`` runs the passes in mixed precision, judged
    against the bf16 roofline."""
    if warmup < 0 or iters < 1:
        raise ValueError(f"profile: warmup must be >= 0 and iters >= 1, got {warmup} and "
                         f"{iters}")
    if backward and targets is None:
        raise ValueError("profile: backward=True needs targets (a loss to differentiate)")
    precision = autocast_context(autocast or "bf16", enabled=autocast is not None)
    if roofline is None and autocast is not None:
        param = next(iter(model.parameters()))
        roofline = Roofline.measure(str(param.device), precision.dtype)
    prof = Profile(model, backward=backward, roofline=roofline)
    clock = prof.clock
    was_training = model.training

    def run(record: Optional[List[Tuple[float, float]]]) -> None:
        start = clock()
        with precision:
            out = model(idx, targets) if targets is not None else model(idx)
        middle = clock()
        if backward:
            model.zero_grad()
            loss = out[1] if isinstance(out, tuple) else out
            loss.backward()
        end = clock()
        if record is not None:
            record.append((middle - start, end - middle))

    unhooked: List[Tuple[float, float]] = []
    try:
        model.train(backward)
        with enable_grad() if backward else no_grad():
            for _ in range(warmup):
                run(None)
            for _ in range(iters):
                run(unhooked)
            with prof:
                for _ in range(iters):
                    run(None)
    finally:  # the mode it found, also when a pass raised
        model.train(was_training)
    prof.reference_ms = {"forward": median([f for f, _ in unhooked]) * 1e3}
    if backward:
        prof.reference_ms["backward"] = median([b for _, b in unhooked]) * 1e3
    return prof
