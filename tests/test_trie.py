"""The jitted trie drafter against tests/naive.py, plus its boundaries (config, save/load, layouts).

Random request scripts (several requests in a row: start → updates in random chunks with proposals
at random points → finish, tiny pools so pruning happens all the time) run on TrieDrafter and on
NaiveTrie; after every operation the whole trie (every token path with its three counts, and the
order of every child list) and every proposed tree must be identical, and the pool must pass
check_integrity().
"""
from __future__ import annotations

import dataclasses
import inspect
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import draftcore
from draftcore import ConfigError, DraftTree, InputError, TrieDrafter
from draftcore.drafters.trie_research import SWITCHES, TrieResearch
from draftcore.tools.variants import research_trie
from draftcore.drafters.trie import LAYOUTS
from draftcore.drafters.trie_pool_kernels import N_PRUNES
from naive import (NaiveTrie, naive_branch_counts, naive_child_order, naive_own_contents, naive_trie_contents,
                   pool_child_order, pool_contents, pool_own_contents)

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


# -- random scripts ---------------------------------------------------------------------------------
def random_params(rng, layouts=("hierarchical", "single")):
    bl = int(rng.integers(2, 7))
    vocab = int(rng.integers(3, 31))
    params = dict(
        capacity=int(2 * bl + 1 + rng.choice([0, 3, 10, 40, 300])),
        branch_length=bl,
        max_match=int(rng.integers(1, 10)),
        prompt_weight=float(rng.choice([0.0, 0.5, 1.0, 4.0, 16.0])),  # dyadic: sums are exact in float32
        recent_weight=float(rng.choice([0.0, 0.5, 1.0, 16.0])),
        min_stage_nodes=int(rng.integers(1, 9)),
        fill=bool(rng.random() < 0.5),
        use_top=bool(rng.random() < 0.5),
        calibrate=bool(rng.random() < 0.5),
        layout=str(rng.choice(layouts)),
    )
    token_limit = vocab if rng.random() < 0.5 else vocab + int(rng.integers(1, 50))
    return vocab, token_limit, params


def random_tokens(rng, base, vocab, n):
    """n tokens that often repeat pieces of `base` (so the trie has something to find)."""
    out = []
    while len(out) < n:
        if rng.random() < 0.7:
            i = int(rng.integers(0, len(base)))
            out += base[i:i + int(rng.integers(1, 12))]
        else:
            out += rng.integers(0, vocab, size=int(rng.integers(1, 4))).tolist()
    return out[:n]


def random_script(rng, vocab, token_limit, n_requests=None, max_live=None):
    """A list of operations on requests named by ids: ("start", rid, prompt), ("update", rid, tokens),
    ("propose", rid, context|None, budget) (None: the request's own stream, as speculate passes it;
    rid None: a one-off TrieDrafter.propose outside any request), ("finish", rid),
    ("warm_up", seqs). Up to `max_live` requests (default 1 to 3) are in progress at once, their
    operations interleaved; a request may be left unfinished."""
    base = rng.integers(0, vocab, size=int(rng.integers(4, 40))).tolist()
    max_live = max_live or int(rng.choice([1, 1, 2, 3]))
    ops = []
    if rng.random() < 0.3:
        ops.append(("warm_up", [random_tokens(rng, base, vocab, int(rng.integers(0, 30)))
                                for _ in range(int(rng.integers(1, 3)))]))
    to_start = n_requests or int(rng.integers(1, 5))
    live, next_id = [], 0
    while to_start or live:
        if to_start and (not live or (len(live) < max_live and rng.random() < 0.3)):
            if rng.random() < 0.3:  # a one-off proposal outside any request
                ops.append(("propose", None, random_tokens(rng, base, vocab, int(rng.integers(1, 10))),
                            int(rng.integers(0, 40))))
            ops.append(("start", next_id, random_tokens(rng, base, vocab, int(rng.integers(1, 40)))))
            live.append(next_id)
            next_id += 1
            to_start -= 1
            continue
        rid = live[int(rng.integers(0, len(live)))]
        r = rng.random()
        if r < 0.08:
            live.remove(rid)
            if rng.random() < 0.9:
                ops.append(("finish", rid))
        elif r < 0.5:
            ops.append(("update", rid, random_tokens(rng, base, vocab, int(rng.integers(0, 9)))))
        elif r < 0.85:
            ops.append(("propose", rid, None, int(rng.integers(0, 40))))
        else:  # some other context: a token past the vocabulary, or just anything
            ctx = random_tokens(rng, base, vocab, int(rng.integers(1, 12)))
            if rng.random() < 0.2:
                ctx[-1] = token_limit - 1
            ops.append(("propose", rid, ctx, int(rng.integers(0, 40))))
    return ops


def with_observes(ops, rng, rate=0.7):
    """The script with, after most proposals of a request on its own stream, an observe of that
    proposal: ("observe", rid, seed), the seed drawing an accepted path and the model's tokens."""
    out = []
    for op in ops:
        out.append(op)
        if op[0] == "propose" and op[1] is not None and rng.random() < rate:
            out.append(("observe", op[1], int(rng.integers(0, 2**31))))
    return out


def random_observation(tree: DraftTree, seed: int, token_limit: int):
    """(node_tokens, path) for `tree` as a verify might give them: a random root-first path
    through its candidates, and at every node a token (often one the tree holds, so learnt
    continuations meet drafted ones), sometimes -1 (not evaluated) or token_limit (beyond the trie)."""
    rng = np.random.default_rng(seed)
    m = tree.n_candidates
    path = [0]
    while rng.random() < 0.6:
        kids = [i for i in range(1, m) if tree.parents[i] == path[-1]]
        if not kids:
            break
        path.append(int(rng.choice(kids)))
    pick = rng.random(len(tree))
    node_tokens = np.where(pick < 0.5, tree.tokens[rng.integers(0, len(tree), len(tree))],
                           rng.integers(0, token_limit, len(tree)))
    node_tokens[pick > 0.9] = -1
    node_tokens[pick > 0.97] = token_limit
    return node_tokens.astype(np.int32), np.array(path, np.int32)


def assert_same_trie(drafter: TrieDrafter, naive: NaiveTrie, requests=()):
    drafter.check_integrity()
    state = drafter.pool.state
    assert drafter.n_nodes == naive.node_count() <= drafter.capacity
    assert pool_contents(state) == naive_trie_contents(naive)
    assert pool_child_order(state) == naive_child_order(naive)
    assert int(state.meta[N_PRUNES]) == naive.n_prunes  # prune passes so far
    for mine, twin in requests:  # each request's own counts
        assert pool_own_contents(state, mine._core.slot) == naive_own_contents(naive, twin)


def assert_same_tree(tree: DraftTree, expected, budget):
    tokens, parents, depths, scores = expected
    assert tree.tokens.tolist() == tokens, (tree, expected)
    assert tree.parents.tolist() == parents
    assert tree.depths.tolist() == depths
    np.testing.assert_allclose(tree.scores, np.array(scores, np.float32), rtol=1e-6)
    assert tree.n_draft <= budget


