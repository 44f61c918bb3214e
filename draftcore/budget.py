"""How many draft nodes to verify per step.

`FixedBudget` always verifies the drafter's best `n` nodes. A policy object with the same three
methods can decide per step from the tree the drafter offers and from what verifying has cost.
"""
from __future__ import annotations

from .tree import DraftTree
from .validate import positive_int


class FixedBudget:
    """Verify up to `n` drafted nodes every step (the paper's decoding_length)."""

    def __init__(self, n: int):
        self.n = positive_int("budget", n, minimum=0)

    def request_size(self) -> int:
        """How many nodes to ask the drafter for."""
        return self.n

    def choose(self, tree: DraftTree) -> int:
        """How many of the offered drafted nodes to verify (a best-first prefix of the tree)."""
        return min(self.n, tree.n_draft)

    def observe(self, n_nodes: int, seconds: float, n_accepted: int) -> None:
        """A verify of `n_nodes` nodes (root included) took `seconds` and accepted `n_accepted`."""


def as_budget_policy(budget):
    """An int becomes a FixedBudget; a policy object is used as it is."""
    if hasattr(budget, "request_size") and hasattr(budget, "choose") and hasattr(budget, "observe"):
        return budget
    return FixedBudget(budget)
