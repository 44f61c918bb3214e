"""What a step costs, per tree size: a menu of sizes worth measuring, a moving average per size and
per lookahead-window size, and a guess for each size never measured.

    costs = CostTable(largest=65, smoothing=0.2, optimism=0.05)
    costs.learn(n_candidates, n_lookahead, seconds)   # a step that verified that tree took `seconds`
    costs.estimated(n_lookahead)                      # seconds per menu size: measured, else guessed
    costs.cost(n_nodes, n_lookahead)                  # the same, interpolated between menu sizes

Each size is measured on its own because the cost is not monotonic in the size (a 3-token forward
can cost more than a 4-token one: the matrix kernels change with the shape). A table may lean on a
`prior` (the table of the nearest context length, draftcore.budget.contexts): its sizes never
measured here are guessed from the prior's, scaled by what the root-only step costs in each. The
measurements behind each rule are in docs/budget.md.
"""
from __future__ import annotations

import bisect
import math

import numpy as np

from ..jit import kernels
from .constants import FIRST_REACH, OUTLIER


def menu(largest: int) -> np.ndarray:
    """Tree sizes worth measuring up to `largest`: every size to 6, then 8, 12, 16, 24, 32, 48, 64,
    96, ... (alternately x1.5 and x1.33), and `largest` itself."""
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
    """A step time's moving average: where none was measured (`old` NaN), `seconds` counted as at
    most `outlier` times `guess` (whole without one); else `weight` of it, counted as at most
    `outlier` times the average. One slow step must not stick, the first one least: a size priced
    from it may never run again to correct it."""
    if math.isnan(old):
        return seconds if math.isnan(guess) else min(seconds, outlier * guess)
    return (1 - weight) * old + weight * min(seconds, outlier * old)


