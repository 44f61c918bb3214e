"""The protocol's newer parts through the real loop on the toy model: drafter feedback (`observe`),
node roles (a Jacobi-shaped lookahead window beside the candidates), backend limits (nodes, leaves,
cache cells), the bare call and its session, and what `import draftcore` loads.

The toy model's logits depend on every (position, token) pair a node sees (draftcore/tools/fixtures/toy.py), so a
window that leaks into the candidates' attention, or sits at the wrong positions, changes either
the output or the tokens the drafter observes, and the tests below catch both.
"""
from __future__ import annotations

import subprocess
import sys
import weakref

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import draftcore
from draftcore import ConfigError, DraftTree, FixedBudget, TrieDrafter
from draftcore.acceptance import greedy_accept
from draftcore.drafters.trie_research import TrieResearch
from naive import naive_greedy_accept
from test_speculate import SETTINGS, OracleDrafter, check_result, continuation, expected_output, requests
from fixtures.toy import ToyModel, ToyVerifier, _mix


# -- a drafter whose trees carry a window -------------------------------------------------------------------
def with_window(tree: DraftTree, levels: int, width: int, rng, vocab: int, first_row=None) -> DraftTree:
    """`tree` plus a Jacobi-shaped window of `levels` x `width` lookahead nodes: level-0 token j
    hangs under level-0 token j - 1 (the root for j = 0), level-l token j under level-(l-1) token
    j - 1 (the root for j = 0), so the depth of (l, j) is j + 1. first_row: level-0 tokens (random
    when None)."""
    n0 = len(tree)
    tokens, parents, depths = list(tree.tokens), list(tree.parents), list(tree.depths)
    index = {}
    for level in range(levels):
        for j in range(width):
            if level == 0:
                parent = 0 if j == 0 else index[(0, j - 1)]
                token = int(first_row[j]) if first_row is not None else int(rng.integers(0, vocab))
            else:
                parent = 0 if j == 0 else index[(level - 1, j - 1)]
                token = int(rng.integers(0, vocab))
            index[(level, j)] = len(tokens)
            tokens.append(token), parents.append(parent), depths.append(j + 1)
    scores = None if tree.scores is None else np.r_[tree.scores, np.zeros(levels * width)].astype(np.float32)
    return DraftTree.build(tokens, parents, depths, scores=scores, n_lookahead=len(tokens) - n0)


class WindowDrafter:
    """Any drafter's candidates plus a random window; records what `observe` receives."""

    def __init__(self, inner, model, levels=2, width=4, seed=0, window_is_truth=False):
        self.inner, self.model = inner, model
        self.levels, self.width = levels, width
        self.rng = np.random.default_rng(seed)
        self.window_is_truth = window_is_truth
        self.proposed = []       # (tree, context) per propose
        self.observed = []       # (tree, node_tokens, path, context) per observe
        self._context = None

    def start(self, prompt):  # returns None: serves its one request itself
        self.request = self.inner.start(prompt) or self.inner
        self._context = [int(t) for t in prompt]

    def update(self, tokens):
        self.request.update(tokens)
        self._context += [int(t) for t in tokens]

    def finish(self):
        self.request.finish()

    def propose(self, context, budget):
        assert context.tolist() == self._context
        tree = self.request.propose(context, budget)
        row = continuation(self.model, context, self.width) if self.window_is_truth else None
        tree = with_window(tree, self.levels, self.width, self.rng, self.model.vocab_size, row)
        self.proposed.append((tree, list(self._context)))
        return tree

    def observe(self, tree, node_tokens, path):
        self.observed.append((tree, node_tokens.copy(), path.copy(), list(self._context)))


class SpyVerifier(ToyVerifier):
    """Records every verified tree and what verify returned; commits are recorded too."""

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        self.verified, self.committed = [], []

    def verify(self, tree, n_logits=0):
        tokens, logits = super().verify(tree, n_logits)
        self.verified.append((tree, tokens.copy(), n_logits))
        return tokens, logits

    def commit(self, path):
        self.committed.append(np.array(path))
        super().commit(path)


def model_tokens(model, context, tree) -> np.ndarray:
    """The model's greedy token after every node's prefix, straight from the definition."""
    return np.array([int(np.argmax(model.logits(list(context) + tree.path_tokens(i)[1:].tolist())))
                     for i in range(len(tree))], np.int32)


def check_observations(drafter, verifier, model):
    """observe got, after every verify: the tree the verifier verified (the same object), exactly
    the tokens it returned, the committed path, and those tokens are the model's true argmax at
    every node (candidates and window alike)."""
    assert len(drafter.observed) == len(verifier.verified) == len(verifier.committed) > 0
    for (tree, tokens, path, context), (v_tree, v_tokens, _), committed in zip(
            drafter.observed, verifier.verified, verifier.committed):
        assert tree is v_tree
        np.testing.assert_array_equal(tokens, v_tokens)
        np.testing.assert_array_equal(path, committed)
        np.testing.assert_array_equal(tokens, model_tokens(model, context, tree))


