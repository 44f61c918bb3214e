"""The n-gram drafter (ANPD) against tests/naive.py, plus its boundaries.

Random token streams over tiny vocabularies (keys collide, sets fill, rows evict, full rows replace
their last token) are fed to the jitted tables and to NaiveNGramTables; after every chunk the two
must hold the same rows in the same places (keys, next tokens with counts, last-touch stamps), and
every draft — a chain (branching 1) or a tree (branching 2-4) — must be the same tree.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import draftcore
from draftcore import ConfigError, DraftcoreError, DraftTree, InputError
from draftcore.drafters.ngram import NGramDrafter
from draftcore.jit import kernels
from naive import (NGRAM_WAYS, NaiveNGramTables, fnv1a, hash_bucket, naive_ngram_draft, ngram_tables_contents,
                   ngram_tables_rows)

K = kernels("draftcore.drafters.ngram_kernels")


def random_stream(rng, vocab: int, n: int) -> list:
    """n tokens that often repeat earlier pieces (so keys recur and counts grow)."""
    out = rng.integers(0, vocab, 3).tolist()
    while len(out) < n:
        if rng.random() < 0.6:
            i = int(rng.integers(0, len(out)))
            out += out[i:i + int(rng.integers(1, 6))]
        else:
            out += rng.integers(0, vocab, int(rng.integers(1, 4))).tolist()
    return out[:n]


def random_config(rng) -> dict:
    choices = int(rng.integers(1, 5))
    return dict(max_n=int(rng.integers(2, 6)), draft_length=int(rng.integers(1, 9)),
                branching=int(rng.integers(1, choices + 1)), rows=int(rng.choice([4, 8, 16])), choices=choices)


def assert_same_tree(tree: DraftTree, want) -> None:
    tokens, parents, depths, scores = want
    assert tree.tokens.tolist() == tokens
    assert tree.parents.tolist() == parents
    assert tree.depths.tolist() == depths
    # float32 rounding may in principle differ; the tokens above decide the order exactly
    np.testing.assert_allclose(tree.scores, np.array(scores, np.float32), rtol=1e-6)


# -- the tables against the twin ---------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_tables_match_naive_after_every_ingest(seed):
    rng = np.random.default_rng(seed)
    evictions = 0
    for _ in range(6):
        levels, rows, choices = int(rng.integers(1, 5)), int(rng.choice([4, 8, 16])), int(rng.integers(1, 5))
        vocab = int(rng.integers(2, 9))
        stream = random_stream(rng, vocab, int(rng.integers(10, 200)))
        tables, naive = K.new_tables(levels, rows, choices), NaiveNGramTables(levels, rows, choices)
        tokens = np.array(stream, np.int32)
        begin = 0
        while begin < len(stream):
            end = min(len(stream), begin + int(rng.integers(1, 30)))
            K.ingest(tables, tokens, begin, end)
            naive.ingest(stream, begin, end)
            assert ngram_tables_rows(tables) == naive.rows_by_index()
            assert int(tables.clock[0]) == naive.clock
            begin = end
        assert ngram_tables_contents(tables) == naive.contents()
        # every distinct key ever seen minus what is still held: keys the sets evicted
        seen = {(lv, tuple(stream[p - lv - 1:p])) for p in range(len(stream)) for lv in range(levels)
                if p - lv - 1 >= 0}
        evictions += len(seen) - len(naive.contents())
    assert evictions > 0  # tiny tables: eviction was really exercised


def test_a_full_row_replaces_its_last_token_and_counts_move_ahead():
    tables, naive = K.new_tables(1, 4, 2), NaiveNGramTables(1, 4, 2)
    for nxt in (5, 6, 6, 7, 7, 7):  # after key (1,): 5 once, then 6 twice (overtakes 5), then 7 (replaces 5)
        K.insert(tables, 0, np.array([1], np.int32), 0, nxt)
        naive.insert(0, (1,), nxt)
    assert ngram_tables_contents(tables) == naive.contents() == {(0, (1,)): [(7, 3), (6, 2)]}


def test_equal_counts_keep_the_older_token_first():
    tables = K.new_tables(1, 4, 3)
    for nxt in (4, 3, 4, 3):  # 3 catches up with 4 but does not overtake it
        K.insert(tables, 0, np.array([9], np.int32), 0, nxt)
    assert ngram_tables_contents(tables) == {(0, (9,)): [(4, 2), (3, 2)]}


def test_a_new_key_takes_an_empty_row_then_the_least_recently_touched():
    """Four keys of one set fill its four ways in order; touching the first makes the second the
    least recently touched, so a fifth key takes the second's row."""
    n_sets = 2
    by_set = {}
    for t in range(200):
        by_set.setdefault(hash_bucket([t], n_sets), []).append(t)
    keys = by_set[0][:5]
    tables, naive = K.new_tables(1, n_sets * NGRAM_WAYS, 2), NaiveNGramTables(1, n_sets * NGRAM_WAYS, 2)
    for k in keys[:4] + [keys[0], keys[4]]:
        K.insert(tables, 0, np.array([k], np.int32), 0, 1)
        naive.insert(0, (k,), 1)
    rows = ngram_tables_rows(tables)
    assert rows == naive.rows_by_index()
    assert [rows[(0, w)][0] for w in range(4)] == [(keys[0],), (keys[4],), (keys[2],), (keys[3],)]


