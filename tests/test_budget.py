"""CostAwareBudget: learns a non-monotonic cost curve and the drafter's real acceptance, degrades to
no draft when nothing is accepted. Driven through its three public methods with a synthetic clock."""
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftcore import CostAwareBudget, DraftTree
from draftcore.budget import FixedBudget, LookaheadProbe
from draftcore.budget.calibration import BINS, RANKS, Calibration, rank_buckets
from draftcore.budget.costs import CostTable, menu
from draftcore.budget.explore import HOPELESS
from draftcore.budget.floor import FloorGuard
from draftcore.errors import ConfigError
from draftcore.jit import kernels
from draftcore.protocols import BudgetPolicy
from draftcore.validate import max_tree_nodes
from naive import naive_cost_estimates, naive_learn_outcomes, naive_measured_growth, naive_menu_values

# seconds per verify by tree size: 3 nodes cost more than 4 (as MKL's small matrix kernels do)
COST = {1: 1.0, 2: 1.6, 3: 1.9, 4: 1.3, 5: 1.35, 6: 1.4, 8: 1.6, 12: 1.9, 16: 2.3, 24: 3.0, 32: 3.8,
        48: 5.0, 64: 6.5, 65: 6.6}


def chain(n_draft: int, score: float, window: int = 0) -> DraftTree:
    """A chain of n_draft candidates, with a Jacobi-shaped window of `window` lookahead nodes
    (two levels: a chain from the root, and nodes one position later hanging off it)."""
    tree = DraftTree.chain(7, np.arange(n_draft) + 10)
    scores = np.r_[1.0, np.full(n_draft, score)]
    if window:
        first = n_draft + 1
        level0 = (window + 1) // 2
        parents = [0] + list(range(first, first + level0 - 1))                 # level 0: a chain from the root
        parents += [0] + list(range(first, first + window - level0 - 1))       # level 1: one position later
        depths = np.r_[tree.depths, np.arange(1, level0 + 1), np.arange(1, window - level0 + 1)]
        tree = DraftTree.build(np.r_[tree.tokens, np.arange(window) + 100], np.r_[tree.parents, parents], depths,
                               n_lookahead=window)
        scores = np.r_[scores, np.zeros(window)]
    tree.scores = scores.astype(np.float32)
    return tree


def cost_of(n_nodes) -> float:
    return float(np.interp(n_nodes, list(COST), list(COST.values())))


def drive(policy, steps: int, n_accepted: int, score: float = 0.3, window: int = 0) -> Counter:
    """Offer 64-candidate chains (plus a window) whose first `n_accepted` candidates are always
    accepted; a step costs COST of its total node count."""
    chosen = Counter()
    for step in range(steps):
        tree = chain(64, score, window)
        k = policy.choose(tree)
        assert 0 <= k <= 64
        verified = tree.with_candidates(k)
        assert verified.n_draft == k and verified.n_lookahead == window
        path = np.arange(1 + min(k, n_accepted), dtype=np.int32)
        policy.observe(verified, path, cost_of(len(verified)))
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
    assert list(menu(1)) == [1]
    assert list(menu(65)) == [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 65]


def test_off_menu_sizes_teach_no_cost():
    policy = CostAwareBudget()
    policy.observe(chain(6, 0.5), np.arange(1, dtype=np.int32), 9.0)   # 7 nodes: not on the menu
    assert all(np.isnan(c).all() for c in policy._costs.measured.values())


def test_a_window_is_priced_whole_and_never_cut():
    """With a 30-node window every step verifies the whole window; the cost learnt for k candidates
    is the cost of k + 1 + 30 nodes, and the window never enters the acceptance calibration."""
    policy = CostAwareBudget()
    offered_before = policy._calibration.offered.sum()
    drive(policy, 300, n_accepted=3, window=30)   # drive() asserts the window is always whole
    measured = {int(s): c for s, c in zip(policy.sizes, policy._costs.measured[30]) if not np.isnan(c)}
    assert measured and all(c == pytest.approx(cost_of(s + 30)) for s, c in measured.items())
    # nothing was priced without the window
    assert 0 not in policy._costs.measured or np.isnan(policy._costs.measured[0]).all()
    # 300 steps offered at most 300 * 64 candidate nodes and never a lookahead node (scores 0 there
    # would pile up in bin 0: check that bin stays at its prior).
    assert policy._calibration.offered[0].sum() == pytest.approx(2.0 * RANKS)
    assert policy._calibration.offered.sum() > offered_before


def test_windows_of_different_sizes_keep_separate_costs():
    policy = CostAwareBudget()
    drive(policy, 60, n_accepted=2, window=10)
    drive(policy, 60, n_accepted=2)
    assert set(policy._costs.measured) == {0, 10}
    assert policy.cost(4, 10) > policy.cost(4, 0)


