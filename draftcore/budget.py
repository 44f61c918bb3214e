"""How many draft nodes to verify per step.

On a GPU a verify of 64 tokens costs about as much as one; on a CPU it does not (SmolLM2 on
llama.cpp, 2 cores: 1 token 7.2 ms, 2 → 12.2, 8 → 25.3). So the size of the tree to verify must
follow what verifying costs on this machine and how likely the draft is to be accepted.

A budget policy has three methods, called by `speculate` once per step:
    request_size() -> int          how many nodes to ask the drafter for
    choose(tree) -> int            how many drafted nodes to verify: a best-first prefix of `tree`
    observe(tree, path, seconds)   the step that verified `tree` (drafting, verify, commit) took
                                   `seconds`; `path` was accepted

`FixedBudget` verifies the drafter's best n nodes every step. `CostAwareBudget` measures the
verifier's cost per tree size while it runs and picks the size that maximises expected tokens per
second, including "no draft"; keep one object per deployment so what it learns carries over.
"""
from __future__ import annotations

import weakref

import numpy as np

from .errors import ConfigError
from .tree import DraftTree
from .validate import positive_float, positive_int


class FixedBudget:
    """Verify up to `n` drafted nodes every step (the paper's decoding_length)."""

    def __init__(self, n: int):
        self.n = positive_int("budget", n, minimum=0)

    def request_size(self) -> int:
        return self.n

    def choose(self, tree: DraftTree) -> int:
        return min(self.n, tree.n_draft)

    def observe(self, tree: DraftTree, path: np.ndarray, seconds: float) -> None:
        pass