# -- hashing ---------------------------------------------------------------------------------------------
def test_hash_is_fnv1a_and_order_aware():
    rng = np.random.default_rng(0)
    for _ in range(200):
        key = rng.integers(0, 2**31 - 1, int(rng.integers(1, 6))).astype(np.int32)
        assert int(K.key_hash(key, 0, key.shape[0])) == fnv1a(key)
    # (a, b) and (b, a) hash apart (an XOR of per-token hashes would not), and land in different sets
    assert all(fnv1a((a, b)) != fnv1a((b, a)) for a in range(20) for b in range(20) if a != b)
    pair = next((a, b) for a in range(50) for b in range(a + 1, 50) if hash_bucket((a, b), 4) != hash_bucket((b, a), 4))
    tables = K.new_tables(2, 16, 2)
    for key in (pair, pair[::-1]):
        K.insert(tables, 1, np.array(key, np.int32), 0, 1)
    rows = {key: row for (_, row), (key, _, _) in ngram_tables_rows(tables).items()}
    assert rows[pair] // NGRAM_WAYS != rows[pair[::-1]] // NGRAM_WAYS


def test_a_hash_collision_never_returns_another_keys_tokens():
    """Keys of the same set share no counts: the row holds the whole key."""
    by_set = {}
    for t in range(100):
        by_set.setdefault(hash_bucket([t], 1), []).append(t)  # one set: every key collides
    a, b = by_set[0][:2]
    drafter = NGramDrafter(max_n=2, rows=4)
    assert drafter.propose(np.array([a, 7, a, 7, b], np.int32), 4).tokens.tolist() == [b]  # b: never seen
    assert drafter.propose(np.array([a, 7, a, 7, a], np.int32), 1).tokens.tolist() == [a, 7]


