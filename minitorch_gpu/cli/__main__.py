"""``python -m minitorch_gpu.cli``: the ``minitorch-gpu`` command."""
from . import entry_point

entry_point()
