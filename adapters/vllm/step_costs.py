"""What a vLLM step costs on this machine, learnt from the time between the proposer's calls.

RowDrafter cuts each row's chain where (1 + expected accepted tokens) / (the step's cost) is
highest. Without a clock that cost is a model, 1 + c * m for m drafted tokens (token_cost and
row_cost, rows.py), whose constants were measured on one machine: a GPU verifies 8 drafted tokens
for about the price of one, a 2-core CPU does not, and on that CPU the cost is not even monotonic
(a few drafted tokens make the step cheaper, its matrix products running as GEMMs rather than
GEMVs; docs/scale-out.md has the figures). So where one process drafts for the engine,
`StepCostTable` measures it:

    vLLM calls propose() once per engine step, after the step's forward and sampling. The time
    from the end of one call to the start of the next is one step, and that step verified the
    chains the earlier call returned: its rows and drafted tokens are known.

A step is learnt from only when it ran the earlier call's rows and nothing else: the same rows,
every one of them decoding, whose tokens grew by at least one each and at most one more than the
chains drafted for them (a new request's prefill or a finished one's replacement changes that).
Its seconds go to the moving average of steps that verified as many tokens (rows + drafted), one
slow step counting as at most twice the average (draftcore.budget.costs.smoothed, the bare call's
rule). The curve RowDrafter gets for n rows is what a step costs where every row drafts m tokens,
over the step without drafts: est(n (1 + m)) / est(n), where est interpolates between the token
counts measured, holds the smallest one's cost below it, and grows past the largest at half the
slope measured up to it (optimistic, so larger chains get tried); chains may reach twice the
largest step measured (the bare call's doubling rule). Until two token counts were measured, the
fixed model holds.
"""
from __future__ import annotations

import numpy as np

from draftcore.budget.costs import OUTLIER, smoothed
from draftcore.validate import positive_float, positive_int

_MEASURED = 2   # token counts measured before the curve replaces the fixed model


class StepCostTable:
    """Seconds of an engine step by the tokens it verified, from timed steps; the cost curve of
    RowDrafter.propose for a batch of n rows."""

    def __init__(self, largest: int, smoothing: float = 0.1):
        self.largest = positive_int("largest", largest)
        self.smoothing = positive_float("smoothing", smoothing)
        self.seconds = np.full(self.largest + 1, np.nan)   # by tokens verified (rows + drafted)
        self.steps_learnt = 0

    def observe(self, seconds: float, rows: int, drafted: int) -> None:
        """A step of `rows` rows verifying `drafted` drafted tokens took `seconds`."""
        tokens = rows + drafted
        if tokens > self.largest:
            return
        self.seconds[tokens] = smoothed(self.seconds[tokens], seconds, self.smoothing, OUTLIER)
        self.steps_learnt += 1

    def estimate(self, tokens: np.ndarray) -> np.ndarray:
        """Seconds of steps verifying `tokens` tokens (the module docstring's rule); needs two measured."""
        measured = np.flatnonzero(~np.isnan(self.seconds))
        known = self.seconds[measured]
        slope = max((known[-1] - known[0]) / (measured[-1] - measured[0]), 0.0)
        inside = np.interp(tokens, measured, known)
        return np.where(tokens > measured[-1], known[-1] + 0.5 * slope * (tokens - measured[-1]), inside)

    def curve(self, n_rows: int, max_draft: int):
        """(curve float64[max_draft + 1], curve_cost) for a step of n_rows rows, or None while the
        fixed model holds. curve_cost, the drafted token's cost the match-length rule weighs, is
        the average one of the longest chain the curve allows."""
        measured = np.flatnonzero(~np.isnan(self.seconds))
        if measured.shape[0] < _MEASURED or n_rows <= 0:
            return None
        m = np.arange(max_draft + 1)
        tokens = n_rows * (1 + m)
        costs = self.estimate(tokens.astype(float))
        curve = costs / costs[0]
        curve[tokens > 2 * measured[-1]] = np.inf
        curve[0] = 1.0
        longest = int(np.flatnonzero(np.isfinite(curve))[-1])
        curve_cost = max((curve[longest] - 1.0) / longest, 0.0) if longest > 0 else 0.0
        return curve, curve_cost


class StepTimer:
    """Turns the proposer's calls into timed steps for a StepCostTable (the module docstring's rule)."""

    def __init__(self, costs: StepCostTable, clock):
        self.costs = costs
        self.clock = clock   # seconds, monotonic (time.perf_counter)
        self._last = None   # (end of the last call, its rows, their tokens then, tokens drafted), or None

    def call_starts(self, n_tokens: np.ndarray, active: np.ndarray) -> None:
        """A propose() call begins with rows holding n_tokens (active: the rows that just decoded);
        learns the step since the last call if it ran that call's rows and nothing else."""
        now = self.clock()
        if self._last is not None and active.all():
            end, rows, tokens_then, drafted = self._last
            grown = int(n_tokens.sum()) - tokens_then
            if n_tokens.shape[0] == rows and rows <= grown <= rows + drafted:
                self.costs.observe(now - end, rows, drafted)
        self._last = None

    def call_ends(self, n_tokens: np.ndarray, active: np.ndarray, drafted: int) -> None:
        """The call returned chains of `drafted` tokens in all for rows holding n_tokens. A batch with
        a row that did not decode (a prefill in progress) times no step."""
        if n_tokens.shape[0] > 0 and active.all():
            self._last = (self.clock(), n_tokens.shape[0], int(n_tokens.sum()), int(drafted))
