"""The auto budget's costs by context length (draftcore.budget.contexts) and the guesses of sizes it
never measured (draftcore.budget.costs): driven with a synthetic cost that grows with the context."""
import numpy as np
import pytest

import draftcore
from draftcore import CostAwareBudget, DraftTree
from draftcore.budget.contexts import ContextCosts, bucket_name, bucket_of
from draftcore.budget.costs import CostTable


def step_cost(n_nodes: int, n_past: int) -> float:
    """A CPU-like verify: each node costs 0.25 of a root-only step at a short context; every node
    attends to the whole context, so a long context makes each node dearer still."""
    attention = n_past / 1000.0
    return 1.0 + attention + (n_nodes - 1) * (0.25 + 0.5 * attention)


def drive_at(policy, n_past: int, steps: int, n_accepted: int) -> list:
    """`steps` steps at context `n_past` (through at_context), offering 32-candidate chains whose
    first `n_accepted` are accepted. Returns the candidates verified per step."""
    chosen = []
    for _ in range(steps):
        policy.at_context(n_past)
        if policy.request_size() == 0:
            policy.observe(DraftTree.root_only(7), np.zeros(1, np.int32), step_cost(1, n_past))
            chosen.append(0)
            continue
        tree = DraftTree.chain(7, np.arange(32) + 10)
        tree.scores = np.r_[1.0, np.full(32, 0.6)].astype(np.float32)
        verified = tree.with_candidates(policy.choose(tree))
        path = np.arange(1 + min(verified.n_draft, n_accepted), dtype=np.int32)
        policy.observe(verified, path, step_cost(len(verified), n_past))
        chosen.append(verified.n_draft)
    return chosen


def test_buckets_are_powers_of_two_with_short_contexts_together():
    assert [bucket_of(n) for n in (0, 1, 255, 256, 511, 512, 3000)] == [8, 8, 8, 9, 9, 10, 12]
    assert [bucket_name(b) for b in (8, 9, 12)] == ["0-255", "256-511", "2048-4095"]


def test_each_context_keeps_its_own_costs_and_a_long_one_verifies_smaller_trees():
    policy = CostAwareBudget(trial_steps=0)
    short = drive_at(policy, 100, 600, n_accepted=4)
    long = drive_at(policy, 3000, 600, n_accepted=4)
    # 5 tokens for 5 nodes: 2 s at 100 tokens (2.5x a root step), 11 s at 3,000 (2.75x): drafting
    # pays at both, but each extra node that brings nothing costs more at 3,000
    assert np.median(long[300:]) <= np.median(short[300:])
    assert np.median(long[300:]) >= 1
    buckets = policy.costs_by_context()
    assert set(buckets) == {"0-255", "2048-4095"}
    root_short, root_long = buckets["0-255"][0], buckets["2048-4095"][0]
    assert root_short == pytest.approx(step_cost(1, 100)) and root_long == pytest.approx(step_cost(1, 3000))
    # back at 100 tokens: the table learnt there, untouched by the long context
    again = drive_at(policy, 100, 50, n_accepted=4)
    assert policy.costs_by_context()["0-255"][0] == pytest.approx(step_cost(1, 100))
    assert again[0] != 0   # no root-only step to re-measure: this bucket knows its costs


def test_a_new_context_measures_its_root_then_prices_trees_from_the_nearest_one():
    policy = CostAwareBudget(trial_steps=0)
    drive_at(policy, 100, 400, n_accepted=4)
    before = dict(policy.costs_by_context())
    first = drive_at(policy, 1500, 2, n_accepted=4)
    assert first[0] == 0   # the root-only step of the new bucket comes first
    table = policy._contexts.current
    measured_here = ~np.isnan(table.table(0))
    assert measured_here.sum() <= 2
    # every size it has not measured is the short context's, scaled by the two root-only costs
    short = np.array(before["0-255"])
    scale = step_cost(1, 1500) / step_cost(1, 100)
    estimate = table.estimated(0)
    unmeasured = np.flatnonzero(~measured_here & ~np.isnan(short))
    assert unmeasured.size >= 3
    for i in unmeasured:
        assert estimate[i] == pytest.approx(scale * short[i]), policy.sizes[i]


def test_a_bucket_lent_to_another_does_not_borrow_back():
    costs = ContextCosts(largest=17, smoothing=0.2, optimism=0.05)
    costs.at(100)
    for size in (1, 2, 4):
        costs.current.learn(size, 0, float(size))
    costs.at(600)                       # leans on 0-255
    for size in (1, 2):
        costs.current.learn(size, 0, 2.0 * size)
    costs.at(100)                       # 0-255 now may lean on 512-1023, which leans on it
    assert np.all(np.isfinite(costs.current.estimated(0)))
    costs.at(600)
    assert np.all(np.isfinite(costs.current.estimated(0)))


