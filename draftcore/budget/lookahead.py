"""Whether a lookahead window (a Jacobi window) rides along with a step's candidates.

Window nodes are never accepted: what they buy is future candidates (a Jacobi pool), worth a small
price where a verify is nearly free (a GPU) and not a doubled step (a CPU). So a window is kept
while it adds at most `window_cost` to a step's cost, and once one is dropped a drafter that can
leave its window out is asked for one only now and then (`LookaheadProbe`).
"""
from __future__ import annotations

import numpy as np

from ..validate import positive_int
from .costs import CostTable


def window_pays(costs: CostTable, n_lookahead: int, n_draft: int, window_cost: float) -> bool:
    """Whether `n_lookahead` window nodes add at most `window_cost` to the cost of a step that
    verifies `n_draft` candidates: measured, or, never measured, optimistically guessed (so an
    unmeasured window gets tried)."""
    nodes = np.array([n_draft + 1])
    with_window = float(costs.cost(nodes, n_lookahead)[0])
    without = float(costs.cost(nodes, 0)[0])
    return with_window <= (1.0 + window_cost) * without


class LookaheadProbe:
    """Whether a drafter should build its lookahead window this step, from what the policy last
    decided about one: every step while windows are kept (or none was offered yet); once one is
    dropped, only every `every`-th step, so a window that would pay again is noticed without
    building one every step only to drop it.

        probe = LookaheadProbe()
        probe.wants()          # before proposing: build a window?
        probe.decided(kept)    # the policy's keep_lookahead verdict on one; returns `kept`
    """

    def __init__(self, every: int = 16):
        self.every = positive_int("every", every)
        self._kept: bool | None = None   # the last verdict; None: no window judged yet
        self._since = 0                   # proposals without a window since the last one offered

    def wants(self) -> bool:
        if self._kept is not False:
            return True
        self._since += 1
        if self._since >= self.every:
            self._since = 0
            return True
        return False

    def decided(self, kept: bool) -> bool:
        self._kept, self._since = bool(kept), 0
        return bool(kept)
