"""Skipping the drafter while it has nothing to offer, where asking it costs (docs/budget.md,
"Skipping a drafter with nothing to offer"): after the k-th proposal in a row that drafted nothing,
the next min(k - 1, `idle_skip`) steps ask for none, while root-only steps that asked are measured
to cost over `idle_cost` more than those that did not; a hopeless proposal skips one step.

    skipping = IdleSkipping(idle_skip=3, idle_cost=0.02)
    skipping.asked = False                    # a step begins
    skipping.skip()                           # a drafting step: True asks the drafter for nothing
    skipping.asked = True                     # the drafter's proposal reached the choice
    k = skipping.after_choice(k, hopeless)    # the choice made: how many next steps skip
    skipping.learn_root_seconds(seconds)      # a root-only step ended
"""
from __future__ import annotations

import math

from .constants import OUTLIER, ROOT_SMOOTHING
from .costs import smoothed


class IdleSkipping:
    """How many of the next steps ask the drafter for nothing, and whether asking costs."""

    def __init__(self, idle_skip: int, idle_cost: float):
        self.idle_skip, self.idle_cost = idle_skip, idle_cost
        self.idle = 0               # proposals in a row that drafted nothing
        self.skip_left = 0          # steps left that ask the drafter for nothing
        self.asked = False          # this step's proposal reached the choice
        self.root_seconds = [math.nan, math.nan]   # root-only steps that [asked, did not ask] the drafter

    def skip(self) -> bool:
        """Whether this drafting step asks the drafter for nothing."""
        if self.skip_left:
            self.skip_left -= 1
            return True
        return False

    def after_choice(self, k: int, hopeless: bool) -> int:
        """Return the choice `k`, having set how many next steps ask the drafter for nothing."""
        if k:
            self.idle = self.skip_left = 0
        else:
            self.idle += 1
            skip = min(self.idle - 1, self.idle_skip) if self.asking_costs() else 0
            self.skip_left = max(skip, 1 if hopeless else 0)
        return k

    def asking_costs(self) -> bool:
        """Whether asking took over `idle_cost` more than not asking; False until both are measured."""
        asked, unasked = self.root_seconds
        return bool(asked - unasked > self.idle_cost * unasked)   # NaN compares False

    def learn_root_seconds(self, seconds: float) -> None:
        """A root-only step took `seconds` (it asked the drafter if `asked`)."""
        i = 0 if self.asked else 1
        # Python floats: numpy scalars cost microseconds a step here
        self.root_seconds[i] = smoothed(self.root_seconds[i], seconds, ROOT_SMOOTHING, OUTLIER)
