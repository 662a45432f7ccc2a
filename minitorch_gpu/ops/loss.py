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

from typing import Any, Optional

from ..autograd import Function
from ..backend import dtypes
from ..tensor import Tensor
from ._util import check_broadcast, require_float, require_tensor, sigmoid_into, unbroadcast
from .promotion import autocast_float32
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
                  reduction: str = "mean", label_smoothing: float = 0.0,
                  weight: Optional[Tensor] = None) -> Tensor:
    """Cross-entropy between logits ``input`` (N, C) or (N, C, d1, ...) and class ids
    ``target`` (N,) or (N, d1, ...), or class probabilities ``target`` of the input's shape
    (a float tensor), as torch.nn.functional.cross_entropy. ``weight`` (C,) weighs the
    classes (class ids without label smoothing only; keyword, as ``ignore_index`` keeps
    the third place here).

    >>> loss = cross_entropy(logits.view(-1, vocab), targets.view(-1))
    """
    require_tensor(input, "cross_entropy")
    require_tensor(target, "cross_entropy", "target")
    require_float(input, "cross_entropy")
    input = autocast_float32(input)  # noqa: A001
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got "
                         f"{reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    # a float target of the input's shape holds probabilities; one of the class ids' shape
    # is a mistake (ids stored as floats), refused as PyTorch refuses it
    ids_shape = () if input.ndim == 1 else tuple(input.shape[:1]) + tuple(input.shape[2:])
    if dtypes.is_floating(target.dtype) and weight is None and \
            tuple(target.shape) != ids_shape:
        return _soft_cross_entropy(input, target, reduction, label_smoothing)
    if not dtypes.is_integer(target.dtype):
        raise TypeError(f"cross_entropy: target must hold integer class ids (or float class "
                        f"probabilities of the input's shape), got {target.dtype}")
    if weight is not None:
        if label_smoothing:
            raise ValueError("cross_entropy: weight with label_smoothing is not supported")
        return nll_loss(input.log_softmax(0 if input.ndim == 1 else 1), target, weight,
                        ignore_index, reduction)
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


def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    """``loss`` summed, averaged over its elements, or as it is."""
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean()
    raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _soft_cross_entropy(input: Tensor, target: Tensor, reduction: str,  # noqa: A002
                        label_smoothing: float) -> Tensor:
    """Cross-entropy against class probabilities ``target`` of the logits' shape: the mean
    over samples (and extra dims) of -sum_c target_c log p_c, as PyTorch. Not the GPT's hot
    path, so composed of log_softmax, a product and a sum."""
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"cross_entropy: probability targets must have the input's shape "
                         f"{tuple(input.shape)}, got {tuple(target.shape)}")
    class_dim = 0 if input.ndim == 1 else 1
    if label_smoothing:
        target = target * (1.0 - label_smoothing) + label_smoothing / input.shape[class_dim]
    loss = -(input.log_softmax(class_dim) * target).sum(class_dim)  # (N, d1, ...)
    return _reduce(loss, reduction, "cross_entropy")


