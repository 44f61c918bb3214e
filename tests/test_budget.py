"""CostAwareBudget: learns a non-monotonic cost curve and the drafter's real acceptance, degrades to
no draft when nothing is accepted. Driven through its three public methods with a synthetic clock."""
from collections import Counter

import numpy as np
import pytest

from draftcore import CostAwareBudget, DraftTree
from draftcore.budget import FixedBudget, _menu
from draftcore.errors import ConfigError

# seconds per verify by tree size: 3 nodes cost more than 4 (as MKL's small matrix kernels do)
COST = {1: 1.0, 2: 1.6, 3: 1.9, 4: 1.3, 5: 1.35, 6: 1.4, 8: 1.6, 12: 1.9, 16: 2.3, 24: 3.0, 32: 3.8,
        48: 5.0, 64: 6.5, 65: 6.6}


def chain(n_draft: int, score: float) -> DraftTree:
    tree = DraftTree.chain(7, np.arange(n_draft) + 10)
    tree.scores = np.r_[1.0, np.full(n_draft, score)].astype(np.float32)
    return tree


def drive(policy, steps: int, n_accepted: int, score: float = 0.3) -> Counter:
    """Offer 64-node chains whose first `n_accepted` drafted nodes are always accepted."""
    chosen = Counter()
    for step in range(steps):
        tree = chain(64, score)
        k = policy.choose(tree)
        assert 0 <= k <= 64
        verified = tree.truncated(1 + k)
        path = np.arange(1 + min(k, n_accepted), dtype=np.int32)
        policy.observe(verified, path, np.interp(len(verified), list(COST), list(COST.values())))
        if step >= steps // 2 and step % policy.explore_every != policy.explore_every - 1:
            chosen[k] += 1
    return chosen


def test_learns_the_cheapest_size_that_holds_the_accepted_tokens():
    # 3 accepted: size 4 gives 4 tokens for 1.3 (3.1/s); size 3 would give 3 for 1.9, 1 node 1 for 1.
    chosen = drive(CostAwareBudget(), 400, n_accepted=3)
    assert chosen.most_common(1)[0][0] == 3, chosen
    assert chosen[3] >= 0.9 * sum(chosen.values()), chosen


def test_long_accepted_runs_get_big_trees():
    chosen = drive(CostAwareBudget(), 400, n_accepted=40, score=0.9)
    # 32 nodes: 32 tokens for 3.8 (8.4/s) beats 48 nodes: 41 for 5.0 (8.2/s) and 16: 16 for 2.3 (7.0/s)
    assert chosen.most_common(1)[0][0] == 31, chosen


def test_never_accepted_drafts_degrade_to_plain_decoding():
    chosen = drive(CostAwareBudget(), 400, n_accepted=0)
    assert chosen[0] >= 0.9 * sum(chosen.values()), chosen


def test_sizes_verified_are_on_the_menu():
    policy = CostAwareBudget(max_nodes=20)
    assert list(policy.sizes) == [1, 2, 3, 4, 5, 6, 8, 12, 16, 21]
    seen = drive(policy, 200, n_accepted=2)
    assert set(seen) <= {s - 1 for s in policy.sizes}


def test_menu():
    assert list(_menu(1)) == [1]
    assert list(_menu(65)) == [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 65]


def test_off_menu_sizes_teach_no_cost():
    policy = CostAwareBudget()
    policy.observe(chain(6, 0.5), np.arange(1, dtype=np.int32), 9.0)   # 7 nodes: not on the menu
    assert np.isnan(policy._cost).all()


@pytest.mark.parametrize("kwargs", [dict(max_nodes=0), dict(smoothing=1.5), dict(smoothing=0),
                                    dict(optimism=-1), dict(explore_every=0)])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        CostAwareBudget(**kwargs)


def test_fixed_budget():
    assert FixedBudget(5).choose(chain(3, 0.5)) == 3
    with pytest.raises(ConfigError, match="budget"):
        FixedBudget(-1)


def test_auto_budget_is_kept_per_verifier_across_calls():
    from toy import ToyModel, ToyVerifier

    import draftcore
    from draftcore.budget import auto_budget

    first, second = ToyVerifier(ToyModel(seed=0)), ToyVerifier(ToyModel(seed=1))
    prompt = np.array([1, 2, 3, 1, 2, 3, 1, 2], np.int32)
    draftcore.speculate(first, prompt, max_new_tokens=20, budget="auto")
    policy = auto_budget(first)
    steps_after_one = policy._step
    assert steps_after_one > 0 and not np.isnan(policy._cost[0])   # it measured while it ran
    draftcore.speculate(first, prompt, max_new_tokens=20, budget="auto")
    assert auto_budget(first) is policy and policy._step > steps_after_one  # and carried on
    assert auto_budget(second) is not policy and auto_budget(second)._step == 0
