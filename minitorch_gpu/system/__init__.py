"""The machine the process runs on, below the engine: files written atomically
(``atomic.py``: the write-rename every checkpoint, run file, download and cache uses) and the
machine's measured ceilings (``machine.py``: matmul peak and copy bandwidth per device and
dtype, cached; BLAS threads; the libraries that run the arithmetic).

Foundation layer, beside ``backend/``: it may import ``backend/`` and nothing else of the
package, so every layer above (data, the profiler, the trainer, the bench) may import it.
"""