# -- observe -------------------------------------------------------------------------------------------
class AskTwelveKeepThree(FixedBudget):
    """Asks the drafter for 12 candidates and verifies the best 3, so verified trees are cut proposals."""

    def __init__(self):
        super().__init__(3)

    def request_size(self):
        return 12


@pytest.mark.parametrize("sampling", [None, dict(temperature=0.8, top_p=0.95, seed=3)])
def test_observe_receives_the_verified_tree_its_argmax_and_the_path(sampling):
    for seed in range(3):
        model = ToyModel(vocab_size=12, seed=seed)
        verifier = SpyVerifier(model)
        drafter = WindowDrafter(OracleDrafter(model, seed), model, seed=seed)
        prompt = [1, 2, 3, 1, 2]
        result = draftcore.speculate(verifier, prompt, max_new_tokens=40, drafter=drafter,
                                     budget=AskTwelveKeepThree(), sampling=sampling)
        check_observations(drafter, verifier, model)
        # the budget cut the oracle's 6..12-candidate trees to 3: observe saw the cut tree, not the proposal
        assert all(t.n_draft <= 3 for t, *_ in drafter.observed)
        assert any(p.n_draft > 3 for p, _ in drafter.proposed)
        if sampling is None:
            check_result(result, *expected_output(model, prompt, 40))
        else:  # sampling asks for the candidates' logits only, never the window's
            assert all(n_logits == tree.n_candidates for tree, _, n_logits in verifier.verified)


class RowsReversedVerifier(ToyVerifier):
    """Planted: returns the logits rows (and their argmax) in reverse node order."""

    def verify(self, tree, n_logits=0):
        _, logits = super().verify(tree, len(tree))
        logits = logits[::-1].copy()
        return logits.argmax(axis=1).astype(np.int32), logits[:n_logits]


def test_observe_check_catches_rows_in_the_wrong_order():
    model = ToyModel(vocab_size=12, seed=1)

    class Spy(RowsReversedVerifier, SpyVerifier):
        pass

    verifier = Spy(model)
    drafter = WindowDrafter(OracleDrafter(model, 1), model, seed=1)
    try:
        draftcore.speculate(verifier, [1, 2, 3, 1, 2], max_new_tokens=30, drafter=drafter, budget=FixedBudget(4))
    except draftcore.BackendError:
        pass  # the reversed rows may also break acceptance outright; what observe saw is checked below
    with pytest.raises(AssertionError):
        check_observations(drafter, verifier, model)


def test_a_drafter_without_observe_is_unaffected():
    model = ToyModel(vocab_size=10, seed=2)
    drafter = OracleDrafter(model, 2)
    assert not hasattr(drafter, "observe")
    result = draftcore.speculate(ToyVerifier(model), [4, 5, 6], max_new_tokens=30, drafter=drafter, budget=8)
    check_result(result, *expected_output(model, [4, 5, 6], 30))


@pytest.mark.parametrize("trusted", [True, False])
def test_only_a_trusted_request_gets_the_loops_arguments_unchecked(trusted):
    """The loop's tree, tokens and path are valid by construction, so draftcore's own requests
    (returns_valid_trees) take them through observe_checked; any other request's observe is called,
    and checks them itself."""
    from draftcore.drafting import StepDrafting

    calls = []

    class Request:
        returns_valid_trees = trusted

        def update(self, tokens):
            pass

        def finish(self):
            pass

        def observe(self, tree, node_tokens, path):
            calls.append("observe")

        def observe_checked(self, tree, node_tokens, path):
            calls.append("observe_checked")

    drafting = StepDrafting(Request(), FixedBudget(0), None)
    drafting.observe(DraftTree.root_only(3), np.array([4], np.int32), np.zeros(1, np.int32))
    assert calls == ["observe_checked" if trusted else "observe"]


OBSERVING_DRAFTERS = {
    "trie": lambda: TrieDrafter(token_limit=16, research=TrieResearch(learn_from_model=True)),
    "ngram": lambda: draftcore.NGramDrafter(),
    "jacobi": lambda: draftcore.JacobiDrafter(window=3, levels=3),
    "composite": lambda: draftcore.CompositeDrafter(token_limit=16),
}


def _same_tree(a: DraftTree, b: DraftTree) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("tokens", "parents", "depths")) \
        and a.n_lookahead == b.n_lookahead


