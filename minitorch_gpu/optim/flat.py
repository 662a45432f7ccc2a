"""AdamW's moments, gradients and step for a whole parameter group as flat arrays.

A GPT has dozens of parameter tensors, most of them small. Updating them one by one costs
a dozen array calls per tensor per step (about 700 for the 4-layer Shakespeare GPT), each
with its Python and dispatch overhead. ``FlatGroup`` keeps a group's two moments as two
contiguous arrays (each parameter's state tensors are views of its slice), copies the
gradients into a third, and computes the step into a fourth: one chain of a dozen calls per
group, on arrays long enough to split over the CPU's cores. Each parameter then subtracts
its slice of the step from its own array: parameters keep their storage (a model's tensors,
tied weights and views of them stay what they were).

If ``load_state_dict`` (or anything) replaces a state tensor, the views no longer match and
the group is laid out again from the current values, so nothing is lost.
"""
from __future__ import annotations

from typing import Any, List, Sequence

from ..tensor import Tensor

__all__ = ["FlatGroup"]


class FlatGroup:
    """The AdamW state ``states`` (dicts with "exp_avg" and "exp_avg_sq" Tensors) of
    ``params`` (one device, one dtype), moved into flat arrays of ``state_dtype``."""

    def __init__(self, params: Sequence[Tensor], states: Sequence[dict], state_dtype: Any):
        xp = params[0].backend.xp
        self.params = list(params)
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.numel())
        total = self.offsets[-1]
        self.grad = xp.empty(total, dtype=params[0].dtype)
        self.exp_avg = xp.empty(total, dtype=state_dtype)
        self.exp_avg_sq = xp.empty(total, dtype=state_dtype)
        self.scratch = xp.empty(total, dtype=state_dtype)  # the step, then each param's slice
        self.views: List[tuple] = []
        for i, (p, state) in enumerate(zip(params, states)):
            moments = []
            for key, flat in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
                moment = self._slice(flat, i)
                moment[...] = state[key].data
                state[key] = Tensor._make(moment, p.backend, False)
                moments.append(moment)
            self.views.append(tuple(moments))

    def _slice(self, flat: Any, i: int) -> Any:
        """Parameter ``i``'s part of ``flat``, in its shape (a view)."""
        return flat[self.offsets[i]:self.offsets[i + 1]].reshape(self.params[i].shape)

    def holds(self, params: Sequence[Tensor], states: Sequence[dict]) -> bool:
        """Whether ``states`` of ``params`` are still this group's views."""
        return len(params) == len(self.params) and all(
            p is mine and state["exp_avg"].data is m and state["exp_avg_sq"].data is v
            for p, mine, state, (m, v) in zip(params, self.params, states, self.views))

    def gather_grads(self, grads: Sequence[Any]) -> None:
        """Copy each parameter's gradient into its slice of the flat gradient."""
        for i, grad in enumerate(grads):
            self._slice(self.grad, i)[...] = grad

    def step_of(self, i: int) -> Any:
        """Parameter ``i``'s slice of the step (in ``scratch``), in its shape."""
        return self._slice(self.scratch, i)

    def pieces(self, parts: int) -> List[range]:
        """Up to ``parts`` runs of consecutive parameters with about equal element counts."""
        total, pieces, first = self.offsets[-1], [], 0
        for i in range(1, len(self.params) + 1):
            if self.offsets[i] >= total * (len(pieces) + 1) / parts or i == len(self.params):
                pieces.append(range(first, i))
                first = i
        return pieces