def run_script(params, token_limit, ops, rng, heap_capacity=None, check_every_op=True):
    drafter = research_trie(**params, token_limit=token_limit)
    naive = NaiveTrie(**params, token_limit=token_limit)
    requests = {}  # rid -> (TrieRequest, NaiveRequest)
    trees = {}     # rid -> its last proposal, until observed
    n_proposed = 0
    for op in ops:
        kind = op[0]
        if kind == "start":
            mine = drafter.start(np.array(op[2], np.int32))
            if heap_capacity is not None:  # a tiny candidate list, so that dropping candidates is exercised
                # (the list lives in the middle of its workspace and holds at most half of it)
                mine._core.buffers = mine._core.buffers._replace(
                    cand_scores=np.empty(2 * heap_capacity, np.float32),
                    cand_items=np.empty((2 * heap_capacity, 4), np.int32))
                naive.heap_capacity = heap_capacity
            requests[op[1]] = (mine, naive.open(op[2]))
        elif kind == "update":
            mine, twin = requests[op[1]]
            mine.update(np.array(op[2], np.int32))
            twin.update(op[2])
        elif kind == "finish":
            mine, twin = requests.pop(op[1])
            mine.finish()
            twin.finish()
        elif kind == "warm_up":
            drafter.warm_up([np.array(s, np.int32) for s in op[1]])
            naive.warm_up(op[1])
        elif kind == "propose":
            rid, context, budget = op[1], op[2], op[3]
            if rid is None:
                if heap_capacity is not None:
                    continue  # a one-off proposal has buffers of its own, with the full candidate list
                mine, twin = drafter, naive
            else:
                mine, twin = requests[rid]
                if context is None:
                    context = twin.stream
            tree = mine.propose(np.array(context, np.int32), budget)
            assert_same_tree(tree, twin.propose(context, budget), budget)
            trees[rid] = tree
            DraftTree.build(tree.tokens, tree.parents, tree.depths)  # a valid tree
            assert tree.tokens[0] == context[-1]
            n_proposed += 1
        elif kind == "observe":
            mine, twin = requests.get(op[1], (None, None))
            tree = trees.pop(op[1], None)
            if mine is None or tree is None:
                continue
            node_tokens, path = random_observation(tree, op[2], token_limit)
            mine.observe(tree, node_tokens, path)
            twin.observe(tree.tokens.tolist(), tree.parents.tolist(), tree.n_candidates, node_tokens.tolist(),
                         path.tolist())
        if check_every_op or rng.random() < 0.3:
            assert_same_trie(drafter, naive, requests.values())
    for rid in sorted(requests):  # requests left unfinished end now
        mine, twin = requests.pop(rid)
        mine.finish()
        twin.finish()
    assert drafter.requests_in_progress == 0
    assert_same_trie(drafter, naive)
    return n_proposed


# -- jitted vs naive ------------------------------------------------------------------------------
@SETTINGS
@given(st.integers(0, 2**32 - 1))
def test_trie_matches_naive_hypothesis(seed):
    rng = np.random.default_rng(seed)
    vocab, token_limit, params = random_params(rng)
    run_script(params, token_limit, random_script(rng, vocab, token_limit), rng)


@pytest.mark.parametrize("block", range(4))
def test_trie_matches_naive_seeded(block):
    n_proposed = 0
    for seed in range(block * 40, block * 40 + 40):
        rng = np.random.default_rng(1000 + seed)
        vocab, token_limit, params = random_params(rng)
        ops = random_script(rng, vocab, token_limit)
        n_proposed += run_script(params, token_limit, ops, rng, check_every_op=seed % 2 == 0)
    assert n_proposed > 50


@pytest.mark.parametrize("seed", range(6))
def test_trie_matches_naive_long_requests(seed):
    """Longer streams in a small pool: many decay rounds, front refreshes and failed allocations."""
    rng = np.random.default_rng(77 + seed)
    vocab, token_limit, params = random_params(rng)
    params["capacity"] = 2 * params["branch_length"] + 1 + int(rng.integers(0, 30))
    ops = []
    base = rng.integers(0, vocab, size=20).tolist()
    for rid in range(3):
        ops.append(("start", rid, random_tokens(rng, base, vocab, 30)))
        for _ in range(25):
            ops.append(("update", rid, random_tokens(rng, base, vocab, int(rng.integers(1, 6)))))
            ops.append(("propose", rid, None, int(rng.integers(0, 24))))
        ops.append(("finish", rid))
    run_script(params, token_limit, ops, rng, check_every_op=False)


@pytest.mark.parametrize("seed", range(6))
def test_trie_matches_naive_with_interleaved_requests(seed):
    """Three requests in progress at once, their steps interleaved, in a small pool: each request's
    own counts, every draft and the shared trie match the twin, and a request's end removes only
    its own prompt branches."""
    rng = np.random.default_rng(300 + seed)
    vocab, token_limit, params = random_params(rng)
    params["capacity"] = 2 * params["branch_length"] + 1 + int(rng.integers(0, 200))
    ops = random_script(rng, vocab, token_limit, n_requests=6, max_live=3)
    assert sum(op[0] == "start" for op in ops) == 6
    run_script(params, token_limit, ops, rng)


@pytest.mark.parametrize("seed", range(4))
def test_trie_matches_naive_with_many_requests_in_progress(seed):
    """More requests at once than the node rows hold own counts for (trie_pool_kernels.INLINE): the
    rest live in the `own` array, which grows as they arrive."""
    from draftcore.drafters.trie_pool_kernels import INLINE
    rng = np.random.default_rng(900 + seed)
    vocab, token_limit, params = random_params(rng)
    params["capacity"] = 2 * params["branch_length"] + 1 + int(rng.integers(50, 400))
    ops = []
    base = rng.integers(0, vocab, size=20).tolist()
    n = INLINE + 3
    for rid in range(n):  # all in progress at once
        ops.append(("start", rid, random_tokens(rng, base, vocab, int(rng.integers(2, 20)))))
    for _ in range(6):
        for rid in rng.permutation(n).tolist():
            ops.append(("update", rid, random_tokens(rng, base, vocab, int(rng.integers(1, 5)))))
            ops.append(("propose", rid, None, int(rng.integers(0, 16))))
    for rid in rng.permutation(n).tolist():
        ops.append(("finish", rid))
    run_script(params, token_limit, ops, rng)


@pytest.mark.parametrize("seed", range(8))
def test_trie_matches_naive_with_a_full_candidate_list(seed):
    """A full candidate list keeps its best candidates (one stage at a time: paper mode)."""
    rng = np.random.default_rng(500 + seed)
    vocab, token_limit, params = random_params(rng)
    params.update(capacity=400, fill=False)
    run_script(params, token_limit, random_script(rng, vocab, token_limit), rng,
               heap_capacity=int(rng.integers(1, 6)), check_every_op=False)


@pytest.mark.parametrize("fill", [True, False])
@pytest.mark.parametrize("layout", ["hierarchical", "single"])
def test_trie_matches_naive_each_mode(fill, layout):
    for seed in range(10):
        rng = np.random.default_rng(9000 + seed)
        vocab, token_limit, params = random_params(rng)
        params.update(fill=fill, layout=layout)
        run_script(params, token_limit, random_script(rng, vocab, token_limit), rng, check_every_op=False)


# -- the model's tokens, learnt for the request in progress ------------------------------------------
def random_learning(rng) -> dict:
    return dict(learn_from_model=bool(rng.random() < 0.9), learn_context=int(rng.integers(1, 6)),
                learn_capacity=int(rng.choice([1, 2, 3, 8, 1024])))


@SETTINGS
@given(st.integers(0, 2**32 - 1))
def test_trie_learning_the_model_matches_naive_hypothesis(seed):
    """Scripts with observes: every learnt count, every forgotten one (a full ring, a request's
    end), every prune they cause and every draft match the twin."""
    rng = np.random.default_rng(seed)
    vocab, token_limit, params = random_params(rng)
    params.update(random_learning(rng))
    run_script(params, token_limit, with_observes(random_script(rng, vocab, token_limit), rng), rng)


@pytest.mark.parametrize("seed", range(8))
def test_trie_learning_the_model_matches_naive_in_a_small_pool(seed):
    """Three requests at once, long, observing every step, in a pool small enough that learning
    makes room (decay and pruning) and sometimes cannot count a continuation at all."""
    rng = np.random.default_rng(1300 + seed)
    vocab, token_limit, params = random_params(rng)
    params.update(random_learning(rng), learn_from_model=True)
    params["capacity"] = 2 * params["branch_length"] + 1 + int(rng.integers(0, 60))
    ops = random_script(rng, vocab, token_limit, n_requests=5, max_live=3)
    run_script(params, token_limit, with_observes(ops, rng, rate=1.0), rng)


def _learning_pair(**options):
    """A learning drafter and a blind one, alike otherwise."""
    config = dict(capacity=1000, branch_length=4, token_limit=20, use_top=False, calibrate=False, learn_context=2)
    config.update(options)
    return research_trie(**config), research_trie(**dict(config, learn_from_model=False))