class CostAwareBudget:
    """Pick the draft size k that maximises (1 + expected accepted tokens) / cost(k + 1 nodes).

    Cost: an exponential moving average of step seconds (drafting + verify + commit) for each size on
    a menu of tree sizes (1 to 6, then 8, 12, 16, 24, 32, 48, 64, ... and max_nodes + 1), each
    measured on its own, because the cost is not monotonic: on a CPU a 3-token forward can cost more
    than a 4-token one, a 2-token one less than a 1-token one (matrix-kernel choice; HFVerifier, SmolLM2
    fp32 on 2 cores: 1 → 46 ms, 2 → 44, 3 → 57, 4 → 55, 6 → 73, 8 → 78, 16 → 99). Only menu sizes
    are verified. A size never measured is guessed optimistically
    from the plain step's cost, so bigger trees get tried, measured and then kept or dropped.
    Acceptance: the drafter's score of each node (its estimate that the node's path is accepted)
    is calibrated against what was really accepted, per score bin and rank in the best-first order
    (1, 2–3, 4–7, 8–15, 16–31, 32+): a trie's first node is accepted far more often than a later
    node of the same score (replayed SmolLM2 outputs: 1.85x vs 1.61x simulated HumanEval speedup
    with rank, benchmarks/budget_sim.py). The expected number of accepted drafted tokens of a
    best-first prefix of k nodes is the sum of their calibrated probabilities.

    Every `explore_every` steps it verifies a neighbouring menu size instead (one up or one down
    from its choice, alternately), so one slow measurement (a page fault, another process) cannot
    stick forever and a better size nearby gets found.

        parameter      default  meaning
        max_nodes      64       most drafted nodes ever verified
        smoothing      0.2      weight of a new cost measurement in its size's average
        optimism       0.05     unmeasured size's guessed cost growth per node, relative to 1 node
        explore_every  16       steps between re-measurements of a neighbouring size
    """

    _BINS = 20   # score bins
    _RANKS = 6   # rank buckets: 1, 2-3, 4-7, 8-15, 16-31, 32+

    def __init__(self, max_nodes: int = 64, smoothing: float = 0.2, optimism: float = 0.05,
                 explore_every: int = 16):
        self.max_nodes = positive_int("max_nodes", max_nodes)
        self.smoothing = positive_float("smoothing", smoothing)
        if self.smoothing > 1.0:
            raise ConfigError(f"smoothing: expected a number in (0, 1], got {smoothing}")
        self.optimism = positive_float("optimism", optimism, inclusive=True)
        self.explore_every = positive_int("explore_every", explore_every)
        self.sizes = _menu(self.max_nodes + 1)               # tree sizes (nodes, root included)
        self._cost = np.full(len(self.sizes), np.nan)        # seconds per step, by menu entry
        self._step = 0
        # Calibration counts per (score bin, rank bucket), with a weak prior that the score is right.
        centres = (np.arange(self._BINS) + 0.5) / self._BINS
        self._offered = np.full((self._BINS, self._RANKS), 2.0)
        self._accepted = np.repeat(2.0 * centres[:, None], self._RANKS, axis=1)

    # -- the policy ---------------------------------------------------------------------------
    def request_size(self) -> int:
        return self.max_nodes

    def choose(self, tree: DraftTree) -> int:
        n_draft = min(tree.n_draft, self.max_nodes)
        if n_draft == 0 or np.isnan(self._cost[0]):
            return 0  # first measure what a plain step costs
        p = self._calibrated(tree)[1:n_draft + 1]
        accepted = np.concatenate(([0.0], np.cumsum(p)))            # expected, k = 0..n_draft
        n_menu = int(np.searchsorted(self.sizes, n_draft + 1, side="right"))
        sizes = self.sizes[:n_menu]
        value = (1.0 + accepted[sizes - 1]) / self._estimated()[:n_menu]
        best = int(np.argmax(value))
        if self._step % self.explore_every == self.explore_every - 1:
            # Re-measure a neighbouring size (one up or down, alternately): local, so the
            # exploration itself stays cheap where big trees are expensive.
            near = best + (1 if (self._step // self.explore_every) % 2 == 0 else -1)
            if 0 <= near < n_menu:
                best = near
        return int(sizes[best]) - 1

    def observe(self, tree: DraftTree, path: np.ndarray, seconds: float) -> None:
        self._step += 1
        i = self._entry(len(tree))
        if i is not None:  # a size off the menu (a drafter that returned fewer nodes) teaches nothing
            old = self._cost[i]
            self._cost[i] = seconds if np.isnan(old) else (1 - self.smoothing) * old + self.smoothing * seconds
        if tree.n_draft:
            cells = self._cells(tree)[1:]
            accepted = np.zeros(len(tree), bool)
            accepted[path] = True
            size = self._offered.size
            self._offered += np.bincount(cells, minlength=size).reshape(self._offered.shape)
            self._accepted += np.bincount(cells, weights=accepted[1:], minlength=size).reshape(self._offered.shape)

    # -- what it has learnt (also for reports) -------------------------------------------------
    def cost(self, n_nodes) -> np.ndarray:
        """Estimated seconds of a step that verifies trees of `n_nodes` nodes (array-like),
        interpolated between menu sizes."""
        return np.interp(np.asarray(n_nodes, float), self.sizes, self._estimated())

    def acceptance_by_score(self) -> np.ndarray:
        """Calibrated acceptance probability per score bin (rows) and rank bucket (for reports)."""
        return self._accepted / self._offered

    # -- internals -----------------------------------------------------------------------------
    def _estimated(self) -> np.ndarray:
        """Seconds per menu size: measured where measured, else an optimistic guess."""
        known = self._cost.copy()
        missing = np.isnan(known)
        if missing.all():
            return 1.0 + self.optimism * (self.sizes - 1.0)
        first = int(np.flatnonzero(~missing)[0])
        base = known[first] / (1.0 + self.optimism * (self.sizes[first] - 1))
        known[missing] = (base * (1.0 + self.optimism * (self.sizes - 1.0)))[missing]
        return known

    def _entry(self, n_nodes: int):
        i = int(np.searchsorted(self.sizes, n_nodes))
        return i if i < len(self.sizes) and self.sizes[i] == n_nodes else None

    def _cells(self, tree: DraftTree) -> np.ndarray:
        """Flat calibration cell of each node: score bin * _RANKS + rank bucket."""
        scores = tree.scores if tree.scores is not None else 0.5 ** tree.depths.astype(float)
        bins = np.clip((np.asarray(scores) * self._BINS).astype(np.int64), 0, self._BINS - 1)
        rank = np.arange(len(tree))
        ranks = np.minimum(np.log2(np.maximum(rank, 1)).astype(np.int64), self._RANKS - 1)
        return bins * self._RANKS + ranks

    def _calibrated(self, tree: DraftTree) -> np.ndarray:
        return (self._accepted / self._offered).ravel()[self._cells(tree)]


def _menu(largest: int) -> np.ndarray:
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


# budget="auto": one CostAwareBudget per verifier, created on first use and dropped with the verifier,
# so what it measures (costs, acceptance) carries from request to request as a kept object would.
_AUTO_BUDGETS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def auto_budget(verifier) -> CostAwareBudget:
    """The CostAwareBudget that `budget="auto"` uses with `verifier` (created on first use; a
    verifier that cannot be weakly referenced gets a fresh one each call)."""
    try:
        policy = _AUTO_BUDGETS.get(verifier)
        if policy is None:
            policy = _AUTO_BUDGETS[verifier] = CostAwareBudget()
        return policy
    except TypeError:  # no __weakref__ slot, or unhashable
        return CostAwareBudget()


def as_budget_policy(budget, verifier=None):
    """An int becomes a FixedBudget; "auto" the verifier's CostAwareBudget (`auto_budget`); a
    policy object is used as it is."""
    if isinstance(budget, str):
        if budget == "auto":
            return auto_budget(verifier)
        raise ConfigError(f"budget: expected an int, 'auto' or a budget policy, got {budget!r}")
    if all(hasattr(budget, m) for m in ("request_size", "choose", "observe")):
        return budget
    return FixedBudget(budget)
