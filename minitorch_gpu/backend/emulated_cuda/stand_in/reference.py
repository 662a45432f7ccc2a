"""Real CuPy, to check the stand-in against (``scripts/cupy_tables.py`` and the
conformance tests): no GPU is needed to read its names, signatures and ufunc loops.

The development set-up (README.md) installs it *beside* the environment, not in it:
``pip install --no-deps --target .venv/cupy-reference cupy-cuda13x==14.2.0
cuda-pathfinder``. So the environment itself never imports CuPy (a GPU machine that adds
``.[cuda12]`` gets no second CuPy wheel, and without a GPU ``cuda`` says "install CuPy"
as a user's machine does), while the checks find it here.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

REFERENCE_ENV = "MINITORCH_CUPY_REFERENCE"  # another folder holding the reference CuPy
INSTALL = ("pip install --no-deps --target .venv/cupy-reference cupy-cuda13x==14.2.0 "
           "cuda-pathfinder")


def reference_folder() -> Path:
    """$MINITORCH_CUPY_REFERENCE, else ``cupy-reference`` in the running environment."""
    return Path(os.environ.get(REFERENCE_ENV) or Path(sys.prefix) / "cupy-reference")


def import_real_cupy() -> ModuleType:
    """The real ``cupy`` module: the one importable here, else the reference copy (its
    folder put first on sys.path). ImportError, naming the install, where there is none."""
    loaded = sys.modules.get("cupy")
    if loaded is not None and not getattr(loaded, "stand_in", False):
        return loaded
    try:
        return importlib.import_module("cupy")
    except ImportError:
        pass
    folder = reference_folder()
    if not (folder / "cupy").is_dir():
        raise ImportError(f"real CuPy is neither importable nor in {folder}; install it "
                          f"there with: {INSTALL}")
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    return importlib.import_module("cupy")