def _own_delta(learning, blind, r_learning, r_blind) -> dict:
    mine = pool_own_contents(learning.pool.state, r_learning._core.slot)
    theirs = pool_own_contents(blind.pool.state, r_blind._core.slot)
    return {p: mine.get(p, (0.0, 0.0))[0] - theirs.get(p, (0.0, 0.0))[0] for p in set(mine) | set(theirs)
            if mine.get(p, (0.0, 0.0)) != theirs.get(p, (0.0, 0.0))}


def test_a_rejected_candidates_model_token_is_learnt_for_the_request_and_leaves_with_it():
    prompt = np.array([7, 1, 2, 3, 7, 1, 2], np.int32)
    learning, blind = _learning_pair()
    runs = []
    for d in (learning, blind):
        r = d.start(prompt)
        tree = r.propose(prompt, 1)            # "7 1 2" was followed by 3
        assert tree.tokens.tolist() == [2, 3]
        # The model rejects 3 (says 5 at the root) and, after 1 2 3, would have said 9.
        r.observe(tree, np.array([5, 9], np.int32), np.array([0], np.int32))
        r.update(np.array([5], np.int32))
        runs.append(r)
    # The snippet (2 3 | 9), learn_context 2: 9 after "2 3" and after "3", one own PROMPT count
    # each; the suffix nodes gain nothing.
    assert _own_delta(learning, blind, *runs) == {(2, 3, 9): 1.0, (3, 9): 1.0}
    learning.check_integrity()
    # After 3, this request now drafts 9 (weighted as prompt text) beside the prompt's 7.
    drafts = [r.propose(np.array([2, 3], np.int32), 4) for r in runs]
    assert 9 in drafts[0].tokens.tolist() and 9 not in drafts[1].tokens.tolist()
    for r in runs:
        r.finish()
    learning.check_integrity()
    assert pool_contents(learning.pool.state) == pool_contents(blind.pool.state)  # nothing learnt outlives it


def test_a_full_ring_forgets_its_oldest_continuation():
    prompt = np.array([7, 1, 2, 3, 7, 1, 4, 7, 1, 6], np.int32)
    learning, blind = _learning_pair(learn_capacity=1, learn_context=1)
    runs = []
    for d in (learning, blind):
        r = d.start(prompt)
        tree = r.propose(np.array([7, 1], np.int32), 3)   # "7 1" was followed by 2, 4 and 6
        assert sorted(tree.tokens.tolist()[1:]) == [2, 4, 6]
        node_tokens = np.array([0, 11, 12, 13], np.int32)  # the model's token after each
        r.observe(tree, node_tokens, np.array([0], np.int32))
        runs.append((r, tree))
    r, tree = runs[0]
    last = int(tree.tokens[3])   # counted in node order: only the last candidate's is kept
    assert last == 6 and _own_delta(learning, blind, r, runs[1][0]) == {(6, 13): 1.0}
    assert r._core.learnt.ring.tolist() == [0, 1]   # (oldest, count) of a ring of one
    for r, _ in runs:
        r.finish()
    assert pool_contents(learning.pool.state) == pool_contents(blind.pool.state)


def test_learning_leaves_other_requests_drafts_alone():
    """A request's learnt counts are its own: another request in progress drafts exactly what it
    would draft beside a request that learns nothing."""
    rng = np.random.default_rng(5)
    learning, blind = _learning_pair(learn_context=3)
    base = rng.integers(0, 12, 30).tolist()
    prompts = [np.array(random_tokens(rng, base, 12, 25), np.int32) for _ in range(2)]
    pairs = [(learning.start(p), blind.start(p)) for p in prompts]
    streams = [list(p) for p in prompts]
    for step in range(30):
        (a, a_blind), (b, b_blind) = pairs
        tree = a.propose(np.array(streams[0], np.int32), 6)
        a_blind.propose(np.array(streams[0], np.int32), 6)
        node_tokens, path = random_observation(tree, step, 12)
        a.observe(tree, node_tokens, path)
        other = b.propose(np.array(streams[1], np.int32), 6)
        alone = b_blind.propose(np.array(streams[1], np.int32), 6)
        assert_same_tree(other, (alone.tokens.tolist(), alone.parents.tolist(), alone.depths.tolist(),
                                 alone.scores.tolist()), 6)
        for i, (x, y) in enumerate(pairs):
            tokens = np.array(random_tokens(rng, base, 12, 2), np.int32)
            x.update(tokens), y.update(tokens)
            streams[i] += tokens.tolist()
    assert learning.pool.state.freq[:, 4].sum() > blind.pool.state.freq[:, 4].sum()   # request a did learn
    for pair in pairs:
        for r in pair:
            r.finish()
    learning.check_integrity()
    assert pool_contents(learning.pool.state) == pool_contents(blind.pool.state)


def test_observe_refuses_bad_arguments_and_changes_nothing():
    d = TrieDrafter(capacity=100, branch_length=4, token_limit=10)
    r = d.start(np.array([1, 2, 3, 1, 2], np.int32))
    tree = r.propose(np.array([1, 2, 3, 1, 2], np.int32), 1)
    assert tree.n_candidates == 2
    good = np.array([4, 5], np.int32)
    before = pool_contents(d.pool.state)
    cases = [
        (dict(node_tokens=np.array([4], np.int32)), "node_tokens"),
        (dict(node_tokens=np.array([4.0, 5.0])), "node_tokens"),
        (dict(path=np.array([1], np.int32)), "path"),
        (dict(path=np.array([0, 2], np.int32)), "path"),
        (dict(path=np.array([], np.int32)), "path"),
        (dict(tree=DraftTree.build([7, 3], [-1, 0], [0, 1])), "tree"),
        (dict(tree="tree"), "tree"),
    ]
    for change, name in cases:
        args = dict(tree=tree, node_tokens=good, path=np.array([0], np.int32))
        args.update(change)
        with pytest.raises(InputError) as info:
            r.observe(**args)
        assert str(info.value).startswith(name), str(info.value)
        assert pool_contents(d.pool.state) == before and r._core.learnt.ring[1] == 0
    r.observe(tree, good, np.array([0], np.int32))   # the request still observes its tree
    assert r._core.learnt.ring[1] == 1
    r.observe(tree, good, np.array([0], np.int32))   # a second observe of one proposal: nothing
    assert r._core.learnt.ring[1] == 1
    r.finish()
    with pytest.raises(InputError, match="request: observe.*finished"):
        r.observe(tree, good, np.array([0], np.int32))


def test_insert_output_and_no_elimination_match_naive():
    for seed in range(20):
        rng = np.random.default_rng(4000 + seed)
        vocab, token_limit, params = random_params(rng)
        params.update(insert_output=bool(seed % 2), eliminate_prompt=bool(seed % 3))
        run_script(params, token_limit, random_script(rng, vocab, token_limit), rng, check_every_op=False)


def test_insert_prompt_false_counts_no_prompt_branches():
    """insert_prompt=False: branches that start inside the prompt are never counted, so no PROMPT
    count may appear (there is no branch elimination to remove one) — also when the pool is full
    and `extend` rebuilds its front from the stream (which includes the prompt)."""
    for seed in range(60):
        rng = np.random.default_rng(7000 + seed)
        vocab, token_limit, params = random_params(rng)
        params.update(insert_prompt=False)
        drafter = research_trie(**params, token_limit=token_limit)
        naive = NaiveTrie(**params)
        requests = {}
        for op in random_script(rng, vocab, token_limit):
            if op[0] == "start":
                requests[op[1]] = (drafter.start(np.array(op[2], np.int32)), naive.open(op[2]))
            elif op[0] == "update":
                requests[op[1]][0].update(np.array(op[2], np.int32)), requests[op[1]][1].update(op[2])
            elif op[0] == "propose" and op[1] is not None:  # counts the pending tokens
                mine, twin = requests[op[1]]
                mine.propose(np.array(twin.stream, np.int32), 4), twin.propose(twin.stream, 4)
            elif op[0] == "finish":
                requests[op[1]][0].finish(), requests.pop(op[1])[1].finish()
            elif op[0] == "warm_up":
                drafter.warm_up([np.array(s, np.int32) for s in op[1]]), naive.warm_up(op[1])
            drafter.check_integrity()
            prompt_counts = {p: c for p, c in pool_contents(drafter.pool.state).items() if c[0] != 0}
            assert not prompt_counts, f"seed {seed}: PROMPT counts with insert_prompt=False: {prompt_counts}"
            assert pool_contents(drafter.pool.state) == naive_trie_contents(naive), f"seed {seed}"


