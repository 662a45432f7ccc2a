"""``minitorch-gpu generate``: sample text from a checkpoint, a run, a Hugging Face folder
or ``hf:NAME``, streamed token by token with the source's own tokenizer."""
from __future__ import annotations

import argparse
import sys

from .errors import EXIT_INTERRUPTED, error
from .options import add_memory_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The generate command."""
    gen = sub.add_parser("generate", help="sample text from a checkpoint or a pretrained model",
                         description="Sample text from a checkpoint, a run directory, a "
                                     "Hugging Face model folder or hf:NAME, streaming it to "
                                     "stdout token by token (with the KV cache).")
    gen.add_argument("checkpoint", metavar="SOURCE",
                     help="a .ckpt file, a run directory (its best.ckpt, else last.ckpt), a "
                          "Hugging Face model folder, or hf:NAME (fetched from the Hub)")
    prompt = gen.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default=None, help="the text to continue (default: a "
                                                       "newline)")
    prompt.add_argument("--prompt-file", default=None, help="read the prompt from a file")
    gen.add_argument("--max-new-tokens", type=int, default=500, help="tokens to sample per "
                                                                      "sample (default 500)")
    gen.add_argument("--temperature", type=float, default=0.8,
                     help="below 1 sharper, above 1 more random, 0 greedy (default 0.8)")
    gen.add_argument("--top-k", type=int, default=200,
                     help="sample among the k most likely tokens; 0 for all (default 200)")
    gen.add_argument("--top-p", type=float, default=None,
                     help="sample among the most likely tokens whose probability reaches p")
    gen.add_argument("--num-samples", type=int, default=1, help="samples to draw (default 1)")
    gen.add_argument("--seed", type=int, default=1337, help="random seed (default 1337)")
    gen.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    gen.add_argument("--block-size", type=int, default=None,
                     help="crop the model's context to this many tokens (a smaller KV cache; "
                          "default: the model's own)")
    gen.add_argument("--no-capture", dest="capture", action="store_false",
                     help="run every token through the eager ops instead of replaying the "
                          "captured decode step (the same tokens, slower on small models)")
    add_memory_argument(gen)
    gen.set_defaults(run=_generate)


def _generate(args: argparse.Namespace) -> int:
    """Stream samples from the checkpoint to stdout; the exit code."""
    import minitorch_gpu as mt
    from ..backend import get_backend
    from ..pretrained.inference import stream_text
    from ..nn.sampling import check_sampling

    top_k = args.top_k or None
    try:
        check_sampling(args.temperature, top_k, args.top_p)
        if args.max_new_tokens < 0 or args.num_samples < 1:
            raise ValueError("--max-new-tokens must be >= 0 and --num-samples >= 1")
        if args.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {args.seed}")
        if args.block_size is not None and args.block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {args.block_size}")
        get_backend(args.device)  # before the checkpoint is read
    except (ValueError, RuntimeError) as exc:  # RuntimeError: an unusable device
        return error("generate", str(exc).splitlines()[0])
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as exc:
            return error("generate", f"cannot read --prompt-file: {exc}")
        except UnicodeDecodeError as exc:
            return error("generate", f"--prompt-file {args.prompt_file!r} is not UTF-8 text "
                                     f"(byte {exc.object[exc.start]:#04x} at offset "
                                     f"{exc.start})")
    else:
        prompt = "\n" if args.prompt is None else args.prompt
    from ..nn.memory import MemoryLimitError
    from ..pretrained import PretrainedError, load_pretrained

    try:  # the weights and the KV cache of a batch of one, checked before they are read
        loaded = load_pretrained(args.checkpoint, args.device, block_size=args.block_size,
                                 check_memory=not args.ignore_memory_check,
                                 memory_advice="pass --ignore-memory-check to try anyway, "
                                               "or --block-size")
    except (PretrainedError, MemoryLimitError) as exc:
        return error("generate", str(exc))
    model, tokenizer = loaded.model, loaded.tokenizer
    if tokenizer is None:
        return error("generate", f"{loaded.path} has no tokenizer (tokenizer.json, or "
                                 f"vocab.json and merges.txt): add one to sample text")
    mt.manual_seed(args.seed)
    out = sys.stdout
    try:
        for sample in range(args.num_samples):
            # checked before the prompt is printed: a refused prompt prints nothing
            pieces = stream_text(model, tokenizer, prompt, args.max_new_tokens,
                                 args.temperature, top_k, args.top_p, capture=args.capture)
            out.write(prompt)
            for piece in pieces:
                out.write(piece)
                out.flush()
            out.write("\n" if sample == args.num_samples - 1 else "\n---------------\n")
            out.flush()
    except ValueError as exc:  # a prompt the tokenizer cannot encode
        return error("generate", str(exc))
    except KeyboardInterrupt:
        out.write("\n")
        return EXIT_INTERRUPTED
    return 0
