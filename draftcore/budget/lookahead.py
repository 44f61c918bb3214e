"""Whether a lookahead window (a Jacobi window) rides along with a step's candidates: one part, its
probe, its experiments and their charge (docs/budget.md, "Lookahead windows").

Window nodes are never accepted: they buy future candidates, worth a small price where a verify is
nearly free (a GPU), not a doubled step (a CPU). So a window rides while it adds at most
`window_cost` to a step; once one is dropped, one is asked for only now and then (`LookaheadProbe`),
and rides anyway at backed-off trials so its cost is measured again. A window's first step and its
trials are experiments, run only where the request's floor affords them at their worst.

    windows = Windows(window_cost=0.1, every=16, trial_every=64, backoff=2)
    windows.wants()                                         # before proposing: build a window?
    windows.keep(costs, n_lookahead, n_draft, step, guard, aftermath)   # does this one ride?
    windows.charge(tree, path, seconds, guard)              # after the step: True if charged as an experiment
"""
from __future__ import annotations

import numpy as np

from ..validate import positive_int
from .costs import CostTable


def window_pays(costs: CostTable, n_lookahead: int, n_draft: int, window_cost: float) -> bool:
    """Whether `n_lookahead` window nodes add at most `window_cost` to a step of `n_draft`
    candidates, as the cost table prices it (CostTable._with_window)."""
    nodes = np.array([n_draft + 1])
    with_window = float(costs.cost(nodes, n_lookahead)[0])
    without = float(costs.cost(nodes, 0)[0])
    return with_window <= (1.0 + window_cost) * without


class LookaheadProbe:
    """Whether a drafter should build its lookahead window this step: every step while windows are
    kept (or none was judged); once one is dropped, every `every`-th step. The auto budget's probe
    takes its explore_every, trial_every and explore_backoff (the defaults are theirs): a dropped
    window is looked at again as often as a neighbouring size is.

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
        """Whether a window the costs would drop rides anyway at `step`, to be re-measured:
        `trial_every` steps after the first drop, then `backoff` times as long after each trial."""
        if self._next_trial is None or step < self._next_trial:
            return False
        self._gap *= self.backoff
        self._next_trial = step + self._gap
        self._since = 0
        return True


class Windows:
    """The window decision: `window_cost`, the probe and its trials, and the experiment in flight."""

    def __init__(self, window_cost: float, every: int, trial_every: int, backoff: int):
        self.window_cost = window_cost
        self.probe = LookaheadProbe(every, trial_every, backoff)
        self._experiment = None   # (its price at the worst in root-only steps, a root-only step's seconds)

    def wants(self) -> bool:
        return self.probe.wants()

    def keep(self, costs: CostTable, n_lookahead: int, n_draft: int, step: int, guard, aftermath) -> bool:
        """Keep the window while it pays (`window_pays`); a window never measured, or a dropped
        one's trial, rides as an experiment where the floor (`guard`) affords it at its worst."""
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
            return False   # its first step's cost is not learnt yet (aftermath.py): no second experiment
        self._experiment = worst = self.at_worst(costs, n_lookahead, n_draft, guard)
        return self.probe.decided(worst is not None, step)

    @staticmethod
    def at_worst(costs: CostTable, n_lookahead: int, n_draft: int, guard) -> tuple[float, float] | None:
        """(the experiment's cost at its worst in root-only steps, a root-only step's seconds), or
        None where the request's slack does not afford it beside the tree's worst case. The window
        is priced as as many more candidates where that size was measured, else a root-only step a
        node (llama.cpp CPU's second node, the dearest measured)."""
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
        """A step ended: where it was a window experiment, charge it to the floor whole and return
        True; else False (it is charged as any other step)."""
        experiment, self._experiment = self._experiment, None
        if experiment is None or not tree.n_lookahead:
            return False
        units_at_worst, root = experiment
        if root > 0:
            guard.learn(path.shape[0], seconds / root, units_at_worst)
        return True
