"""How many draft nodes to verify per step: the budget policies.

On a GPU a verify of 64 tokens costs about as much as one; on a CPU it does not. So the size of the
tree to verify must follow what verifying costs on this machine and how likely the draft is to be
accepted. The contract a policy keeps is `draftcore.protocols.BudgetPolicy`.

    FixedBudget(n)       verify the drafter's best n candidates every step
    CostAwareBudget()    measure the verifier's cost per tree size while it runs and pick the size
                         that maximises expected tokens per second, "no draft" included
                         (cost_aware.py, over the parts it lists; docs/budget.md: why each rule)
    as_budget_policy(b)  an int becomes a FixedBudget; a policy is used as it is
"""
from .cost_aware import CostAwareBudget
from .fixed import FixedBudget, as_budget_policy
from .lookahead import LookaheadProbe

__all__ = ["FixedBudget", "CostAwareBudget", "LookaheadProbe", "as_budget_policy"]