def test_the_pause_decision_follows_a_growing_context():
    # Drafting pays (1 accepted of 1 candidate: 2 tokens for about 1.4x a root step) at every length,
    # and the context grows by 8 tokens a step, so every step is dearer than the last. Compared per
    # second, the pause arm's memory holds trials from earlier, cheaper steps against drafting steps
    # measured later: pausing won trials and paused 7 % of the steps after the first 1,000.
    # Compared per root-only step at each step's own context, 2 %.
    policy = CostAwareBudget(trial_every=16, trial_steps=16)
    drafted = []
    for step in range(3000):
        chosen = drive_at(policy, 100 + 8 * step, 1, n_accepted=1)
        drafted.append(chosen[0] > 0)
    assert policy.drafting_pays
    assert sum(drafted[1000:]) >= 0.95 * 2000, sum(drafted[1000:])
    draft_rate, pause_rate = policy.arm_rates()
    assert draft_rate > pause_rate


def test_sizes_between_two_measured_are_guessed_from_the_growth_between_them():
    table = CostTable(largest=17, smoothing=0.2, optimism=0.05)
    table.learn(1, 0, 1.0)
    table.learn(16, 0, 3.0)   # 15 nodes more cost 2 root-only steps (within twice its guess, 1.75)
    estimate = dict(zip(table.sizes.tolist(), table.estimated(0)))
    # half the slope measured between them: 1 + 0.5 * (2 / 15) * (n - 1)
    for n in (2, 4, 8, 12):
        assert estimate[n] == pytest.approx(1.0 + 0.5 * 2.0 / 15.0 * (n - 1)), n
    # without the measurement at 16, the same sizes are guessed at 5 % per node
    fresh = CostTable(largest=17, smoothing=0.2, optimism=0.05)
    fresh.learn(1, 0, 1.0)
    assert fresh.estimated(0)[list(fresh.sizes).index(12)] == pytest.approx(1.0 + 0.05 * 11)


def test_the_loop_tells_the_budget_each_steps_context():
    from fixtures.toy import ToyModel, ToyVerifier

    seen = []

    class Recording(CostAwareBudget):
        def at_context(self, n_past):
            seen.append(n_past)
            super().at_context(n_past)

    verifier = ToyVerifier(ToyModel(seed=0))
    prompt = np.arange(30, dtype=np.int32) % 5 + 1
    result = draftcore.speculate(verifier, prompt, max_new_tokens=40, budget=Recording())
    assert len(seen) == result.stats.steps - 1   # every step after the prefill's
    assert seen[0] == len(prompt) and seen == sorted(seen) and seen[-1] < len(prompt) + 40


def test_trees_grow_by_doubling_from_the_largest_measured():
    # Every candidate accepted and every size nearly free (a GPU): the budget still verifies no tree
    # more than twice the largest it has measured (2 nodes before any), so the sizes grow
    # 2 -> 4 -> 8 -> 16 -> 32 -> 64 nodes, and a gamble on a guessed cost stays small where it is not
    # free.
    policy = CostAwareBudget(trial_steps=0, explore_every=10**6)
    grown, largest = [], 1
    for _ in range(40):
        tree = DraftTree.chain(7, np.arange(64) + 10)
        tree.scores = np.ones(65, np.float32)
        k = policy.choose(tree)
        assert k + 1 <= max(2 * largest, 2), (k, largest)
        largest = max(largest, k + 1)
        grown.append(k + 1)
        policy.observe(tree.with_candidates(k), np.arange(k + 1, dtype=np.int32), 1.0 + 0.001 * k)
    assert max(grown) == 65 and grown.index(65) <= 7, grown


@pytest.mark.parametrize("n_past", [-1, 2.5, "100", None, True])
def test_a_bad_context_length_is_refused_by_name_and_changes_nothing(n_past):
    from draftcore.errors import DraftcoreError

    policy = CostAwareBudget(trial_steps=0)
    drive_at(policy, 100, 20, n_accepted=2)
    before = policy.costs_by_context()
    with pytest.raises(DraftcoreError, match="n_past") as error:
        policy.at_context(n_past)
    assert repr(n_past) in str(error.value)
    after = policy.costs_by_context()
    assert after.keys() == before.keys() and policy._contexts.bucket == bucket_of(100)
    assert all(np.array_equal(after[b], before[b], equal_nan=True) for b in before)