def _malformed(tree: DraftTree) -> DraftTree:
    """`tree` with node 1 hung from a parent that does not exist (the kernels index with parents)."""
    parents = tree.parents.copy()
    parents[1] = 10 ** 9
    return DraftTree(tree.tokens.copy(), parents, tree.depths.copy(), None, tree.n_lookahead)


@pytest.mark.parametrize("name", sorted(OBSERVING_DRAFTERS))
def test_every_drafters_observe_refuses_malformed_arguments_and_changes_nothing(name):
    """observe is public: a caller's malformed tree, tokens or path is an InputError naming the
    argument, raised before any kernel reads them (unchecked, a bad parent index crashed the process
    and a short node_tokens array put out-of-bounds memory into later drafts). The request then goes
    on exactly as a twin that never saw the bad calls."""
    context = np.array([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 1, 2], np.int32)
    bad, twin = OBSERVING_DRAFTERS[name]().start(context), OBSERVING_DRAFTERS[name]().start(context)
    tree = bad.propose(context, 6)
    assert _same_tree(twin.propose(context, 6), tree) and len(tree) >= 3
    n = len(tree)
    good_tokens, good_path = np.full(n, 4, np.int32), np.array([0], np.int32)
    cases = [
        (dict(tree=_malformed(tree)), "tree"),
        (dict(tree="tree"), "tree"),
        (dict(node_tokens=good_tokens[:1]), "node_tokens"),
        (dict(node_tokens=good_tokens.astype(np.float32)), "node_tokens"),
        (dict(node_tokens=np.r_[good_tokens[:-1], -2].astype(np.int32)), "node_tokens"),
        # an int64 that a cast would wrap to 4
        (dict(node_tokens=np.r_[good_tokens[:-1].astype(np.int64), 2 ** 32 + 4]), "node_tokens"),
        (dict(path=np.array([0, n], np.int32)), "path"),
        (dict(path=np.array([1], np.int32)), "path"),
        (dict(path=[]), "path"),
    ]
    for change, argument in cases:
        args = {**dict(tree=tree, node_tokens=good_tokens, path=good_path), **change}
        with pytest.raises(draftcore.InputError) as info:
            bad.observe(**args)
        assert str(info.value).startswith(argument), (change, str(info.value))
    following = np.r_[context, 4].astype(np.int32)
    for request in (bad, twin):
        request.observe(tree, good_tokens, good_path)
        request.update(np.array([4], np.int32))
    assert _same_tree(bad.propose(following, 6), twin.propose(following, 6))


@pytest.mark.parametrize("kwargs, argument", [
    (dict(tokens=np.array([2 ** 32 + 5, 3], np.int64), parents=[-1, 0]), "tokens"),   # would wrap to 5
    (dict(tokens=np.array([2 ** 63, 3], np.uint64), parents=[-1, 0]), "tokens"),      # would wrap to 0
    (dict(tokens=[1, 3], parents=np.array([-1, 2 ** 32], np.int64)), "parents"),       # would wrap to 0
    (dict(tokens=[1, 3], parents=[-1, 0], scores="abc"), "scores"),
    (dict(tokens=[1, 3], parents=[-1, 0], scores=[1.0, float("nan")]), "scores"),
    (dict(tokens=[1, 3], parents=[-1, 0], scores=[1.0]), "scores"),
])
def test_draft_tree_build_refuses_values_a_cast_would_change(kwargs, argument):
    with pytest.raises(draftcore.InputError, match=f"^{argument}: "):
        DraftTree.build(**kwargs)
    built = DraftTree.build(np.array([7, 3], np.uint32), np.array([-1, 0], np.int64), scores=[1, 0.5])
    assert built.tokens.tolist() == [7, 3] and built.scores.dtype == np.float32


def test_draft_tree_helpers_refuse_bad_arguments_by_name():
    tree = DraftTree.build([1, 2, 3], [-1, 0, 1], scores=[1.0, 0.5, 0.25])
    for call, argument in ((lambda: DraftTree.chain("a", [1]), "root"),
                           (lambda: DraftTree.chain(1, np.array([2 ** 32 + 1])), "draft"),   # would wrap to 1
                           (lambda: tree.path_tokens(3), "node"),
                           (lambda: tree.path_tokens(-1), "node"),
                           (lambda: tree.with_candidates("1"), "n_draft")):
        with pytest.raises(draftcore.InputError, match=f"^{argument}: "):
            call()
    with pytest.raises(ConfigError, match="^n_bins: "):
        tree.score_bins(0)   # would have put every node in bin -1
    with pytest.raises(ConfigError, match="^window_cost: "):
        draftcore.CostAwareBudget(window_cost=np.array([0.1, 0.2]))
    assert DraftTree.chain(np.int64(1), [2, 3]).tokens.tolist() == [1, 2, 3]
    assert tree.path_tokens(2).tolist() == [1, 2, 3] and len(tree.with_candidates(1)) == 2

