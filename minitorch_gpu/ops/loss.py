"""Cross-entropy of logits against class indices, one fused Function (log-softmax + NLL).

Forward keeps the softmax probabilities; backward is ``(p - onehot) * scale`` written in
one pass over them. The full log-probability matrix is never materialised. On a CUDA
backend, float32 logits go to the fused kernel (backend/kernels/cross_entropy.cu), which
keeps only each row's log-sum-exp and recomputes the probabilities in backward.

Nothing here reads a value back to the host, so a training step never waits for the GPU
here: the number of targets that count (not ``ignore_index``) stays a device array, the
mean divides by it clamped to 1 (nan when there is none, as PyTorch), and the targets'
range check is the backend's (``check_in_range``: at once on the CPU, deferred on a GPU).
"""
from __future__ import annotations

from ..autograd import Function
from ..backend import dtypes
from ..tensor import Tensor
from ._util import autocast_float32, require_float, require_tensor
from .softmax import working_copy


class CrossEntropy(Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction, label_smoothing):
        xp = ctx.xp
        # logits: (M, C) rows of classes; target: (M,) class ids
        valid = target != ignore_index
        kernels = ctx.backend.fused_kernels()  # CUDA: backend/kernels/cross_entropy.cu
        ctx.kernels = kernels if kernels is not None and kernels.supports_cross_entropy(
            logits, target) else None
        if ctx.kernels is not None:  # saves the logits and each row's log-sum-exp only
            nll, lse = ctx.kernels.cross_entropy_forward(logits, target, ignore_index,
                                                         label_smoothing)
            ctx.save_for_backward(logits, target, lse)
            ctx.ignore_index = ignore_index
        else:
            rows = xp.arange(target.shape[0])
            safe_target = xp.where(valid, target, 0)
            z = working_copy(logits)
            z -= z.max(axis=1, keepdims=True)
            picked = z[rows, safe_target]  # shifted logit of the target class, (M,)
            mean_z = z.mean(axis=1) if label_smoothing else None
            xp.exp(z, out=z)
            total = z.sum(axis=1)
            log_total = xp.log(total)
            nll = log_total - picked
            if label_smoothing:  # mix in the mean over classes of -log p
                nll = (1 - label_smoothing) * nll + label_smoothing * (log_total - mean_z)
            nll = xp.where(valid, nll, 0)
            z /= total[:, None]  # probabilities, kept for backward
            ctx.save_for_backward(z, safe_target, valid)
        ctx.reduction, ctx.smoothing = reduction, label_smoothing
        ctx.logits_dtype = logits.dtype
        if reduction == "none":
            return nll.astype(logits.dtype, copy=False)
        loss = nll.sum()
        if reduction == "mean":
            count = valid.sum()  # a device array: the targets that count
            # the mean's divisor, max(count, 1), for backward too (a Python int before
            # the division by it would be a read of count, a wait for the GPU)
            ctx.divisor = xp.maximum(count, 1).astype(nll.dtype)
            loss = xp.where(count > 0, loss / ctx.divisor, xp.nan)  # none counts: nan (PyTorch)
        return xp.asarray(loss, dtype=logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        if ctx.kernels is not None:
            logits, target, lse = ctx.saved_tensors
            # dL/d(each row's loss); the kernel zeroes ignored rows itself
            row_grad = grad / ctx.divisor if ctx.reduction == "mean" else grad
            grad_logits = ctx.kernels.cross_entropy_backward(
                logits, target, lse, row_grad, ctx.ignore_index, ctx.smoothing)
            return grad_logits, None, None, None, None
        probs, target, valid = ctx.saved_tensors
        rows = xp.arange(target.shape[0])
        grad_logits = probs.copy()
        if ctx.smoothing:
            grad_logits -= ctx.smoothing / probs.shape[1]
        grad_logits[rows, target] -= 1 - ctx.smoothing
        if ctx.reduction == "none":
            scale = grad * valid
        elif ctx.reduction == "mean":
            scale = valid * (grad / ctx.divisor)
        else:
            scale = valid * grad
        grad_logits *= scale[:, None] if scale.ndim else scale
        return grad_logits.astype(ctx.logits_dtype, copy=False), None, None, None, None


def cross_entropy(input: Tensor, target: Tensor, ignore_index: int = -100,  # noqa: A002
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy between logits ``input`` (N, C) or (N, C, d1, ...) and class ids
    ``target`` (N,) or (N, d1, ...), as torch.nn.functional.cross_entropy.

    >>> loss = cross_entropy(logits.view(-1, vocab), targets.view(-1))
    """
    require_tensor(input, "cross_entropy")
    require_tensor(target, "cross_entropy", "target")
    require_float(input, "cross_entropy")
    input = autocast_float32(input)  # noqa: A001
    if not dtypes.is_integer(target.dtype):
        raise TypeError(f"cross_entropy: target must hold integer class ids, got {target.dtype}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got "
                         f"{reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if input.ndim < 1:
        raise ValueError("cross_entropy: input must have a class dim")
    if input.ndim == 1:  # one sample: (C,) with a scalar target
        expected = ()
    else:
        expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(f"cross_entropy: target has shape {tuple(target.shape)}, expected "
                         f"{expected} for input of shape {tuple(input.shape)} (classes in dim "
                         f"{0 if input.ndim == 1 else 1})")
    classes = input.shape[0] if input.ndim == 1 else input.shape[1]
    xp = input._backend.xp
    ids = target.data
    target._backend.check_in_range(ids, classes, "cross_entropy: target id",
                                   f"is out of range for {classes} classes (expected 0 <= "
                                   f"id < {classes} or ignore_index {ignore_index})",
                                   ignore=ignore_index)
    # bring classes to the last dim and flatten everything else: (M, C)
    logits = input
    if input.ndim == 1:
        logits = input.unsqueeze(0)
    elif input.ndim > 2:
        logits = input.permute((0, *range(2, input.ndim), 1))
    logits = logits.reshape(-1, classes)
    loss = CrossEntropy.apply(logits, xp.reshape(ids, (-1,)), ignore_index, reduction,
                              label_smoothing)
    if reduction == "none":
        loss = loss.reshape(expected)
    return loss
