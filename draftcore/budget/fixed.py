"""The fixed budget, and what a `budget=` argument becomes."""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..tree import DraftTree
from ..validate import tree_size


class FixedBudget:
    """Verify up to `n` drafted nodes every step (the paper's decoding_length)."""

    concurrent_requests = True  # no state: any number of requests may share one

    def __init__(self, n: int):
        # Asked of the drafter every step: more than one verify can hold is refused (validate.max_tree_nodes).
        self.n = tree_size("budget", n, minimum=0)

    def request_size(self) -> int:
        return self.n

    def choose(self, tree: DraftTree) -> int:
        return min(self.n, tree.n_draft)  # the tree's lookahead nodes are kept whole by the loop

    def observe(self, tree: DraftTree, path: np.ndarray, seconds: float) -> None:
        pass


def as_budget_policy(budget):
    """An int becomes a FixedBudget; a policy object (request_size, choose, observe) is used as it is."""
    if all(callable(getattr(budget, m, None)) for m in ("request_size", "choose", "observe")):
        return budget
    if isinstance(budget, str):
        raise ConfigError(f"budget: expected None, 'auto', an int or a budget policy, got {budget!r}")
    return FixedBudget(budget)
