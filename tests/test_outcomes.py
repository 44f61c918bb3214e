"""What every proposed candidate would have done (draftcore.outcomes) and how the auto budget uses it:
the kernel against its naive twin, the loop's bookkeeping against the emitted tokens, the budget's
calibration of unverified candidates, its tree-consistent expectation and its bias correction."""
import numpy as np
import pytest

import draftcore
from draftcore import CostAwareBudget, DraftTree
from draftcore.jit import kernels
from draftcore.outcomes import ProposalOutcomes
from naive import naive_expected_accepted, naive_would_accept
from fixtures.toy import ToyModel, ToyVerifier, plain_greedy


def random_tree(rng, n: int, vocab: int) -> DraftTree:
    parents = np.r_[-1, [rng.integers(0, i) for i in range(1, n)]].astype(np.int32)
    return DraftTree.build(rng.integers(0, vocab, n), parents)


def test_would_accept_matches_its_naive_twin():
    K = kernels("draftcore.tree_kernels")
    rng = np.random.default_rng(0)
    for _ in range(400):
        vocab = int(rng.integers(2, 5))   # few tokens: many nodes agree with the continuation
        tree = random_tree(rng, int(rng.integers(1, 30)), vocab)
        continuation = rng.integers(0, vocab, int(rng.integers(0, 8))).astype(np.int32)
        got = K.would_accept(tree.tokens, tree.parents, tree.depths, len(tree), continuation)
        assert got.tolist() == naive_would_accept(tree.tokens, tree.parents, continuation)


def test_expected_accepted_matches_its_naive_twin_and_never_counts_siblings_twice():
    K = kernels("draftcore.budget.kernels")
    rng = np.random.default_rng(1)
    for _ in range(300):
        tree = random_tree(rng, int(rng.integers(2, 25)), 50)
        p = np.r_[1.0, rng.random(len(tree) - 1)]
        got = K.expected_accepted(p, tree.parents, len(tree))
        want = [naive_expected_accepted(p, tree.parents, k) for k in range(len(tree))]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        assert np.all(got <= tree.depths.max() + 1e-9)   # one path is accepted: at most its depth
    # Two siblings calibrated at 0.8 each: together at most what their parent (the root) holds.
    star = DraftTree.build([5, 1, 2], [-1, 0, 0])
    assert K.expected_accepted(np.array([1.0, 0.8, 0.8]), star.parents, 3).tolist() == [0.0, 0.8, 1.0]
    # A chain is the plain sum while each node is at most its parent.
    chain = DraftTree.chain(5, [1, 2, 3])
    np.testing.assert_allclose(K.expected_accepted(np.array([1.0, 0.9, 0.5, 0.4]), chain.parents, 4),
                               [0.0, 0.9, 1.4, 1.8])


class Recorder:
    def __init__(self):
        self.reports = []

    def __call__(self, tree, verified, outcome):
        self.reports.append((tree, verified, outcome.copy()))


def test_a_proposal_is_settled_once_its_deepest_candidate_can_be_told():
    report = Recorder()
    outcomes = ProposalOutcomes(report)
    context = np.array([9, 9, 4, 1, 2, 3, 0, 0], np.int32)   # the root is context[2]; 1, 2, 3 follow
    proposal = DraftTree.build([4, 1, 2, 7, 3], [-1, 0, 1, 0, 2])   # 4-1-2-3 and 4-7
    outcomes.add(proposal, 1, start=3)
    proposal.tokens[:] = 0            # a drafter reusing its buffers must not change what was added
    outcomes.settle(context, 5)       # two tokens: the depth-3 candidate cannot be told yet
    assert report.reports == []
    outcomes.settle(context, 6)
    (tree, verified, outcome), = report.reports
    assert verified == 1 and tree.tokens.tolist() == [4, 1, 2, 7, 3]
    assert outcome.tolist() == [1, 1, 1, 0, 1]


def test_a_request_that_ends_settles_the_rest_as_unknown():
    report = Recorder()
    outcomes = ProposalOutcomes(report)
    context = np.array([4, 1, 5], np.int32)
    outcomes.add(DraftTree.build([4, 1, 2, 6], [-1, 0, 1, 0]), 0, start=1)
    outcomes.settle(context, 2, final=True)   # only one token came: the depth-2 node is unknown
    (_, _, outcome), = report.reports
    assert outcome.tolist() == [1, 1, -1, 0]
    outcomes.add(DraftTree.root_only(4), 0, start=1)   # nothing proposed: nothing to tell
    outcomes.settle(context, 3, final=True)
    assert len(report.reports) == 1


