"""The budget's headroom: a replay-only budget that knows what each draft prefix will accept.

The auto budget picks each step's draft size from an expectation (the calibrated acceptance of the
drafter's candidates) and measured costs. On a replay the recorded output says what every prefix of
the proposal would really accept, so `OracleBudget` picks, each step, the prefix of the same
proposal with the most tokens per second:

    k* = argmax over k in 0 .. n_draft of (1 + accepted(k)) / cost(k + 1 nodes)

`accepted(k)` is the greedy walk over the tree's first k + 1 nodes against the recorded output
(`TraceVerifier.accepted_by_prefix`). It is a per-step ceiling for budgets over the same drafter's
proposals, not a global optimum (a step's choice changes the next step's context and proposal): the
auto budget's distance to it says how much a better expectation could still gain, where
`draftcore.tools.bounds` says how much better drafts could.

    replay(traces, budget="oracle", cost="llamacpp-cpu")
    benchmarks/budget_sim.py --policies auto,oracle

Between the two, `AssistedBudget` is the auto budget told one thing only, to say which part of that
distance is which:

    "oracle-skip"    no tree where nothing of the proposal would be accepted (the steps a budget that
                     recognised a drafter's dead ends could save)
    "oracle-extend"  where every candidate the auto budget chose would be accepted (the model did not
                     disagree, the draft ran out), as many more as the proposal would have accepted
                     (what recognising a copy that keeps going could gain: suffix decoding's signal)
"""
from __future__ import annotations

import numpy as np

from ..budget import CostAwareBudget
from ..errors import ConfigError
from ..tree import DraftTree

ASSISTS = ("oracle-skip", "oracle-extend")


class OracleBudget:
    """A BudgetPolicy over a `TraceVerifier` and a `CostModel`: it always asks for `max_nodes`
    candidates and verifies the prefix that, by the recorded output, gives the most tokens per
    second. It learns nothing; `accepted` and `chosen` keep each choice's accepted tokens and size
    (for tests and reports)."""

    concurrent_requests = False

    def __init__(self, verifier, cost, max_nodes: int = 64):
        self.verifier, self.cost, self.max_nodes = verifier, cost, max_nodes
        self.chosen: list[int] = []     # candidates verified per choice
        self.accepted: list[int] = []   # tokens it knew that choice would accept

    def request_size(self) -> int:
        return self.max_nodes

    def choose(self, tree: DraftTree) -> int:
        n = min(tree.n_draft, self.max_nodes) + 1
        accepted = self.verifier.accepted_by_prefix(tree)[:n]
        seconds = np.array([self.cost.seconds(k + 1 + tree.n_lookahead) for k in range(n)])
        k = int(np.argmax((1.0 + accepted) / seconds))   # the first of equals: the smaller tree
        self.chosen.append(k)
        self.accepted.append(int(accepted[k]))
        return k

    def keep_lookahead(self, tree: DraftTree, n_draft: int) -> bool:
        return False   # a window is never accepted: it would only add cost

    def observe(self, tree: DraftTree, path: np.ndarray, seconds: float) -> None:
        pass


class AssistedBudget(CostAwareBudget):
    """The auto budget (learning as it always does, from the steps it really verifies), whose choice
    is changed by one piece of the recorded output's knowledge, `assist` (ASSISTS). An extended tree
    is verified at the next menu size (the sizes the budget measures), so its cost is learnt as any
    other. `assisted` counts the choices changed."""

    def __init__(self, verifier, assist: str, **settings):
        if assist not in ASSISTS:
            raise ConfigError(f"assist: expected one of {list(ASSISTS)}, got {assist!r}")
        super().__init__(**settings)
        self.verifier, self.assist = verifier, assist
        self.assisted = 0

    def choose(self, tree: DraftTree) -> int:
        k = super().choose(tree)
        changed = self.assisted_choice(tree, k)
        self.assisted += changed != k
        return changed

    def assisted_choice(self, tree: DraftTree, k: int) -> int:
        """The candidates to verify instead of the auto budget's `k`, by the assist's rule."""
        n = min(tree.n_draft, self.max_nodes) + 1
        if n == 1:
            return k
        accepted = self.verifier.accepted_by_prefix(tree)[:n]
        if self.assist == "oracle-skip":
            return 0 if k and accepted[-1] == 0 else k
        if 0 < k < n - 1 and accepted[k] == k and accepted[-1] > k:
            needed = int(np.argmax(accepted == accepted[-1]))   # the smallest prefix accepting it all
            bigger = self.sizes[self.sizes - 1 >= needed]
            return min(int(bigger[0]) - 1 if bigger.shape[0] else needed, n - 1)
        return k