def test_a_dropped_window_is_asked_for_only_every_probe_interval():
    """wants_lookahead: every step before any window is judged and while windows are kept; after
    keep_lookahead drops one, every `every`-th step (counted from the drop); window_cost=inf keeps
    and wants every window."""
    probe = LookaheadProbe(every=4)
    assert [probe.wants() for _ in range(3)] == [True] * 3
    assert probe.decided(False) is False
    assert [probe.wants() for _ in range(9)] == [False, False, False, True] * 2 + [False]
    assert probe.decided(True) is True and all(probe.wants() for _ in range(5))
    with pytest.raises(ConfigError, match="every"):
        LookaheadProbe(every=0)
    with pytest.raises(ConfigError, match="trial_every"):
        LookaheadProbe(trial_every=0)

    probe = LookaheadProbe(trial_every=10, backoff=3)   # trials: 10 steps from the first drop, then x3
    assert not probe.trial(100)                          # nothing dropped yet
    probe.decided(False, 5)
    probe.decided(False, 9)                              # a later drop does not move the trial
    assert [s for s in range(5, 140) if probe.trial(s)] == [15, 45, 135]   # 10, 30, 90 apart
    probe.decided(True, 140)
    probe.decided(False, 141)                            # kept again: the gap starts over
    assert [s for s in range(141, 200) if probe.trial(s)] == [151, 181]

    policy = CostAwareBudget()   # on a cost curve where a window doubles a step, it is dropped once measured
    drive(policy, 60, n_accepted=2)
    tree = chain(8, 0.5, window=30)
    assert policy.wants_lookahead()
    assert policy.keep_lookahead(tree, 4)   # never measured: tried
    drive(policy, 2, n_accepted=2, window=30)
    assert not policy.keep_lookahead(tree, 4)
    wanted = [policy.wants_lookahead() for _ in range(32)]
    assert wanted == ([False] * 15 + [True]) * 2
    free = CostAwareBudget(window_cost=float("inf"))
    assert free.keep_lookahead(tree, 4) and all(free.wants_lookahead() for _ in range(20))


def run_windows(policy, steps: int, seconds, window: int = 10, n_past: int = 2048) -> tuple[list, list]:
    """Drive `policy` as the loop drives a drafter that can leave its window out (the composite):
    a window is built when the policy wants one and dropped when it does not keep it; a step takes
    `seconds(step, tree)` and accepts 2 candidates; a step the policy asks no draft of (a pause
    trial) verifies the root alone. The context stays in one cost table's bucket (2,048-4,095
    tokens) for up to ~600 steps. Returns (the steps that verified a window, the steps that
    drafted)."""
    windowed, drafted = [], []
    for step in range(steps):
        policy.at_context(n_past)
        if not policy.request_size():
            path = np.arange(1, dtype=np.int32)
            policy.observe(chain(0, 0.3), path, seconds(step, chain(0, 0.3)))
            n_past += 1
            continue
        drafted.append(step)
        tree = chain(64, 0.3, window if policy.wants_lookahead() else 0)
        k = policy.choose(tree)
        if tree.n_lookahead and not policy.keep_lookahead(tree, k):
            tree = tree.without_lookahead()
            k = policy.choose(tree)
        verified = tree.with_candidates(k)
        if verified.n_lookahead:
            windowed.append(step)
        path = np.arange(1 + min(k, 2), dtype=np.int32)
        policy.observe(verified, path, seconds(step, verified))
        n_past += len(path)
    return windowed, drafted


def nearly_free(step, tree) -> float:
    """A GPU's verify: 1 ms a step and 0.2 % more per node, window nodes too."""
    return 1.0e-3 * (1.0 + 0.002 * (len(tree) - 1))


def test_a_window_that_costs_little_rides():
    """Where a window adds a few percent (a GPU), it is measured and kept. Its first step waits for
    the request's slack to afford it at the worst (10 root-only steps, a node each: at step 1 the
    request has 1), so it rides at the next probe (every 16th step), not at the step after (its
    cost is learnt with that step's, aftermath.py), and at every step from then on. Guessed as a
    tree of as many more nodes (5 % each), a 10-node window looked 50 % dearer than its step and
    never rode."""
    windowed, drafted = run_windows(CostAwareBudget(), 300, nearly_free)
    assert windowed[:2] == [17, 19] and windowed[1:] == [step for step in drafted if step >= 19], windowed


def test_a_window_whose_first_step_stalled_rides_again():
    """A first window step that met a stall (7x) drops the window, but the trial 64 steps after the
    drop measures it afresh and it is kept from then on. Without trials nothing re-measured it: the
    window stayed dropped for the budget's life."""
    first = []

    def stalled_first(step, tree):
        if tree.n_lookahead and not first:
            first.append(step)
            return 7.0 * nearly_free(step, tree)
        return nearly_free(step, tree)

    windowed, drafted = run_windows(CostAwareBudget(), 400, stalled_first)
    # step 17 (afforded, as above): the stalled window; dropped at step 19; the trial at the first
    # probe (every 16th proposal) from step 19 + 64; kept from the probe after it on
    assert windowed[0] == 17 and 83 <= windowed[1] < 83 + 20 and windowed[2] < windowed[1] + 20, windowed
    assert [step for step in drafted if step >= windowed[2]] == windowed[2:]