# -- drafts against the twin -------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_drafts_match_naive_during_a_decode(seed, mode):
    """A request's drafts while its context grows in random chunks, on tables small enough to evict."""
    rng = np.random.default_rng(1000 * seed + (mode == "tree"))
    n_proposals = 0
    for _ in range(4):
        config = random_config(rng)
        if mode == "chain":
            config["branching"] = 1
        else:
            config["choices"] = int(rng.integers(2, 5))
            config["branching"] = int(rng.integers(2, config["choices"] + 1))
        vocab = int(rng.integers(2, 8))
        stream = random_stream(rng, vocab, int(rng.integers(20, 150)))
        n_prompt = int(rng.integers(1, 20))
        drafter = NGramDrafter(**config, learn_from_model=False)
        request = drafter.start(np.array(stream[:n_prompt], np.int32))
        naive = NaiveNGramTables(config["max_n"] - 1, config["rows"], config["choices"])
        naive.ingest(stream, 0, n_prompt)
        n_seen = n_prompt
        while n_seen < len(stream):
            n_context = min(len(stream), n_seen + int(rng.integers(0, 8)))
            budget = int(rng.integers(0, 25))
            context = np.array(stream[:n_context], np.int32)
            tree = request.propose(context, budget)
            naive.ingest(stream, n_seen, n_context)
            n_seen = max(n_seen, n_context)
            want = naive_ngram_draft(naive, stream[:n_context], budget, config["draft_length"], config["branching"])
            assert_same_tree(tree, want)
            assert ngram_tables_rows(request._tables) == naive.rows_by_index()
            tree.check(vocab)
            assert tree.n_draft <= budget and tree.depths.max() <= config["draft_length"]
            assert np.all(np.diff(tree.scores) <= 0)  # best first
            if config["branching"] == 1:
                assert tree.is_chain()
            n_proposals += tree.n_draft > 0
            if n_context == len(stream):
                break
        request.finish()
    assert n_proposals > 5


def test_branching_draws_a_tree_of_the_most_frequent_continuations():
    # bigrams only: after 1 came 2 (x3), 3 (x2), 4 (x1); after 2: 5, after 3: 6, after 4: 0
    prompt = np.array([1, 2, 5, 1, 2, 5, 1, 2, 5, 1, 3, 6, 1, 3, 6, 1, 4, 0, 1], np.int32)
    tree = NGramDrafter(max_n=2, draft_length=2, branching=3).start(prompt).propose(prompt, 20)
    assert tree.tokens.tolist() == [1, 2, 5, 3, 6, 4, 0]  # best first; ties: the earlier pushed
    assert tree.parents.tolist() == [-1, 0, 1, 0, 3, 0, 5]
    np.testing.assert_allclose(tree.scores, [1, 3 / 6, 3 / 6, 2 / 6, 2 / 6, 1 / 6, 1 / 6], rtol=1e-6)
    chain = NGramDrafter(max_n=2, draft_length=2, branching=1).start(prompt).propose(prompt, 20)
    assert chain.tokens.tolist() == [1, 2, 5]


def test_query_is_longest_key_first():
    """After (1, 2) came 3 once; after 2 alone came 4 three times: the longer key wins where it
    matches, the shorter one elsewhere (ANPD Algorithm 2)."""
    prompt = np.array([1, 2, 3, 9, 2, 4, 8, 2, 4, 7, 2, 4], np.int32)
    request = NGramDrafter(max_n=3, branching=1).start(prompt)
    assert request.propose(np.r_[prompt, 1, 2].astype(np.int32), 1).tokens.tolist() == [2, 3]
    assert request.propose(np.r_[prompt, 1, 2, 5, 2].astype(np.int32), 1).tokens.tolist() == [2, 4]
    # the chain feeds its own predictions back: after (2, 3) came 9 (level 1), after 9: 2 ...
    assert request.propose(np.r_[prompt, 1, 2, 5, 2, 1, 2].astype(np.int32), 3).tokens.tolist() == [2, 3, 9, 2]


def test_one_off_propose_equals_a_fresh_request():
    stream = np.array(random_stream(np.random.default_rng(5), 5, 80), np.int32)
    drafter = NGramDrafter(branching=2, rows=16)
    a = drafter.propose(stream, 12)
    b = drafter.start(stream).propose(stream, 12)
    assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()


def test_a_draft_owns_its_arrays():
    stream = np.array(random_stream(np.random.default_rng(6), 4, 60), np.int32)
    request = NGramDrafter(branching=2).start(stream)
    tree = request.propose(stream, 8)
    kept = [a.copy() for a in (tree.tokens, tree.parents, tree.depths, tree.scores)]
    request.propose(np.r_[stream, 3, 1, 2].astype(np.int32), 8)
    for got, was in zip((tree.tokens, tree.parents, tree.depths, tree.scores), kept):
        np.testing.assert_array_equal(got, was)