def test_insert_prompt_false_minimal_repro():
    """The smallest case of the above: a full pool makes extend() refresh its front from the
    stream, prompt included, so the branch starting at the last prompt token is counted as PROMPT
    and, with insert_prompt=False, never eliminated (it can never decay either)."""
    d = research_trie(capacity=9, branch_length=4, insert_prompt=False, token_limit=16)
    d.warm_up([[1, 2, 1, 2, 1, 2, 1, 2]])  # paths 1, 1-2, 1-2-1, ..., 2, 2-1, ...: 8 nodes, 1 free
    r = d.start(np.array([5, 1], np.int32))
    r.update(np.array([2], np.int32))     # < branch_length free: make_room, front rebuilt from [5, 1]
    r.finish()
    d.check_integrity()
    assert {p: c for p, c in pool_contents(d.pool.state).items() if c[0]} == {}


# -- counting from the definition ---------------------------------------------------------------------
def test_output_counts_persist_and_prompt_counts_are_removed():
    rng = np.random.default_rng(3)
    bl = 4
    d = TrieDrafter(capacity=100_000, branch_length=bl, token_limit=10)
    requests = []
    for _ in range(5):
        prompt = rng.integers(0, 10, size=int(rng.integers(1, 30))).tolist()
        output = rng.integers(0, 10, size=int(rng.integers(0, 30))).tolist()
        r = d.start(np.array(prompt, np.int32))
        for i in range(0, len(output), 3):
            r.update(np.array(output[i:i + 3], np.int32))
        r.propose(np.array(prompt + output, np.int32), 0)  # counts the tokens
        d.check_integrity()
        while_running = pool_contents(d.pool.state)
        assert any(c[0] > 0 for c in while_running.values())  # the prompt is in the trie
        r.finish()
        requests.append((prompt, output))
        got = pool_contents(d.pool.state)
        assert got == naive_branch_counts(requests, bl)  # exactly the output branches, every request
        assert all(c[0] == 0.0 and c[2] == 0.0 for c in got.values())
    assert d.n_nodes == len(naive_branch_counts(requests, bl))


def test_prompt_branches_counted_while_running():
    d = TrieDrafter(capacity=1000, branch_length=3, token_limit=10)
    r = d.start(np.array([1, 2, 3, 1, 2], np.int32))
    r.update(np.array([4], np.int32))
    assert (4,) not in pool_contents(d.pool.state)  # counted at the next propose (one kernel call a step)
    r.propose(np.array([1, 2, 3, 1, 2, 4], np.int32), 0)
    d.check_integrity()
    got = pool_contents(d.pool.state)
    # prompt branches: start positions 0..4, 3 tokens each, growing into the output token 4
    assert got[(1,)] == (2.0, 0.0, 0.0) and got[(1, 2)] == (2.0, 0.0, 0.0) and got[(1, 2, 3)] == (1.0, 0.0, 0.0)
    assert got[(1, 2, 4)] == (1.0, 0.0, 0.0) and got[(2, 4)] == (1.0, 0.0, 0.0)
    assert got[(4,)] == (0.0, 1.0, 1.0)  # OUTPUT, and RECENT while the request runs
    r.finish()
    assert pool_contents(d.pool.state) == {(4,): (0.0, 1.0, 0.0)}


def test_recent_counts_follow_the_running_request():
    d = TrieDrafter(capacity=1000, branch_length=3, token_limit=10)
    d.warm_up([[1, 2, 3]])
    r = d.start(np.array([5], np.int32))
    r.update(np.array([1, 2, 4], np.int32))
    r.propose(np.array([5, 1, 2, 4], np.int32), 0)
    d.check_integrity()
    got = pool_contents(d.pool.state)
    assert got[(1,)] == (0.0, 2.0, 1.0) and got[(1, 2)] == (0.0, 2.0, 1.0) and got[(1, 2, 3)] == (0.0, 1.0, 0.0)
    assert got[(1, 2, 4)] == (0.0, 1.0, 1.0) and got[(5, 1)] == (1.0, 0.0, 0.0)
    r.finish()
    got = pool_contents(d.pool.state)
    assert all(c[2] == 0.0 for c in got.values()) and (5,) not in got
    assert got[(1, 2)] == (0.0, 2.0, 0.0)


def test_without_elimination_prompt_counts_become_output_counts():
    d = research_trie(capacity=1000, branch_length=3, token_limit=10, eliminate_prompt=False)
    r = d.start(np.array([1, 2, 3], np.int32))
    r.update(np.array([4], np.int32))
    r.finish()
    assert pool_contents(d.pool.state) == naive_branch_counts([([], [1, 2, 3, 4])], 3)


def test_stage_zero_drafts_the_most_frequent_tokens():
    d = research_trie(capacity=1000, branch_length=2, token_limit=10, use_top=True, prompt_weight=1.0, calibrate=False)
    d.warm_up([[1, 1, 1, 2, 2, 3]])
    tree = d.propose(np.array([9], np.int32), 2)  # 9 was never seen: only stage 0 offers anything
    assert tree.tokens.tolist() == [9, 1, 2] and tree.parents.tolist() == [-1, 0, 0]
    np.testing.assert_allclose(tree.scores, [1.0, 3 / 6, 2 / 6], rtol=1e-6)
    d2 = research_trie(capacity=1000, branch_length=2, token_limit=10, use_top=False)
    d2.warm_up([[1, 1, 1, 2, 2, 3]])
    assert len(d2.propose(np.array([9], np.int32), 2)) == 1


def test_paper_configuration():
    d = TrieDrafter.paper(capacity=100)
    assert (d.branch_length, d.fill, d.use_top, d.recent_weight) == (12, False, False, 0.0)
    assert d.capacity == 100


@pytest.mark.parametrize("seed", range(5))
def test_node_count_never_exceeds_capacity(seed):
    rng = np.random.default_rng(seed)
    bl = int(rng.integers(2, 8))
    cap = 2 * bl + 1 + int(rng.integers(0, 20))
    d = TrieDrafter(capacity=cap, branch_length=bl, token_limit=50)
    for _ in range(4):
        r = d.start(rng.integers(0, 50, size=int(rng.integers(1, 60))).astype(np.int32))
        for _ in range(20):
            r.update(rng.integers(0, 50, size=int(rng.integers(1, 5))).astype(np.int32))
            assert d.n_nodes <= cap
            d.check_integrity()
            r.propose(rng.integers(0, 50, size=5).astype(np.int32), int(rng.integers(0, 20)))
        r.finish()
        assert d.n_nodes <= cap
        d.check_integrity()


# -- layouts ----------------------------------------------------------------------------------------
def _paths(tree: DraftTree):
    return {tuple(tree.path_tokens(i).tolist()) for i in range(len(tree))}


@pytest.mark.parametrize("layout", ["parallel", "single", "hierarchical"])
@pytest.mark.parametrize("fill", [True, False])
def test_layouts_give_valid_trees_within_budget(layout, fill):
    for seed in range(30):
        rng = np.random.default_rng(seed)
        vocab = int(rng.integers(3, 12))
        base = rng.integers(0, vocab, size=12).tolist()
        kw = dict(capacity=500, branch_length=int(rng.integers(2, 7)), max_match=int(rng.integers(1, 6)),
                  min_stage_nodes=int(rng.integers(1, 5)), fill=fill, token_limit=vocab)
        d = research_trie(layout=layout, **kw)
        merged = research_trie(layout="hierarchical", **kw)
        for x in (d, merged):
            x.warm_up([random_tokens(np.random.default_rng(seed), base, vocab, 60)])
        for _ in range(10):
            ctx = np.array(random_tokens(rng, base, vocab, int(rng.integers(1, 8))), np.int32)
            budget = int(rng.integers(0, 30))
            tree = d.propose(ctx, budget)
            DraftTree.build(tree.tokens, tree.parents, tree.depths)
            assert tree.tokens[0] == ctx[-1] and tree.n_draft <= budget
            assert tree.tokens.dtype == tree.parents.dtype == tree.depths.dtype == np.int32
            ref = merged.propose(ctx, budget)
            ref_paths = _paths(ref)
            if layout == "parallel":
                # the merged tree's branches laid side by side, shared prefixes repeated
                assert _paths(tree) <= ref_paths
                assert tree.n_draft == min(budget, sum(int(ref.depths[i]) for i in ref.leaves() if i > 0))
            if layout == "hierarchical":
                assert len(set(zip(tree.parents.tolist(), tree.tokens.tolist()))) == len(tree)


