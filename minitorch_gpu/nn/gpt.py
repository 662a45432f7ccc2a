"""GPT-2, as nanoGPT writes it, on this framework's modules.

The parameter names are GPT-2's (``transformer.wte.weight``, ``transformer.h.0.attn.c_attn
.weight``, ``lm_head.weight``, ...), so a state dict moves key by key between this model
and nanoGPT's. Generation keeps a key/value cache: the prompt is run once, then every new
token costs one position of work.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Iterator, Optional, Tuple

from ..autograd import is_grad_enabled, no_grad
from ..backend import dtypes
from ..creation import arange, zeros
from ..ops import cat
from ..ops.attention import cached_causal_attention
from ..tensor import Tensor
from . import init
from .containers import ModuleDict, ModuleList
from .layers import (GELU, CrossEntropyLoss, Dropout, Embedding, LayerNorm, Linear,
                     PackedCausalAttention)
from .module import Module
from .parameter import Parameter
from .sampling import check_sampling, sample_next_token


@dataclass
class GPTConfig:
    """The shape of a GPT. The defaults are GPT-2 small (124M parameters)."""

    block_size: int = 1024  # the longest sequence the model sees: rows of the position table
    vocab_size: int = 50304  # GPT-2's 50257 tokens padded up to a multiple of 64 (faster GEMMs)
    n_layer: int = 12  # transformer blocks stacked on the residual stream
    n_head: int = 12  # attention heads per block; each works on n_embd // n_head dims
    n_embd: int = 768  # width of the residual stream (the embedding size)
    dropout: float = 0.0  # on embeddings, attention weights and residual branches; 0 to pretrain
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2; False is a bit faster and better

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int):
                if not isinstance(value, numbers.Integral) or isinstance(value, bool) \
                        or value < 1:
                    raise ValueError(f"GPTConfig: {f.name} must be a positive int, got {value!r}")
                setattr(self, f.name, int(value))  # NumPy integers become Python ints
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd ({self.n_embd}) must be divisible by n_head "
                             f"({self.n_head})")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.bias, bool):
            raise ValueError(f"GPTConfig: bias must be true or false, got {self.bias!r}")


class KVCache:
    """Keys and values of every layer for the positions processed so far, in buffers of
    ``block_size`` positions allocated once: (B, n_head, block_size, head_dim) per layer.

    ``GPT.forward(idx, kv_cache=cache)`` runs ``idx`` as the positions after the cached
    ones and appends their keys and values (``ops.attention.cached_causal_attention``).
    """

    def __init__(self, config: GPTConfig, batch_size: int, device: object = "cpu",
                 dtype: object = dtypes.float32) -> None:
        shape = (batch_size, config.n_head, config.block_size, config.n_embd // config.n_head)
        self.keys = [zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.values = [zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.shape = shape  # (B, n_head, capacity, head_dim) of every layer's buffers
        self.n_layer = config.n_layer
        self.capacity = config.block_size
        self.batch_size = batch_size
        self.length = 0  # positions held

    def check_fits(self, config: GPTConfig, batch: int, new: int) -> None:
        """ValueError unless this cache was made for a model of ``config`` and a batch of
        ``batch`` sequences, and has room for ``new`` more positions."""
        expected = (self.n_layer, self.shape[1], self.shape[3], self.capacity)
        actual = (config.n_layer, config.n_head, config.n_embd // config.n_head,
                  config.block_size)
        if expected != actual:
            raise ValueError(f"GPT.forward: the kv_cache was made for n_layer, n_head, "
                             f"head_dim, block_size = {expected}, the model has {actual}")
        if batch != self.batch_size:
            raise ValueError(f"GPT.forward: the kv_cache holds {self.batch_size} sequences, "
                             f"idx has {batch}")
        if self.length + new > self.capacity:
            raise ValueError(f"GPT.forward: the kv_cache is full: it holds {self.length} of "
                             f"{self.capacity} positions and {new} more do not fit (start a "
                             f"new cache with the last tokens, as generate does)")


class CausalSelfAttention(Module):
    """Multi-head self-attention where each position attends to itself and the positions
    before it. One fused op (``core``) does softmax(q k^T / sqrt(hs)) v for all heads at once,
    reading the heads in place from c_attn's (B, T, 3C) output."""

    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v
        self.core = PackedCausalAttention(config.n_head, config.dropout)
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = Dropout(config.dropout)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.layer = layer  # which KVCache slot is ours

    def forward(self, x: Tensor, kv_cache: Optional[KVCache] = None) -> Tensor:
        qkv = self.c_attn(x)  # (B, T, 3C): q, k, v side by side
        if kv_cache is None:
            y = self.core(qkv)  # (B, T, C), heads side by side
        else:
            y = self._cached_attention(qkv, kv_cache)
        return self.resid_dropout(self.c_proj(y))

    def _cached_attention(self, qkv: Tensor, kv_cache: KVCache) -> Tensor:
        """Attention of these T positions over the cached ones and themselves (inference):
        one op that appends their keys and values to this layer's cache buffers."""
        return cached_causal_attention(qkv, kv_cache.keys[self.layer],
                                       kv_cache.values[self.layer], kv_cache.length,
                                       self.n_head)  # (B, T, C)


