"""Checkpoint files: a model's state dict, an optimizer's state and JSON metadata in one file.

A checkpoint is a safetensors file (safetensors_file.py), written atomically and read
without running any code: every array is a tensor of its own, named by its part and place
(``model.transformer.wte.weight``, ``optimizer.state.0.exp_avg``), and the rest is JSON in
the header's ``__metadata__`` (layout.py). CRC-32s of the header and of every tensor are
checked on load. ZIP checkpoints of formats 1 and 2 still load (legacy_zip.py).

>>> save_checkpoint("out/last.ckpt", model.state_dict(), opt.state_dict(), {"iter": 500})
>>> ckpt = load_checkpoint("out/last.ckpt")
>>> model.load_state_dict(ckpt.model); opt.load_state_dict(ckpt.optimizer)

Inputs-and-outputs layer: may import ``nn``/``optim``, the engine and the foundation;
nothing beside it, and never ``train/``, ``profiler/``, ``bench/`` or the CLI above.
"""
from .errors import CheckpointError
from .layout import FORMAT, VERSION
from .load import Checkpoint, TableCheck, load_checkpoint, read_checkpoint_meta
from .save import save_checkpoint
from .tree import decode_tree, encode_tree

__all__ = ["Checkpoint", "CheckpointError", "FORMAT", "VERSION", "TableCheck", "decode_tree",
           "encode_tree", "load_checkpoint", "read_checkpoint_meta", "save_checkpoint"]