# -- node roles ----------------------------------------------------------------------------------------
@SETTINGS
@given(requests(), st.integers(1, 3), st.integers(1, 6), st.sampled_from(["oracle", "trie"]))
def test_lossless_with_windows(req, levels, width, kind):
    """Trees that carry windows stay exact, windows are verified whole or not at all, and the
    statistics count candidates and lookahead nodes apart."""
    vocab, model_seed, prompt, max_new, budget, eos, stops, slack, seed = req
    model = ToyModel(vocab_size=vocab, seed=model_seed)
    verifier = SpyVerifier(model, max_context=len(prompt) + max_new + slack)
    inner = OracleDrafter(model, seed) if kind == "oracle" else TrieDrafter(capacity=500, token_limit=vocab)
    drafter = WindowDrafter(inner, model, levels, width, seed)
    result = draftcore.speculate(verifier, np.array(prompt, np.int32), max_new_tokens=max_new, drafter=drafter,
                                 budget=budget, eos_token_id=eos, stop_sequences=stops)
    eos_ids = () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))
    check_result(result, *expected_output(model, prompt, max_new, eos_ids, stops), verifier)
    window = levels * width
    proposed = {id(t): t for t, _ in drafter.proposed}
    for tree, _, _ in verifier.verified:
        assert tree.n_lookahead in (0, window)       # whole, or dropped when it did not fit
    stats = result.stats
    assert stats.lookahead_nodes == sum(t.n_lookahead for t, _, _ in verifier.verified)
    assert stats.drafted_tokens == sum(t.n_draft for t, _, _ in verifier.verified)
    assert len(proposed) == len(drafter.proposed)
    if verifier.verified and drafter.observed:
        check_observations(drafter, verifier, model)


def test_the_window_verified_is_the_window_proposed():
    model = ToyModel(vocab_size=16, seed=4)
    verifier = SpyVerifier(model)
    drafter = WindowDrafter(OracleDrafter(model, 4), model, levels=3, width=5, seed=4)
    draftcore.speculate(verifier, [1, 2, 3, 4], max_new_tokens=40, drafter=drafter, budget=FixedBudget(2))
    for (proposed, _), (verified, _, _) in zip(drafter.proposed, verifier.verified):
        m, w = verified.n_candidates, verified.n_lookahead
        assert w == proposed.n_lookahead == 15
        np.testing.assert_array_equal(verified.tokens[m:], proposed.tokens[proposed.n_candidates:])
        np.testing.assert_array_equal(verified.depths[m:], proposed.depths[proposed.n_candidates:])
        # parents renumbered by the cut: same shape relative to the window's first node
        rel = lambda t: np.where(t.parents[t.n_candidates:] > 0, t.parents[t.n_candidates:] - t.n_candidates, -1)
        np.testing.assert_array_equal(rel(verified), rel(proposed))


def test_acceptance_never_walks_into_the_window():
    """The window's level-0 row holds the model's true continuation and the drafter offers no
    candidate: nothing is accepted (one token per step), and the output is exact."""
    model = ToyModel(vocab_size=12, seed=5)

    class NoCandidates:
        def start(self, prompt): pass
        def update(self, tokens): pass
        def finish(self): pass
        def propose(self, context, budget): return DraftTree.root_only(int(context[-1]))

    drafter = WindowDrafter(NoCandidates(), model, levels=1, width=6, seed=5, window_is_truth=True)
    result = draftcore.speculate(ToyVerifier(model), [1, 2, 3], max_new_tokens=30, drafter=drafter, budget=4)
    check_result(result, *expected_output(model, [1, 2, 3], 30))
    assert result.stats.accepted_hist == [result.stats.steps - 1]
    assert result.stats.lookahead_nodes == 6 * len(drafter.proposed) > 0


class WindowInCandidatesSightVerifier(ToyVerifier):
    """Planted: candidates also see every lookahead node (as if the window came first in a causal batch)."""

    def verify(self, tree, n_logits=0):
        n = len(tree)
        mask = tree.ancestor_mask()
        mask[:tree.n_candidates, tree.n_candidates:] = True
        positions = tree.position_ids(self.n_past)
        out = np.empty((n, self.vocab_size), np.float32)
        for i in range(n):
            visible = np.flatnonzero(mask[i])
            order = visible[np.argsort(positions[visible], kind="stable")]
            h = self.hashes[-1]
            seq = list(self.cache[-2:])
            for j in order:
                h = _mix(h, int(positions[j]), int(tree.tokens[j]))
                seq.append(int(tree.tokens[j]))
            out[i] = self.model.logits_from_hash(h, seq[-1], seq[-2] if len(seq) >= 2 else 0)
        self.pending = tree
        self.n_verify += 1
        return out.argmax(axis=1).astype(np.int32), out[:n_logits]


