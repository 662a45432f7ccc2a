"""``python -m minitorch_gpu``: the ``minitorch-gpu`` command."""
from .cli import entry_point

entry_point()