def test_pending_proposals_are_bounded():
    report = Recorder()
    outcomes = ProposalOutcomes(report)
    deep = DraftTree.chain(1, np.arange(200) % 7)
    for i in range(ProposalOutcomes.MAX_PENDING + 10):
        outcomes.add(deep, 0, start=i)
    assert len(outcomes._pending) == ProposalOutcomes.MAX_PENDING


class SpyBudget:
    """A fixed budget that records each proposal with where its root's continuation starts, and
    what the loop later tells it about every proposal."""

    def __init__(self, n: int, n_prompt: int):
        self.n = n
        self.position = n_prompt + 1   # the prefill emits one token
        self.proposals = []            # (start, tokens, parents, verified) of proposals with candidates
        self.reports = []

    def request_size(self):
        return 64

    def choose(self, tree):
        k = min(self.n, tree.n_draft)
        if tree.n_draft:
            self.proposals.append((self.position, tree.tokens.copy(), tree.parents.copy(), k))
        return k

    def observe(self, tree, path, seconds):
        self.position += path.shape[0]   # the accepted candidates and the model's next token

    def observe_outcomes(self, tree, verified, outcome):
        self.reports.append((tree.tokens.copy(), tree.parents.copy(), verified, outcome.copy()))


@pytest.mark.parametrize("n", [0, 2, 64])
def test_the_loop_reports_what_every_proposal_would_have_done(n):
    # Whatever was verified (nothing, a prefix, everything), each report must be what the tokens
    # really emitted after its proposal's root say; a loop passing a wrong start fails it.
    model = ToyModel(vocab_size=12, seed=3)
    prompt = np.array([1, 2, 3, 1, 2, 3, 1, 2], np.int32)
    budget = SpyBudget(n, len(prompt))
    result = draftcore.speculate(ToyVerifier(model), prompt, max_new_tokens=60, drafter="trie", budget=budget)
    np.testing.assert_array_equal(result.tokens, plain_greedy(ToyVerifier(model), prompt, 60))
    assert len(budget.proposals) > 5, "the trie proposed little on a repeating toy text"
    assert len(budget.reports) == len(budget.proposals)   # every proposal told, in order
    emitted = np.r_[prompt, result.tokens]
    told = accepted = 0
    for (start, tokens, parents, verified), report in zip(budget.proposals, budget.reports):
        assert emitted[start - 1] == tokens[0]   # the spy's own bookkeeping: the root precedes start
        np.testing.assert_array_equal(report[0], tokens)
        np.testing.assert_array_equal(report[1], parents)
        assert report[2] == verified
        want = naive_would_accept(tokens, parents, emitted[start:])
        assert report[3].tolist() == want
        told += sum(w >= 0 for w in want[1:])
        accepted += sum(w == 1 for w in want[1:])
    assert told > 0 and 0 < accepted < told


def test_unverified_candidates_join_the_calibration():
    budget = CostAwareBudget()
    tree = DraftTree.chain(7, [1, 2, 3, 4])
    tree.scores = np.array([1.0, 0.5, 0.5, 0.5, 0.5], np.float32)
    before_offered = budget._calibration.offered.sum()
    before_accepted = budget._calibration.accepted.sum()
    budget.observe_outcomes(tree, 1, np.array([1, 1, 1, 0, 0], np.int8))   # candidate 1 was verified
    assert budget._calibration.offered.sum() - before_offered == pytest.approx(3)      # candidates 2, 3, 4
    assert budget._calibration.accepted.sum() - before_accepted == pytest.approx(1)    # candidate 2
    budget.observe_outcomes(tree, 0, np.array([1, 1, -1, -1, -1], np.int8))  # unknowns are not counted
    assert budget._calibration.offered.sum() - before_offered == pytest.approx(4)