# -- learning from the model's tokens -----------------------------------------------------------------------
def learn_case():
    """A context, a tree with off-path nodes, the model's tokens at its nodes and the accepted path."""
    context = np.array([4, 1, 2, 3, 1, 2], np.int32)
    #          root 2 ── 3 (node 1) ── 1 (node 2)
    #                 └─ 5 (node 3) ── 6 (node 4)
    #                 └─ 7 (node 5)
    tree = DraftTree.build([2, 3, 1, 5, 6, 7], [-1, 0, 1, 0, 3, 0])
    node_tokens = np.array([3, 1, 9, 8, 0, -1], np.int32)  # -1: not evaluated
    path = np.array([0, 1], np.int32)
    return context, tree, node_tokens, path


def test_observe_counts_the_models_token_at_off_path_candidates():
    context, tree, node_tokens, path = learn_case()
    request = NGramDrafter(max_n=4, rows=8192, choices=4).start(context)
    request.propose(context, 4)
    naive = NaiveNGramTables(3, 8192, 4)
    naive.ingest(context.tolist(), 0, len(context))
    request.observe(tree, node_tokens, path)
    for node in range(len(tree)):
        if node in path or node_tokens[node] < 0:
            continue  # path nodes' continuations come as accepted tokens; -1 was not evaluated
        prefix = context.tolist() + tree.path_tokens(node)[1:].tolist()
        for level in range(3):
            naive.insert(level, prefix[len(prefix) - level - 1:], int(node_tokens[node]))
    assert ngram_tables_contents(request._tables) == naive.contents()
    contents = ngram_tables_contents(request._tables)
    assert contents[(0, (5,))] == [(8, 1)]        # node 3 (token 5) was followed by the model's 8
    assert contents[(2, (2, 3, 1))] == [(2, 1), (9, 1)]  # node 2 hangs below the path but is off it
    assert contents[(1, (2, 3))] == [(1, 1)]      # node 1 is on the path: its token comes as accepted
    assert (0, (7,)) not in contents              # node 5 was not evaluated (-1)


def test_paper_configuration_learns_from_accepted_tokens_only():
    context, tree, node_tokens, path = learn_case()
    drafter = NGramDrafter.paper()
    assert (drafter.max_n, drafter.draft_length, drafter.branching, drafter.learn_from_model) == (5, 7, 1, False)
    request = drafter.start(context)
    request.propose(context, 4)
    before = ngram_tables_rows(request._tables)
    request.observe(tree, node_tokens, path)
    assert ngram_tables_rows(request._tables) == before


def test_observe_of_a_root_only_tree_or_after_finish_changes_nothing():
    context, tree, node_tokens, path = learn_case()
    request = NGramDrafter().start(context)
    request.propose(context, 4)
    before = ngram_tables_rows(request._tables)
    request.observe(DraftTree.root_only(2), node_tokens[:1], path[:1])
    assert ngram_tables_rows(request._tables) == before
    request.finish()
    request.observe(tree, node_tokens, path)  # a finished request ignores feedback


# -- boundaries -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, name", [
    (dict(rows=12), "rows"),           # 3 sets: not a power of two
    (dict(rows=6), "rows"),            # not a multiple of 4
    (dict(rows=2), "rows"),
    (dict(rows=4 * 3 * 8), "rows"),
    (dict(branching=5), "branching"),  # more than choices=4
    (dict(branching=3, choices=2), "branching"),
    (dict(max_n=1), "max_n"),
    (dict(max_n=0), "max_n"),
    (dict(draft_length=0), "draft_length"),
    (dict(choices=0), "choices"),
    (dict(branching=0), "branching"),
    (dict(rows=8.0), "rows"),
    (dict(learn_from_model="no"), "learn_from_model"),   # bool("no") is True: refused, not coerced
])
def test_bad_constructor_args_raise_config_error_naming_the_argument(kwargs, name):
    with pytest.raises(ConfigError) as info:
        NGramDrafter(**kwargs)
    assert str(info.value).startswith(name), str(info.value)


@pytest.mark.parametrize("kwargs, named", [(dict(rows=2**40), "rows=1099511627776, max_n=5, choices=4"),
                                           (dict(max_n=10**6), "rows=8192, max_n=1000000, choices=4")])
