"""What a drafted step leaves for the step after it, counted as the drafted step's cost
(docs/budget.md, "Costs": on ONNX Runtime's CPU EP a root-only step after a tree step took 46 ms,
after another 35 ms). A drafted step's cost is learnt one step late: its own seconds plus, when the
next step is root-only, what that step took beyond a root-only step's estimate.

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
        """A step of `n_candidates` and `n_lookahead` nodes took `seconds` at `table`'s context;
        returns the measurements to learn now. `teaches`: whether its own cost may be learnt (a
        paused step's may not, but it settles the drafted step before it)."""
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
        """Whether the pending step, not learnt yet, ran `n_lookahead` window nodes at `table`'s context."""
        return self.pending is not None and self.pending[0] is table and self.pending[2] == n_lookahead

    def flush(self) -> list[tuple]:
        """The pending step as measured (the sequence ended)."""
        pending, self.pending = self.pending, None
        return [] if pending is None else [pending]