def test_a_window_that_doubles_a_step_is_retried_ever_more_rarely():
    """Where a window doubles a step (a CPU), it rides once (measured) and is dropped; trials follow
    64, 128, 256 and 512 steps apart (trial_every, doubling by explore_backoff), each one step."""
    windowed, _ = run_windows(CostAwareBudget(), 1000, lambda step, tree: cost_of(len(tree)) * 1e-3)
    assert windowed[0] == 17 and len(windowed) == 5, windowed   # afforded at step 17, dropped at 19
    due = 19 + 64
    for i, step in enumerate(windowed[1:]):
        assert due <= step < due + 20, windowed   # at the first probe (every 16th proposal) from then
        due = step + 64 * 2 ** (i + 1)


def test_a_window_the_request_cannot_afford_never_rides():
    """Where every node costs a root-only step (llama.cpp CPU's second node) a 10-node window's
    first step costs 10 root-only steps: more than the request's floor affords while drafting
    earns little, so no window rides. Priced by the early guesses (5 % a node), windows rode at
    steps 1 and 2 and in trials, and 300 steps ran at 0.88x of root-only steps (now 1.00x)."""
    windowed, drafted = run_windows(CostAwareBudget(), 300, lambda step, tree: 1e-3 * len(tree))
    assert windowed == [] and drafted


def test_a_window_trial_replaces_the_window_s_cost():
    """CostTable.remeasure: the next step with that window is learnt as a first measurement, the
    others keep theirs; the window is priced from the window-less table times its overhead, and an
    unmeasured window from the prior's overhead, else as free."""
    table = CostTable(largest=65, smoothing=0.2, optimism=0.05)
    for size, seconds in ((1, 1.0), (2, 1.2), (4, 1.6)):
        table.learn(size, 0, seconds)
    np.testing.assert_allclose(table.estimated(8)[:4], [1.0, 1.2, 1.3, 1.6])   # never measured: free
    table.learn(1, 8, 6.0)    # a stall: 6x the step without the window (a root-only step's first, taken whole)
    table.learn(2, 5, 1.8)
    assert table.estimated(8)[0] == 6.0 and table.estimated(8)[3] == pytest.approx(6 * 1.6)
    table.remeasure(8)
    assert table.estimated(8)[0] == 6.0          # until measured again
    table.learn(4, 8, 2.4)                       # 1.5x the step without it: a first step, within twice its guess
    assert np.isnan(table.measured[8][0]) and table.measured[8][3] == 2.4
    np.testing.assert_allclose(table.estimated(8)[:2], [1.5 * 1.0, 1.5 * 1.2])
    assert table.measured[5][1] == 1.8           # another window's cost is kept
    later = CostTable(largest=65, smoothing=0.2, optimism=0.05)
    later.prior = table
    later.learn(1, 0, 2.0)
    assert later.estimated(8)[3] == pytest.approx(later.estimated(0)[3] * 1.5)


@pytest.mark.parametrize("kwargs", [dict(max_nodes=0), dict(smoothing=1.5), dict(smoothing=0),
                                    dict(optimism=-1), dict(explore_every=0)])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        CostAwareBudget(**kwargs)


def test_fixed_budget():
    assert FixedBudget(5).choose(chain(3, 0.5)) == 3
    with pytest.raises(ConfigError, match="budget"):
        FixedBudget(-1)


@pytest.mark.parametrize("build, name", [(lambda n: CostAwareBudget(max_nodes=n), "max_nodes"),
                                         (FixedBudget, "budget")], ids=["CostAwareBudget", "FixedBudget"])
def test_a_budget_larger_than_one_verify_holds_is_refused_naming_the_limit(build, name):
    """Past max_tree_nodes() a tree cannot be verified in one step on any backend (its ancestor mask
    alone exceeds physical memory). CostAwareBudget(max_nodes=10**9) built rank tables for it (37 s;
    168 MB at 10**7) and FixedBudget(10**12) asked every drafter for buffers of that size (a
    MemoryError at the first propose); both are refused at once, naming the argument, the value and
    the limit, which itself is accepted."""
    limit = max_tree_nodes()
    for n in (limit + 1, 10**9, 10**12):
        start = time.perf_counter()
        with pytest.raises(ConfigError, match=rf"^{name}: {n} asks for trees of [0-9,]+ nodes; expected at most "
                                              rf"{limit:,}: .*physical memory"):
            build(n)
        assert time.perf_counter() - start < 1.0
    build(limit)


