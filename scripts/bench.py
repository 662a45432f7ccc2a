"""Training-step and generation speed of the GPT and the Llama, optionally against PyTorch.

The same as ``minitorch-gpu bench`` (see ``minitorch_gpu/bench/runner.py``):

    python scripts/bench.py --vs-torch --threads 2
    python scripts/bench.py --case small --steps 20
"""
import sys

from minitorch_gpu.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