def _class_rows(input: Tensor, target: Tensor, op: str) -> tuple:  # noqa: A002
    """``input`` (N, C, d1, ...) or (C,) as (M, C) rows and ``target`` as (M,) ids, checked;
    and the shape a 'none' reduction returns."""
    if input.ndim < 1:
        raise ValueError(f"{op}: input must have a class dim")
    expected = () if input.ndim == 1 else (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(f"{op}: target has shape {tuple(target.shape)}, expected {expected} "
                         f"for input of shape {tuple(input.shape)}")
    rows = input.unsqueeze(0) if input.ndim == 1 else input
    if input.ndim > 2:
        rows = input.permute((0, *range(2, input.ndim), 1))
    classes = input.shape[0] if input.ndim == 1 else input.shape[1]
    return rows.reshape(-1, classes), expected, classes


class NLLLoss(Function):
    """-weight[t] * input[i, t] for each row i of log-probabilities (M, C) with class id t;
    backward scatters the gradient back to the picked entries."""

    @staticmethod
    def forward(ctx, logp, target, weight, ignore_index, reduction):
        xp = ctx.xp
        valid = target != ignore_index
        safe = xp.where(valid, target, 0)
        rows = xp.arange(target.shape[0])
        w = (weight[safe] if weight is not None else xp.ones(target.shape, logp.dtype)) * valid
        w = w.astype(logp.dtype, copy=False)
        loss = -logp[rows, safe] * w  # (M,)
        ctx.save_for_backward(safe, w)
        ctx.logp_shape, ctx.reduction = logp.shape, reduction
        if reduction == "none":
            return loss
        total = loss.sum()
        if reduction == "mean":
            ctx.divisor = w.sum()  # a device array; 0 gives nan, as PyTorch
            total = total / ctx.divisor
        return xp.asarray(total, dtype=logp.dtype)

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        safe, w = ctx.saved_tensors
        scale = grad / ctx.divisor if ctx.reduction == "mean" else grad
        grad_logp = xp.zeros(ctx.logp_shape, dtype=w.dtype)
        grad_logp[xp.arange(safe.shape[0]), safe] = -w * scale
        return grad_logp, None, None, None, None


def nll_loss(input: Tensor, target: Tensor, weight: Optional[Tensor] = None,  # noqa: A002
             ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities ``input`` (N, C) or (N, C, d1, ...) at
    class ids ``target``, weighted per class by ``weight`` (C,), as
    torch.nn.functional.nll_loss: the weighted mean divides by the targets' summed weights."""
    require_tensor(input, "nll_loss")
    require_tensor(target, "nll_loss", "target")
    require_float(input, "nll_loss")
    if not dtypes.is_integer(target.dtype):
        raise TypeError(f"nll_loss: target must hold integer class ids, got {target.dtype}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"nll_loss: reduction must be 'mean', 'sum' or 'none', got "
                         f"{reduction!r}")
    rows, expected, classes = _class_rows(input, target, "nll_loss")
    if weight is not None:
        require_tensor(weight, "nll_loss", "weight")
        if tuple(weight.shape) != (classes,):
            raise ValueError(f"nll_loss: weight must have shape ({classes},), got "
                             f"{tuple(weight.shape)}")
    ids = target.data
    target._backend.check_in_range(ids, classes, "nll_loss: target id",
                                   f"is out of range for {classes} classes (expected 0 <= "
                                   f"id < {classes} or ignore_index {ignore_index})",
                                   ignore=ignore_index)
    xp = input._backend.xp
    loss = NLLLoss.apply(rows, xp.reshape(ids, (-1,)),
                         None if weight is None else weight.data, ignore_index, reduction)
    return loss.reshape(expected) if reduction == "none" else loss


def binary_cross_entropy(input: Tensor, target: Tensor,  # noqa: A002
                         weight: Optional[Tensor] = None, reduction: str = "mean") -> Tensor:
    """-(t log x + (1 - t) log(1 - x)) of probabilities ``input`` and targets of its shape,
    each log clamped at -100 as PyTorch's; ``weight`` broadcasts to the input."""
    require_tensor(input, "binary_cross_entropy")
    require_float(input, "binary_cross_entropy")
    target = _same_shape_target(input, target, "binary_cross_entropy")
    loss = -(target * input.log().clamp(min=-100.0)
             + (1.0 - target) * (1.0 - input).log().clamp(min=-100.0))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy")


def _same_shape_target(input: Tensor, target: Any, op: str) -> Tensor:  # noqa: A002
    require_tensor(target, op, "target")
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"{op}: target has shape {tuple(target.shape)}, expected the "
                         f"input's {tuple(input.shape)}")
    return target if dtypes.is_floating(target.dtype) else target.to(input.dtype)


class BinaryCrossEntropyWithLogits(Function):
    """(1 - t) x + (1 + (pw - 1) t) softplus(-x), elementwise, with softplus(-x) written
    as log1p(exp(-|x|)) + max(-x, 0), which never overflows:
        d/dx = (1 - t) - (1 + (pw - 1) t) sigmoid(-x),
        d/dt = -x + (pw - 1) softplus(-x),   d/dpw = t softplus(-x)."""

    @staticmethod
    def forward(ctx, x, t, pos_weight):
        xp = ctx.xp
        softplus_neg = xp.log1p(xp.exp(-xp.abs(x))) + xp.maximum(-x, 0)
        coeff = 1.0 + (pos_weight - 1.0) * t if pos_weight is not None else 1.0
        ctx.save_for_backward(x, t, pos_weight, softplus_neg)
        return ((1.0 - t) * x + coeff * softplus_neg).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        xp = ctx.xp
        x, t, pos_weight, softplus_neg = ctx.saved_tensors
        need_x, need_t, need_pw = ctx.needs_input_grad[:3]
        grad_x = grad_t = grad_pw = None
        if need_x:
            coeff = 1.0 + (pos_weight - 1.0) * t if pos_weight is not None else 1.0
            sig_neg = xp.empty_like(x)  # sigmoid(-x)
            sigmoid_into(xp, -x, sig_neg, xp.empty_like(x))
            grad_x = grad * ((1.0 - t) - coeff * sig_neg)
        if need_t:
            extra = (pos_weight - 1.0) * softplus_neg if pos_weight is not None else 0.0
            grad_t = grad * (extra - x)
        if need_pw:
            grad_pw = unbroadcast(grad * t * softplus_neg, pos_weight.shape)
        return grad_x, grad_t, grad_pw


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor,  # noqa: A002
                                     weight: Optional[Tensor] = None, reduction: str = "mean",
                                     pos_weight: Optional[Tensor] = None) -> Tensor:
    """Binary cross-entropy of logits ``input`` (sigmoid inside, numerically stable) and
    targets of its shape, as torch.nn.functional.binary_cross_entropy_with_logits:
    ``pos_weight`` weighs the positive term and broadcasts over the last (class) dim,
    ``weight`` weighs each element."""
    require_tensor(input, "binary_cross_entropy_with_logits")
    require_float(input, "binary_cross_entropy_with_logits")
    target = _same_shape_target(input, target, "binary_cross_entropy_with_logits")
    if pos_weight is not None:
        require_tensor(pos_weight, "binary_cross_entropy_with_logits", "pos_weight")
        check_broadcast("binary_cross_entropy_with_logits (pos_weight)",
                        tuple(pos_weight.shape), tuple(input.shape))
    loss = BinaryCrossEntropyWithLogits.apply(input, target, pos_weight)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")
