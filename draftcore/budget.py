"""How many draft nodes to verify per step.

On a GPU a verify of 64 tokens costs about as much as one; on a CPU it does not (SmolLM2 on
llama.cpp, 2 cores: 1 token 7.2 ms, 2 → 12.2, 8 → 25.3). So the size of the tree to verify must
follow what verifying costs on this machine and how likely the draft is to be accepted.

A budget policy has three methods, called by `speculate` once per step:
    request_size() -> int          how many nodes to ask the drafter for
    choose(tree) -> int            how many drafted nodes to verify: a best-first prefix of `tree`
    observe(tree, path, seconds)   the verify of `tree` took `seconds`; `path` was accepted

`FixedBudget` verifies the drafter's best n nodes every step. `CostAwareBudget` measures the
verifier's cost per tree size while it runs and picks the size that maximises expected tokens per
second, including "no draft"; keep one object per deployment so what it learns carries over.
"""
from __future__ import annotations

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

    Cost: an exponential moving average of verify seconds per size bucket (1, 2, 3–4, 5–8, …),
    linearly interpolated; a bucket never measured is guessed optimistically from the smallest
    measured one (so larger trees get tried, measured and then kept or dropped).
    Acceptance: the drafter's score of each node (its estimate that the node's path is accepted)
    is calibrated against what was really accepted, per score bin; the expected number of accepted
    drafted tokens of a best-first prefix of k nodes is the sum of their calibrated probabilities.

    Every `explore_every` steps it verifies a neighbouring size instead (one bucket bigger or
    smaller than its choice), so one slow measurement (a page fault, another process) cannot
    stick forever and a better size nearby gets found.

        parameter      default  meaning
        max_nodes      64       most drafted nodes ever verified
        smoothing      0.2      weight of a new cost measurement in its bucket's average
        optimism       0.05     unmeasured bucket's guessed cost growth per node, relative to 1 node
        explore_every  16       steps between re-measurements of the stalest size
    """

    _BINS = 20

    def __init__(self, max_nodes: int = 64, smoothing: float = 0.2, optimism: float = 0.05,
                 explore_every: int = 16):
        self.max_nodes = positive_int("max_nodes", max_nodes)
        self.smoothing = positive_float("smoothing", smoothing)
        if self.smoothing > 1.0:
            raise ConfigError(f"smoothing: expected a number in (0, 1], got {smoothing}")
        self.optimism = positive_float("optimism", optimism, inclusive=True)
        n_buckets = int(np.ceil(np.log2(self.max_nodes + 1))) + 1
        self._bucket_size = 2 ** np.arange(n_buckets)      # bucket b holds sizes (2^(b-1), 2^b]
        self._cost = np.full(n_buckets, np.nan)             # seconds per verify, by bucket
        self.explore_every = positive_int("explore_every", explore_every)
        self._step = 0
        # Calibration counts per score bin, with a weak prior that the score is right.
        centres = (np.arange(self._BINS) + 0.5) / self._BINS
        self._offered = np.full(self._BINS, 2.0)
        self._accepted = 2.0 * centres

    # -- the policy ---------------------------------------------------------------------------
    def request_size(self) -> int:
        return self.max_nodes

    def choose(self, tree: DraftTree) -> int:
        n_draft = min(tree.n_draft, self.max_nodes)
        if n_draft == 0 or np.isnan(self._cost[0]):
            return 0  # first measure what a plain step costs
        p = self._calibrated(tree)[1:n_draft + 1]
        gain = 1.0 + np.concatenate(([0.0], np.cumsum(p)))          # expected tokens, k = 0..n_draft
        cost = self.cost(np.arange(1, n_draft + 2))                  # nodes verified = k + 1
        best = int(np.argmax(gain / cost))
        if self._step % self.explore_every == self.explore_every - 1:
            # Re-measure a neighbouring size (one bucket up or down, alternately): local, so the
            # exploration itself stays cheap where big trees are expensive.
            b = self._bucket(best + 1) + (1 if (self._step // self.explore_every) % 2 == 0 else -1)
            if 0 <= b < len(self._bucket_size) and self._bucket_size[b] <= n_draft + 1:
                return int(self._bucket_size[b]) - 1
        return best

    def observe(self, tree: DraftTree, path: np.ndarray, seconds: float) -> None:
        self._step += 1
        b = self._bucket(len(tree))
        old = self._cost[b]
        self._cost[b] = seconds if np.isnan(old) else (1 - self.smoothing) * old + self.smoothing * seconds
        if tree.n_draft:
            bins = self._score_bins(tree)[1:]
            accepted = np.zeros(len(tree), bool)
            accepted[path] = True
            self._offered += np.bincount(bins, minlength=self._BINS)
            self._accepted += np.bincount(bins, weights=accepted[1:], minlength=self._BINS)

    # -- what it has learnt (also for reports) -------------------------------------------------
    def cost(self, n_nodes) -> np.ndarray:
        """Estimated seconds to verify trees of `n_nodes` nodes (array-like)."""
        n_nodes = np.asarray(n_nodes, float)
        measured = ~np.isnan(self._cost)
        if not measured.any():
            return np.ones_like(n_nodes)
        sizes = self._bucket_size.astype(float)
        known = self._cost.copy()
        first = int(np.flatnonzero(measured)[0])
        base = known[first] / (1.0 + self.optimism * (sizes[first] - 1))
        guess = base * (1.0 + self.optimism * (sizes - 1))
        known[~measured] = guess[~measured]
        # Never believe a bigger tree is cheaper than a smaller one.
        known = np.maximum.accumulate(known)
        return np.interp(n_nodes, sizes, known)

    def acceptance_by_score(self) -> np.ndarray:
        """Calibrated acceptance probability per score bin (for reports)."""
        return self._accepted / self._offered

    # -- internals -----------------------------------------------------------------------------
    def _bucket(self, n_nodes: int) -> int:
        return min(int(np.ceil(np.log2(max(n_nodes, 1)))), len(self._cost) - 1)

    def _score_bins(self, tree: DraftTree) -> np.ndarray:
        scores = tree.scores if tree.scores is not None else 0.5 ** tree.depths.astype(float)
        return np.clip((np.asarray(scores) * self._BINS).astype(np.int64), 0, self._BINS - 1)

    def _calibrated(self, tree: DraftTree) -> np.ndarray:
        return (self._accepted / self._offered)[self._score_bins(tree)]


def as_budget_policy(budget):
    """An int becomes a FixedBudget; "auto" a CostAwareBudget; a policy object is used as it is."""
    if isinstance(budget, str):
        if budget == "auto":
            return CostAwareBudget()
        raise ConfigError(f"budget: expected an int, 'auto' or a budget policy, got {budget!r}")
    if all(hasattr(budget, m) for m in ("request_size", "choose", "observe")):
        return budget
    return FixedBudget(budget)
