"""What every decoder-only language model here shares: the checks of ``forward``'s
inputs, the language-model head and its loss, the key/value cache, sampling with it, and
the FLOP accounting. ``GPT`` (nn/gpt.py) and ``Llama`` (nn/llama.py) differ only in their
blocks and embeddings; both return ``(logits, loss)`` from ``model(idx, targets)`` and
sample with ``model.generate``.
"""
from __future__ import annotations

import numbers
from dataclasses import fields
from typing import Iterator, Optional, Tuple

from ..autograd import is_grad_enabled, no_grad
from ..backend import dtypes
from ..ops import cat
from ..tensor import Tensor
from .decoder import decoder_for
from .kv_cache import KVCache
from .lm_config import GPTConfig
from .module import Module
from .sampling import check_sampling, sample_next_token

__all__ = ["CausalLM", "KVCache"]


class CausalLM(Module):
    """A language model over token ids: subclasses set ``config`` (a GPTConfig), ``lm_head``
    and ``loss`` modules, and implement ``_hidden(idx, start, kv_cache)``, the final
    hidden states (B, T, C) of positions start .. start + T - 1."""

    config: GPTConfig
    arch: str  # the config.arch the subclass builds

    def _own_config(self, config: GPTConfig) -> GPTConfig:
        """``self.config``, a GPTConfig copied from ``config`` (crop_block_size edits it), its
        arch defaults resolved (a run config's model section leaves them None); TypeError
        unless it is a GPTConfig of this class's arch."""
        name = type(self).__name__
        if not isinstance(config, GPTConfig) or config.arch != self.arch:
            what = f"arch {config.arch!r}" if isinstance(config, GPTConfig) else \
                type(config).__name__
            raise TypeError(f"{name}: expected a GPTConfig of arch {self.arch!r}, got {what} "
                            f"(nn.model_for picks the class by config.arch)")
        self.config = GPTConfig(**{f.name: getattr(config, f.name) for f in fields(GPTConfig)})
        return self.config

    # --- forward ------------------------------------------------------------------------
    def forward(self, idx: Tensor, targets: Optional[Tensor] = None, *,
                all_logits: bool = False,
                kv_cache: Optional[KVCache] = None) -> Tuple[Tensor, Optional[Tensor]]:
        """``(logits, loss)`` for token ids ``idx`` (B, T).

        With ``targets`` (B, T) the logits of every position (B, T, V) and the mean
        cross-entropy (targets of -1 are ignored). Without, only the last position's logits
        (B, 1, V), as generation needs, unless ``all_logits``; the loss is None. With
        ``kv_cache`` (inference only), ``idx`` continues the cached positions.
        """
        name = type(self).__name__
        self._check_ids(idx, "idx")
        B, T = idx.shape
        start = 0
        if kv_cache is not None:
            if is_grad_enabled():
                raise RuntimeError(f"{name}.forward: kv_cache is for inference; run under "
                                   f"no_grad() (generate does)")
            kv_cache.check_fits(self.config, B, T, f"{name}.forward")
            start = kv_cache.length
        if T > self.config.block_size:
            raise ValueError(f"{name}.forward: cannot run a sequence of length {T}: the "
                             f"block size is {self.config.block_size} (crop the input to its "
                             f"last {self.config.block_size} tokens)")
        if targets is not None:
            self._check_ids(targets, "targets")
            if tuple(targets.shape) != (B, T):
                raise ValueError(f"{name}.forward: targets have shape "
                                 f"{tuple(targets.shape)}, expected idx's shape {(B, T)}")
        x = self._hidden(idx, start, kv_cache)  # (B, T, C)
        if kv_cache is not None:
            kv_cache.length += T
        if targets is not None:
            logits = self.lm_head(x)  # (B, T, V)
            loss = self.loss(logits.view(B * T, -1), targets.reshape(B * T))
            return logits, loss
        if not all_logits:
            x = x[:, -1:, :]  # (B, 1, C): the only position generation needs
        return self.lm_head(x), None

    def _hidden(self, idx: Tensor, start: "int | Tensor",
                kv_cache: Optional[KVCache]) -> Tensor:
        raise NotImplementedError

    def decode_step(self, tokens: Tensor, position: Tensor, kv_cache: KVCache) -> Tensor:
        """The logits (B, V) after ``tokens`` (B, T), the new positions position ..
        position + T - 1 of each sequence, ``position`` a (1,) int64 tensor on the model's
        device: their keys and values are written into ``kv_cache`` there and each
        attends over the positions up to its own (later slots ignored). The arithmetic is
        ``forward(tokens, kv_cache=cache)``'s with ``cache.length`` = position; what
        differs is that the position is read from a tensor, so that the step can be
        captured once and replayed at every position (``nn.decoder``). The cache's
        ``length`` is the caller's to advance. Inference only (under no_grad)."""
        name = type(self).__name__
        self._check_ids(tokens, "tokens")
        if is_grad_enabled():
            raise RuntimeError(f"{name}.decode_step: a KV cache is for inference; run under "
                               f"no_grad() (generate does)")
        if not isinstance(position, Tensor):
            raise TypeError(f"{name}.decode_step: position must be a (1,) int64 tensor, got "
                            f"{type(position).__name__} (a Python int would be frozen into "
                            f"a capture)")
        kv_cache.check_fits(self.config, tokens.shape[0], 0, f"{name}.decode_step")
        T, room = tokens.shape[1], kv_cache.capacity - tokens.shape[1]
        if not dtypes.is_integer(position.dtype) or tuple(position.shape) != (1,):
            raise ValueError(f"{name}.decode_step: expected a position tensor of one integer, "
                             f"shape (1,), got {position.dtype} of shape "
                             f"{tuple(position.shape)}")
        # at once on the CPU; on a GPU read at the next host read. A CPU replay checks
        # again in the attention op, which reads the position; a GPU graph's launches do
        # not (DESIGN, "Capture and replay")
        position._backend.check_in_range(
            position.data, room + 1, f"{name}.decode_step: position",
            f"leaves no room for {T} new tokens in a cache of {kv_cache.capacity} positions "
            f"(expected 0 <= position <= {room})")
        kv_cache.position = position
        try:
            x = self._hidden(tokens, position, kv_cache)  # (B, T, C)
        finally:
            kv_cache.position = None
        last = x if x.shape[1] == 1 else x[:, -1:, :]  # (B, 1, C): the last position
        return self.lm_head(last).squeeze(1)  # (B, V)

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context to ``block_size`` positions, as nanoGPT does to fine-tune a
        checkpoint on shorter sequences: a GPT keeps the first rows of its position table;
        a Llama has none (its positions are computed), so only the limit changes."""
        if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or \
                not 1 <= block_size <= self.config.block_size:
            raise ValueError(f"crop_block_size: block_size must be an int in [1, "
                             f"{self.config.block_size}], got {block_size!r}")
        self._crop(int(block_size))
        self.config.block_size = int(block_size)

    def _crop(self, block_size: int) -> None:
        """What a model keeps of its arrays when its context shrinks (nothing by default)."""

    def _check_ids(self, ids: Tensor, name: str) -> None:
        where = f"{type(self).__name__}.forward"
        if not isinstance(ids, Tensor) or not dtypes.is_integer(ids.dtype):
            what = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
            raise TypeError(f"{where}: {name} must be an integer Tensor of token ids, got "
                            f"{what}")
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(f"{where}: {name} must be (batch, time) with time >= 1, got "
                             f"shape {tuple(ids.shape)}")

    # --- generation ---------------------------------------------------------------------
    @no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: Optional[int] = None, top_p: Optional[float] = None,
                 use_cache: bool = True, window_shift: int = 1,
                 capture: bool = True) -> Tensor:
        """Extend ``idx`` (B, T) by ``max_new_tokens`` sampled tokens: (B, T + max_new_tokens).

        ``temperature`` 0 is greedy; ``top_k`` and ``top_p`` restrict the choice (see
        ``sample_next_token``). Draws come from the seeded stream (``manual_seed``). Call
        ``model.eval()`` first unless you want dropout while sampling. ``generate_tokens``
        yields the same tokens one at a time, for streaming.

        With ``use_cache`` the prompt runs once and each new token then costs one position.
        A prompt longer than ``block_size`` is cropped to its last ``block_size`` tokens.
        When the text outgrows the window, the oldest ``window_shift`` tokens of the
        context are dropped and the rest runs again as a new prompt, from position 0:
        GPT's learned positions are absolute, and a Llama's rotary keys carry the
        positions they were cached at, so neither can keep its cache once the window
        shifts (a Llama would otherwise be asked about positions past the ``block_size``
        it trained on). The default, 1, keeps the last ``block_size`` tokens at every
        step, exactly as nanoGPT crops without a cache, and so reruns the whole window for
        every token past ``block_size``; a larger shift (say ``block_size // 2``) reruns
        it only every ``window_shift`` tokens, with a context of ``block_size + 1 -
        window_shift`` to ``block_size`` tokens. Without a cache the same windows are
        recomputed at every step, so both give the same tokens.

        With ``capture`` (and the cache) each token after the prompt is one replay of a
        captured decode step (``nn.decoder``): the model's ops and the sampling recorded
        once, then run without building a Tensor or a node. The tokens are those of
        ``capture=False``: greedy output token for token, and sampling the same draws
        from the seeded stream. The capture is kept on the model for the next call with
        the same batch size, device, dtype and sampling setting.
        """
        new = list(self.generate_tokens(idx, max_new_tokens, temperature, top_k, top_p,
                                        use_cache, window_shift, capture))
        return cat([idx, *new], dim=1) if new else idx

    def generate_tokens(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
                        top_k: Optional[int] = None, top_p: Optional[float] = None,
                        use_cache: bool = True, window_shift: int = 1,
                        capture: bool = True) -> Iterator[Tensor]:
        """Yield ``max_new_tokens`` sampled tokens after ``idx`` (B, T), each (B, 1), as soon
        as it is drawn: what a streaming generator prints. The arguments are ``generate``'s
        and are checked at the call, not at the first ``next``. Each step runs under
        ``no_grad``; grad mode is the caller's again while the generator is suspended."""
        self._check_ids(idx, "idx")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be an int >= 0, got "
                             f"{max_new_tokens!r}")
        check_sampling(temperature, top_k, top_p)
        block_size = self.config.block_size
        if not isinstance(window_shift, int) or not 1 <= window_shift <= block_size:
            raise ValueError(f"generate: window_shift must be an int in [1, block_size = "
                             f"{block_size}], got {window_shift!r}")
        if use_cache and capture:
            return self._captured_loop(idx, max_new_tokens, temperature, top_k, top_p,
                                       window_shift)
        return self._sample_loop(idx, max_new_tokens, temperature, top_k, top_p, use_cache,
                                 window_shift)

    def _captured_loop(self, idx: Tensor, max_new_tokens: int, temperature: float,
                       top_k: Optional[int], top_p: Optional[float],
                       window_shift: int) -> Iterator[Tensor]:
        """``_sample_loop`` with the cache, every step a captured one's replay
        (``nn.decoder``): the prompt, and the window each time it slides, as one step of
        its length from position 0; each token after it as a one-token step. The tokens
        drawn are kept in a list and joined to the text only when the window slides, so
        that a token costs its replay and nothing else: no op runs outside it."""
        block_size = self.config.block_size
        with no_grad():
            decoder = decoder_for(self, idx.shape[0], idx.device, self.lm_head.weight.dtype,
                                  temperature, top_k, top_p)
        cache = decoder.cache
        length = idx.shape[1]  # of the text: idx and the tokens drawn since
        start = max(0, length - block_size)  # where the context window begins
        drawn: list = []  # tokens drawn and not yet joined to idx
        next_token = None
        decoder.busy = True  # the cache is this stream's until it ends (or is dropped)
        try:
            for _ in range(max_new_tokens):
                if next_token is None or length - start > block_size:
                    if next_token is not None:  # the newest token does not fit: shift
                        start = length - (block_size + 1 - window_shift)
                    idx = cat([idx, *drawn], dim=1) if drawn else idx
                    drawn = []
                    with no_grad():
                        window = idx[:, start:] if start else idx  # the one op outside
                        next_token = decoder.step(window, decoder.position(0))
                    cache.length = length - start
                else:  # the last token drawn, at the next position
                    with no_grad():
                        next_token = decoder.step(next_token, decoder.position(cache.length))
                    cache.length += 1
                drawn.append(next_token)
                length += 1
                yield next_token  # (B, 1)
        finally:
            decoder.busy = False

    def _sample_loop(self, idx: Tensor, max_new_tokens: int, temperature: float,
                     top_k: Optional[int], top_p: Optional[float], use_cache: bool,
                     window_shift: int) -> Iterator[Tensor]:
        block_size = self.config.block_size
        cache = None
        start = max(0, idx.shape[1] - block_size)  # where the context window begins
        for _ in range(max_new_tokens):
            if idx.shape[1] - start > block_size:  # the newest token does not fit: shift
                start = idx.shape[1] - (block_size + 1 - window_shift)
                cache = None
            with no_grad():
                if not use_cache:
                    logits, _ = self(idx[:, start:])
                elif cache is None:  # the first step, or the window moved: run as a prompt
                    cache = KVCache(self.config, idx.shape[0], idx.device,
                                    self.lm_head.weight.dtype)
                    logits, _ = self(idx[:, start:], kv_cache=cache)
                else:
                    logits, _ = self(idx[:, -1:], kv_cache=cache)  # only the newest token
                next_token = sample_next_token(logits[:, -1, :], temperature, top_k, top_p)
                idx = cat([idx, next_token], dim=1)  # (B, T + 1)
            yield next_token  # (B, 1)

    # --- accounting ---------------------------------------------------------------------
    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, tied ones once. ``non_embedding`` leaves out the tables that are
        looked up rather than multiplied (``_lookup_tables``), as nanoGPT reports: GPT's
        position table; an untied token table (a tied one is also the output layer)."""
        n = self.num_parameters()
        if non_embedding:
            n -= sum(t.numel() for t in self._lookup_tables())
        return n

    def _lookup_tables(self) -> list:
        raise NotImplementedError

    def flops_per_token(self, seq_len: Optional[int] = None) -> int:
        """FLOPs of a training step (forward and backward) per token: 6 N for the weight
        matmuls plus 12 L d T for attention's QK^T and AV, d = n_head x head_dim, the query
        side: grouped-query attention shares keys, not work (nanoGPT's estimate, from the
        PaLM paper). The forward pass is a third of it. ``seq_len`` defaults to
        block_size."""
        c = self.config
        T = c.block_size if seq_len is None else seq_len
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * T

    def estimate_mfu(self, fwdbwd_per_iter: int, dt: float, peak_flops: float,
                     seq_len: Optional[int] = None) -> float:
        """Model FLOPs utilisation: achieved FLOP/s of ``fwdbwd_per_iter`` sequences per
        ``dt`` seconds, as a fraction of ``peak_flops`` (FLOP/s, measured on this machine).
        Unlike nanoGPT's, there is no default peak (nanoGPT assumes an A100's 312 TFLOP/s):
        a ratio against the wrong machine's peak would mislead."""
        T = self.config.block_size if seq_len is None else seq_len
        return self.flops_per_token(T) * T * fwdbwd_per_iter / dt / peak_flops

    def configure_optimizers(self, weight_decay: float, learning_rate: float,
                             betas: Tuple[float, float] = (0.9, 0.95),
                             device_type: Optional[str] = None, *, eps: float = 1e-8):
        """AdamW with weight decay on the 2-D weights only (matmuls and embeddings), none on
        biases and norm gains, as nanoGPT configures it. ``device_type`` is accepted for
        nanoGPT's call signature and not needed: the update runs on each parameter's own
        device."""
        from ..optim import configure_adamw  # the optimizer layer sits beside nn, not below
        return configure_adamw(self, weight_decay, learning_rate, betas, eps)
