"""``hf:NAME``: a model folder fetched from the Hugging Face Hub and cached there.

``huggingface_hub`` downloads only what this project reads (config, safetensors weights,
tokenizer files) into its own cache (``$HF_HOME``, ~/.cache/huggingface), and answers from
that cache with no network once a name has been fetched. Offline with nothing cached, the
error is one line saying where to put the folder instead.
"""
from __future__ import annotations

import re
from pathlib import Path

from .hf_config import PretrainedError

__all__ = ["HUB_PREFIX", "hub_folder"]

HUB_PREFIX = "hf:"
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# what from_pretrained reads; the Hub's repos also hold pickles and other frameworks' files
PATTERNS = ["config.json", "generation_config.json", "*.safetensors",
            "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
            "vocab.json", "merges.txt"]


def hub_folder(name: str) -> Path:
    """The local folder of the Hub model ``name`` (``gpt2``, ``owner/model``), fetched
    when it is not cached yet."""
    if not _REPO.match(name) or ".." in name:
        raise PretrainedError(f"hf:{name}: expected a Hub model name such as hf:gpt2 or "
                              f"hf:owner/model")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise PretrainedError(f"hf:{name} needs the huggingface_hub package (pip install "
                              f"huggingface_hub), or pass a local model folder") from None
    try:
        return Path(snapshot_download(repo_id=name, allow_patterns=PATTERNS))
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, gated, HTTP errors
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PretrainedError(
            f"hf:{name}: cannot fetch it from the Hugging Face Hub ({type(exc).__name__}"
            f"{': ' + reason[:200] if reason else ''}); offline, download the model folder "
            f"(config.json, model.safetensors, tokenizer.json) from "
            f"https://huggingface.co/{name} elsewhere and pass the folder's path") from None