def test_auto_budget_is_kept_per_verifier_across_calls():
    from fixtures.toy import ToyModel, ToyVerifier

    import draftcore

    first, second = ToyVerifier(ToyModel(seed=0)), ToyVerifier(ToyModel(seed=1))
    prompt = np.array([1, 2, 3, 1, 2, 3, 1, 2], np.int32)
    draftcore.speculate(first, prompt, max_new_tokens=20, budget="auto")
    policy = draftcore.Session.of(first).budget
    steps_after_one = policy._step
    assert steps_after_one > 0 and not np.isnan(policy._costs.measured[0][0])   # it measured while it ran
    draftcore.speculate(first, prompt, max_new_tokens=20)              # the bare call: the same budget
    assert draftcore.Session.of(first).budget is policy and policy._step > steps_after_one  # and carried on
    assert draftcore.Session.of(second).budget is not policy and draftcore.Session.of(second).budget._step == 0


def test_exploration_backs_off_while_the_choice_holds():
    """Once the cheapest size is settled, re-measuring a neighbour gets rarer (backoff 2, up to 16x),
    so a workload where drafting never pays pays for fewer exploratory drafts; with backoff 1 it
    explores every 16 steps for ever."""
    def explorations(policy, steps=2000):
        drafted = 0
        for step in range(steps):
            tree = chain(64, 0.3)
            k = policy.choose(tree)
            verified = tree.with_candidates(k)
            policy.observe(verified, np.zeros(1, np.int32), cost_of(len(verified)))
            drafted += step >= steps // 2 and k > 0
        return drafted

    backed_off = explorations(CostAwareBudget())
    fixed = explorations(CostAwareBudget(explore_backoff=1))
    assert fixed >= 25 and backed_off <= fixed / 4, (backed_off, fixed)


def test_memory_lets_acceptance_follow_a_workload_change():
    """3 candidates always accepted for 1500 steps, then none: with a memory the budget returns to
    no draft within a few hundred steps; without one the old evidence keeps it drafting longer."""
    def steps_until_plain(policy):
        drive(policy, 1500, n_accepted=3)
        for step in range(4000):
            tree = chain(64, 0.3)
            k = policy.choose(tree)
            verified = tree.with_candidates(k)
            policy.observe(verified, np.zeros(1, np.int32), cost_of(len(verified)))
            if k == 0 and policy.choose(chain(64, 0.3)) == 0:
                return step
        return 4000

    remembering = steps_until_plain(CostAwareBudget(memory=300))
    forgetting_nothing = steps_until_plain(CostAwareBudget(memory=None))
    assert remembering < forgetting_nothing, (remembering, forgetting_nothing)


