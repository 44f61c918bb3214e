"""How often the drafter's candidates are really accepted, per (score bin, rank bucket) cell
(docs/budget.md, "Acceptance"): rank says as much as score. Every proposed candidate counts,
verified or not (`learn_outcomes`), so the calibration does not rest on the few a CPU verifies.

    calibration = Calibration(max_nodes=64, memory=6000.0)
    calibration.expected_accepted(tree, m)        # expected accepted tokens of each prefix of m nodes
    calibration.learn_verified(tree, path)        # a verified step's candidates
    calibration.learn_outcomes(tree, verified, outcome, sizes, seconds)   # the rest of its proposal
"""
from __future__ import annotations

import numpy as np

from ..jit import kernels
from ..tree import DraftTree
from .constants import BINS, CALIBRATION_PRIOR, RANKS

_NO_SCORES = np.empty(0, np.float32)   # what the cells kernel takes for a tree without scores
_KERNEL_SCORES = (np.dtype(np.float32), np.dtype(np.float64))   # score dtypes it bins as numpy does


def rank_buckets(n: int, n_buckets: int) -> np.ndarray:
    """int64[n]: the rank bucket of best-first positions 0 .. n-1: 1, 2-3, 4-7, ... (the root: 0)."""
    return np.minimum(np.log2(np.maximum(np.arange(n), 1)).astype(np.int64), n_buckets - 1)


class Calibration:
    """Offered and accepted counts per cell from a weak prior that the score is right; with a
    `memory` (steps) they fade towards it, so that one budget follows a changing workload."""

    def __init__(self, max_nodes: int, memory: float | None):
        self.memory = memory
        centres = (np.arange(BINS) + 0.5) / BINS
        self.offered = np.full((BINS, RANKS), CALIBRATION_PRIOR)
        self.accepted = np.repeat(CALIBRATION_PRIOR * centres[:, None], RANKS, axis=1)
        self.prior_offered, self.prior_accepted = self.offered.copy(), self.accepted.copy()
        self.probability = (self.accepted / self.offered).ravel()   # flat, refreshed as the counts change
        self._rank_bucket = rank_buckets(max_nodes + 2, RANKS)
        self._kernels = kernels("draftcore.budget.kernels")

    def cells(self, tree: DraftTree, m: int) -> np.ndarray:
        """Flat cell of the first m nodes: score bin * RANKS + rank bucket."""
        if m > self._rank_bucket.shape[0]:
            self._rank_bucket = rank_buckets(m, RANKS)
        scores = tree.scores if tree.scores is not None else _NO_SCORES
        if scores.dtype not in _KERNEL_SCORES:   # a foreign drafter's float16: numpy's own rounding
            return tree.score_bins(BINS, 0, m) * RANKS + self._rank_bucket[:m]
        return self._kernels.calibration_cells(scores, tree.depths, m, BINS, self._rank_bucket, RANKS)

    def probabilities(self, tree: DraftTree, m: int) -> np.ndarray:
        """float64[m]: the calibrated acceptance of the tree's first m nodes (the root: 1)."""
        p = self.probability[self.cells(tree, m)]   # a copy (fancy indexing)
        p[0] = 1.0
        return p

    def expected_accepted(self, tree: DraftTree, m: int) -> np.ndarray:
        """float64[m]: [k] the expected accepted candidates of the first k (kernels.expected_accepted)."""
        return self._kernels.expected_accepted(self.probabilities(tree, m), tree.parents, m)

    def learn_verified(self, tree: DraftTree, path: np.ndarray) -> None:
        """A drafting step verified `tree` and accepted `path`: fade the counts, count each candidate."""
        if self.memory is not None:  # forget old evidence, keep the prior (probability refreshed too)
            self._kernels.fade_counts(self.offered, self.accepted, self.prior_offered, self.prior_accepted,
                                      1.0 - 1.0 / self.memory, self.probability)
        if tree.n_draft:
            cells = self.cells(tree, tree.n_candidates)[1:]
            accepted = np.zeros(tree.n_candidates, bool)
            accepted[path] = True
            flat_offered, flat_accepted = self.offered.reshape(-1), self.accepted.reshape(-1)
            np.add.at(flat_offered, cells, 1.0)
            np.add.at(flat_accepted, cells, accepted[1:])
            self.probability = (self.accepted / self.offered).ravel()

    def learn_outcomes(self, tree: DraftTree, verified: int, outcome: np.ndarray, sizes: np.ndarray,
                       seconds: np.ndarray) -> tuple[float, float]:
        """Count the known outcomes of the candidates after the first `verified`; return (expected,
        accepted) tokens of the prefix the calibration alone would pick (menu `sizes` at `seconds`),
        where longer than what was verified and fully known, else (-1, 0) (kernels.learn_outcomes)."""
        n = tree.n_candidates
        return self._kernels.learn_outcomes(
            self.offered.reshape(-1), self.accepted.reshape(-1), self.probability, self.cells(tree, n), outcome,
            verified, tree.parents, n, sizes, seconds)
