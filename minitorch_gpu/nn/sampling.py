"""Choosing the next token from a model's logits: greedy, temperature, top-k, top-p."""
from __future__ import annotations

import numbers
from typing import Optional

from .. import functional as F
from ..ops import cumsum, multinomial, sort, topk
from ..tensor import Tensor


def check_sampling(temperature: float, top_k: Optional[int], top_p: Optional[float]) -> None:
    """ValueError naming the argument when a sampling setting is impossible."""
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if top_k is not None and (not isinstance(top_k, numbers.Integral)
                              or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")


def sample_next_token(logits: Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                      top_p: Optional[float] = None) -> Tensor:
    """Next-token ids (B, 1) from logits (B, V), drawn from the seeded stream.

    ``temperature`` 0 is greedy (argmax); otherwise the logits are divided by it, ``top_k``
    keeps the k most likely tokens, ``top_p`` keeps the smallest set of most likely tokens
    whose probability reaches p (nucleus sampling), and one token is drawn from the rest.
    """
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)  # (B, 1)
    # in float64 and shifted so the largest logit is 0: a tiny temperature then sends the
    # others towards -inf (probability 0) instead of overflowing the largest to inf (nan)
    logits = logits.double()
    logits = logits - logits.amax(-1, keepdim=True)
    if temperature != 1.0:  # x / 1.0 is x: no op for the common case
        logits = logits / temperature
    top_k = None if top_k is None else int(top_k)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = topk(logits, top_k, dim=-1)[0][:, -1:]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)  # (B, V)
    if top_p is None or top_p >= 1.0:
        return multinomial(probs, 1)
    sorted_probs, order = sort(probs, dim=-1, descending=True)  # (B, V) each
    # a token is dropped once the tokens ranked above it already hold top_p of the mass;
    # the most likely token always stays
    mass_before = cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return order.gather(-1, multinomial(sorted_probs, 1))  # (B, 1): back to token ids
