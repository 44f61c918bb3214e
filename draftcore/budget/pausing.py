"""Whether drafting pays at all: the "draft" and "pause" arms, tried against each other
(docs/budget.md, "Pausing").

Choosing "no draft" still pays for the proposal and the choice, a few percent of a cheap step. So
the better arm by recent tokens per root-only step runs, and the other is tried now and then.
Paused steps teach no cost and no acceptance; the drafter still sees every token through `update`.

    trials = PauseTrials(every=64, steps=16, backoff=2)   # fresh=True: an arm on trial is judged by its trial alone;
                                                        # first_trial, clear_win: pause sooner (the vLLM floor)
    drafting = trials.start_step(step)                  # before the step: which arm runs it
    drafted = trials.end_step(step, tokens, time)       # after it: that arm's tokens and time (any unit)
"""
from __future__ import annotations

import numpy as np

from ..validate import positive_float, positive_int

from .constants import ARM_MEMORY, MAX_BACKOFF, PAUSE_MARGIN, PAUSE_TRIAL, SETTLED_TRIALS

DRAFT, PAUSE = 0, 1     # arms


class PauseTrials:
    """The arm each step runs. The other arm is tried every `every` steps, the interval growing by
    `backoff` (up to MAX_BACKOFF x) while the winner stays; a trial of drafting lasts `steps` steps
    (0: never pause), a trial of pausing PAUSE_TRIAL. The steps before half of `first_trial`
    (default `every`) learn sizes and acceptance and do not count.

    For the vLLM floor: with `fresh`, an arm on trial is judged by its trial alone (what drafting is
    worth changes under the arms there); with `clear_win` (a ratio), pausing that wins by that much
    takes over after one trial, not two."""

    def __init__(self, every: int, steps: int, backoff: int, fresh: bool = False,
                 first_trial: int | None = None, clear_win: float | None = None):
        self.every, self.steps, self.backoff, self.fresh = every, steps, backoff, fresh
        # every, steps and backoff come validated from CostAwareBudget's settings
        self.first_trial = every if first_trial is None else positive_int("first_trial", first_trial)
        # a win by less than 1x is no win: such a clear_win would pause a drafter that pays
        self.clear_win = None if clear_win is None else positive_float("clear_win", clear_win, minimum=1.0)
        self.arm = DRAFT                       # the arm of the step under way
        self.winner = DRAFT
        self.tokens = np.zeros(2)              # faded sums per arm: tokens emitted, time
        self.time = np.zeros(2)
        self.steps_run = np.zeros(2, np.int64)
        self.trial_left = 0                    # steps left in the running trial of the other arm
        self.pause_won_last = False            # whether pausing won the last trial
        self.next_trial = self.first_trial
        self.period = every                    # steps from the next trial to the one after

    def start_step(self, step: int) -> bool:
        """Whether the step about to begin drafts (else it verifies the root alone), `step` steps
        having been observed."""
        if self.steps and self.trial_left == 0 and step >= self.next_trial:
            self.trial_left = PAUSE_TRIAL if self.winner == DRAFT else self.steps
            if self.fresh:
                self.tokens[1 - self.winner] = self.time[1 - self.winner] = 0.0
        self.arm = 1 - self.winner if self.trial_left else self.winner
        return self.arm == DRAFT

    def end_step(self, step: int, tokens: float, time: float) -> bool:
        """Step `step` emitted `tokens` in `time`; returns whether it drafted. A step that
        `start_step` did not begin drafts."""
        arm, self.arm = self.arm, DRAFT
        self._learn(arm, step, tokens, time)
        return arm == DRAFT

    def drafting_pays(self) -> bool:
        return self.winner == DRAFT

    def rates(self) -> tuple[float, float]:
        """Recent tokens per unit of time of the (draft, pause) arms; NaN for an arm never run."""
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = self.tokens / self.time
        return float(rate[0]) if self.steps_run[0] else float("nan"), \
            float(rate[1]) if self.steps_run[1] else float("nan")

    def _learn(self, arm: int, step: int, tokens: float, time: float) -> None:
        if step <= self.first_trial // 2:
            return   # the first steps measure sizes and acceptance, not what drafting is worth
        keep = 1.0 - 1.0 / ARM_MEMORY
        self.tokens[arm] = keep * self.tokens[arm] + tokens
        self.time[arm] = keep * self.time[arm] + time
        self.steps_run[arm] += 1
        if not self.trial_left:
            return
        self.trial_left -= 1
        if self.trial_left:
            return
        # A trial ended: pausing wins by PAUSE_MARGIN, and takes over after two wins running (or one, by clear_win).
        draft_rate = self.tokens[0] / self.time[0] if self.time[0] > 0 else 0.0
        pause_rate = self.tokens[1] / self.time[1] if self.steps_run[1] else 0.0
        pause_wins = pause_rate > (1.0 + PAUSE_MARGIN) * draft_rate
        clear = self.clear_win is not None and pause_rate > self.clear_win * draft_rate
        winner = PAUSE if pause_wins and (self.winner == PAUSE or self.pause_won_last or clear) else DRAFT
        self.pause_won_last = pause_wins
        if winner != self.winner:
            self.winner, self.period = winner, self.every
        elif pause_wins and self.winner == DRAFT and self.steps_run[DRAFT] >= SETTLED_TRIALS * self.every:
            # Pausing won once against a drafting record long enough to judge: confirm it soon (backed
            # off, one burst before the confirming trial kept a losing arm for hundreds of steps).
            self.period = self.every
        else:
            self.period = min(self.period * self.backoff, MAX_BACKOFF * self.every)
        self.next_trial = step + self.period
