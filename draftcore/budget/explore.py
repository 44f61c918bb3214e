"""Now and then verify a neighbouring menu size instead of the best one, so that one slow
measurement does not stick to a size and a better neighbour is found; rarer while the choice stays
(docs/budget.md, "Exploration").
"""
from __future__ import annotations

import numpy as np

from .constants import HOPELESS, MAX_BACKOFF


class Explorer:
    """Which menu entry to verify: the best, or every so often one up or one down from it
    (alternately), after `every` steps, then at intervals that grow by `backoff` (up to MAX_BACKOFF x) while
    the best stays the same, and back to `every` when it changes."""

    def __init__(self, every: int, backoff: int):
        self.every, self.backoff = every, backoff
        self.period = every           # steps from the next exploration to the one after
        self.next_step = every - 1    # the step of the next exploration
        self.n_explored = 0
        self.last_best = -1

    def pick(self, step: int, best: int, value: np.ndarray) -> int:
        """The entry to verify at `step`, given the `best` entry of `value` (tokens per second)."""
        if best != self.last_best:
            self.last_best, self.period = best, self.every
        if step < self.next_step:
            return best
        # a neighbour, so it stays cheap; never one worth under HOPELESS of the best, which no
        # re-measured cost would make the better one
        near = best + (1 if self.n_explored % 2 == 0 else -1)
        self.n_explored += 1
        self.next_step = step + self.period
        self.period = min(self.period * self.backoff, MAX_BACKOFF * self.every)
        if 0 <= near < value.shape[0] and value[near] >= HOPELESS * value[best]:
            return near
        return best