class WindowShiftedVerifier(ToyVerifier):
    """Planted: lookahead nodes one position too far (candidates are right)."""

    def verify(self, tree, n_logits=0):
        depths = tree.depths.copy()
        depths[tree.n_candidates:] += 1
        out = super().verify(DraftTree(tree.tokens, tree.parents, depths, None, tree.n_lookahead), n_logits)
        self.pending = tree
        return out


def test_a_window_that_leaks_into_candidates_is_caught_by_equality():
    caught = 0
    for seed in range(6):
        model = ToyModel(vocab_size=12, seed=seed)
        drafter = WindowDrafter(OracleDrafter(model, seed), model, levels=2, width=4, seed=seed)
        result = draftcore.speculate(WindowInCandidatesSightVerifier(model), [1, 2, 3, 1, 2], max_new_tokens=40,
                                     drafter=drafter, budget=8)
        caught += result.tokens.tolist() != expected_output(model, [1, 2, 3, 1, 2], 40)[0]
    assert caught >= 4, caught


def test_a_window_at_wrong_positions_is_caught_by_what_observe_sees():
    model = ToyModel(vocab_size=12, seed=6)

    class Spy(WindowShiftedVerifier, SpyVerifier):
        pass

    verifier = Spy(model)
    drafter = WindowDrafter(OracleDrafter(model, 6), model, levels=2, width=4, seed=6)
    result = draftcore.speculate(verifier, [1, 2, 3, 1, 2], max_new_tokens=30, drafter=drafter, budget=8)
    check_result(result, *expected_output(model, [1, 2, 3, 1, 2], 30))   # candidates are unaffected...
    with pytest.raises(AssertionError):
        check_observations(drafter, verifier, model)                      # ...the window's tokens are not


def test_greedy_accept_walks_only_the_first_n_walk_nodes():
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(1, 30))
        parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], np.int32)
        tokens = rng.integers(0, 3, n).astype(np.int32)
        model = rng.integers(0, 3, n).astype(np.int32)
        n_walk = int(rng.integers(1, n + 1))
        path, nxt = greedy_accept(tokens, parents, model, n_walk)
        want = naive_greedy_accept(tokens[:n_walk].tolist(), parents[:n_walk].tolist(), model[:n_walk].tolist())
        assert (path.tolist(), int(nxt)) == (list(want[0]), want[1])


def test_with_candidates_keeps_the_window_and_renumbers_it():
    rng = np.random.default_rng(1)
    tree = with_window(DraftTree.build([5, 1, 2, 3, 4], [-1, 0, 1, 0, 3]), 2, 3, rng, 10)
    cut = tree.with_candidates(1)
    cut.check()
    assert len(cut) == 2 + 6 and cut.n_lookahead == 6 and cut.n_draft == 1
    assert [cut.path_tokens(i).tolist() for i in range(2, 8)] == [tree.path_tokens(i).tolist() for i in range(5, 11)]
    assert tree.with_candidates(99) is tree and tree.without_lookahead().n_lookahead == 0
    i32 = lambda v: np.array(v, np.int32)  # noqa: E731
    with pytest.raises(draftcore.InputError, match="lookahead node 3 hangs below candidate 1"):
        DraftTree(i32([5, 1, 2, 7]), i32([-1, 0, 1, 1]), i32([0, 1, 2, 2]), None, 1).check()
    with pytest.raises(draftcore.InputError, match="n_lookahead"):
        DraftTree(tree.tokens, tree.parents, tree.depths, None, len(tree)).check()


# -- the one-token path -------------------------------------------------------------------------------------
class AdvancingVerifier(SpyVerifier):
    """A verifier with the optional fused one-token step, `advance(token)`; `wrong` plants a bug in it
    (the next token shifted by one, or out of the vocabulary) that the loop must not pass on."""

    def __init__(self, model, wrong=None, **kw):
        super().__init__(model, **kw)
        self.wrong, self.advanced = wrong, []

    def advance(self, token):
        tokens, _ = ToyVerifier.verify(self, DraftTree.root_only(token))
        ToyVerifier.commit(self, np.zeros(1, np.int32))
        self.advanced.append(token)
        token = int(tokens[0])
        if self.wrong == "shifted":
            return (token + 1) % self.vocab_size
        return token + self.vocab_size if self.wrong == "outside" else token


