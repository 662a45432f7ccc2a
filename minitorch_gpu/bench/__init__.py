"""Measuring tools: how fast this machine trains and samples, against PyTorch.

``runner.py`` (``minitorch-gpu bench``: the cases, each side in a fresh process),
``table.py`` (its records as a table), ``torch_reference.py`` (GPT-2 and the Llama in
PyTorch with this project's parameter names: the reference side, and the tests' oracle).
The machine's ceilings the MFU is measured against are ``system/machine.py``'s.

Application layer: it may import the engine, ``nn``/``optim``, the layer below them and the
foundation, never ``train``/``profiler`` beside it nor the CLI above it.
"""