@pytest.mark.parametrize("kwargs", [dict(explore_backoff=0), dict(memory=0.5), dict(memory="long")])
def test_bad_adaptation_settings_are_refused(kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        CostAwareBudget(**kwargs)


def arms_only(**kwargs) -> CostAwareBudget:
    """A budget whose drafting steps all ask the drafter: no idle skipping (a run of proposals that
    draft nothing would skip steps inside the drafting arm) and no floor guard (a request that lost
    a tree is not asked again until it affords the next): the two arms alone."""
    return CostAwareBudget(idle_skip=0, max_loss=float("inf"), **kwargs)


def drive_with_pauses(policy, steps: int, n_accepted: int, drafting_seconds: float = 0.1, cost=cost_of) -> list:
    """Like `drive`, asking request_size first: a paused step (size 0) verifies the root alone and
    pays no drafting; a drafting step pays `drafting_seconds` on top of its verify. Returns, per
    step, whether it drafted. `cost`: seconds of a verify by its nodes. (The tests of the two arms
    build their budgets with `arms_only`.)"""
    drafted = []
    for _ in range(steps):
        if policy.request_size() == 0:
            policy.observe(DraftTree.root_only(7), np.zeros(1, np.int32), cost(1))
            drafted.append(False)
            continue
        tree = chain(64, 0.3)
        verified = tree.with_candidates(policy.choose(tree))
        path = np.arange(1 + min(verified.n_draft, n_accepted), dtype=np.int32)
        policy.observe(verified, path, cost(len(verified)) + drafting_seconds)
        drafted.append(True)
    return drafted


# The shape of SmolLM2's verify cost on HF CPU (cost_model "hf-cpu", relative to one node): every
# node adds a little, monotonically.
HF_CPU_SHAPE = {1: 1.0, 2: 1.125, 4: 1.2, 8: 1.41, 16: 1.68, 32: 2.37, 64: 3.73, 65: 3.8}


def hf_cpu_cost(n_nodes) -> float:
    return float(np.interp(n_nodes, list(HF_CPU_SHAPE), list(HF_CPU_SHAPE.values())))


def test_drafting_pauses_where_it_does_not_pay_and_resumes_where_it_does():
    """On HF CPU's cost shape. (On COST, whose 4 nodes cost less than 2, a budget that learnt while
    idle that nothing is accepted measures 2 nodes only, too dear to win a trial: it resumed only
    while its first tree was 4 nodes; docs/budget.md, "Trees grow by doubling".)"""
    policy = arms_only()
    idle = drive_with_pauses(policy, 3000, n_accepted=0, cost=hf_cpu_cost)
    assert not policy.drafting_pays
    assert sum(idle[1500:]) <= 0.05 * 1500, sum(idle[1500:])   # only the trials still draft
    # The workload changes: 3 candidates always accepted (4 tokens for 1.2 + 0.1 s against 1 for 1 s).
    # Only trials draft now, and the acceptance learnt while idle keeps their first trees small, so
    # drafting takes a few trials to win back.
    busy = drive_with_pauses(policy, 3000, n_accepted=3, cost=hf_cpu_cost)
    assert policy.drafting_pays
    assert sum(busy[-500:]) >= 0.95 * 500, sum(busy[-500:])
    rates = policy.arm_rates()
    assert rates[0] > rates[1], rates


def test_drafting_that_pays_is_never_paused_for_long():
    policy = arms_only()
    drafted = drive_with_pauses(policy, 3000, n_accepted=3)
    assert sum(drafted) >= 0.98 * 3000, 3000 - sum(drafted)   # the pause trials, a few steps each


def test_a_close_call_keeps_drafting():
    """Pausing must beat drafting by a margin, twice running: where drafting's overhead only just
    outweighs what it gains, drafting goes on (a burst missed while paused would cost more)."""
    policy = arms_only()
    # 1 token per 1.03 s drafting (overhead 0.03, nothing accepted) against 1 token per 1 s paused
    drafted = drive_with_pauses(policy, 2000, n_accepted=0, drafting_seconds=0.03)
    assert policy.drafting_pays and sum(drafted) >= 0.95 * 2000


def test_a_trial_pausing_won_is_confirmed_soon():
    """Drafting that paid for its overhead (a close call) stops paying after 1500 steps: once
    pausing wins a trial against that long a drafting record, the confirming trial comes
    `trial_every` steps later instead of after the backed-off interval (up to 16 x 64 steps), so
    pausing takes over sooner (948 drafted steps of the next 2500; backed off: 1572)."""
    policy = arms_only()
    drive_with_pauses(policy, 1500, n_accepted=0, drafting_seconds=0.03)
    assert policy.drafting_pays
    drafted = drive_with_pauses(policy, 2500, n_accepted=0, drafting_seconds=0.2)
    assert not policy.drafting_pays and sum(drafted) < 1200, sum(drafted)


def test_a_first_trial_lost_while_drafting_still_learns_is_not_confirmed_at_once():
    """The first trial (step 64) meets a drafting record of 32 steps spent learning sizes: a pause
    win there is confirmed only after the backed-off interval, as before (switch at step ~196)."""
    policy = arms_only()
    drafted = drive_with_pauses(policy, 260, n_accepted=0, drafting_seconds=0.1)
    assert all(drafted[70:190]) and not any(drafted[200:260]), (drafted.index(False, 69))


def test_a_size_never_measured_is_guessed_from_the_cost_growth_measured_below_it():
    """Sizes 1 and 2..4 measured on a steep cost (1 s per node): a bigger size is guessed at the
    largest measured one plus half the measured slope, not from 5 % growth per node."""
    steep = CostAwareBudget()
    for n_draft in (0, 1, 2, 3, 0):   # the last root-only step settles the tree before it (aftermath.py)
        steep.observe(chain(n_draft, 0.3), np.zeros(1, np.int32), float(n_draft + 1))
    assert steep.cost(4) == pytest.approx(4.0)                       # measured
    assert steep.cost(64) == pytest.approx(4.0 + 0.5 * 1.0 * 60)     # half the slope
    # Where the cost does not grow (a GPU), neither does the guess: 5 % per node would price 64
    # nodes at 4x, and the trees would stop growing (the doubling rule bounds the gamble).
    flat = CostAwareBudget()
    for n_draft in (0, 1, 2, 3, 0):
        flat.observe(chain(n_draft, 0.3), np.zeros(1, np.int32), 1.0)
    assert flat.cost(64) == pytest.approx(1.0)
    # Only one size measured: no slope yet, the optimistic guess.
    one = CostAwareBudget()
    one.observe(chain(0, 0.3), np.zeros(1, np.int32), 1.0)
    assert one.cost(8) == pytest.approx(1.0 + 0.05 * 7)


def test_the_root_estimate_is_the_estimates_first_entry_measured_or_guessed():
    """root_estimate skips guessing the other sizes; it must read what `estimated` would."""
    from draftcore.budget.costs import CostTable

    table = CostTable(largest=65, smoothing=0.2, optimism=0.05)
    table.learn(3, 0, 2.0)                                       # the root itself never measured
    assert table.root_estimate(0) == pytest.approx(float(table.estimated(0)[0]))
    table.learn(1, 0, 1.5)
    table.learn(1, 0, 1.0)
    assert table.root_estimate(0) == float(table.estimated(0)[0]) == pytest.approx(0.8 * 1.5 + 0.2 * 1.0)
    assert table.root_estimate(2) == pytest.approx(float(table.estimated(2)[0]))   # a window never measured


def test_trial_steps_zero_never_pauses():
    policy = arms_only(trial_steps=0)
    assert all(drive_with_pauses(policy, 1000, n_accepted=0))


def test_a_paused_step_never_asks_the_drafter_and_changes_no_output():
    from fixtures.toy import ToyModel, ToyVerifier, plain_greedy

    import draftcore
    from draftcore.drafters import TrieDrafter

    now = [0.0]

    class SlowCounting(TrieDrafter):
        """A trie whose every proposal costs 100 clock seconds (a step otherwise costs 5)."""
        proposals = 0

        def start(self, prompt):
            request = super().start(prompt)
            propose = request.propose

            def slow(context, budget):
                SlowCounting.proposals += 1
                now[0] += 100.0
                return propose(context, budget)
            request.propose = slow
            return request

    def clock():
        now[0] += 1.0
        return now[0]

    verifier = ToyVerifier(ToyModel(seed=3))
    prompt = np.arange(40, dtype=np.int32) % 7 + 1
    policy = CostAwareBudget(trial_every=8, trial_steps=2)
    result = draftcore.speculate(verifier, prompt, max_new_tokens=300, drafter=SlowCounting(), budget=policy,
                                 clock=clock)
    assert np.array_equal(result.tokens, plain_greedy(verifier, prompt, 300))
    assert not policy.drafting_pays
    assert SlowCounting.proposals < result.stats.steps / 3, (SlowCounting.proposals, result.stats.steps)


@pytest.mark.parametrize("kwargs", [dict(trial_every=0), dict(trial_steps=-1), dict(trial_steps=1.5)])
def test_bad_pause_settings_are_refused(kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        CostAwareBudget(**kwargs)


def test_exploration_skips_a_neighbour_worth_less_than_half_the_choice():
    policy = CostAwareBudget(trial_steps=0)
    tree = chain(8, 0.02)   # calibrated near 0.025: a candidate is worth almost nothing
    for size in (1, 2, 3, 4):
        policy.observe(tree.with_candidates(size - 1), np.zeros(1, np.int32), 2.5 * size - 1.5)
    choices = []
    for _ in range(200):
        policy._explore.next_step = policy._step   # an exploration due at every step
        choices.append(policy.choose(tree))
        policy.observe(DraftTree.root_only(7), np.zeros(1, np.int32), 1.0)
    assert set(choices) == {0}   # 1 candidate: 1.025 tokens for 3.5 steps' time, never re-measured
    cheap = CostAwareBudget(trial_steps=0)
    for size in (1, 2, 3, 4):
        cheap.observe(tree.with_candidates(size - 1), np.zeros(1, np.int32), 1.0 + 0.05 * size)
    explored = []
    for _ in range(20):
        cheap._explore.next_step = cheap._step
        explored.append(cheap.choose(tree))
        cheap.observe(DraftTree.root_only(7), np.zeros(1, np.int32), 1.0)
    assert 1 in explored   # a neighbour nearly as good is re-measured


def test_one_slow_step_cannot_make_no_draft_look_dearer_than_a_draft():
    # A root-only step 8x slower than usual (a page fault) once raised the no-draft estimate above a
    # 2-token step's, and a budget then verified a poor candidate every step.
    policy = CostAwareBudget(trial_steps=0)
    tree = chain(8, 0.5)
    for size in (1, 2, 3, 4):
        for _ in range(5):
            policy.observe(tree.with_candidates(size - 1), np.zeros(1, np.int32), 2.0 * size - 1.0)
    policy.observe(DraftTree.root_only(7), np.zeros(1, np.int32), 8.0)
    assert policy.cost([1])[0] <= 1.2 + 1e-9   # 0.8 * 1 + 0.2 * min(8, 2 * 1)
    policy._explore.next_step = 1 << 30
    assert policy.choose(tree) == 0


def test_proposals_that_draft_nothing_are_mostly_skipped_where_asking_costs():
    """Where no draft ever pays and asking the drafter costs 4 % of a step (not enough for pausing,
    which must win by 5 %), idle skipping asks on about one step in four once pausing's trials have
    measured a step that does not ask; where asking costs 0.5 % it asks on every step; where drafts
    pay it asks on every step."""
    policy = CostAwareBudget()
    idle = drive_with_pauses(policy, 3000, n_accepted=0, drafting_seconds=0.04)
    assert policy.drafting_pays and policy.asking_costs()
    assert 0.2 * 1000 <= sum(idle[2000:]) <= 0.3 * 1000, sum(idle[2000:])
    free = CostAwareBudget()
    asked = drive_with_pauses(free, 3000, n_accepted=0, drafting_seconds=0.005)
    assert free.drafting_pays and not free.asking_costs()
    assert sum(asked[2000:]) >= 0.95 * 1000, sum(asked[2000:])
    busy = drive_with_pauses(CostAwareBudget(), 2000, n_accepted=3, drafting_seconds=0.04)
    assert sum(busy[100:]) >= 0.98 * 1900, sum(busy[100:])   # the pause trials, a few steps each


def test_both_budgets_keep_the_policy_contract():
    assert isinstance(FixedBudget(4), BudgetPolicy) and isinstance(CostAwareBudget(), BudgetPolicy)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_learn_outcomes_matches_its_naive_twin(seed):
    """kernels.learn_outcomes against naive_learn_outcomes: random trees, cells, outcomes (some
    unknown), verified prefixes, menus and step costs (sometimes none measured: empty sizes)."""
    K = kernels("draftcore.budget.kernels")
    rng = np.random.default_rng(seed)
    for _ in range(20):
        n = int(rng.integers(2, 40))
        chainy = rng.random()
        parents = np.r_[-1, [i - 1 if rng.random() < chainy else rng.integers(0, i) for i in range(1, n)]]
        parents = parents.astype(np.int32)
        n_cells = int(rng.integers(1, 30))
        cells = rng.integers(0, n_cells, n)
        offered = rng.uniform(1.0, 10.0, n_cells)
        accepted = offered * rng.random(n_cells)
        probability = rng.random(n_cells)   # stale where not counted: only counted cells are refreshed
        if rng.random() < 0.3:   # a coarse calibration: equal values, ties between sizes (never 0: the prior)
            probability = rng.choice([0.25, 0.5, 1.0], n_cells)
        outcome = rng.choice(np.array([-1, 0, 1], np.int8), n, p=rng.dirichlet([1, 1, 1])).astype(np.int8)
        outcome[0] = 1
        verified = int(rng.integers(0, n if rng.random() < 0.5 else 2))
        sizes = menu(int(rng.integers(1, 70)))
        if rng.random() < 0.1:
            sizes = sizes[:0]
        growth = rng.uniform(0.0, 1.0, sizes.shape[0]) * (rng.random(sizes.shape[0]) < rng.random())
        seconds = np.cumsum(growth) + rng.uniform(0.1, 2.0)   # sometimes flat: sizes that cost the same
        want_offered, want_accepted, want_probability, want = naive_learn_outcomes(
            offered, accepted, probability, cells, outcome, verified, parents, n, sizes, seconds)
        got = K.learn_outcomes(offered, accepted, probability, cells, outcome, verified, parents, n, sizes, seconds)
        assert offered.tolist() == want_offered and accepted.tolist() == want_accepted
        assert probability.tolist() == want_probability
        assert got[1] == want[1] and got[0] == pytest.approx(want[0], rel=1e-12, abs=1e-12), (got, want)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_measured_growth_matches_its_naive_twin(seed):
    """kernels.measured_growth against naive_measured_growth: random menus and tables, from
    none to every size measured, costs that grow, stay flat or fall."""
    K = kernels("draftcore.budget.kernels")
    rng = np.random.default_rng(seed)
    for _ in range(20):
        sizes = menu(int(rng.integers(1, 70)))
        known = np.cumsum(rng.normal(0.3, 0.5, sizes.shape[0])) + 5.0
        known[rng.random(sizes.shape[0]) < rng.random()] = np.nan
        got = K.measured_growth(known, sizes)
        want = naive_measured_growth(known.tolist(), sizes.tolist())
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, equal_nan=True)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_the_cost_tables_estimates_match_their_naive_twin(seed):
    """CostTable.estimated (the guessed_costs kernel, each window's smallest measured size kept as
    `learn` goes) against naive_cost_estimates, which searches every table: random steps learnt in
    random order over three window sizes, read after each."""
    rng = np.random.default_rng(seed)
    table = CostTable(largest=int(rng.integers(2, 70)), smoothing=0.2, optimism=0.05)
    windows = (0, 3, 8)
    for _ in range(25):
        window = int(rng.choice(windows))
        size = int(rng.choice(table.sizes))
        table.learn(size, window, float(rng.uniform(0.5, 3.0)) * (1.0 + 0.1 * size))
        for n_lookahead in windows:
            want = naive_cost_estimates(table.measured, table.sizes.tolist(), 0.05, n_lookahead)
            np.testing.assert_allclose(table.estimated(n_lookahead), want, rtol=1e-12, atol=0)


def test_calibration_cells_are_the_score_bins_and_rank_buckets():
    """The cells kernel bins as DraftTree.score_bins does, edges included: float32 scores at and
    next to every bin edge (the product taken in float32, as numpy takes it), float64 scores, and a
    tree without scores (0.5 ** depth)."""
    calibration = Calibration(max_nodes=64, memory=None)
    edges = np.arange(BINS + 1) / BINS
    near = np.concatenate([edges, np.nextafter(edges.astype(np.float32), np.float32(0)),
                           np.nextafter(edges.astype(np.float32), np.float32(2)), [0.15, 0.35, 0.55, 0.7]])
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64, None):
        for n in (1, 2, 7, 40, 90):
            tree = DraftTree.chain(3, rng.integers(0, 50, n - 1))
            if dtype is not None:
                scores = rng.choice(near, n).astype(dtype)
                scores[0] = 1.0
                tree.scores = scores
            for m in (1, n // 2 + 1, n):
                want = tree.score_bins(BINS, 0, m) * RANKS + rank_buckets(max(m, 66), RANKS)[:m]
                np.testing.assert_array_equal(calibration.cells(tree, m), want)


def test_fading_the_calibration_in_place_is_the_numpy_arithmetic_bit_for_bit():
    rng = np.random.default_rng(1)
    calibration = Calibration(max_nodes=16, memory=500.0)
    offered, accepted = calibration.offered + rng.uniform(0, 40, calibration.offered.shape), None
    accepted = offered * rng.uniform(0, 1, offered.shape)
    calibration.offered, calibration.accepted = offered.copy(), accepted.copy()
    keep = 1.0 - 1.0 / 500.0
    want_offered = calibration.prior_offered + keep * (offered - calibration.prior_offered)
    want_accepted = calibration.prior_accepted + keep * (accepted - calibration.prior_accepted)
    calibration.learn_verified(DraftTree.root_only(3), np.zeros(1, np.int32))
    np.testing.assert_array_equal(calibration.offered, want_offered)
    np.testing.assert_array_equal(calibration.accepted, want_accepted)
    np.testing.assert_array_equal(calibration.probability, (want_accepted / want_offered).ravel())


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_the_choices_kernel_is_its_naive_twin(seed):
    """kernels.menu_values (CostAwareBudget.choose's arithmetic in one call) against
    naive_menu_values: random trees and calibrated probabilities, menus cut anywhere, estimates with
    a zero or negative root-only cost, NaN and equal values, slack and max_loss from none to inf."""
    K = kernels("draftcore.budget.kernels")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 66))
    parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], np.int32)
    p = np.concatenate([[1.0], rng.choice([1e-3, 0.25, 0.5, 1.0, rng.uniform(1e-3, 1.0)], n - 1)])   # counts keep p > 0
    sizes = menu(65)
    n_menu = int(rng.integers(1, int(np.searchsorted(sizes, n, side="right")) + 1))
    estimates = np.cumsum(rng.choice([0.0, 1.0, rng.uniform(0.1, 3.0)], len(sizes)))
    estimates[0] = rng.choice([0.0, -1.0, 1.0, rng.uniform(0.1, 2.0)])
    if rng.uniform() < 0.2:
        estimates[int(rng.integers(0, n_menu))] = np.nan
    correction, slack = float(rng.uniform(0.25, 1.0)), float(rng.choice([0.0, 1.0, rng.uniform(0, 40), np.inf]))
    max_loss = float(rng.choice([0.0, 0.02, np.inf]))
    value, best, hopeless = K.menu_values(p, parents, n, sizes, n_menu, estimates, correction, slack, max_loss,
                                          HOPELESS)
    want, want_best, want_hopeless = naive_menu_values(p, parents, sizes[:n_menu], estimates[:n_menu], correction,
                                                       slack, max_loss, HOPELESS)
    np.testing.assert_allclose(value, want, rtol=1e-12, atol=0)
    assert (best, hopeless) == (want_best, want_hopeless)
    # one cut (kernels.affords) behind both menu_values and FloorGuard.affordable (request_size asks it): no
    # value here is 0 before the cut (a positive numerator over finite, NaN or non-positive seconds)
    if estimates[0] > 0:
        guard = FloorGuard(max_loss)
        guard.slack = slack
        assert np.array_equal(value == 0.0, ~guard.affordable(estimates[:n_menu] / estimates[0]))


@pytest.mark.parametrize("tick_every", [0, 7, 2])
def test_a_clock_that_never_advances_or_seldom_does_changes_no_output(tick_every):
    """Steps measured at 0 seconds: a frozen clock (every step; every size is then worth inf, and the
    first, the root, is kept), or a coarse one that advances a whole second every `tick_every` calls
    (a root-only step's estimate can be 0). The auto budget still chooses, learns outcomes and
    compares its arms, all of which divide by those seconds, and the output is plain greedy's. The
    kernels and the arms' comparison raised ZeroDivisionError there."""
    from fixtures.toy import ToyModel, ToyVerifier, plain_greedy

    import draftcore
    from draftcore.drafters import TrieDrafter

    verifier = ToyVerifier(ToyModel(seed=4))
    prompt = np.tile(np.arange(1, 9, dtype=np.int32), 6)
    policy = CostAwareBudget()
    calls = [0]

    def clock():
        calls[0] += 1
        return 5.0 + (calls[0] // tick_every if tick_every else 0)
    result = draftcore.speculate(verifier, prompt, max_new_tokens=200, drafter=TrieDrafter(), budget=policy,
                                 clock=clock)
    assert np.array_equal(result.tokens, plain_greedy(verifier, prompt, 200))
