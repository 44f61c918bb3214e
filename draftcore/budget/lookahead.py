"""Whether a lookahead window (a Jacobi window) rides along with a step's candidates.

Window nodes are never accepted: what they buy is future candidates (a Jacobi pool), worth a small
price where a verify is nearly free (a GPU) and not a doubled step (a CPU). So a window is kept
while it adds at most `window_cost` to a step's cost, and once one is dropped a drafter that can
leave its window out is asked for one only now and then (`LookaheadProbe`). A dropped window rides
anyway now and then, further apart each time (`LookaheadProbe.trial`), so that its cost is measured
again: nothing else re-measures a window that never rides, and one stalled window step would price
windows out for good. A window's first step and its trials run only where the request's floor
affords them (draftcore.budget.cost_aware).
"""
from __future__ import annotations

import numpy as np

from ..validate import positive_int
from .costs import CostTable


def window_pays(costs: CostTable, n_lookahead: int, n_draft: int, window_cost: float) -> bool:
    """Whether `n_lookahead` window nodes add at most `window_cost` to the cost of a step that
    verifies `n_draft` candidates: measured, or guessed from the overhead measured at other sizes
    (never measured: none, so the window gets tried; CostTable._with_window)."""
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
        probe.wants()                # before proposing: build a window?
        probe.trial(step)            # the costs drop this one: does it ride anyway, to be re-measured?
        probe.decided(kept, step)    # the policy's keep_lookahead verdict on one; returns `kept`
    """

    def __init__(self, every: int = 16, trial_every: int = 64, backoff: int = 2):
        self.every = positive_int("every", every)
        self.trial_every = positive_int("trial_every", trial_every)
        self.backoff = positive_int("backoff", backoff)
        self._kept: bool | None = None   # the last verdict; None: no window judged yet
        self._since = 0                   # proposals without a window since the last one offered
        self._gap = self.trial_every      # steps from a drop (or the last trial) to the next trial
        self._next_trial: int | None = None   # None: no window dropped since one was kept

    def wants(self) -> bool:
        if self._kept is not False:
            return True
        self._since += 1
        if self._since >= self.every:
            self._since = 0
            return True
        return False

    def decided(self, kept: bool, step: int = 0) -> bool:
        """The policy kept or dropped a window at `step`; returns `kept`."""
        self._kept, self._since = bool(kept), 0
        if kept:
            self._gap, self._next_trial = self.trial_every, None
        elif self._next_trial is None:
            self._next_trial = step + self._gap
        return bool(kept)

    def trial(self, step: int) -> bool:
        """Whether a window the costs would drop rides anyway at `step`, its cost measured afresh
        (CostTable.remeasure): `trial_every` steps after the first drop, then `backoff` times as
        long after each trial, until a window is kept again (and only where the request's floor
        affords it: CostAwareBudget._window_at_worst). On a CPU, where a window nearly doubles a
        step, that is 4 dear steps in a session's first 1,000, and ever fewer."""
        if self._next_trial is None or step < self._next_trial:
            return False
        self._gap *= self.backoff
        self._next_trial = step + self._gap
        self._since = 0
        return True