def test_the_bias_correction_follows_what_the_prefix_it_picks_achieves():
    # Verified steps teach the bias at once; outcomes teach it for the longer prefix it would have
    # picked uncorrected; a prefix already verified is not counted twice.
    budget = CostAwareBudget()
    cost = {1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5, 5: 3.0, 6: 3.5}   # each candidate costs half a step
    tree = DraftTree.chain(7, [1, 2, 3, 4, 5])
    tree.scores = np.array([1.0, 0.95, 0.95, 0.95, 0.95, 0.95], np.float32)
    for size, seconds in cost.items():   # costs measured, every verified candidate accepted
        for _ in range(3):
            budget.observe(tree.with_candidates(size - 1), np.arange(size, dtype=np.int32), seconds)
    budget._explore.next_step = 1 << 30
    assert budget.choose(tree) == 5
    before = budget.bias()
    budget.observe_outcomes(tree, 5, np.array([1, 0, 0, 0, 0, 0], np.int8))   # all five were verified
    assert budget.bias() == before
    for _ in range(12):   # the picked prefix fails: only its root comes true
        k = budget.choose(tree)
        budget.observe(tree.with_candidates(k), np.array([0], np.int32), cost[k + 1])
        if k == 0:
            break
    assert k == 0 and budget.bias() < 0.7
    # the prefixes come true again (seen in outcomes, nothing verified): the correction recovers
    for _ in range(200):
        budget.observe_outcomes(tree, 0, np.ones(6, np.int8))
    assert budget.bias() == 1.0 and budget.choose(tree) == 5


def test_outcomes_of_a_prefix_it_would_not_pick_leave_the_bias_alone():
    budget = CostAwareBudget()
    tree = DraftTree.chain(7, [1, 2, 3])
    tree.scores = np.array([1.0, 0.01, 0.01, 0.01], np.float32)
    for size in (1, 2, 3, 4):
        budget.observe(tree.with_candidates(size - 1), np.array([0], np.int32), float(size))
    before = budget.bias()
    for _ in range(40):   # it would pick no draft: these outcomes say nothing of its bias
        budget.observe_outcomes(tree, 0, np.array([1, 0, 0, 0], np.int8))
    assert budget.bias() == before


def costly_chain_budget(**options):
    """(budget, 5-candidate chain, {nodes: seconds}): a budget that has measured a cost where a
    candidate costs 1.5 steps, never exploring, and without the floor guard (these trees lost, it
    would ask the drafter for nothing until the request earned the next: the skipping tested here
    is the idle rule's alone)."""
    budget = CostAwareBudget(trial_steps=0, max_loss=float("inf"), **options)
    cost = {1: 1.0, 2: 2.5, 3: 4.0, 4: 5.5, 5: 7.0, 6: 8.5}
    tree = DraftTree.chain(7, [1, 2, 3, 4, 5])
    for size, seconds in cost.items():
        budget.observe(tree.with_candidates(size - 1), np.array([0], np.int32), seconds)
    budget._explore.next_step = 1 << 30
    return budget, tree, cost


def test_a_hopeless_proposal_skips_the_next_one():
    budget, tree, _ = costly_chain_budget(idle_skip=0)
    tree.scores = np.array([1.0, 0.02, 0.01, 0.01, 0.01, 0.01], np.float32)
    assert budget.request_size() > 0
    assert budget.choose(tree) == 0          # worth far less than no draft
    assert budget.request_size() == 0        # so the next step asks the drafter for nothing
    assert budget.request_size() > 0         # and the one after asks again
    tree.scores = np.array([1.0, 0.95, 0.95, 0.95, 0.95, 0.95], np.float32)
    budget._calibration.offered[:] = 2.0
    budget._calibration.accepted[:] = budget._calibration.prior_accepted
    budget._calibration.probability = (budget._calibration.accepted / budget._calibration.offered).ravel()
    budget.choose(tree)
    assert budget.request_size() > 0         # a proposal worth something skips nothing