@pytest.mark.parametrize("fill", [False, True])
def test_single_layout_is_one_branch(fill):
    """layout="single" is the paper's single-branch draft: a chain (what a chain-only verifier,
    e.g. a standard exported ONNX decoder, needs)."""
    for seed in range(30):
        rng = np.random.default_rng(seed)
        vocab = int(rng.integers(3, 12))
        base = rng.integers(0, vocab, size=12).tolist()
        d = research_trie(capacity=500, branch_length=4, max_match=4, layout="single", fill=fill, token_limit=vocab)
        d.warm_up([random_tokens(rng, base, vocab, 60)])
        for _ in range(10):
            ctx = np.array(random_tokens(rng, base, vocab, 6), np.int32)
            tree = d.propose(ctx, 10)
            assert tree.is_chain(), f"seed {seed}: {tree}"


def test_single_layout_minimal_repro():
    d = TrieDrafter(capacity=1000, branch_length=4, layout="single", max_match=3, token_limit=16)
    d.warm_up([[1, 2, 3, 4, 5, 1, 2, 7, 8, 9, 2, 3, 6, 6]])
    tree = d.propose(np.array([0, 1, 2], np.int32), 10)
    assert tree.is_chain(), tree  # got tokens [2, 3, 4, 6, 6], parents [-1, 0, 1, 1, 3]


def test_equal_scores_are_ordered_by_token():
    """(11, 2) and (11, 15) both score 4/9: the tie goes to the smaller token. (A candidate's score
    must be rounded to float32 before it is compared with the float32 scores already listed.)"""
    d = research_trie(capacity=1000, branch_length=2, token_limit=16, fill=False, use_top=False, min_stage_nodes=1)
    d.warm_up([[11, 2]] * 4 + [[11, 15]] * 4 + [[11]])
    tree = d.propose(np.array([11], np.int32), 1)
    assert tree.tokens.tolist() == [11, 2], tree
    tree = d.propose(np.array([11], np.int32), 2)
    assert tree.tokens.tolist() == [11, 2, 15], tree


def test_a_candidate_dropped_for_lack_of_room_is_missed_after_a_merge():
    """fill: stage (X, Y) drafts A; stage (Y) offers A (0.6) and B (0.4) with room for one more
    node, so B is dropped from the candidate list; A then merges into the existing node (using no
    room) and its child C (0.2) is drafted instead of B, against the best-first rule."""
    X, Y, A, B, C = 1, 2, 3, 4, 5
    d = research_trie(capacity=100, branch_length=3, max_match=2, token_limit=8, fill=True, use_top=False)
    d.warm_up([[X, Y, A], [Y, A, C], [Y, A], [Y, B], [Y, B]])
    tree = d.propose(np.array([X, Y], np.int32), 2)
    assert tree.tokens.tolist() == [Y, A, B] and tree.parents.tolist() == [-1, 0, 0], tree


def test_retrieval_prefers_the_frequent_continuation_and_scores_are_ratios():
    d = research_trie(capacity=1000, branch_length=3, token_limit=10, prompt_weight=1.0, calibrate=False)
    d.warm_up([[1, 2, 3] * 3 + [1, 2, 4]])
    tree = d.propose(np.array([7, 1, 2], np.int32), 8)
    # (1,2) seen 4 times, followed by 3 three times, by 4 once
    assert tree.tokens[:3].tolist() == [2, 3, 4]
    np.testing.assert_allclose(tree.scores[:3], [1.0, 0.75, 0.25])


# -- calibrated retrieval -----------------------------------------------------------------------------
def _two_stage_trie(**options):
    """Context (X, Y): stage 2 offers A and C at 0.5 each; stage 1, (Y), offers D at 10 / 14."""
    X, Y, A, C, D = 1, 2, 3, 4, 5
    d = research_trie(capacity=1000, branch_length=3, max_match=2, token_limit=10, use_top=False, **options)
    d.warm_up([[X, Y, A]] * 2 + [[X, Y, C]] * 2 + [[Y, D]] * 10)
    return d, (X, Y, A, C, D)


def test_calibrated_retrieval_ranks_every_stage_together():
    """Uncalibrated, the longest stage drafts first whatever its weights; calibrated (the prior
    alone: each bin's centre, whatever the context length) D at 0.71 outranks A and C at 0.5."""
    plain, (X, Y, A, C, D) = _two_stage_trie(calibrate=False)
    assert plain.propose(np.array([X, Y], np.int32), 1).tokens.tolist() == [Y, A]
    calibrated, _ = _two_stage_trie()
    tree = calibrated.propose(np.array([X, Y], np.int32), 3)
    assert tree.tokens.tolist() == [Y, D, A, C]
    # bins [0.7, 0.9) and [0.5, 0.7): the prior's centres
    np.testing.assert_allclose(tree.scores, [1.0, 0.8, 0.6, 0.6], rtol=1e-6)


def test_calibration_learns_what_came_true_per_context_length():
    """A request drafts [Y, D, A, C] (D from the 1-token match, A and C from the 2-token one), then
    emits A: D and C count as misses and A as a hit in their cells; A's continuation was not
    drafted. Taught often enough, the 2-token stage's A outranks D. (The requests' prompts and
    outputs weigh and add nothing, so only the calibration changes.)"""
    K = __import__("draftcore.drafters.trie_calibration_kernels", fromlist=["x"])
    d, (X, Y, A, C, D) = _two_stage_trie(prompt_weight=0.0, insert_output=False)
    prior = d.pool.state.cal.copy()
    cell_d, cell_ac = 1 * K.CAL_BINS + 7, 2 * K.CAL_BINS + 6   # (m=1, [0.7, 0.9)), (m=2, [0.5, 0.7))
    r = d.start(np.array([X, Y], np.int32))
    r.propose(np.array([X, Y], np.int32), 3)
    r.update(np.array([A], np.int32))
    r.propose(np.array([X, Y, A], np.int32), 0)   # learns from the first draft: every node is settled
    learnt = np.zeros_like(prior)
    learnt[:, cell_d] = [1.0, 0.0]
    learnt[:, cell_ac] = [2.0, 1.0]
    np.testing.assert_allclose(d.pool.state.cal, prior + learnt, rtol=0, atol=1e-12)
    r.finish()
    for _ in range(20):   # X Y always continues with A: D keeps missing, A keeps coming true
        r = d.start(np.array([X, Y], np.int32))
        r.propose(np.array([X, Y], np.int32), 3)
        r.update(np.array([A], np.int32))
        r.finish()   # learns from what the stream settled
    assert d.propose(np.array([X, Y], np.int32), 1).tokens.tolist() == [Y, A]


def test_calibration_leaves_other_contexts_and_the_paper_alone():
    """A draft of some other context than the stream teaches nothing (its outcome is not in the
    stream); the paper's configuration and the single layout do not calibrate."""
    d, (X, Y, A, C, D) = _two_stage_trie()
    prior = d.pool.state.cal.copy()
    r = d.start(np.array([X, Y], np.int32))
    r.propose(np.array([7, X, Y], np.int32), 3)
    r.update(np.array([A], np.int32))
    r.finish()
    np.testing.assert_array_equal(d.pool.state.cal, prior)
    assert not TrieDrafter.paper().calibrate
    # `calibrate` says whether the calibration applies: with fill and a non-single layout only
    assert TrieDrafter(layout="parallel").calibrate
    assert not research_trie(fill=False).calibrate and not TrieDrafter(layout="single").calibrate
    single, _ = _two_stage_trie(layout="single")
    assert single.propose(np.array([X, Y], np.int32), 1).tokens.tolist()[1] in (A, C)


