"""A drafted step's cost includes what it leaves for the next step (draftcore.budget.aftermath)."""
import numpy as np
import pytest

from draftcore import CostAwareBudget, DraftTree
from draftcore.budget.aftermath import Aftermath
from draftcore.budget.costs import CostTable

ROOT, TREE, AFTER = 1.0, 1.1, 0.5   # a root-only step, a 2-node tree's own step, what it leaves behind


def step(policy, n_past, n_draft, seconds, accepted=0):
    policy.at_context(n_past)
    tree = DraftTree.chain(7, np.arange(n_draft) + 10)
    policy.observe(tree, np.arange(accepted + 1, dtype=np.int32), seconds)
    return n_past + accepted + 1


def test_a_tree_costs_what_the_root_only_step_after_it_pays_and_the_root_stays_clean():
    """As on ONNX Runtime's CPU EP at ~1,000 tokens: the step after a tree pays part of it. The
    tree's cost is learnt with that part, and the root-only cost only from root-only steps after
    root-only steps; learnt where measured (the planted wrong rule), the root would cost 1.25 and a
    2-node tree 1.1."""
    policy = CostAwareBudget(trial_steps=0)
    n_past = step(policy, 100, 0, ROOT)
    for _ in range(30):
        n_past = step(policy, n_past, 0, ROOT)
        n_past = step(policy, n_past, 1, TREE)
        n_past = step(policy, n_past, 0, ROOT + AFTER)
    assert policy.cost(1) == pytest.approx(ROOT)
    assert policy.cost(2) == pytest.approx(TREE + AFTER)


def test_trees_in_a_row_each_carry_the_aftermath_of_the_one_before():
    policy = CostAwareBudget(trial_steps=0)
    n_past = step(policy, 100, 0, ROOT)
    n_past = step(policy, n_past, 1, TREE)
    for _ in range(30):
        n_past = step(policy, n_past, 1, TREE + AFTER)   # its own step and the last tree's aftermath
    assert policy.cost(2) == pytest.approx(TREE + AFTER, rel=1e-3)
    n_past = step(policy, n_past, 0, ROOT + AFTER)       # settles the last one (smoothed in)
    assert policy.cost(1) == pytest.approx(ROOT) and policy.cost(2) == pytest.approx(TREE + AFTER, rel=0.1)


def test_a_new_sequence_settles_the_last_tree_as_measured():
    """The first step of the next request follows a prefill, not the tree: it is no aftermath."""
    policy = CostAwareBudget(trial_steps=0)
    n_past = step(policy, 100, 0, ROOT)
    n_past = step(policy, n_past, 0, ROOT)
    step(policy, n_past, 1, TREE)
    step(policy, 50, 0, ROOT + 5.0)   # another sequence (n_past is not where the last one left off)
    assert policy.cost(2) == pytest.approx(TREE)
    assert policy.cost(1) > ROOT   # that step followed no tree of its sequence: it teaches the root-only cost


def test_a_paused_step_settles_the_tree_before_it_but_teaches_no_cost_of_its_own():
    table = CostTable(largest=65, smoothing=1.0, optimism=0.05)
    table.learn(1, 0, ROOT)
    after = Aftermath()
    assert after.settle(table, 2, 0, TREE, teaches=True) == []          # held for the next step
    learnt = after.settle(table, 1, 0, ROOT + AFTER, teaches=False)     # a paused step
    assert learnt == [(table, 2, 0, pytest.approx(TREE + AFTER))] and after.pending is None
    assert after.settle(table, 1, 0, ROOT, teaches=False) == []


def test_a_fast_root_step_lowers_the_tree_cost_but_never_below_half_its_own():
    table = CostTable(largest=65, smoothing=1.0, optimism=0.05)
    table.learn(1, 0, ROOT)
    after = Aftermath()
    after.settle(table, 4, 0, 2.0, teaches=True)
    (learnt,) = after.settle(table, 1, 0, 0.8, teaches=True)   # 0.2 under the root's estimate: noise
    assert learnt[3] == pytest.approx(1.8)
    after.settle(table, 4, 0, 2.0, teaches=True)
    (learnt,) = after.settle(table, 1, 0, 0.0, teaches=True)
    assert learnt[3] == pytest.approx(1.0)