@pytest.mark.parametrize("budget", [0, 3, "auto"])
def test_root_only_greedy_steps_take_the_verifiers_advance(budget):
    """Every root-only step of a greedy call goes through `advance` (verify + commit in one), every
    other step through verify and commit; the output is plain greedy's either way."""
    model = ToyModel(vocab_size=24, seed=5)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6] * 3
    verifier = AdvancingVerifier(model)
    result = draftcore.speculate(verifier, prompt, max_new_tokens=50, budget=budget)
    assert result.tokens.tolist() == model.greedy(prompt, 50).tolist()
    assert len(verifier.advanced) + len(verifier.verified) == result.stats.steps - 1
    assert len(verifier.committed) == len(verifier.verified)
    assert all(len(tree) > 1 for tree, _, _ in verifier.verified)
    assert len(verifier.advanced) == result.stats.budget_hist.get(0, 0) > 0
    if budget == 0:
        assert not verifier.verified


def test_a_sampled_call_never_takes_advance_it_needs_the_logits():
    model = ToyModel(vocab_size=24, seed=5)
    verifier = AdvancingVerifier(model)
    draftcore.speculate(verifier, [3, 1, 4, 1, 5], max_new_tokens=20, budget=0,
                        sampling=dict(temperature=0.7, seed=1))
    assert not verifier.advanced and len(verifier.verified) == 19


def test_a_wrong_advance_is_caught():
    """A planted bug in advance: a token outside the vocabulary is a BackendError naming it; a wrong
    token in range is what the output comparison above would catch (the same check, made to fail)."""
    model = ToyModel(vocab_size=24, seed=5)
    prompt = [3, 1, 4, 1, 5]
    refused = r"verifier\.advance\(\) returned: expected a token id in \[0, 24\)"
    with pytest.raises(draftcore.BackendError, match=refused):
        draftcore.speculate(AdvancingVerifier(model, wrong="outside"), prompt, max_new_tokens=10, budget=0)
    shifted = draftcore.speculate(AdvancingVerifier(model, wrong="shifted"), prompt, max_new_tokens=10, budget=0)
    assert shifted.tokens.tolist() != model.greedy(prompt, 10).tolist()


# -- backend limits -------------------------------------------------------------------------------------
class LimitedVerifier(SpyVerifier):
    def __init__(self, model, max_tree_nodes=None, max_tree_leaves=None, **kw):
        super().__init__(model, **kw)
        self.max_tree_nodes, self.max_tree_leaves = max_tree_nodes, max_tree_leaves

    def verify(self, tree, n_logits=0):
        assert self.max_tree_nodes is None or len(tree) <= self.max_tree_nodes
        assert self.max_tree_leaves is None or len(tree.leaves()) <= self.max_tree_leaves
        return super().verify(tree, n_logits)


@pytest.mark.parametrize("nodes, leaves, window", [(6, None, (1, 3)), (None, 2, (2, 3)), (5, 1, (0, 0)),
                                                   (40, 3, (3, 4)), (4, 8, (2, 2))])
def test_trees_respect_node_and_leaf_limits(nodes, leaves, window):
    levels, width = window
    for seed in range(4):
        model = ToyModel(vocab_size=12, seed=seed)
        verifier = LimitedVerifier(model, nodes, leaves)
        drafter = OracleDrafter(model, seed)
        if levels:
            drafter = WindowDrafter(drafter, model, levels, width, seed)
        result = draftcore.speculate(verifier, [1, 2, 3, 1, 2], max_new_tokens=40, drafter=drafter, budget=16)
        check_result(result, *expected_output(model, [1, 2, 3, 1, 2], 40))
        assert any(t.n_draft > 0 for t, _, _ in verifier.verified)
        if levels and nodes and 1 + levels * width > nodes:
            assert all(t.n_lookahead == 0 for t, _, _ in verifier.verified)   # dropped whole


def test_bad_limits_are_config_errors():
    verifier = ToyVerifier(ToyModel(vocab_size=10))
    for attr, value in (("max_tree_nodes", 0), ("max_tree_leaves", 0), ("max_tree_leaves", 2.5)):
        setattr(verifier, attr, value)
        with pytest.raises(ConfigError, match=attr):
            draftcore.speculate(verifier, [1, 2], max_new_tokens=4)
        setattr(verifier, attr, None)


# -- the bare call ------------------------------------------------------------------------------------------
class ClockedToyVerifier(ToyVerifier):
    """A toy verifier on a synthetic clock: a verify of n nodes costs 1 + 0.12 (n - 1) units (a CPU:
    bigger trees cost more), a prefill 2 units; `clock()` reads the time spent so far."""

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def prefill(self, prompt, n_logits=0):
        self.now += 2.0
        return super().prefill(prompt, n_logits)

    def verify(self, tree, n_logits=0):
        self.now += 1.0 + 0.12 * (len(tree) - 1)
        return super().verify(tree, n_logits)


