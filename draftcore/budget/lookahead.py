"""Whether a lookahead window (a Jacobi window) rides along with a step's candidates: one part, its
probe, its experiments and their charge.

Window nodes are never accepted: what they buy is future candidates (a Jacobi pool), worth a small
price where a verify is nearly free (a GPU) and not a doubled step (a CPU). So a window is kept
while it adds at most `window_cost` to a step's cost, and once one is dropped a drafter that can
leave its window out is asked for one only now and then (`LookaheadProbe`). A dropped window rides
anyway now and then, further apart each time (`LookaheadProbe.trial`), so that its cost is measured
again: nothing else re-measures a window that never rides, and one stalled window step would price
windows out for good. A window's first step and its trials are experiments: they run only where the
request's floor affords them at their worst (`Windows.at_worst`), and are charged to it whole
(`Windows.charge`).

    windows = Windows(window_cost=0.1, trial_every=64, backoff=2)
    windows.wants()                                         # before proposing: build a window?
    windows.keep(costs, n_lookahead, n_draft, step, guard, aftermath)   # does this one ride?
    windows.charge(tree, path, seconds, guard)              # after the step: True if charged as an experiment
"""
from __future__ import annotations

import numpy as np

from ..validate import positive_int
from .constants import PROBE_EVERY
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

    def __init__(self, every: int = PROBE_EVERY, trial_every: int = 64, backoff: int = 2):
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


class Windows:
    """The window decision: `window_cost`, the probe and its trials, and the experiment in flight."""

    def __init__(self, window_cost: float, trial_every: int, backoff: int):
        self.window_cost = window_cost
        self.probe = LookaheadProbe(trial_every=trial_every, backoff=backoff)
        self._experiment = None   # (its price at the worst in root-only steps, a root-only step's seconds)

    def wants(self) -> bool:
        return self.probe.wants()

    def keep(self, costs: CostTable, n_lookahead: int, n_draft: int, step: int, guard, aftermath) -> bool:
        """Keep the window while its measured extra cost is at most `window_cost` of the same step
        without it. A window never measured rides once to be measured, and one dropped rides now
        and then anyway, to be measured again (`LookaheadProbe.trial`); both only where the
        request's floor (`guard`) affords the window at its worst (`at_worst`), and are charged to
        it whole (`charge`)."""
        if self.window_cost == float("inf"):
            return True
        if not costs.prices_windowless():
            return False   # judged against the step without it, measured first (not a verdict)
        if costs.prices_window(n_lookahead):
            if window_pays(costs, n_lookahead, n_draft, self.window_cost):
                return self.probe.decided(True, step)
            worst = self.at_worst(costs, n_lookahead, n_draft, guard)
            if worst is not None and self.probe.trial(step):
                costs.remeasure(n_lookahead)
                self._experiment = worst
                return True
            return self.probe.decided(False, step)
        if aftermath.holds(costs, n_lookahead):
            return False   # its first step's cost is learnt with this one's (aftermath.py): no second experiment
        self._experiment = worst = self.at_worst(costs, n_lookahead, n_draft, guard)
        return self.probe.decided(worst is not None, step)

    @staticmethod
    def at_worst(costs: CostTable, n_lookahead: int, n_draft: int, guard) -> tuple[float, float] | None:
        """(the step's cost at its worst in root-only steps, a root-only step's seconds) for a
        window step that is an experiment (a window never measured, or a trial of one dropped),
        where the request's slack (FloorGuard) affords it beside the tree's own worst case; None
        where it does not. The window is priced as `n_lookahead` more candidates where the table
        measured a tree that big, else at a root-only step a node, the dearest measured (llama.cpp
        CPU's second node): a window's first step there cost 5-8 root-only steps, and the early
        guesses say a tenth of that."""
        root = costs.root_estimate(0)
        if not root > 0:   # a clock that never advanced prices nothing: afforded, charged nothing
            return float(n_draft + 1 + n_lookahead), 0.0
        with_window, without = costs.cost([n_draft + 1 + n_lookahead, n_draft + 1], 0) / root
        if costs.largest_measured_without_window() < n_draft + 1 + n_lookahead:
            with_window = without + n_lookahead
        tree_worst_case = max(without - (1.0 + guard.max_loss), 0.0)
        if with_window - without > guard.slack - tree_worst_case:
            return None
        return float(with_window), root

    def charge(self, tree, path: np.ndarray, seconds: float, guard) -> bool:
        """A step ended: where it was a window experiment (a window's first step or trial), charge
        it to the floor whole, against its price at the worst, and return True; else False (the
        step is charged as any other)."""
        experiment, self._experiment = self._experiment, None
        if experiment is None or not tree.n_lookahead:
            return False
        units_at_worst, root = experiment
        if root > 0:
            guard.learn(path.shape[0], seconds / root, units_at_worst)
        return True
