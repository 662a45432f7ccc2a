"""``minitorch-gpu export``: a run or checkpoint as a Hugging Face model folder."""
from __future__ import annotations

import argparse

from .errors import error


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The export command."""
    exp = sub.add_parser("export", help="write a run as a Hugging Face model folder",
                         description="Write a run directory or checkpoint (or any source "
                                     "generate reads) as a Hugging Face model folder: "
                                     "config.json, model.safetensors, tokenizer.json, which "
                                     "transformers' AutoModelForCausalLM.from_pretrained "
                                     "loads with the same logits.")
    exp.add_argument("source", help="a run directory, a .ckpt file, a Hugging Face model "
                                     "folder or hf:NAME")
    exp.add_argument("out_dir", help="the folder to write (new or empty)")
    exp.add_argument("--format", choices=("hf",), default="hf",
                     help="hf: Hugging Face's layout (the only one, the default)")
    exp.add_argument("--dtype", choices=("float32", "bf16"), default="float32",
                     help="the stored weights' dtype (default float32)")
    exp.add_argument("--overwrite", action="store_true",
                     help="write into a folder that is not empty")
    exp.set_defaults(run=_export)


def _export(args: argparse.Namespace) -> int:
    from ..nn.memory import MemoryLimitError
    from ..pretrained import PretrainedError
    from ..pretrained.hf_export import export_hf
    try:
        out = export_hf(args.source, args.out_dir, dtype=args.dtype, overwrite=args.overwrite)
    except (PretrainedError, MemoryLimitError) as exc:
        return error("export", str(exc))
    except OSError as exc:
        return error("export", f"cannot write {args.out_dir}: {exc}")
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    print(f"wrote {out} ({files}); load it with "
          f"transformers' AutoModelForCausalLM.from_pretrained({str(out)!r}) or "
          f"minitorch-gpu generate {out}")
    return 0