def workload(kind: str, n_requests: int = 12):
    """(model, prompts): "repetitive" text a trie predicts, or "surprising" text it cannot."""
    rng = np.random.default_rng(7)
    if kind == "repetitive":
        model = ToyModel(vocab_size=16, seed=3, surprise_every=7)
        prompts = [np.tile(rng.integers(0, 16, 5), 3).astype(np.int32) for _ in range(n_requests)]
    else:
        model = ToyModel(vocab_size=200, seed=3, surprise_every=1)    # every position depends on the whole prefix
        prompts = [rng.integers(0, 200, 12).astype(np.int32) for _ in range(n_requests)]
    return model, prompts


def time_of(kind: str, **options) -> float:
    """Synthetic time to serve the workload's requests in order with one verifier (options as speculate's;
    drafter/budget may be factories called once, or per request when per_request=True)."""
    model, prompts = workload(kind)
    verifier = ClockedToyVerifier(model)
    per_request = options.pop("per_request", False)
    make = {k: options.pop(k) for k in ("drafter", "budget") if callable(options.get(k)) and k in options}
    kept = {k: f() for k, f in make.items()}
    for prompt in prompts:
        call = {k: (f() if per_request else kept[k]) for k, f in make.items()}
        result = draftcore.speculate(verifier, prompt, max_new_tokens=60, clock=verifier.clock, **call, **options)
        assert result.tokens.tolist() == model.greedy(prompt, 60).tolist()
    return verifier.now


@pytest.mark.parametrize("kind", ["repetitive", "surprising"])
def test_the_bare_call_costs_no_more_than_the_better_of_plain_and_the_kept_auto_budget(kind):
    bare = time_of(kind)
    plain = time_of(kind, budget=0)
    kept = time_of(kind, drafter=lambda: TrieDrafter(), budget=lambda: draftcore.CostAwareBudget())
    assert bare <= 1.1 * min(plain, kept), (bare, plain, kept)
    if kind == "repetitive":
        assert bare < 0.9 * plain, (bare, plain)  # and drafting does pay where the text repeats


def test_the_old_bare_call_fails_the_same_bound():
    """A fresh trie per call and a fixed 16 (the bare call before sessions) drafts into text it cannot
    predict and pays for it: the bound above would catch it."""
    old = time_of("surprising", drafter=lambda: TrieDrafter(), budget=lambda: 16, per_request=True)
    plain = time_of("surprising", budget=0)
    assert old > 1.1 * plain, (old, plain)


# -- sessions -------------------------------------------------------------------------------------------------
def test_session_of_a_verifier_is_kept_visible_and_resettable():
    model = ToyModel(vocab_size=16, seed=3)
    verifier = ToyVerifier(model)
    prompt = np.array([1, 2, 3, 4, 1, 2, 3, 4], np.int32)
    first = draftcore.speculate(verifier, prompt, max_new_tokens=50, budget=8)
    session = draftcore.Session.of(verifier)
    assert draftcore.Session.of(verifier) is session
    second = draftcore.speculate(verifier, prompt, max_new_tokens=50, budget=8)
    assert second.stats.steps < first.stats.steps          # the session's trie remembered the output
    drafter_before = session.drafter
    session.reset()
    assert session.drafter is not drafter_before
    assert draftcore.speculate(verifier, prompt, max_new_tokens=50, budget=8).stats.steps == first.stats.steps
    mine = TrieDrafter(token_limit=16)
    draftcore.speculate(verifier, prompt, max_new_tokens=20, drafter=mine)
    assert session.drafter is not mine and mine.n_nodes > 0  # an explicit drafter overrides, for that call only
    assert "Session(ToyVerifier" in repr(session)


def test_an_own_session_resolves_none_names_and_auto_itself():
    """session.speculate(drafter=None / a name, budget="auto") means this session's own drafter and
    budget, not those of the verifier's default session."""
    verifier = ToyVerifier(ToyModel(vocab_size=10, seed=4))
    default = draftcore.Session.of(verifier)
    mine = draftcore.Session(verifier)
    prompt = [1, 2, 3, 1, 2, 3]
    mine.speculate(prompt, max_new_tokens=20, drafter=None, budget="auto")
    mine.speculate(prompt, max_new_tokens=20, drafter="ngram", budget=None)
    assert default.drafter.n_nodes == 0 and default.budget._step == 0 and not default._named
    assert mine.drafter.n_nodes > 0 and mine.budget._step > 0 and list(mine._named) == ["ngram"]