def _overhead(with_window: np.ndarray, without: np.ndarray) -> np.ndarray:
    """with_window / without per size; 1 where that is not a number (a clock that never advanced
    prices no overhead)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        overhead = with_window / without
    overhead[~np.isfinite(overhead)] = 1.0
    return overhead


class CostTable:
    """Seconds per step for each menu size (nodes, root included), one table per number of
    lookahead nodes, since a window's nodes are verified whole on top of the candidates."""

    def __init__(self, largest: int, smoothing: float, optimism: float):
        self.smoothing = smoothing   # weight of a new measurement in its size's average
        self.optimism = optimism     # an unmeasured size's guessed cost growth per node, relative to 1 node
        self.sizes = menu(largest)
        self._entry = {int(size): i for i, size in enumerate(self.sizes)}   # learn's lookup, every step
        self._size_list = self.sizes.tolist()                                # reachable's, every step
        self.measured: dict[int, np.ndarray] = {}    # n_lookahead -> seconds by menu entry, NaN: never
        self._estimates: dict[int, np.ndarray] = {}  # what choose() reads every step, until learn() changes it
        self.prior: CostTable | None = None          # guesses come from it where it measured more
        self._own: dict[int, np.ndarray] = {}        # estimates without the prior: what a prior lends
        self.largest_measured = 1                     # nodes (root included) of the largest tree measured
        self._first_measured: dict[int, int] = {}    # n_lookahead -> its smallest menu entry measured
        self._remeasuring: set[int] = set()            # windows whose next step's time replaces their table

    def table(self, n_lookahead: int) -> np.ndarray:
        """The measured seconds with `n_lookahead` lookahead nodes (created, all NaN, on first use)."""
        costs = self.measured.get(n_lookahead)
        if costs is None:
            costs = self.measured[n_lookahead] = np.full(len(self.sizes), np.nan)
        return costs

    def n_measured(self, n_lookahead: int) -> int:
        """How many menu sizes were measured with `n_lookahead` lookahead nodes."""
        return int(np.count_nonzero(~np.isnan(self.table(n_lookahead))))

    def root_measured(self, n_lookahead: int) -> bool:
        """Whether a step without candidates (and with `n_lookahead` lookahead nodes) was measured."""
        return not math.isnan(self.table(n_lookahead)[0])

    def learn(self, n_candidates: int, n_lookahead: int, seconds: float) -> None:
        """A step that verified `n_candidates` nodes (root included) and `n_lookahead` more took
        `seconds`. A size off the menu (a drafter that returned fewer nodes) teaches nothing."""
        i = self._entry.get(n_candidates)
        if i is None:
            return
        if n_lookahead in self._remeasuring:   # a window trial (remeasure): its time replaces the old
            self._remeasuring.discard(n_lookahead)
            self.measured.pop(n_lookahead, None)
            self._first_measured.pop(n_lookahead, None)
        costs = self.table(n_lookahead)
        # One slow step (a page fault, a collection, another process) counts as at most OUTLIER times
        # the estimate: taken whole, it can make the root-only step look dearer than a draft, and the
        # size then chosen instead keeps the root-only step from ever being re-measured. A tree's
        # first step counts as at most OUTLIER times its guess, where the table has measured
        # anything to guess from: taken whole, one tree that met a stall (14 ms where the root took
        # 1.9 ms, on a loaded machine) priced every tree beyond what a request's floor affords,
        # and no tree ran again to re-measure it (docs/budget.md, "A stalled first tree"). Not the
        # root-only step's: a new context's is rightly dearer than its prior's guess, and it is
        # re-measured by every root-only step after another.
        first_tree = i > 0 and math.isnan(costs[i]) and self._guessable()
        guess = self.estimated(n_lookahead)[i] if first_tree else math.nan
        costs[i] = smoothed(costs[i], seconds, self.smoothing, OUTLIER, guess)
        if i < self._first_measured.get(n_lookahead, len(self.sizes)):
            self._first_measured[n_lookahead] = i
        self.tried(n_candidates)
        self._estimates.clear()
        self._own.clear()

    def prices_windowless(self) -> bool:
        """Whether the root-only step without a window was measured, here or in the prior this
        table's guesses come from: a window's overhead is measured against that step. Until it is,
        the window-less costs are guessed from the window's own steps (`_optimistic_base`), and a
        window priced against them looked 50 % dearer than its step where it cost 2 %."""
        return self.root_measured(0) or self._prior_guesses()

    def largest_measured_without_window(self) -> int:
        """Nodes of the largest tree measured without a window (0: none)."""
        measured = self.sizes[~np.isnan(self.table(0))]
        return int(measured[-1]) if measured.shape[0] else 0

    def prices_window(self, n_lookahead: int) -> bool:
        """Whether a step with `n_lookahead` window nodes was measured, here or in the prior: else
        `_with_window` prices the window free (so it gets measured)."""
        return self.n_measured(n_lookahead) > 0 or (self.prior is not None and self.prior.n_measured(n_lookahead) > 0)

    def remeasure(self, n_lookahead: int) -> None:
        """The next step measured with `n_lookahead` window nodes replaces what steps with that
        window cost so far, as a first measurement (a window trial, draftcore.budget.lookahead:
        averaged in, one 7x stall would take ~20 more window steps to wear off, and a dropped
        window gets none)."""
        self._remeasuring.add(n_lookahead)

    def _guessable(self) -> bool:
        """Whether `estimated` rests on a measurement, here or in the prior it leans on
        (`_from_prior`), not on nothing (`_optimistic_base` guesses 1 s then). With a window too:
        its guesses are the window-less estimates times an overhead (`_with_window`)."""
        return bool(self._first_measured) or self._prior_guesses()

    def _prior_guesses(self) -> bool:
        """Whether the prior measured more than its root without a window: only then are this
        table's guesses its (`_from_prior`)."""
        return self.prior is not None and self.prior.n_measured(0) >= 2

    def tried(self, n_candidates: int) -> None:
        """A tree of `n_candidates` nodes (root included) was verified; its cost may be learnt a
        step later (draftcore.budget.aftermath), but trees may grow from it now (`reachable`)."""
        self.largest_measured = max(self.largest_measured, n_candidates)

    def forget_estimates(self) -> None:
        """Recompute the guesses on the next read (the prior changed or learnt)."""
        self._estimates.clear()

    def reachable(self) -> int:
        """How many menu entries a step may verify: sizes up to twice the largest measured here or
        in the prior, with any window, and at least FIRST_REACH nodes. A tree bigger than any
        measured is a gamble on a guessed cost and, early on, on the calibration's prior: on a CPU
        one 32-node tree, tried first, cost llama.cpp 16 root-only steps, a quarter of a 64-token
        request. The first drafted tree has 2 nodes: on llama.cpp CPU a second node costs a whole
        root-only step, and 4 nodes, tried first, cost a new deployment's short requests 5 %.
        Growing by doubling from 2 nodes, a GPU still reaches 64 nodes within six drafting steps
        (docs/budget.md: what a first request gains or loses by it)."""
        largest = max(self.largest_measured, self.prior.largest_measured if self.prior is not None else 1)
        return bisect.bisect_right(self._size_list, max(2 * largest, FIRST_REACH))

    def menu_entries(self, n_nodes: int) -> int:
        """How many menu entries a step whose tree holds at most `n_nodes` nodes (root included) may
        verify: those of at most `n_nodes` nodes that are `reachable`."""
        return min(bisect.bisect_right(self._size_list, n_nodes), self.reachable())

    def cost(self, n_nodes, n_lookahead: int = 0) -> np.ndarray:
        """Estimated seconds of a step that verifies `n_nodes` candidate nodes (array-like, root
        included) plus `n_lookahead` lookahead nodes, interpolated between menu sizes."""
        return np.interp(np.asarray(n_nodes, float), self.sizes, self.estimated(n_lookahead))

    def estimated(self, n_lookahead: int) -> np.ndarray:
        """Seconds per menu size with `n_lookahead` lookahead nodes: measured where measured, else
        guessed (`_guess`)."""
        estimate = self._estimates.get(n_lookahead)
        if estimate is None:
            estimate = self._estimates[n_lookahead] = self._guess(n_lookahead)
        return estimate

    def root_estimate(self, n_lookahead: int) -> float:
        """`estimated(n_lookahead)[0]`, without guessing the other sizes where the root-only step
        was measured: a root-only step learns its cost every step and so clears the guesses, and
        the budget reads this entry on every step, paused or not (redoing `_guess` there cost
        ~0.1 ms of a llama.cpp CPU step)."""
        seconds = self.table(n_lookahead)[0]
        return float(seconds) if not math.isnan(seconds) else float(self.estimated(n_lookahead)[0])

    def own_estimates(self, n_lookahead: int) -> np.ndarray:
        """`estimated` without the prior: what this table lends a table that leans on it (priors
        may lean on each other; lending only its own keeps that from recursing)."""
        estimate = self._own.get(n_lookahead)
        if estimate is None:
            estimate = self._own[n_lookahead] = self._guess(n_lookahead, with_prior=False)
        return estimate

    def _guess(self, n_lookahead: int, with_prior: bool = True) -> np.ndarray:
        """The table with every unmeasured size guessed. A window's, from the table without one
        (`_with_window`). Without a window:
        - from the prior where it has one (`_from_prior`: it measured sizes this table has not);
        - else from the cost growth measured around the size (kernels.measured_growth):
          between two measured sizes, the smaller one's cost plus half the slope between them;
          above the largest measured size, where at least two are, its cost plus half the slope
          measured up to it from the smallest. Half, so the guess stays optimistic and the size
          gets tried where it might pay. Guessed at a flat `optimism` per node instead, a CPU,
          where each node adds to a verify, had every large size guessed far too cheap and tried
          once each, at several times its guess, and one big tree measured left each size between
          it and the root to be tried in turn (llama.cpp: 15, then 11, then 7 nodes on a
          100-token request); a GPU, where a node adds almost nothing, had them guessed too dear
          and stopped growing its trees;
        - else optimistically: the step with the fewest nodes measured so far (with any window,
          `_optimistic_base`) growing by `optimism` per node, so bigger trees get tried, measured
          and then kept or dropped.
        Without a prior it is one kernel call (kernels.guessed_costs): a root-only step's
        cost changes the guesses, so they are redone on every drafting step."""
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
        """The table with `n_lookahead` window nodes: measured where measured; elsewhere the
        window-less estimate times the window's overhead (its measured cost over the window-less
        estimate), interpolated between the sizes measured with it and held beyond them. A window
        this table never measured takes the prior's overhead (`with_prior`), and none where the
        prior never measured it either: priced free, a new window rides once and is measured
        (draftcore.budget.lookahead). Guessed as a tree of as many more nodes instead, an 8-node
        window looked 40 % dearer than the step without it on any machine, over `window_cost`:
        no window ever rode, not even on a GPU, where one costs a few percent."""
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
        """The prior's estimates without a window, scaled by this table's root-only cost over the
        prior's where both are measured (a verify grows with the context, and so does every size's
        cost); None without a prior that measured more than the root."""
        if not self._prior_guesses():
            return None
        theirs = self.prior.own_estimates(0)
        scale = known[0] / theirs[0] if not math.isnan(known[0]) and theirs[0] > 0 else 1.0
        return theirs * scale

    def _optimistic_base(self) -> float:
        """The seconds the optimistic guess grows from: a root-only step's, as the measured step
        with the fewest nodes (ties: the cheaper), over every window size, implies it (each
        window's smallest size measured is kept by `learn`: no search of the tables)."""
        fewest = None
        for window, i in self._first_measured.items():
            candidate = (self._size_list[i] + window - 1.0, float(self.measured[window][i]))
            fewest = candidate if fewest is None else min(fewest, candidate)
        if fewest is None:
            return 1.0
        extra, seconds = fewest
        return seconds / (1.0 + self.optimism * extra)