# -- save / load ------------------------------------------------------------------------------------
def _busy_drafter(seed=0, **kw):
    rng = np.random.default_rng(seed)
    d = research_trie(capacity=kw.pop("capacity", 60), branch_length=4, token_limit=20, **kw)
    d.warm_up([[1, 2, 3, 1, 2, 4, 1, 5]])  # node (1,) has children 2, 5; node (1, 2) has 3, 4
    base = rng.integers(0, 20, size=15).tolist()
    for _ in range(3):
        r = d.start(np.array(random_tokens(rng, base, 20, 20), np.int32))
        r.update(np.array(random_tokens(rng, base, 20, 30), np.int32))
        r.finish()
    d.check_integrity()
    return d, rng, base


def test_save_load_round_trip(tmp_path):
    d, rng, base = _busy_drafter()
    path = tmp_path / "trie.npz"
    d.save(path)
    e = TrieDrafter.load(path)
    e.check_integrity()
    assert pool_contents(e.pool.state) == pool_contents(d.pool.state)
    assert pool_child_order(e.pool.state) == pool_child_order(d.pool.state)
    for _ in range(20):
        ctx = np.array(random_tokens(rng, base, 20, 6), np.int32)
        a, b = d.propose(ctx, 12), e.propose(ctx, 12)
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
        np.testing.assert_array_equal(a.scores, b.scores)
    # and both keep learning identically
    for x in (d, e):
        r = x.start(np.array(base, np.int32))
        r.update(np.array(base[::-1], np.int32))
        r.finish()
    assert pool_contents(e.pool.state) == pool_contents(d.pool.state)


def _calibrated_drafter():
    """A busy trie whose requests proposed as they went, so its calibration has learnt."""
    d, rng, base = _busy_drafter(capacity=400)
    for _ in range(6):
        stream = random_tokens(rng, base, 20, 20)
        r = d.start(np.array(stream, np.int32))
        for _ in range(10):
            r.propose(np.array(stream, np.int32), 6)
            step = random_tokens(rng, base, 20, 3)
            r.update(np.array(step, np.int32))
            stream += step
        r.finish()
    return d, rng, base


def test_save_load_keeps_the_calibration(tmp_path):
    """The calibration learnt so far travels with the file, so the loaded trie ranks candidates
    as the saved one did; a format-1 file (before `cal` was saved) loads with the prior."""
    d, rng, base = _calibrated_drafter()
    prior = draftcore.drafters.trie_calibration_kernels.new_calibration()
    assert not np.array_equal(d.pool.state.cal, prior)
    d.save(tmp_path / "t.npz")
    e = TrieDrafter.load(tmp_path / "t.npz")
    np.testing.assert_array_equal(e.pool.state.cal, d.pool.state.cal)
    with np.load(tmp_path / "t.npz") as z:
        old = {k: z[k] for k in z.files if k != "cal"}
    old["config"] = old["config"].copy()
    old["config"][0] = 1
    np.savez(tmp_path / "format1.npz", **old)
    f = TrieDrafter.load(tmp_path / "format1.npz")
    np.testing.assert_array_equal(f.pool.state.cal, prior)
    assert pool_contents(f.pool.state) == pool_contents(d.pool.state)
    same, differs = True, False
    for _ in range(40):
        ctx = np.array(random_tokens(rng, base, 20, 6), np.int32)
        a, b, c = (x.propose(ctx, 6) for x in (d, e, f))
        same &= (a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
                 and np.array_equal(a.scores, b.scores))
        differs |= not np.array_equal(a.scores, c.scores)
    assert same
    assert differs  # the calibration decides these trees: without it the scores differ


def test_load_takes_options(tmp_path):
    d, _, _ = _busy_drafter()
    d.save(tmp_path / "t.npz")
    e = TrieDrafter.load(tmp_path / "t.npz", layout="single", max_match=3)
    assert e.layout == "single" and e.max_match == 3 and e.capacity == d.capacity


def test_save_load_round_trip_any_file_name(tmp_path):
    """save(path) then load(path) must work whatever the suffix (np.savez appends '.npz' to a file
    name without it, so save writes a different file than the one load reads)."""
    d, _, _ = _busy_drafter()
    path = tmp_path / "pool.trie"
    d.save(path)
    e = TrieDrafter.load(path)
    assert pool_contents(e.pool.state) == pool_contents(d.pool.state)


def test_save_during_requests_keeps_what_persists(tmp_path):
    """A server checkpoints while requests run: the file holds the shared trie, not the live
    requests' own counts, and loads as a trie with no request in progress."""
    d, _, base = _busy_drafter()
    idle = tmp_path / "idle.npz"
    d.save(idle)
    r = d.start(np.array(base, np.int32))
    r.update(np.array(base[::-1], np.int32))
    r.propose(np.array(base + base[::-1], np.int32), 4)
    d.save(tmp_path / "busy.npz")
    e = TrieDrafter.load(tmp_path / "busy.npz")
    e.check_integrity()
    got = pool_contents(e.pool.state)
    assert all(c[0] == 0.0 and c[2] == 0.0 for c in got.values())
    live = pool_contents(d.pool.state)
    assert {p: c[1] for p, c in got.items()} == {p: c[1] for p, c in live.items()}  # OUTPUT as it stands
    r.finish()
    d.check_integrity()


def test_load_refuses_options_the_file_holds(tmp_path):
    d, _, _ = _busy_drafter()
    d.save(tmp_path / "t.npz")
    for name in ("capacity", "branch_length", "token_limit"):
        with pytest.raises(ConfigError, match=f"^{name}: .*from the file"):
            TrieDrafter.load(tmp_path / "t.npz", **{name: 64})
    with pytest.raises(ConfigError, match="^foo: not an option of TrieDrafter"):
        TrieDrafter.load(tmp_path / "t.npz", foo=3)


def test_save_into_a_missing_folder_is_an_input_error(tmp_path):
    d, _, _ = _busy_drafter()
    with pytest.raises(InputError, match="path: .*not an existing folder"):
        d.save(tmp_path / "missing" / "t.npz")
    for bad in (3, tmp_path):   # not a path; a folder (the temporary would go to its parent, the rename fail)
        with pytest.raises(InputError, match="^path: expected the path of a file"):
            d.save(bad)
    assert list(tmp_path.iterdir()) == []


