"""Train from a YAML config: the same as ``minitorch-gpu train CONFIG [options]``."""
import sys

from minitorch_gpu.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
