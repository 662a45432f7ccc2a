"""Where a model's time goes, layer by layer, and whether each layer is compute- or
memory-bound on this machine.

    with profile(model) as prof:                 # backward=True also times loss.backward()
        for _ in range(10):
            model(idx, targets)
    print(prof.table())                          # one row per module, and totals
    prof.rows                                    # the same, as Row objects
    prof.export_chrome_trace("trace.json")       # for ui.perfetto.dev or chrome://tracing

costs.py counts each layer's FLOPs and bytes from shapes; roofline.py holds the machine's
ceilings and judges a layer against them; recording.py times module calls and backward
nodes into a Recording (records.py); rows.py and summary.py turn a recording into rows and
totals; table.py, trace.py and plot.py report them; driver.py is ``profile_model``.

Application layer: may import the layers below (``nn``, the engine, ``system/``'s
machine), never ``train/`` or ``bench/`` beside it nor the CLI above.
"""
from .costs import Cost, register_cost
from .driver import profile_model
from .plot import PLOT_HINT
from .recording import Profile, profile
from .roofline import Roofline
from .rows import Row
from .table import SORT_KEYS

__all__ = ["Cost", "PLOT_HINT", "Profile", "Roofline", "Row", "SORT_KEYS", "profile",
           "profile_model", "register_cost"]
