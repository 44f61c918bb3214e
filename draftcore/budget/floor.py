"""A floor per request: drafting may cost a request at most `max_loss` of its plain decoding time
(docs/budget.md, "The floor per request"; a conservative bandit, Wu et al., 2016). Each request keeps
a slack, in root-only steps at its own context:

    slack = sum over its steps of (1 + max_loss) * tokens emitted - the step's cost

starting from FIRST_SLACK, or what the requests before it earned, up to CARRIED_SLACK. A tree is
verified only if its worst case, nothing accepted, keeps the slack at or above zero.

    guard = FloorGuard(max_loss=0.02)
    guard.new_request()                         # a new sequence starts
    guard.affordable(step_units)                # per menu entry: its worst case fits the slack
    guard.learn(tokens, step_units, estimate)   # a step ended (estimate: None for a root-only step)
"""
from __future__ import annotations

import numpy as np

from ..jit import kernels
from .constants import CARRIED_SLACK, FIRST_SLACK, OUTLIER


class FloorGuard:
    """The slack of the current request, in root-only steps, and the trees it affords."""

    def __init__(self, max_loss: float):
        self.max_loss = max_loss
        self.slack = FIRST_SLACK

    def new_request(self) -> None:
        """A new sequence starts: with FIRST_SLACK, or what the last one earned up to CARRIED_SLACK."""
        self.slack = min(max(self.slack, FIRST_SLACK), CARRIED_SLACK)

    def affordable(self, step_units: np.ndarray) -> np.ndarray:
        """bool per menu entry of `step_units` root-only steps: its worst case fits the slack (the
        root-only entry always; the one cut, kernels.affords)."""
        return kernels("draftcore.budget.kernels").affordable(np.asarray(step_units, np.float64), self.slack,
                                                              self.max_loss)

    def learn(self, tokens: int, step_units: float, estimate: float | None) -> None:
        """A step emitted `tokens` in `step_units` root-only steps; `estimate`: its tree's estimated
        cost, None for a root-only step, which counts at its estimate (its noise must not decide
        when the first tree runs)."""
        if estimate is None:
            self.slack += self.max_loss * tokens
        else:
            # a stalled step counts as at most OUTLIER times its estimate, as the cost table counts it
            self.slack += (1.0 + self.max_loss) * tokens - min(step_units, OUTLIER * estimate)
