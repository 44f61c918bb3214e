"""What a step costs, per tree size: a moving average per menu size and per lookahead-window size,
and a guess for each size never measured (docs/budget.md, "Costs": the measurement behind each rule).

    costs = CostTable(largest=65, smoothing=0.2, optimism=0.05)
    costs.learn(n_candidates, n_lookahead, seconds)   # a step that verified that tree took `seconds`
    costs.estimated(n_lookahead)                      # seconds per menu size: measured, else guessed
    costs.cost(n_nodes, n_lookahead)                  # the same, interpolated between menu sizes
"""
from __future__ import annotations

import bisect
import math

import numpy as np

from ..jit import kernels
from .constants import OUTLIER


def menu(largest: int) -> np.ndarray:
    """Tree sizes worth measuring: every size to 6, then 8, 12, 16, 24, 32, 48, 64, ..., and
    `largest`. Each is measured on its own: the cost is not monotonic in the size."""
    sizes = [s for s in range(1, 7)]
    step = 2
    while sizes[-1] < largest:
        nxt = sizes[-1] + step
        sizes.append(nxt)
        if nxt >= 4 * step:
            step *= 2
    sizes = [s for s in sizes if s < largest] + [largest]
    return np.array(sorted(set(sizes)), np.int64)


def smoothed(old: float, seconds: float, weight: float, outlier: float, guess: float = math.nan) -> float:
    """A moving average that counts one slow step as at most `outlier` times the average (a first
    step: times `guess`, whole without one), so that a stall does not stick."""
    if math.isnan(old):
        return seconds if math.isnan(guess) else min(seconds, outlier * guess)
    return (1 - weight) * old + weight * min(seconds, outlier * old)


