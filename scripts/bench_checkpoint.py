"""Time and peak memory of saving and loading a GPT-2 124M checkpoint (the model and an
AdamW state after one step), this tree's format against another revision's.

    python scripts/bench_checkpoint.py --runs 3 --against 97e7335  # the last revision with the ZIP format

Each save and each load runs in a fresh process: the time is of a plain call, the peak is
tracemalloc's (NumPy reports its arrays to it) over a second call in the same process.
The file is in the page cache when it is loaded, as it is right after a save; saves end
with an fsync. Prints one line per run and the medians.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import zlib
from pathlib import Path

GPT2 = dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=1024)


def old_module(revision: str, folder: Path):
    """minitorch_gpu/checkpoint.py of ``revision`` (the one-file ZIP format), importable."""
    source = subprocess.run(["git", "show", f"{revision}:minitorch_gpu/checkpoint.py"],
                            check=True, capture_output=True, text=True).stdout
    path = folder / "checkpoint_old.py"
    path.write_text(source.replace("from .", "from minitorch_gpu."))
    spec = importlib.util.spec_from_file_location("checkpoint_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def checkpoint_api(which: str, revision: str, folder: Path):
    if which == "new":
        import minitorch_gpu.checkpoint as module
        return module
    return old_module(revision, folder)


def trained_state():
    """A GPT-2 124M's state dict and its AdamW state after one step on 8 tokens."""
    import minitorch_gpu as mt
    from minitorch_gpu import nn
    mt.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(**GPT2))
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4)
    batch = mt.randint(0, GPT2["vocab_size"], (1, 8))
    _, loss = model(batch, batch)
    loss.backward()
    optimizer.step()
    return model.state_dict(), optimizer.state_dict()


def measure(call) -> dict:
    """Seconds of one ``call()`` and the tracemalloc peak (bytes) of a second one."""
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    call()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"seconds": seconds, "peak_bytes": peak}


def child(args) -> None:
    folder = Path(args.folder)
    api = checkpoint_api(args.which, args.against, folder)
    path = folder / f"{args.which}.ckpt"
    if args.child == "save":
        model, optimizer = trained_state()
        result = measure(lambda: api.save_checkpoint(path, model, optimizer, {"iter_num": 1}))
        result["file_bytes"] = path.stat().st_size
    else:
        result = measure(lambda: api.load_checkpoint(path))
        data = path.read_bytes()
        start = time.perf_counter()
        zlib.crc32(data)
        result["crc32_seconds"] = time.perf_counter() - start
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--against", default="97e7335", help="the revision of the old format")
    parser.add_argument("--child", choices=["save", "load"], help=argparse.SUPPRESS)
    parser.add_argument("--which", choices=["old", "new"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for run in range(args.runs):
            for which in ("old", "new"):
                for step in ("save", "load"):
                    done = subprocess.run(
                        [sys.executable, __file__, "--child", step, "--which", which,
                         "--folder", folder, "--against", args.against],
                        check=True, capture_output=True, text=True)
                    result = json.loads(done.stdout.strip().splitlines()[-1])
                    results.setdefault((which, step), []).append(result)
                    print(f"run {run + 1} {which} {step}: {json.dumps(result)}", flush=True)
    for (which, step), runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        peak = statistics.median(r["peak_bytes"] for r in runs) / 2 ** 20
        extra = ""
        if "file_bytes" in runs[0]:
            extra = f", file {runs[0]['file_bytes'] / 2 ** 20:.1f} MiB"
        if "crc32_seconds" in runs[0]:
            extra = f", zlib.crc32 of the whole file " \
                    f"{statistics.median(r['crc32_seconds'] for r in runs):.3f} s"
        print(f"median {which} {step}: {seconds:.2f} s, peak {peak:.0f} MiB{extra}")


if __name__ == "__main__":
    main()