def test_tables_beyond_physical_memory_are_refused_at_construction(kwargs, named):
    """NGramDrafter(rows=2**40) (or a max_n whose keys grow as its square) was accepted, and every
    start() then built tables of petabytes: a MemoryError, or a machine that swaps. Refused at
    construction, naming the arguments that size the tables, the bytes and this machine's memory."""
    with pytest.raises(ConfigError, match=re.escape(named) + ": each request's n-gram tables would take [0-9,]+ "
                                                            "bytes, more than this machine's physical memory"):
        NGramDrafter(**kwargs)


def test_good_edge_configs_are_accepted():
    for kwargs in (dict(rows=4), dict(rows=8), dict(max_n=2), dict(branching=4, choices=4)):
        NGramDrafter(**kwargs)


def test_bad_calls_raise_and_change_no_state():
    prompt = np.array([1, 2, 3, 1, 2], np.int32)
    request = NGramDrafter().start(prompt)
    context = np.r_[prompt, 3, 1, 2].astype(np.int32)
    before = ngram_tables_rows(request._tables)
    # budget: a ConfigError naming it, as TrieRequest.propose raises (tests/test_trie.py); 10**12, more
    # than one verify holds, sized buffers for it after ingesting the context (a MemoryError)
    for budget in (-1, 2.5, "4", None, 10**12):
        with pytest.raises(ConfigError, match="budget"):
            request.propose(context, budget)
    with pytest.raises(ConfigError, match="^budget: 1000000000000 asks for trees"):
        NGramDrafter().propose(context, 10**12)
    for bad in (np.array([], np.int32), np.array([1.0, 2.0]), np.array([[1, 2]], np.int32), [1, -2],
                prompt[:3]):  # the last: fewer tokens than the request has seen
        with pytest.raises(InputError, match="context"):
            request.propose(bad, 4)
    with pytest.raises(InputError, match="tokens"):
        request.update(np.array([-1], np.int32))
    assert ngram_tables_rows(request._tables) == before  # the longer context was not ingested by refused calls
    fresh = NGramDrafter().start(prompt)
    assert request.propose(context, 4).tokens.tolist() == fresh.propose(context, 4).tokens.tolist()
    with pytest.raises(InputError, match="prompt"):
        NGramDrafter().start(np.array([], np.int32))


def test_calls_after_finish_raise():
    request = NGramDrafter().start(np.array([1, 2, 3], np.int32))
    request.finish()
    request.finish()  # idempotent
    with pytest.raises(InputError, match="request: propose.*finished"):
        request.propose(np.array([1, 2, 3], np.int32), 4)
    with pytest.raises(InputError, match="request: update.*finished"):
        request.update(np.array([1], np.int32))
    assert isinstance(InputError("x"), DraftcoreError)


def test_requests_share_nothing():
    drafter = NGramDrafter()
    assert drafter.concurrent_requests is True
    a = drafter.start(np.array([1, 2, 3, 1, 2, 3, 1, 2], np.int32))
    b = drafter.start(np.array([1, 2, 4, 1, 2, 4, 1, 2], np.int32))
    assert a.propose(np.array([1, 2, 3, 1, 2, 3, 1, 2], np.int32), 1).tokens.tolist() == [2, 3]
    assert b.propose(np.array([1, 2, 4, 1, 2, 4, 1, 2], np.int32), 1).tokens.tolist() == [2, 4]


def test_speculate_with_ngram_drafter_is_plain_greedy_smoke():
    """The full losslessness matrix is in tests/test_composite.py; this is the n-gram file's own check."""
    from fixtures.toy import ToyModel, ToyVerifier
    model = ToyModel(vocab_size=12, seed=2)
    prompt = np.tile(np.array([1, 5, 7, 3], np.int32), 5)
    result = draftcore.speculate(ToyVerifier(model), prompt, max_new_tokens=40, drafter=NGramDrafter(branching=2),
                                 budget=6)
    assert result.tokens.tolist() == model.greedy(prompt, 40).tolist()
