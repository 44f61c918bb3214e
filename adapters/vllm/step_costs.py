"""What a vLLM step costs on this machine, learnt from the time between the proposer's calls.

RowDrafter cuts each row's chain by a cost model with no clock in it: a step of n rows verifying d
drafted tokens costs a + b * n + c * d, seen as two ratios, token_cost = c / (a + b) (one more
drafted token against a one-row step) and row_cost = b / a. Constants measured on one machine are
wrong on another (a GPU verifies 8 drafted tokens for about the price of one; a 2-core CPU does
not), so where one process drafts for the whole engine, `StepCosts` learns the three terms from
what the engine's steps take:

    vLLM calls propose() once per engine step, after the step's forward and sampling. The time
    from the end of one call to the start of the next is one step, and that step verified the
    chains the earlier call returned: its rows and drafted tokens are known.

A step is learnt from only when it ran the earlier call's rows and nothing else: the same number of
rows, whose tokens grew by at least one and at most one more than the chains drafted for them
(a new request's prefill or a finished one's replacement changes both). A step over three times
the fitted cost is left out (a pause of the host, a compilation).

The fit is least squares over the steps seen, each weighing `keep` times the one after it, plus a
prior that holds the default ratios at the scale of the steps seen: `prior_steps` steps' worth
at (1 row, 0 drafted), (1 row, max_draft drafted) and (8 rows, 0 drafted). With one row only (batch
1), the data say nothing of row_cost, and it stays at the prior's; token_cost moves as soon as
drafted tokens vary. Ratios are clamped to [0, 1] (token_cost) and [0, 4] (row_cost); while the fit
is not positive where it must be, the defaults hold.
"""
from __future__ import annotations

import numpy as np

from draftcore.validate import positive_float, positive_int

_OUTLIER = 3.0          # a step this many times its fitted cost is not learnt from ...
_SETTLED = 16           # ... once this many steps were
_MAX_TOKEN_COST = 1.0   # a drafted token dearer than a whole step would be a measurement fault
_MAX_ROW_COST = 4.0


class StepCosts:
    """token_cost and row_cost of RowDrafter's cost rule, learnt from timed engine steps."""

    def __init__(self, token_cost: float, row_cost: float, *, max_draft: int, keep: float = 0.999,
                 prior_steps: float = 2.0):
        self.default_token_cost = positive_float("token_cost", token_cost, inclusive=True)
        self.default_row_cost = positive_float("row_cost", row_cost, inclusive=True)
        self.max_draft = positive_int("max_draft", max_draft)
        self.keep = positive_float("keep", keep)
        self.prior_steps = positive_float("prior_steps", prior_steps)   # > 0: the fit is never singular
        self._gram = np.zeros((3, 3))     # decayed sum of w x x^T, x = (1, rows, drafted)
        self._moment = np.zeros(3)        # decayed sum of w x t
        self._unit = np.zeros(2)          # decayed sums of t / (the prior's cost at scale 1) and of w
        self.steps_learnt = 0
        self.steps_refused = 0
        prior_x = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, self.max_draft], [1.0, 8.0, 0.0]])
        self._prior_x = prior_x
        self._prior_unit_cost = prior_x @ self._unit_coefficients()

    def _unit_coefficients(self) -> np.ndarray:
        """(a, b, c) of the default ratios with a = 1."""
        r, t = self.default_row_cost, self.default_token_cost
        return np.array([1.0, r, t * (1.0 + r)])

    def observe(self, seconds: float, rows: int, drafted: int) -> bool:
        """One engine step of `rows` rows verifying `drafted` drafted tokens took `seconds`.
        Returns whether it was learnt from (False: an outlier)."""
        x = np.array([1.0, float(rows), float(drafted)])
        if self.steps_learnt >= _SETTLED and seconds > _OUTLIER * float(self._coefficients() @ x):
            self.steps_refused += 1
            return False
        self._gram *= self.keep
        self._moment *= self.keep
        self._unit *= self.keep
        self._gram += np.outer(x, x)
        self._moment += x * seconds
        self._unit += (seconds / float(x @ self._unit_coefficients()), 1.0)
        self.steps_learnt += 1
        return True

    def _coefficients(self) -> np.ndarray:
        """(a, b, c) seconds fitted to the steps and the prior at their scale."""
        scale = self._unit[0] / self._unit[1] if self._unit[1] > 0 else 1.0
        prior_t = scale * self._prior_unit_cost
        gram = self._gram + self.prior_steps * self._prior_x.T @ self._prior_x
        moment = self._moment + self.prior_steps * self._prior_x.T @ prior_t
        return np.linalg.solve(gram, moment)

    def ratios(self) -> tuple[float, float]:
        """(token_cost, row_cost) now: the defaults until a step was learnt from."""
        if self.steps_learnt == 0:
            return self.default_token_cost, self.default_row_cost
        a, b, c = self._coefficients()
        if not (a > 0 and a + b > 0 and np.isfinite(c)):
            return self.default_token_cost, self.default_row_cost
        return float(np.clip(c / (a + b), 0.0, _MAX_TOKEN_COST)), float(np.clip(b / a, 0.0, _MAX_ROW_COST))


class StepTimer:
    """Turns the proposer's calls into timed steps for a StepCosts (the module docstring's rule)."""

    def __init__(self, costs: StepCosts, clock):
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
