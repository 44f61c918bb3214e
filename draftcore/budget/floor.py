"""A floor per request: drafting may cost a request at most `max_loss` of its plain decoding time.

The auto budget's choice is right on average, but a request's first drafted trees are verified on
a prior (the drafter's scores, sizes never measured), and where a drafted node costs as much as a
root-only step (llama.cpp on a CPU) a few wrong trees take a short request below plain decoding.
So, as a conservative bandit does (Wu et al., 2016: keep the reward at least (1 - alpha) of the
baseline's at every step), each request keeps a slack, in root-only steps at its own context (a
step that carries a lookahead window: that step without candidates, since the window is kept or
dropped by its own rule):

    slack = sum over its steps of (1 + max_loss) * tokens emitted - the step's cost

a root-only step counted at its estimate (so it adds `max_loss`), a drafted step at its measured
seconds; a request starts with one root-only step of slack, or what the requests before it earned
(at most four). A tree is verified only if its worst case, nothing accepted (one token for the tree's
estimated cost), keeps the slack at or above zero. Where drafting pays, each accepted token adds a
root-only step of slack, and the guard stops no tree that pays; on a GPU, where a tree costs about
what the root does, its worst case costs almost nothing. What it stops is a tree whose loss the request has
not earned: on llama.cpp CPU's cost shape, a fresh budget's first requests lost 5-15 % to
exploring trees of 2 to 16 nodes. The guarantee is on the estimates: a tree dearer than its guess
can take the slack below zero, and then no tree runs until the request has earned it back. The
budget's default, 2 % beyond one root-only step, keeps a 64-token request above 0.95x plain with
room for that (docs/budget.md, "The floor per request").

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
        """bool per menu entry, `step_units` its estimated cost in root-only steps: whether a step of
        that size that accepts nothing keeps the slack at or above zero (the root-only entry, 0,
        always). One cut, kernels.affords, which `choose` makes inside kernels.menu_values too."""
        return kernels("draftcore.budget.kernels").affordable(np.asarray(step_units, np.float64), self.slack,
                                                              self.max_loss)

    def learn(self, tokens: int, step_units: float, estimate: float | None) -> None:
        """A step emitted `tokens` and took `step_units` root-only steps (measured); `estimate`: what
        its tree was estimated to cost, None for a root-only step. A root-only step counts at its
        estimate: its noise would otherwise decide when the first tree may run."""
        if estimate is None:
            self.slack += self.max_loss * tokens
        else:
            # one stalled step (a page fault, another process) counts as at most OUTLIER times its
            # estimate, as the cost table counts it
            self.slack += (1.0 + self.max_loss) * tokens - min(step_units, OUTLIER * estimate)
