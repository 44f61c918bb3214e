"""What a drafted step leaves for the step after it, counted as the drafted step's cost.

A verify that kept part of a tree can leave work that the next step pays: on ONNX Runtime's CPU EP
at ~1,000 tokens of context a root-only step right after a tree step took 46 ms, one after another
root-only step 35 ms (the commit leaves the KV cache in freshly allocated memory, which the next run
pays for). Learnt where it is measured, that work made the root-only step look dearer and the trees
cheaper than they were: the budget priced a 2-node tree at 1.06x a root-only step where it cost
1.45x with its aftermath, drafted where drafting lost, and ran at 0.84x plain there. So a drafted
step's cost is learnt one step late: its own seconds plus, when the next step is root-only, what
that step took beyond a root-only step's estimate; and only a root-only step that follows another
teaches what a root-only step costs.

    after = Aftermath()
    for table, n_candidates, n_lookahead, seconds in after.settle(table, n_c, n_l, seconds, teaches=True):
        table.learn(n_candidates, n_lookahead, seconds)
    after.flush()   # a new request: the pending step, as it was measured
    after.pending   # None: the next step follows no drafted step
    after.holds(table, n_lookahead)   # a step with that window on that table waits for its cost
"""
from __future__ import annotations

import math

from .constants import AFTERMATH_FLOOR


class Aftermath:
    """The last drafted step, held until the next step shows what it left behind."""

    def __init__(self):
        self.pending = None   # (table, n_candidates, n_lookahead, seconds) of the last drafted step

    def settle(self, table, n_candidates: int, n_lookahead: int, seconds: float, teaches: bool) -> list[tuple]:
        """A step verified `n_candidates` nodes (root included) and `n_lookahead` window nodes in
        `seconds`, with `table` the cost table of its context; returns the measurements to learn now,
        as (table, n_candidates, n_lookahead, seconds). `teaches`: whether this step's own cost may be
        learnt (paused steps' may not: draftcore.budget.pausing); a paused step still settles the
        drafted step before it."""
        learnt = []
        drafted = n_candidates > 1 or n_lookahead > 0
        pending, self.pending = self.pending, None
        if pending is not None:
            if drafted:   # the next tree's time holds this one's aftermath: counted there, as each tree's is
                learnt.append(pending)
            else:
                root = table.root_estimate(0)
                extra = seconds - root if not math.isnan(root) else 0.0
                p_table, p_candidates, p_lookahead, p_seconds = pending
                # signed: a noisy root-only step must not bias every tree's cost upwards
                learnt.append((p_table, p_candidates, p_lookahead, max(p_seconds + extra, AFTERMATH_FLOOR * p_seconds)))
        if not teaches:
            return learnt
        if drafted:
            self.pending = (table, n_candidates, n_lookahead, seconds)
        elif pending is None:
            learnt.append((table, n_candidates, n_lookahead, seconds))
        return learnt

    def holds(self, table, n_lookahead: int) -> bool:
        """Whether the pending drafted step ran `n_lookahead` window nodes in `table`'s context: its
        cost is not learnt yet (the next step's time brings it)."""
        return self.pending is not None and self.pending[0] is table and self.pending[2] == n_lookahead

    def flush(self) -> list[tuple]:
        """The pending drafted step, as it was measured (the sequence ended: nothing follows it)."""
        pending, self.pending = self.pending, None
        return [] if pending is None else [pending]