class MLP(Module):
    """The feed-forward half of a block: n_embd -> 4 n_embd -> GELU (tanh) -> n_embd."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = GELU(approximate="tanh")
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(Module):
    """A pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, kv_cache: Optional[KVCache] = None) -> Tensor:
        x = x + self.attn(self.ln_1(x), kv_cache)
        return x + self.mlp(self.ln_2(x))


class GPT(Module):
    """GPT-2: token and position embeddings, ``n_layer`` blocks, a final LayerNorm, and a
    language-model head whose weight is the token embedding's (weight tying).

    >>> model = GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128))
    >>> logits, loss = model(idx, targets)       # idx, targets: (B, T) int64
    >>> out = model.generate(idx[:, :8], max_new_tokens=50, temperature=0.8, top_k=20)
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT: expected a GPTConfig, got {type(config).__name__}")
        self.config = config = replace(config)  # our own copy: crop_block_size edits it
        self.transformer = ModuleDict(dict(
            wte=Embedding(config.vocab_size, config.n_embd),
            wpe=Embedding(config.block_size, config.n_embd),
            drop=Dropout(config.dropout),
            h=ModuleList(Block(config, i) for i in range(config.n_layer)),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        self.loss = CrossEntropyLoss(ignore_index=-1)
        # weight tying: one (vocab, n_embd) matrix embeds tokens and scores them
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 n_layer), as the residual stream
        # adds two of them per block
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: Module) -> None:
        if isinstance(module, Linear):
            init.normal_(module.weight, 0.0, 0.02)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, Embedding):
            init.normal_(module.weight, 0.0, 0.02)

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
        self._check_ids(idx, "idx")
        B, T = idx.shape
        start = 0
        if kv_cache is not None:
            if is_grad_enabled():
                raise RuntimeError("GPT.forward: kv_cache is for inference; run under no_grad() "
                                   "(generate does)")
            kv_cache.check_fits(self.config, B, T)
            start = kv_cache.length
        if T > self.config.block_size:
            raise ValueError(f"GPT.forward: cannot run a sequence of length {T}: the block "
                             f"size is {self.config.block_size} (crop the input to its last "
                             f"{self.config.block_size} tokens)")
        if targets is not None:
            self._check_ids(targets, "targets")
            if tuple(targets.shape) != (B, T):
                raise ValueError(f"GPT.forward: targets have shape {tuple(targets.shape)}, "
                                 f"expected idx's shape {(B, T)}")
        pos = arange(start, start + T, device=idx.device)  # (T,)
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(pos))  # (B, T, C) + (T, C)
        for block in tr.h:
            x = block(x, kv_cache)
        x = tr.ln_f(x)
        if kv_cache is not None:
            kv_cache.length += T
        if targets is not None:
            logits = self.lm_head(x)  # (B, T, V)
            loss = self.loss(logits.view(B * T, -1), targets.reshape(B * T))
            return logits, loss
        if not all_logits:
            x = x[:, -1:, :]  # (B, 1, C): the only position generation needs
        return self.lm_head(x), None

    def _check_ids(self, ids: Tensor, name: str) -> None:
        if not isinstance(ids, Tensor) or not dtypes.is_integer(ids.dtype):
            what = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
            raise TypeError(f"GPT.forward: {name} must be an integer Tensor of token ids, got "
                            f"{what}")
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(f"GPT.forward: {name} must be (batch, time) with time >= 1, got "
                             f"shape {tuple(ids.shape)}")

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context to ``block_size`` positions (keeping the first rows of the
        position table), as nanoGPT does to fine-tune a checkpoint on shorter sequences."""
        if not isinstance(block_size, int) or not 1 <= block_size <= self.config.block_size:
            raise ValueError(f"crop_block_size: block_size must be an int in [1, "
                             f"{self.config.block_size}], got {block_size!r}")
        wpe = self.transformer.wpe
        wpe.weight = Parameter(wpe.weight[:block_size].contiguous())
        wpe.num_embeddings = block_size
        self.config.block_size = block_size

    # --- generation ---------------------------------------------------------------------
    @no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: Optional[int] = None, top_p: Optional[float] = None,
                 use_cache: bool = True, window_shift: int = 1) -> Tensor:
        """Extend ``idx`` (B, T) by ``max_new_tokens`` sampled tokens: (B, T + max_new_tokens).

        ``temperature`` 0 is greedy; ``top_k`` and ``top_p`` restrict the choice (see
        ``sample_next_token``). Draws come from the seeded stream (``manual_seed``). Call
        ``model.eval()`` first unless you want dropout while sampling. ``generate_tokens``
        yields the same tokens one at a time, for streaming.

        With ``use_cache`` the prompt runs once and each new token then costs one position.
        A prompt longer than ``block_size`` is cropped to its last ``block_size`` tokens.
        When the text outgrows the window, the oldest ``window_shift`` tokens of the
        context are dropped and the rest runs again as a new prompt (positions are absolute,
        so cached keys cannot be reused once they shift). The default, 1, keeps the last
        ``block_size`` tokens at every step, exactly as nanoGPT crops without a cache, and
        so reruns the whole window for every token past ``block_size``; a larger shift
        (say ``block_size // 2``) reruns it only every ``window_shift`` tokens, with a
        context of ``block_size + 1 - window_shift`` to ``block_size`` tokens. Without a
        cache the same windows are recomputed at every step, so both give the same tokens.
        """
        new = list(self.generate_tokens(idx, max_new_tokens, temperature, top_k, top_p,
                                        use_cache, window_shift))
        return cat([idx, *new], dim=1) if new else idx

    def generate_tokens(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
                        top_k: Optional[int] = None, top_p: Optional[float] = None,
                        use_cache: bool = True, window_shift: int = 1) -> Iterator[Tensor]:
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
        return self._sample_loop(idx, max_new_tokens, temperature, top_k, top_p, use_cache,
                                 window_shift)

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
        """Parameters, tied ones once. ``non_embedding`` leaves out the position table (the
        token table stays: it is also the output layer), as nanoGPT reports."""
        n = self.num_parameters()
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: Optional[int] = None) -> int:
        """FLOPs of a training step (forward and backward) per token: 6 N for the weight
        matmuls plus 12 L d T for attention's QK^T and AV (nanoGPT's estimate, from the
        PaLM paper). The forward pass is a third of it. ``seq_len`` defaults to block_size."""
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
        biases and LayerNorm gains, as nanoGPT configures it. ``device_type`` is accepted
        for nanoGPT's call signature and not needed: the update runs on each parameter's
        own device."""
        from ..optim import configure_adamw  # the optimizer layer sits beside nn, not below
        return configure_adamw(self, weight_decay, learning_rate, betas, eps)