def test_a_save_that_fails_midway_leaves_the_previous_file(tmp_path, monkeypatch):
    """Disk full halfway through: the previous checkpoint still loads, and no temporary is left."""
    d, _, base = _busy_drafter()
    path = tmp_path / "t.npz"
    d.save(path)
    before = path.read_bytes()
    r = d.start(np.array(base, np.int32))
    r.update(np.array(base, np.int32))
    r.finish()  # the trie has changed since

    def failing_savez(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(OSError, match="No space"):
        d.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    TrieDrafter.load(path).check_integrity()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.npz"]


def _arrays(tmp_path):
    d = TrieDrafter(capacity=60, branch_length=4, token_limit=20)
    d.warm_up([[1, 2, 3, 1, 2, 4, 1, 5], [6, 7]])  # node (1,) has children 2, 5; node (1, 2) has 3, 4
    d.save(tmp_path / "good.npz")
    with np.load(tmp_path / "good.npz") as z:
        return {k: z[k].copy() for k in z.files}


def _node_of(arrays, path):
    links, root = arrays["links"], arrays["root"]
    node = int(root[path[0]])
    for t in path[1:]:
        c = int(links[node, 2])
        while int(links[c, 0]) != t:
            c = int(links[c, 3])
        node = c
    return node


def _corrupt_cases(a):
    """name -> arrays dict with one defect."""
    cases = {}

    def case(name, **changes):
        b = {k: v.copy() for k, v in a.items()}
        for k, v in changes.items():
            if v is None:
                del b[k]
            elif callable(v):
                b[k] = v(b[k])
            else:
                b[k] = v
        cases[name] = b

    def set_(arr, idx, value):
        arr[idx] = value
        return arr

    node = _node_of(a, [1, 2])     # children 3 and 4
    child = _node_of(a, [1, 2, 4])
    other = _node_of(a, [1, 2, 3])
    top = _node_of(a, [6])
    free_node = int(np.flatnonzero(a["links"][:, 1] == -2)[0])

    case("truncated links", links=lambda x: x[:-1])
    case("truncated free", free=lambda x: x[:-3])
    case("truncated root", root=lambda x: x[:5])
    case("links wrong dtype", links=lambda x: x.astype(np.int64))
    case("freq wrong dtype", freq=lambda x: x.astype(np.float64))
    case("meta wrong dtype", meta=lambda x: x.astype(np.int32))
    case("links 1-D", links=lambda x: x.ravel())
    case("missing freq", freq=None)
    case("config wrong format", config=np.array([99, 60, 4, 20], np.int64))
    case("config wrong shape", config=np.array([1, 60, 4], np.int64))
    case("config wrong dtype", config=np.array([1, 60, 4, 20], np.float64))
    case("child points to a free node", links=lambda x: set_(x, (node, 2), free_node))
    case("child points out of the pool", links=lambda x: set_(x, (node, 2), 10_000))
    case("child's parent is wrong", links=lambda x: set_(x, (child, 1), top))
    case("sibling cycle", links=lambda x: set_(x, (other, 3), child) if x[child, 3] == other else set_(x, (child, 3), other))
    case("self sibling", links=lambda x: set_(x, (child, 3), child))
    case("child cycle", links=lambda x: set_(x, (child, 2), node))
    case("root index to a wrong node", root=lambda x: set_(x, 1, top))
    case("root index to a missing node", root=lambda x: set_(x, 9, free_node))
    case("root list loses a node", meta=lambda x: set_(x, 1, int(a["links"][int(x[1]), 3])))
    case("token out of range", links=lambda x: set_(x, (child, 0), 99))
    case("negative count", freq=lambda x: set_(x, (node, 1), -1.0))
    case("NaN count", freq=lambda x: set_(x, (node, 1), np.nan))
    case("infinite OUTPUT count", freq=lambda x: set_(x, (node, 1), np.inf))
    case("infinite PROMPT count", freq=lambda x: set_(x, (node, 0), np.inf))
    case("RECENT above OUTPUT", freq=lambda x: set_(x, (node, 2), x[node, 1] + 1))
    case("RECENT left over from a request", freq=lambda x: set_(set_(x, (node, 1), x[node, 1] + 1), (node, 2), 1.0))
    case("freq without RECENT", freq=lambda x: x[:, :2].copy())
    case("missing cal", cal=None)
    case("cal wrong shape", cal=lambda x: x[:, :-1].copy())
    case("cal wrong dtype", cal=lambda x: x.astype(np.float32))
    case("cal NaN", cal=lambda x: set_(x, (1, 3), np.nan))
    case("cal hits above candidates", cal=lambda x: set_(x, (1, 3), x[0, 3] + 1))
    case("cal negative hits", cal=lambda x: set_(x, (1, 3), -0.5))
    case("cal no candidates", cal=lambda x: set_(set_(x, (0, 3), 0.0), (1, 3), 0.0))
    case("cal candidates at the cap", cal=lambda x: set_(x, (0, 3), 1024.0))
    case("free list count too big", meta=lambda x: set_(x, 0, x[0] + 1))
    case("free list count negative", meta=lambda x: set_(x, 0, -1))
    case("free list holds a live node", free=lambda x: set_(x, 0, node))
    case("duplicate sibling tokens", links=lambda x: set_(x, (child, 0), 3))
    return cases


def test_corrupt_saved_files_raise_input_error_naming_the_path(tmp_path):
    a = _arrays(tmp_path)
    cases = _corrupt_cases(a)
    assert len(cases) >= 20
    wrong = []
    for i, (name, arrays) in enumerate(cases.items()):
        path = tmp_path / f"case{i}.npz"
        np.savez(path, **arrays)
        try:
            TrieDrafter.load(path)
            wrong.append(f"{name}: loaded")
        except InputError as exc:
            if str(path) not in str(exc):
                wrong.append(f"{name}: message does not name the path: {exc}")
        except Exception as exc:  # noqa: BLE001 - anything else is a wrong answer
            wrong.append(f"{name}: {type(exc).__name__}: {exc}")
    assert not wrong, wrong
    # the untouched arrays load fine
    np.savez(tmp_path / "same.npz", **a)
    TrieDrafter.load(tmp_path / "same.npz").check_integrity()


def test_garbage_and_pickles_raise_input_error(tmp_path):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not a numpy file at all" * 20)
    with pytest.raises(InputError, match="garbage.npz"):
        TrieDrafter.load(garbage)
    with pytest.raises(InputError, match="missing.npz"):
        TrieDrafter.load(tmp_path / "missing.npz")
    a = _arrays(tmp_path)
    obj = np.empty(2, object)
    obj[:] = [{"x": 1}, [2]]
    a["links"] = obj
    np.savez(tmp_path / "pickle.npz", **a)
    with pytest.raises(InputError, match="pickle.npz"):
        TrieDrafter.load(tmp_path / "pickle.npz")


def test_truncated_file_raises_input_error(tmp_path):
    _arrays(tmp_path)
    data = (tmp_path / "good.npz").read_bytes()
    for n in (len(data) // 2, 100, len(data) - 10):
        path = tmp_path / f"cut{n}.npz"
        path.write_bytes(data[:n])
        with pytest.raises(InputError, match=f"cut{n}.npz"):
            TrieDrafter.load(path)


def test_plain_npy_file_raises_input_error(tmp_path):
    np.save(tmp_path / "array.npy", np.arange(4))
    with pytest.raises(InputError, match="array.npy"):
        TrieDrafter.load(tmp_path / "array.npy")


@pytest.mark.parametrize("config", [[1, 5, 4, 20], [1, 60, 1, 20], [1, 60, 4, 0], [1, -3, 4, 20]])
def test_bad_config_in_file_raises_input_error(tmp_path, config):
    """A saved file's config is data, not a constructor call: InputError naming the file."""
    a = _arrays(tmp_path)
    a["config"] = np.array(config, np.int64)
    np.savez(tmp_path / "cfg.npz", **a)
    with pytest.raises(InputError, match="cfg.npz"):
        TrieDrafter.load(tmp_path / "cfg.npz")


def test_huge_config_in_file_raises_input_error_without_allocating(tmp_path):
    a = _arrays(tmp_path)
    a["config"] = np.array([1, 2**45, 4, 20], np.int64)
    np.savez(tmp_path / "huge.npz", **a)
    with pytest.raises(InputError, match="huge.npz"):
        TrieDrafter.load(tmp_path / "huge.npz")


# -- kernels, repr --------------------------------------------------------------------------------------
def test_drafter_calls_compile_nothing_beyond_the_warm_up(tmp_path):
    """Every kernel call the drafter makes has the argument types the trie kernel modules' warm_up()
    compiled (else the first real call compiles, inside a timed decode step)."""
    from draftcore.drafters import trie_candidate_kernels as H, trie_check_kernels as X, trie_count_kernels as C
    from draftcore.drafters import trie_pool_kernels as P, trie_retrieval_kernels as K
    TrieDrafter(capacity=100, branch_length=4, token_limit=10)  # runs warm_up once per process
    from draftcore.drafters import trie_model_kernels as M
    kernels = [K.step, K.retrieve, C.extend, C.end_request, P.make_room, H.refresh_top, X.find_corruption,
               M.learn, M.forget_all]
    before = {k.__name__: set(k.signatures) for k in kernels}
    for layout in LAYOUTS:
        d = research_trie(capacity=100, branch_length=4, token_limit=10, layout=layout, fill=layout != "single")
        d.warm_up([[1, 2, 3, 1, 2, 4]])
        r = d.start([1, 2, 3])
        r.update([1, 2])
        r.propose([3, 1, 2], 3)
        tree = r.propose(np.array([1, 2], np.int32), 100)  # a budget beyond the first buffers
        r.observe(tree, np.full(len(tree), 3, np.int32), np.array([0], np.int32))
        d.check_integrity()
        r.finish()
        d.save(tmp_path / "t.npz")
        TrieDrafter.load(tmp_path / "t.npz").propose([1, 2], 4)
    assert {k.__name__: set(k.signatures) for k in kernels} == before


def test_repr_shows_the_pool_without_counting_pending_tokens():
    d = TrieDrafter(capacity=100, branch_length=4, token_limit=10)
    r = d.start(np.array([1, 2, 3], np.int32))  # branches 1, 1-2, 1-2-3, 2, 2-3, 3
    r.update(np.array([4, 5], np.int32))
    before = pool_contents(d.pool.state)
    assert repr(d) == ("TrieDrafter(capacity=100, nodes_in_use=6, requests_in_progress=1, branch_length=4, "
                       "layout='hierarchical')")
    assert repr(r) == "TrieRequest(slot=0, tokens=5, prompt=3)"
    assert pool_contents(d.pool.state) == before and d.n_nodes == 6
    r.propose(np.array([1, 2, 3, 4, 5], np.int32), 0)  # counts them: 4, 3-4, 2-3-4, 1-2-3-4, 5, 4-5, 3-4-5, 2-3-4-5
    assert d.n_nodes == 6 + 8
    r.finish()
    assert repr(r).endswith(", finished)") and d.requests_in_progress == 0


def test_retrieval_settings_are_fixed_at_construction():
    d = TrieDrafter(capacity=100, branch_length=4, token_limit=10, max_match=3)
    with pytest.raises(AttributeError):
        d.max_match = 5
    assert d.max_match == 3


# -- constructor and call checks -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, name", [
    (dict(capacity=0), "capacity"),
    (dict(capacity=24, branch_length=12), "capacity"),
    (dict(capacity=10.5), "capacity"),
    (dict(capacity=True), "capacity"),
    (dict(branch_length=1), "branch_length"),
    (dict(branch_length="12"), "branch_length"),
    (dict(max_match=0), "max_match"),
    (dict(recent_weight=-0.5), "recent_weight"),
    (dict(recent_weight=float("nan")), "recent_weight"),
    (dict(prompt_weight=-1.0), "prompt_weight"),
    (dict(prompt_weight=float("nan")), "prompt_weight"),
    (dict(prompt_weight=float("inf")), "prompt_weight"),
    (dict(prompt_weight="4"), "prompt_weight"),
    (dict(min_stage_nodes=0), "min_stage_nodes"),
    (dict(layout="tree"), "layout"),
    (dict(token_limit=0), "token_limit"),
    (dict(token_limit=-5), "token_limit"),
    # bool("False") is True: a string or a number for a switch is refused, not coerced
    (dict(calibrate="False"), "calibrate"),
    (dict(fill="no"), "fill"),
    (dict(use_top=0), "use_top"),
    (dict(learn_from_model="no"), "learn_from_model"),
    (dict(insert_prompt=None), "insert_prompt"),
    (dict(eliminate_prompt=1), "eliminate_prompt"),
])
def test_bad_constructor_args_raise_config_error(kwargs, name):
    with pytest.raises(ConfigError) as info:
        research_trie(**kwargs)
    assert str(info.value).startswith(name), str(info.value)
    assert isinstance(info.value, draftcore.DraftcoreError)