def test_a_bad_budget_is_refused_before_a_session_learns_a_drafter_name():
    verifier = ToyVerifier(ToyModel(vocab_size=10))
    for call in (lambda: draftcore.speculate(verifier, [1, 2], max_new_tokens=4, drafter="ngram", budget="x"),
                 lambda: draftcore.Session.of(verifier).speculate([1, 2], max_new_tokens=4, drafter="ngram",
                                                                  budget=-1)):
        with pytest.raises(ConfigError, match="budget"):
            call()
    assert not draftcore.Session.of(verifier)._named
    with pytest.raises(ConfigError, match="^drafter: .*3"):
        draftcore.Session(verifier, drafter=3)
    with pytest.raises(ConfigError, match="^budget: "):
        draftcore.Session(verifier, budget=np.array([3, 4]))

def test_session_is_dropped_with_its_verifier():
    verifier = ToyVerifier(ToyModel(vocab_size=10))
    draftcore.speculate(verifier, [1, 2], max_new_tokens=4)
    ref = weakref.ref(draftcore.Session.of(verifier))
    del verifier
    import gc
    gc.collect()
    assert ref() is None


def test_own_session_object_and_unreferenceable_verifiers():
    model = ToyModel(vocab_size=10, seed=1)
    session = draftcore.Session(ToyVerifier(model), budget=6)
    result = session.speculate([1, 2, 3], max_new_tokens=20)
    check_result(result, *expected_output(model, [1, 2, 3], 20))
    assert list(session.stream([1, 2, 3], max_new_tokens=5))

    class Slotted(ToyVerifier):
        __slots__ = ()

    class NoWeakref:
        """A verifier object that cannot be weakly referenced (a __slots__ class without __weakref__)."""
        __slots__ = ("inner",)

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

    verifier = NoWeakref(ToyVerifier(model))
    with pytest.warns(RuntimeWarning, match="weakly referenced"):
        result = draftcore.speculate(verifier, [1, 2, 3], max_new_tokens=20)
    check_result(result, *expected_output(model, [1, 2, 3], 20))


# -- imports ----------------------------------------------------------------------------------------------------
def _modules_after(code: str) -> list:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_import_draftcore_does_not_load_numba_or_a_framework():
    modules = _modules_after("import draftcore")
    assert "numba" not in modules and "llvmlite" not in modules
    assert not {"torch", "transformers", "llama_cpp", "onnxruntime"} & set(modules)
    assert not [m for m in modules if m.startswith("draftcore.adapters") or m.startswith("draftcore.tools")]


PUBLIC_NAMES = [
    "speculate", "speculate_stream", "Session", "SpeculateResult", "SpeculateStats", "SamplingParams", "DraftTree",
    "Verifier", "Drafter", "DraftRequest", "BudgetPolicy",
    "TrieDrafter", "NGramDrafter", "JacobiDrafter", "CompositeDrafter", "DRAFTER_NAMES", "FixedBudget", "CostAwareBudget",
    "DraftcoreError", "ConfigError", "InputError", "BackendError", "BusyError",
]


def test_the_top_level_holds_what_users_and_backend_authors_need():
    assert sorted(draftcore.__all__) == sorted(PUBLIC_NAMES)
    assert all(hasattr(draftcore, name) for name in draftcore.__all__)
    # internals left the top level and stay importable from their own modules
    from draftcore.drafters.rows import RowDrafter
    from draftcore.drafters.trie import TrieRequest
    from draftcore.loop import SpeculationStream
    from draftcore.text import IncrementalText
    for internal in (RowDrafter, TrieRequest, SpeculationStream, IncrementalText):
        assert not hasattr(draftcore, internal.__name__)


def test_the_menu_is_four_drafters_and_registered_names_join_it(monkeypatch):
    from draftcore import drafters

    assert draftcore.DRAFTER_NAMES == ("trie", "ngram", "jacobi", "composite")
    monkeypatch.setattr(drafters, "_registered", {})
    with pytest.raises(ConfigError, match="drafter: expected a Drafter or one of"):
        drafters.make_drafter("trie-blind", 24)
    drafters.register_drafter("trie-blind", lambda vocab: draftcore.TrieDrafter(
        token_limit=vocab, research=TrieResearch(learn_from_model=False)))
    assert drafters.drafter_names() == draftcore.DRAFTER_NAMES + ("trie-blind",)
    assert drafters.make_drafter("trie-blind", 24).learn_from_model is False
    with pytest.raises(ConfigError, match="'trie' is one of the menu's drafters"):
        drafters.register_drafter("trie", lambda vocab: draftcore.NGramDrafter())


def test_kernels_load_on_first_use():
    modules = _modules_after("import draftcore\ndraftcore.TrieDrafter()")
    assert "numba" in modules and "draftcore.drafters.trie_retrieval_kernels" in modules
