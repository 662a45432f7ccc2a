"""Generation without Python in the loop: one decode step captured, then replayed.

A decode step runs one new token per sequence through every layer and samples the next.
Its shapes are the same at every position when the keys and values go to a static cache
(``KVCache``'s buffers of ``block_size`` positions, allocated once) and the position is a
tensor rather than a Python int (``CausalLM.decode_step``): the attention writes the new
key and value at that position and attends over every slot, those past the position
masked off. Such a step is captured once (``capture``: its ops recorded) and then each
token costs the replay of its forwards, with no Tensor, graph node, check or dispatch
built on the way: on the baby GPT 45 ops per token.

A ``CapturedDecoder`` holds one model's cache and captured step for one batch size,
device, cache dtype and sampling setting; ``decoder_for`` keeps the latest per model (a
new setting replaces it, and with it its cache) and makes one when asked for another.
The prompt (and the window again each time it slides) is a step of its length from
position 0, captured once per length too. On a GPU the one-token step is a CUDA Graph:
a token is one launch.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Optional

import numpy as np

from .. import amp
from ..autograd import is_grad_enabled
from ..capturing import CapturedFunction
from ..tensor import Tensor
from .kv_cache import KVCache
from .sampling import sample_next_token

__all__ = ["CapturedDecoder", "decoder_for"]


class CapturedDecoder:
    """The captured steps ``(tokens (B, T), position (1,)) -> next token (B, 1)`` of one
    model: ``model.decode_step`` into ``cache``, then ``sample_next_token`` with the
    sampling setting fixed here (a replay draws fresh numbers from the seeded stream, the
    ones an eager step would draw). Two captured functions: ``token_step`` for the one
    token after a prompt (on a GPU a CUDA Graph: one launch per token), and
    ``prompt_step`` for a prompt and the window after it slides, one capture per length,
    always replayed op by op: a graph of a whole window would hold every activation of
    its forward for as long as the decoder lives (a GPU's gigabyte at GPT-2's 1,024), and
    it runs once per ``window_shift`` tokens."""

    def __init__(self, model: Any, batch_size: int, device: Any, dtype: Any,
                 sampling: tuple) -> None:
        self.key = _key(model, batch_size, device, dtype, sampling)
        self.cache = KVCache(model.config, batch_size, device, dtype)
        temperature, top_k, top_p = sampling
        model_ref = weakref.ref(model)  # the model holds this decoder (weakly keyed)
        cache = self.cache

        def decode(tokens: Tensor, position: Tensor) -> Tensor:
            logits = model_ref().decode_step(tokens, position, cache)  # (B, V)
            return sample_next_token(logits, temperature, top_k, top_p)

        name = f"{type(model).__name__}.decode_step"
        self.token_step = CapturedFunction(decode, max_captures=1, name=name)
        # the prompt's length and the slid window's: two captures
        self.prompt_step = CapturedFunction(decode, max_captures=2, name=name,
                                            cuda_graphs=False)
        self._backend = self.cache.keys[0]._backend
        tables = getattr(model, "rotary_tables", None)
        if tables is not None:  # made now, not inside a capture (a GPU's graph pool)
            for table_dtype in {np.dtype(np.float32), np.dtype(dtype)} & {
                    np.dtype(np.float32), np.dtype(np.float64)}:
                tables(0, 0, table_dtype, device)
        self.busy = False  # a generation is using the cache (CausalLM._captured_loop)

    def step(self, tokens: Tensor, position: Tensor) -> Tensor:
        """The next token (B, 1) after ``tokens`` (B, T) at ``position``: a replay of the
        step captured for T (captured now if there is none)."""
        chosen = self.token_step if tokens.shape[1] == 1 else self.prompt_step
        return chosen(tokens, position)

    @property
    def captures(self) -> int:
        return self.token_step.captures + self.prompt_step.captures

    @property
    def replays(self) -> int:
        return self.token_step.replays + self.prompt_step.replays

    def position(self, value: int) -> Tensor:
        """The position ``value`` as the step's (1,) int64 input on the cache's device."""
        backend = self._backend
        return Tensor._make(backend.asarray(np.array([value], dtype=np.int64)), backend, False)

    @property
    def nbytes(self) -> int:
        """The cache's buffers and what one replay of the step allocates at most."""
        cache = sum(t.nbytes for t in self.cache.keys + self.cache.values)
        return cache + self.token_step.nbytes + self.prompt_step.nbytes


_DECODERS: "weakref.WeakKeyDictionary[Any, CapturedDecoder]" = weakref.WeakKeyDictionary()


def _key(model: Any, batch_size: int, device: Any, dtype: Any, sampling: tuple) -> tuple:
    # what the step depends on beyond its inputs' shapes: the sampling setting, the cache
    # (batch, device, dtype) and the modes ops read as Python state
    return (batch_size, str(device), np.dtype(dtype).name, sampling, model.training,
            is_grad_enabled(), amp.autocast_dtype(), dataclasses.astuple(model.config))


def decoder_for(model: Any, batch_size: int, device: Any, dtype: Any, temperature: float,
                top_k: Optional[int], top_p: Optional[float]) -> CapturedDecoder:
    """The model's decoder for this setting: the one it holds when that one matches and no
    unfinished generation uses it, else a new one, which replaces it (its cache and
    captures freed) unless the held one is in use."""
    sampling = (float(temperature), None if top_k is None else int(top_k),
                None if top_p is None else float(top_p))
    held = _DECODERS.get(model)
    key = _key(model, batch_size, device, dtype, sampling)
    if held is not None and held.busy:
        # a generation still running on it (a generate_tokens stream not finished): its
        # cache is that stream's, so this one gets a decoder of its own, not kept
        return CapturedDecoder(model, batch_size, device, dtype, sampling)
    if held is not None and held.key == key:
        return held
    _DECODERS.pop(model, None)  # free the old cache before allocating the new one
    decoder = CapturedDecoder(model, batch_size, device, dtype, sampling)
    _DECODERS[model] = decoder
    return decoder
