"""Sample text from a checkpoint: the same as ``minitorch-gpu generate CHECKPOINT [options]``."""
import sys

from minitorch_gpu.cli import main

if __name__ == "__main__":
    sys.exit(main(["generate", *sys.argv[1:]]))