def test_research_switches_are_off_the_public_constructor():
    """The switches that exist to measure a variant take a TrieResearch, not keywords of their own;
    research_trie takes both side by side and builds the same drafter."""
    names = set(inspect.signature(TrieDrafter).parameters)
    assert not names & set(SWITCHES) and "research" in names
    with pytest.raises(TypeError):
        TrieDrafter(calibrate=False)
    with pytest.raises(ConfigError, match=r"^research: expected None or a TrieResearch .*got \{'calibrate': False\}"):
        TrieDrafter(research={"calibrate": False})
    d = research_trie(capacity=100, token_limit=10, calibrate=False, learn_from_model=False, min_stage_nodes=2)
    assert d.research == TrieResearch(calibrate=False, learn_from_model=False, min_stage_nodes=2)
    assert not d.calibrate and not d.learn_from_model and d.min_stage_nodes == 2 and d.capacity == 100
    assert TrieDrafter().research == TrieResearch() and TrieDrafter.paper().research == TrieResearch.paper()
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrieResearch().calibrate = False


@pytest.mark.parametrize("kwargs, named", [
    (dict(capacity=2**40), "capacity=1099511627776: the trie's node pool"),
    (dict(token_limit=2**40), "token_limit=1099511627776: the trie's root index"),
    (dict(learn_capacity=2**40), "learn_capacity=1099511627776, learn_context=4: each request's ring of snippets"),
    (dict(learn_context=2**40), "learn_capacity=1024, learn_context=1099511627776: each request's ring of snippets"),
])
def test_sizes_beyond_physical_memory_are_refused_at_construction(kwargs, named):
    """capacity=2**40 and token_limit=2**40 ended in a MemoryError (arrays of 64 and 4 TiB), and
    learn_capacity or learn_context 2**40 in one at the first start(): each is refused at
    construction, naming the arguments that size it, the bytes and this machine's memory."""
    with pytest.raises(ConfigError, match=re.escape(named) + r" would take [0-9,]+ bytes, more than this "
                                                            r"machine's physical memory \([0-9,]+ bytes\)"):
        TrieDrafter(**kwargs)


def test_a_propose_budget_larger_than_one_verify_holds_is_refused_and_changes_nothing():
    """propose(context, 10**12) sized draft buffers for 10**12 nodes (a MemoryError); now it is
    refused (validate.max_tree_nodes) before the request or the pool changes: the next draft is
    the one a twin request that never saw the call makes."""
    prompt, context = [1, 2, 3, 1, 2, 4], np.array([1, 2, 3, 1, 2, 4, 1, 2], np.int32)
    drafters = [TrieDrafter(capacity=200, branch_length=4, token_limit=10) for _ in range(2)]
    requests = []
    for d in drafters:
        d.warm_up([[1, 2, 3, 1, 2, 5]])
        requests.append(d.start(prompt))
        requests[-1].update([1, 2])
    d, r = drafters[0], requests[0]
    before = pool_contents(d.pool.state)
    for call in (lambda: r.propose(context, 10**12), lambda: d.propose(context, 10**12)):
        with pytest.raises(ConfigError, match=r"^budget: 1000000000000 asks for trees of [0-9,]+ nodes; expected "
                                              r"at most"):
            call()
    assert pool_contents(d.pool.state) == before and d.requests_in_progress == 1
    got, want = r.propose(context, 6), requests[1].propose(context, 6)
    assert len(got) > 1 and got.tokens.tolist() == want.tokens.tolist()
    assert got.parents.tolist() == want.parents.tolist()


def test_bad_calls_raise_input_error():
    d = TrieDrafter(capacity=100, branch_length=4, token_limit=10)
    with pytest.raises(InputError, match="prompt"):
        d.start(np.array([], np.int32))
    with pytest.raises(InputError, match="prompt"):
        d.start(np.array([1, 10], np.int32))  # outside token_limit
    with pytest.raises(InputError, match="prompt"):
        d.start(np.array([1.0, 2.0]))
    with pytest.raises(InputError, match="prompt"):
        d.start(np.array([[1, 2]], np.int32))
    r = d.start(np.array([1, 2], np.int32))
    with pytest.raises(InputError, match="tokens"):
        r.update(np.array([-1], np.int32))
    with pytest.raises(InputError, match="sequences"):
        d.warm_up([[1, 2], [3, 11]])
    with pytest.raises(ConfigError, match="budget"):
        r.propose(np.array([1, 2], np.int32), -1)
    with pytest.raises(InputError, match="context: token id 10 is outside"):
        r.propose(np.array([1, 10], np.int32), 2)  # the one-pass check of int32 arrays refuses it too
    with pytest.raises(InputError, match="tokens: token id 10 is outside"):
        r.update(np.array([10], np.int32))
    assert d.n_nodes == 3  # nothing changed by the refused calls
    d.check_integrity()
    r.finish()
    r.finish()  # idempotent
    with pytest.raises(InputError, match="request: update.*finished"):
        r.update(np.array([1], np.int32))
    with pytest.raises(InputError, match="request: propose.*finished"):
        r.propose(np.array([1], np.int32), 2)