def _overhead(with_window: np.ndarray, without: np.ndarray) -> np.ndarray:
    """with_window / without per size; 1 where not a number (a clock that never advanced)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        overhead = with_window / without
    overhead[~np.isfinite(overhead)] = 1.0
    return overhead


class CostTable:
    """Seconds per step for each menu size (nodes, root included), one table per number of
    lookahead nodes. A `prior` (the nearest context's table, contexts.py) lends its guesses."""

    def __init__(self, largest: int, smoothing: float, optimism: float):
        self.smoothing = smoothing
        self.optimism = optimism
        self.sizes = menu(largest)
        self._entry = {int(size): i for i, size in enumerate(self.sizes)}   # learn's lookup, every step
        self._size_list = self.sizes.tolist()                                # reachable's, every step
        self.measured: dict[int, np.ndarray] = {}    # n_lookahead -> seconds by menu entry, NaN: never
        self._estimates: dict[int, np.ndarray] = {}  # what choose() reads every step, until learn() changes it
        self.prior: CostTable | None = None
        self._own: dict[int, np.ndarray] = {}        # estimates without the prior: what a prior lends
        self.largest_measured = 1                     # nodes of the largest tree verified
        self._first_measured: dict[int, int] = {}    # n_lookahead -> its smallest menu entry measured
        self._remeasuring: set[int] = set()            # windows whose next step's time replaces their table

    def table(self, n_lookahead: int) -> np.ndarray:
        costs = self.measured.get(n_lookahead)
        if costs is None:
            costs = self.measured[n_lookahead] = np.full(len(self.sizes), np.nan)
        return costs

    def n_measured(self, n_lookahead: int) -> int:
        return int(np.count_nonzero(~np.isnan(self.table(n_lookahead))))

    def root_measured(self, n_lookahead: int) -> bool:
        return not math.isnan(self.table(n_lookahead)[0])

    def learn(self, n_candidates: int, n_lookahead: int, seconds: float) -> None:
        """A step of `n_candidates` nodes (root included) and `n_lookahead` more took `seconds`; a
        size off the menu teaches nothing."""
        i = self._entry.get(n_candidates)
        if i is None:
            return
        if n_lookahead in self._remeasuring:   # a window trial: its time replaces the old
            self._remeasuring.discard(n_lookahead)
            self.measured.pop(n_lookahead, None)
            self._first_measured.pop(n_lookahead, None)
        costs = self.table(n_lookahead)
        # A tree's first step counts as at most OUTLIER times its guess, where there is one to guess
        # from ("A stalled first tree"); a root-only step's is taken whole.
        first_tree = i > 0 and math.isnan(costs[i]) and self._guessable()
        guess = self.estimated(n_lookahead)[i] if first_tree else math.nan
        costs[i] = smoothed(costs[i], seconds, self.smoothing, OUTLIER, guess)
        if i < self._first_measured.get(n_lookahead, len(self.sizes)):
            self._first_measured[n_lookahead] = i
        self.tried(n_candidates)
        self._estimates.clear()
        self._own.clear()

    def prices_windowless(self) -> bool:
        """Whether the root-only step without a window was measured, here or in the prior: a window's
        overhead is measured against it."""
        return self.root_measured(0) or self._prior_guesses()

    def largest_measured_without_window(self) -> int:
        measured = self.sizes[~np.isnan(self.table(0))]
        return int(measured[-1]) if measured.shape[0] else 0

    def prices_window(self, n_lookahead: int) -> bool:
        """Whether a step with `n_lookahead` window nodes was measured, here or in the prior."""
        return self.n_measured(n_lookahead) > 0 or (self.prior is not None and self.prior.n_measured(n_lookahead) > 0)

    def remeasure(self, n_lookahead: int) -> None:
        """The next step with `n_lookahead` window nodes replaces that window's table (a window trial)."""
        self._remeasuring.add(n_lookahead)

    def _guessable(self) -> bool:
        return bool(self._first_measured) or self._prior_guesses()

    def _prior_guesses(self) -> bool:
        return self.prior is not None and self.prior.n_measured(0) >= 2

    def tried(self, n_candidates: int) -> None:
        """A tree of `n_candidates` nodes was verified: trees may grow from it now (its cost may be
        learnt a step later, aftermath.py)."""
        self.largest_measured = max(self.largest_measured, n_candidates)

    def forget_estimates(self) -> None:
        self._estimates.clear()

    def reachable(self) -> int:
        """How many menu entries a step may verify: up to twice the largest tree verified here or in
        the prior, so the first drafted tree has 2 nodes ("Trees grow by doubling")."""
        largest = max(self.largest_measured, self.prior.largest_measured if self.prior is not None else 1)
        return bisect.bisect_right(self._size_list, 2 * largest)

    def menu_entries(self, n_nodes: int) -> int:
        """The reachable menu entries of at most `n_nodes` nodes."""
        return min(bisect.bisect_right(self._size_list, n_nodes), self.reachable())

    def cost(self, n_nodes, n_lookahead: int = 0) -> np.ndarray:
        """Estimated seconds of a step of `n_nodes` candidate nodes (array-like, root included) and
        `n_lookahead` more, interpolated between menu sizes."""
        return np.interp(np.asarray(n_nodes, float), self.sizes, self.estimated(n_lookahead))

    def estimated(self, n_lookahead: int) -> np.ndarray:
        """Seconds per menu size: measured where measured, else guessed."""
        estimate = self._estimates.get(n_lookahead)
        if estimate is None:
            estimate = self._estimates[n_lookahead] = self._guess(n_lookahead)
        return estimate

    def root_estimate(self, n_lookahead: int) -> float:
        """`estimated(n_lookahead)[0]` without guessing the rest where it was measured (read every step)."""
        seconds = self.table(n_lookahead)[0]
        return float(seconds) if not math.isnan(seconds) else float(self.estimated(n_lookahead)[0])

    def own_estimates(self, n_lookahead: int) -> np.ndarray:
        """`estimated` without the prior: what this table lends (lending only its own cannot recurse)."""
        estimate = self._own.get(n_lookahead)
        if estimate is None:
            estimate = self._own[n_lookahead] = self._guess(n_lookahead, with_prior=False)
        return estimate

    def _guess(self, n_lookahead: int, with_prior: bool = True) -> np.ndarray:
        """Every unmeasured size guessed ("Guessing unmeasured sizes"): a window's from the table
        without one; else from the prior; else from the growth measured around the size, at half its
        slope (kernels.guessed_costs); else `optimism` per node above the cheapest step measured."""
        if n_lookahead:
            return self._with_window(n_lookahead, with_prior)
        known = self.table(0)
        guess = self._from_prior(known) if with_prior else None
        if guess is None:
            return kernels("draftcore.budget.kernels").guessed_costs(known, self.sizes, self._optimistic_base(),
                                                                     self.optimism)
        known = known.copy()
        missing = np.isnan(known)
        known[missing] = guess[missing]
        return known

    def _with_window(self, n_lookahead: int, with_prior: bool) -> np.ndarray:
        """Measured where measured; elsewhere the window-less estimate times the window's measured
        overhead, interpolated and held beyond; the prior's overhead where only it measured one;
        free where neither did, so a new window rides once and is measured."""
        without = self.estimated(0) if with_prior else self.own_estimates(0)
        known = self.table(n_lookahead)
        measured = ~np.isnan(known)
        if measured.any():
            overhead = _overhead(known[measured], without[measured])
            return np.where(measured, known, without * np.interp(self.sizes, self.sizes[measured], overhead))
        if with_prior and self.prices_window(n_lookahead):   # measured in the prior, not here
            return without * _overhead(self.prior.own_estimates(n_lookahead), self.prior.own_estimates(0))
        return without.copy()

    def _from_prior(self, known: np.ndarray) -> np.ndarray | None:
        """The prior's estimates scaled by the two root-only costs, where both are measured."""
        if not self._prior_guesses():
            return None
        theirs = self.prior.own_estimates(0)
        scale = known[0] / theirs[0] if not math.isnan(known[0]) and theirs[0] > 0 else 1.0
        return theirs * scale

    def _optimistic_base(self) -> float:
        """The root-only step's seconds the optimistic guess grows from, as the measured step with the
        fewest nodes (ties: the cheaper), over every window size, implies it."""
        fewest = None
        for window, i in self._first_measured.items():
            candidate = (self._size_list[i] + window - 1.0, float(self.measured[window][i]))
            fewest = candidate if fewest is None else min(fewest, candidate)
        if fewest is None:
            return 1.0
        extra, seconds = fewest
        return seconds / (1.0 + self.optimism * extra)
