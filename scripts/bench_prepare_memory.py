"""Peak memory of ``minitorch-gpu prepare`` at corpus sizes far apart: it must not grow.

    python scripts/bench_prepare_memory.py --source ../shared/data/tinyshakespeare.txt \
        --sizes-mb 40 160 [--tokenizer bpe] [--workers 2] [--checkout PATH]

Builds a corpus of many documents of each size from the source text's lines (shuffled, so
the documents differ), prepares it in a fresh cache in a child process, and samples the
proportional resident memory (PSS) of that process and its worker processes every 20 ms
from /proc: the peak of their sum, and the main process's own peak. ``--checkout PATH`` runs another checkout
of the package instead (an older commit, for the figure before a change). One line per
size, then a JSON record.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

DOCUMENT_CHARS = 200_000


def make_corpus(folder: Path, source: str, megabytes: float, seed: int) -> int:
    """Files of about DOCUMENT_CHARS characters of the source's lines in a random order;
    the characters written."""
    lines = Path(source).read_text(encoding="utf-8").splitlines(keepends=True)
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    target, written, index = int(megabytes * 1e6), 0, 0
    while written < target:
        order = rng.permutation(len(lines))
        start = 0
        while start < len(order) and written < target:
            take = order[start:start + DOCUMENT_CHARS // 40]
            text = "".join(lines[i] for i in take)
            (folder / f"doc{index:06d}.txt").write_text(text, encoding="utf-8")
            written += len(text)
            start += len(take)
            index += 1
    return written


def _tree_rss(pid: int) -> Dict[int, int]:
    """The proportional resident bytes (PSS: a page shared by n processes counts 1/n in
    each, so forked workers' shared pages are not counted n times) of ``pid`` and its
    descendants."""
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                pss = next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
            out[p] = pss * 1024
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, StopIteration, ValueError):
            continue
    return out


def measure(corpus: Path, cache: Path, args: argparse.Namespace) -> Dict[str, float]:
    settings = dict(source="text_files", path=str(corpus / "*.txt"), tokenizer=args.tokenizer,
                    vocab_size=args.vocab_size, cache_dir=str(cache))
    if args.checkout is None:  # the keys an older checkout does not know stay out
        settings.update(workers=args.workers, tokenizer_sample_chars=args.sample_chars)
    code = textwrap.dedent(f"""
        import sys
        {'sys.path.insert(0, ' + repr(args.checkout) + ')' if args.checkout else ''}
        from minitorch_gpu.data import DataConfig, prepare
        data = prepare(DataConfig(**{settings!r}), log=lambda line: None)
        print(data.meta["train_tokens"] + data.meta["val_tokens"])
    """)
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    peak_sum = peak_main = 0
    while child.poll() is None:
        rss = _tree_rss(child.pid)
        peak_sum = max(peak_sum, sum(rss.values()))
        peak_main = max(peak_main, rss.get(child.pid, 0))
        time.sleep(0.02)
    tokens = int(child.stdout.read().strip() or 0)
    if child.returncode != 0:
        raise SystemExit(f"prepare failed with exit code {child.returncode}")
    return {"peak_rss_mb": peak_sum / 2**20, "peak_main_rss_mb": peak_main / 2**20,
            "tokens": tokens, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="a text file whose lines make the corpus")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[40, 160])
    parser.add_argument("--tokenizer", default="bpe", choices=["bpe", "char"])
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--sample-chars", type=int, default=10_000_000,
                        help="data.tokenizer_sample_chars")
    parser.add_argument("--workers", type=int, default=None, help="data.workers (null: all cores)")
    parser.add_argument("--checkout", default=None, help="run the package of this checkout")
    args = parser.parse_args()
    results: List[Dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, size in enumerate(args.sizes_mb):
            corpus = Path(tmp, f"corpus{i}")
            chars = make_corpus(corpus, args.source, size, seed=i)
            record = {"size_mb": size, "characters": chars,
                      "documents": len(list(corpus.iterdir())),
                      **measure(corpus, Path(tmp, f"cache{i}"), args)}
            results.append(record)
            print(f"{chars / 1e6:7.1f} M chars in {record['documents']:,} files: peak PSS "
                  f"{record['peak_rss_mb']:7.1f} MiB (main process {record['peak_main_rss_mb']:.1f}"
                  f" MiB), {record['tokens']:,} tokens in {record['seconds']:.1f} s", flush=True)
    growth = results[-1]["peak_rss_mb"] / results[0]["peak_rss_mb"]
    print(json.dumps({"tokenizer": args.tokenizer, "checkout": args.checkout or "this",
                      "results": results, "peak_growth": round(growth, 3)}))


if __name__ == "__main__":
    main()