def test_proposals_that_draft_nothing_in_a_row_skip_more_and_a_draft_resets():
    budget, tree, cost = costly_chain_budget(idle_skip=3)
    assert not budget.asking_costs()              # not measured: no skipping yet
    budget.request_size()
    budget.observe(tree.with_candidates(0), np.array([0], np.int32), 1.0)   # a step that did not ask
    budget.request_size()
    budget.choose(tree.with_candidates(0))
    budget.observe(tree.with_candidates(0), np.array([0], np.int32), 1.1)   # one that asked: 10 % more
    assert budget.asking_costs()
    budget._skipping.idle = budget._skipping.skip_left = 0
    tree.scores = np.array([1.0, 0.6, 0.6, 0.6, 0.6, 0.6], np.float32)   # worth less than no draft, not hopeless

    def skipped_after_choosing():
        assert budget.request_size() > 0 and budget.choose(tree) == 0
        n = 0
        while budget.request_size() == 0:
            n += 1
        return n

    assert [skipped_after_choosing() for _ in range(6)] == [0, 1, 2, 3, 3, 3]
    cheap = CostAwareBudget(trial_steps=0, idle_skip=3)   # the same proposal where a candidate is nearly free
    for size in cost:
        cheap.observe(tree.with_candidates(size - 1), np.array([0], np.int32), 1.0 + 0.01 * size)
    cheap._explore.next_step = 1 << 30
    cheap._skipping.root_seconds[:] = (1.1, 1.0)
    assert cheap.choose(tree) > 0 and cheap.request_size() > 0    # a draft: nothing skipped
    budget.choose(tree.with_candidates(0))        # the drafter had nothing: that counts as drafting nothing
    assert budget.request_size() == 0
    cheap._skipping.idle = 5
    assert cheap.choose(tree) > 0                 # a proposal that drafts resets the run
    assert cheap._skipping.idle == 0 and cheap.request_size() > 0


def test_a_caller_that_reports_no_outcomes_gets_no_bias_or_gamble_correction():
    # Learnt from verified trees alone, the corrections could fall and never see the trees it then
    # stopped verifying come true (llama-cpp-python's draft-model loop reports no outcomes).
    budget = CostAwareBudget()
    tree = DraftTree.chain(7, [1, 2, 3])
    tree.scores = np.array([1.0, 0.95, 0.95, 0.95], np.float32)
    for _ in range(50):
        budget.observe(tree, np.array([0], np.int32), 1.0)
    assert budget.bias() == 1.0 and budget.gamble_correction() == 1.0


def measured_chain_budget(cost):
    """A budget that has measured `cost` (nodes -> seconds) and been told outcomes, never exploring,
    and a 5-candidate chain it calibrates at 0.95 a node. Without the floor per request: the costs
    given are learnt from steps whose losses would leave no slack for any tree."""
    budget = CostAwareBudget(trial_steps=0, max_loss=float("inf"))
    tree = DraftTree.chain(7, [1, 2, 3, 4, 5])
    tree.scores = np.array([1.0, 0.95, 0.95, 0.95, 0.95, 0.95], np.float32)
    for size, seconds in cost.items():
        for _ in range(3):
            budget.observe(tree.with_candidates(size - 1), np.arange(size, dtype=np.int32), seconds)
    budget.observe_outcomes(tree, 5, np.ones(6, np.int8))
    budget._explore.next_step = 1 << 30
    return budget, tree


def test_verified_trees_that_fall_short_lower_the_gamble_correction_to_its_floor_and_back():
    cost = {1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5, 5: 3.0, 6: 3.5}
    budget, tree = measured_chain_budget(cost)
    assert budget.gamble_correction() == 1.0
    for _ in range(100):
        # the chains it verifies stop after one token of the five expected, while the chains it
        # proposes and does not verify come true (so the calibration and the bias stay high)
        budget.observe(tree.with_candidates(5), np.array([0, 1], np.int32), cost[6])
        for _ in range(20):
            budget.observe_outcomes(tree, 0, np.ones(6, np.int8))
    assert budget.bias() > 0.9
    assert budget.gamble_correction() == pytest.approx(budget._gamble.floor)
    for _ in range(200):   # the verified ones come true again
        budget.observe(tree.with_candidates(5), np.arange(6, dtype=np.int32), cost[6])
    assert budget.gamble_correction() == 1.0


def test_the_gamble_correction_scales_what_choose_expects():
    # Calibration and bias say a 5-token chain pays (1 + about 4.9 tokens for 4.5 s against 1 token
    # for 1 s); verified trees that delivered 0.6 of their estimate make it not pay (1 + 2.9 < 4.5).
    budget, tree = measured_chain_budget({1: 1.0, 2: 4.5, 3: 4.5, 4: 4.5, 5: 4.5, 6: 4.5})
    assert budget.bias() == 1.0 and budget.choose(tree) == 5
    budget._gamble.expected, budget._gamble.accepted = 1000.0, 0.0
    assert budget.gamble_correction() == budget._gamble.floor
    assert budget.choose(tree) == 0
