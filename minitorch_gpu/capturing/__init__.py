"""Capture and replay: a function over tensors run once while its ops are recorded, then
replayed as a flat list of ``Function.forward`` calls on raw arrays.

An eager op costs the Python around its arithmetic: argument checks, dispatch, a Tensor, a
graph node. For a model's decode step (one token through every layer) that is most of the
time on small models, and the same work repeats for every token with the same shapes. A
captured function pays it once::

    step = mt.capture(lambda token, pos: model.decode_step(token, pos, cache))
    logits = step(token, pos)        # first call: runs eagerly and records its ops
    logits = step(token2, pos2)      # later calls: the recorded forwards, nothing else

What is recorded is the sequence of ``Function.apply`` calls (every op's way into the
engine): which forward, its ``ctx``, and where each argument comes from: an input of the
call, the output of an earlier op, or a constant (a parameter's array, a KV cache buffer,
a number, an array made by a factory such as ``arange``). A replay runs those forwards in
order on the new inputs' arrays: no Tensor, no node, no check is built. Arrays that live
outside the call (parameters, caches) are read and written where they are, so a replay
sees their current values and an op that writes into a cache writes into it again.

What a replay cannot do faithfully is refused when capturing, with an error that names it
(``CaptureError``):

* a host read outside an op (``item()``, ``tolist()``, ``bool(t)``, ``.numpy()``, an op
  that reads a size back): its value would be frozen into the replay, and a Python branch
  on it would never be taken again;
* a random draw outside an op (``randn``...): its numbers would be the same every time.
  Random ops (dropout, ``multinomial``) draw inside their forward, so each replay draws
  fresh numbers from the seeded stream, the same ones eager calls would draw;
* an array computed outside an op (a shortcut that wraps a new array in a Tensor without a
  node), or an in-place update outside one (``add_``, ``t[i] = v``): the replay would not
  redo it.

Python values the function computes (ints, floats, a slice bound) are constants of the
capture: anything that changes from call to call must be a tensor input. A call whose
inputs differ in shape, dtype or device from every capture so far is captured again (up
to ``max_captures``, the oldest dropped); a parameter whose array was replaced (``load_
state_dict`` into new arrays, ``.to()``) makes the capture stale and it is captured again.
A replay never waits for the device or reads a value back unless an op's forward does.

On the CPU a replay's ops allocate their results as eagerly run ones do; the arrays of one
replay are at most those of the captured call (``nbytes``), freed when the next replay
starts except the outputs handed back. On a GPU a capture is a CUDA Graph
(``_GraphCapture``): the capturing call runs on a capturing stream, and a replay is one
``Graph.launch`` between copies of the inputs in and the results out (docs/DESIGN.md,
"Capture and replay").

The folder is part of the engine layer: it imports the engine's autograd, tensor and amp
and the backend below; ``recorder.py`` records a capturing call, ``replay.py`` holds what
a replay runs (the op list, or a CUDA Graph on a GPU), ``function.py`` is
``CapturedFunction``.
"""
from .function import CapturedFunction, capture, is_capturing
from .recorder import CaptureError

__all__ = ["capture", "CapturedFunction", "CaptureError", "is_capturing"]
