"""Text generation from a checkpoint the trainer wrote.

A checkpoint carries everything generation needs: the model's shape (a GPT or a Llama),
its weights and the tokenizer, so no config file or data cache is read::

    model, tokenizer, meta = load_for_inference("checkpoints/shakespeare_char", "cpu")
    for piece in stream_text(model, tokenizer, "ROMEO:", max_new_tokens=200, top_k=40):
        print(piece, end="", flush=True)
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

from ..backend import dtypes
from ..checkpoint import CheckpointError, load_checkpoint
from ..creation import tensor
from ..data import tokenizer_from_json
from ..nn.memory import check_model_arrays
from ..nn.build import DTYPES, build_model
from ..nn import CausalLM, GPTConfig

__all__ = ["checkpoint_model", "resolve_checkpoint", "load_for_inference", "stream_text"]

# the (vocab_size, n_embd) arrays: a GPT's and a Llama's token embedding and lm_head (one
# array when tied, two when not)
VOCAB_ROWS = ("transformer.wte.weight", "model.embed_tokens.weight", "lm_head.weight")
# load_for_inference's check_memory(model_config, meta), before any array is read
MemoryCheck = Callable[[GPTConfig, Dict[str, Any]], None]


def resolve_checkpoint(path: Union[str, Path]) -> Path:
    """A checkpoint file, or for a run directory its best.ckpt (else its last.ckpt)."""
    path = Path(path)
    if path.is_dir():
        for name in ("best.ckpt", "last.ckpt"):
            if (path / name).is_file():
                return path / name
        raise CheckpointError(f"{path} is a directory with no best.ckpt or last.ckpt in it")
    return path


def checkpoint_model(meta: Dict[str, Any], path: Union[str, Path]) -> Tuple[GPTConfig, Any]:
    """(model shape, tokenizer) a checkpoint's metadata describes; CheckpointError (one
    line) when either is missing or unusable."""
    try:
        return GPTConfig.from_dict(meta["model_config"]), tokenizer_from_json(meta["tokenizer"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: the checkpoint has no usable model config or "
                              f"tokenizer ({type(exc).__name__}: {exc})") from None


def load_for_inference(path: Union[str, Path], device: str = "cpu", *,
                       keep_padding: bool = False,
                       check_memory: Optional[MemoryCheck] = None
                       ) -> Tuple[CausalLM, Any, Dict[str, Any]]:
    """(model in eval mode on ``device``, tokenizer, checkpoint metadata). Raises
    CheckpointError (one line) for a missing, truncated or foreign file, and for one whose
    arrays are not the model (a GPT or a Llama) its metadata describes (names, shapes,
    dtypes, bytes against the file's size): checked from the file's header before any array
    is read or any model built, so a metadata claiming 10^9 layers costs nothing.

    ``check_memory(model_config, meta)``, when given, runs after that check and before
    any array is read: it may refuse (``memory.check_memory``); what it raises is passed on.

    A vocabulary padded past the tokenizer's (``model.pad_vocab_to``) is cut back to it, so
    sampling never draws an id with no text; ``keep_padding=True`` keeps the model exactly
    as trained (its loss then matches the trainer's to the last digit)."""
    path = resolve_checkpoint(path)
    found: Dict[str, Any] = {}

    def check(meta: Dict[str, Any], table: Dict[str, Any], file_size: int) -> None:
        found["config"], found["tokenizer"] = checkpoint_model(meta, path)
        # the trainer keeps float32 weights for float32 and bf16 runs; a file saved by
        # other means may say no dtype: then any float, cast by load_state_dict
        try:
            check_model_arrays(found["config"], DTYPES.get(meta.get("dtype")), table, file_size)
        except ValueError as exc:
            raise CheckpointError(f"{path}: the weights do not fit the model it describes "
                                  f"({exc})") from None
        if check_memory is not None:
            check_memory(found["config"], meta)

    ckpt = load_checkpoint(path, load_optimizer=False, check=check)
    meta, model_config, tokenizer = ckpt.meta, found["config"], found["tokenizer"]
    weights = ckpt.model
    vocab = tokenizer.vocab_size
    if model_config.vocab_size > vocab and not keep_padding:
        # a vocabulary padded past the tokenizer's (model.pad_vocab_to, as nanoGPT's 50304):
        # the padding ids decode to nothing, so they are cut from the model and never drawn
        # (sampling among the real tokens, as if the padding's logits were -inf); their
        # shapes were checked against model_config before anything was read
        weights = {key: value[:vocab] if key in VOCAB_ROWS else value
                   for key, value in weights.items()}
        model_config = dataclasses.replace(model_config, vocab_size=vocab)
    model = build_model(model_config, DTYPES.get(meta.get("dtype"), dtypes.float32))
    try:
        model.load_state_dict(weights)
    except (RuntimeError, ValueError, TypeError) as exc:
        detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise CheckpointError(f"{path}: the weights do not fit the model it describes "
                              f"({detail[:400]})") from None
    return model.to(device).eval(), tokenizer, meta


def stream_text(model: CausalLM, tokenizer: Any, prompt: str, max_new_tokens: int,
                temperature: float = 1.0, top_k: Optional[int] = None,
                top_p: Optional[float] = None, capture: bool = True) -> Iterator[str]:
    """Yield the text of each new token as it is sampled (the prompt not included), each
    a replay of the captured decode step unless ``capture`` is False (``generate``).

    A byte-level BPE token may end inside a multi-byte character: such tokens wait until
    the character is complete, so no half character is ever printed. Each token is decoded
    once (with the few still waiting), so a long sample costs no more per token than a
    short one. The prompt and settings are checked at the call, not at the first ``next``,
    so a caller can refuse them before printing anything.
    """
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give at least one character "
                         "(for example a newline)")
    device = model.lm_head.weight.device
    idx = tensor([ids], device=device)  # (1, T)
    tokens = model.generate_tokens(idx, max_new_tokens, temperature, top_k, top_p,
                                   capture=capture)
    return _decode_as_whole_characters(tokens, tokenizer)


def _decode_as_whole_characters(tokens: Iterator[Any], tokenizer: Any) -> Iterator[str]:
    pending: list = []  # tokens whose bytes do not yet end on a whole character
    for token in tokens:
        pending.append(int(token.item()))
        text = tokenizer.decode(pending)
        if text.endswith("\ufffd") and len(pending) < 8:  # a UTF-8 character is <= 4 bytes
            continue
        pending = []
        yield text
    if pending:
        yield tokenizer.decode(pending)
