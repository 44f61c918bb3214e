"""The Jacobi (lookahead decoding) drafter: its window step and n-gram pool against tests/naive.py,
the window's tree, and a planted wrong window mask that the harvested n-grams expose.

The window's n-grams are only right if every window node's token was produced by the model from
that node's parent: on a model whose next token is a fixed function of the previous two tokens,
every harvested n-gram g must satisfy g[k + 1] == table[g[k - 1], g[k]]. A window that rides with a
wrong mask (still a valid tree) breaks that, while the output stays exactly plain greedy (window
nodes are never accepted): the check below is what catches it.
"""
from __future__ import annotations

import numpy as np
import pytest

import draftcore
from draftcore import ConfigError, DraftTree, InputError
from draftcore.drafters import jacobi_kernels
from draftcore.drafters.jacobi import JacobiDrafter, JacobiRequest
from draftcore.jit import kernels
from naive import NaivePool, jacobi_pool_contents, naive_window_step, window_node_parent
from fixtures.toy import ToyModel, ToyVerifier

K = kernels("draftcore.drafters.jacobi_kernels")


# -- the pool and the window step against the twin --------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_pool_matches_naive(seed):
    rng = np.random.default_rng(seed)
    for _ in range(10):
        rows, per_key, gram_len = int(rng.choice([1, 2, 4, 8])), int(rng.integers(1, 4)), int(rng.integers(1, 4))
        vocab = int(rng.integers(2, 7))
        pool, naive = K.new_pool(rows, per_key, gram_len), NaivePool(rows, per_key, gram_len)
        out = np.empty((per_key, gram_len), np.int32)
        for _ in range(60):
            first = int(rng.integers(0, vocab))
            gram = rng.integers(0, vocab, gram_len).astype(np.int32)
            K.pool_insert(pool, first, gram)
            naive.insert(first, gram)
            assert jacobi_pool_contents(pool) == naive.contents()
            assert int(pool.clock[0]) == naive.clock
            for t in range(vocab):
                n = K.pool_lookup(pool, t, out)
                assert [tuple(g) for g in out[:n].tolist()] == naive.lookup(t), t


def random_outs(rng, n_levels, width, vocab):
    """The model's tokens at the window nodes, about one in five not evaluated (-1)."""
    outs = rng.integers(0, vocab, (n_levels, width)).astype(np.int32)
    outs[rng.random((n_levels, width)) < 0.2] = -1
    return outs


@pytest.mark.parametrize("seed", range(10))
def test_window_step_matches_naive(seed):
    rng = np.random.default_rng(100 + seed)
    harvested = 0
    for _ in range(6):
        top_max, width = int(rng.integers(1, 5)), int(rng.integers(1, 7))
        vocab = int(rng.integers(2, 8))
        rows, per_key = int(rng.choice([1, 2, 4, 16])), int(rng.integers(1, 4))
        window = rng.integers(0, vocab, (top_max, width)).astype(np.int32)
        n_levels = int(rng.integers(1, top_max + 1))
        pool, naive_pool = K.new_pool(rows, per_key, top_max), NaivePool(rows, per_key, top_max)
        naive = window.tolist()
        for _ in range(25):
            outs = random_outs(rng, n_levels, width, vocab)
            naive, naive_levels = naive_window_step(naive, n_levels, outs.tolist(), naive_pool)
            n_levels = K.window_step(window, n_levels, outs, pool)
            assert n_levels == naive_levels
            assert window.tolist() == naive
            assert jacobi_pool_contents(pool) == naive_pool.contents()
        harvested += naive_pool.clock
    assert harvested > 0


@pytest.mark.parametrize("levels, width", [(1, 4), (2, 1), (3, 5), (4, 3), (4, 6)])
def test_window_parents_are_as_documented(levels, width):
    base = 7
    out = np.empty(levels * width, np.int32)
    K.window_parents(levels, width, base, out)
    for l in range(levels):
        for j in range(width):
            parent = window_node_parent(l, j)
            want = 0 if parent is None else base + parent[0] * width + parent[1]
            assert out[l * width + j] == want, (l, j)


# -- the window in a request's tree ---------------------------------------------------------------------------
def model_tokens_for(tree, rng, vocab):
    return rng.integers(0, vocab, len(tree)).astype(np.int32)


def check_window_tree(tree: DraftTree, request: JacobiRequest, width: int) -> None:
    """The window rides after the candidates: node (l, j) at n_candidates + l * W + j, below the
    root or another window node as documented, at depth j + 1; the whole is a valid tree."""
    tree.check()
    n_levels = request.n_levels
    assert tree.n_lookahead == n_levels * width
    m = tree.n_candidates
    assert (tree.parents[1:m] < m).all()  # candidates never hang below the window
    for l in range(n_levels):
        for j in range(width):
            i = m + l * width + j
            parent = window_node_parent(l, j)
            assert tree.parents[i] == (0 if parent is None else m + parent[0] * width + parent[1]), (l, j)
            assert tree.depths[i] == j + 1
            assert tree.tokens[i] == request.window[l, j]
    assert tree.scores is None or (tree.scores[m:] == 0).all()


@pytest.mark.parametrize("window, levels", [(4, 4), (3, 3), (5, 2), (4, 5), (2, 3)])
def test_window_tree_and_growth(window, levels):
    """The window starts with one level of prompt tokens and grows one level per observe until it
    has N - 1 levels (after N - 2 observes); its tree is valid at every size."""
    rng = np.random.default_rng(window * 10 + levels)
    vocab = 9
    prompt = rng.integers(0, vocab, 15).astype(np.int32)
    drafter = JacobiDrafter(window=window, levels=levels, pool_size=4)
    assert drafter.window_nodes == (levels - 1) * window
    request = drafter.start(prompt)
    assert request.n_levels == 1 and set(request.window[0].tolist()) <= set(prompt.tolist())
    context = prompt
    for step in range(levels + 3):
        assert request.n_levels == min(1 + step, levels - 1)
        tree = request.propose(context, 6)
        check_window_tree(tree, request, window)
        node_tokens = model_tokens_for(tree, rng, vocab)
        request.observe(tree, node_tokens, np.zeros(1, np.int32))
        context = np.r_[context, node_tokens[0]].astype(np.int32)
        request.update(node_tokens[:1])
    assert request.n_levels == levels - 1


def test_a_dropped_window_is_left_as_it_was():
    """The loop may drop the window (it did not fit): observe then moves nothing."""
    prompt = np.arange(10, dtype=np.int32)
    request = JacobiDrafter(window=3, levels=3).start(prompt)
    tree = request.propose(prompt, 4)
    before = request.window.copy()
    cut = tree.without_lookahead()
    request.observe(cut, np.zeros(len(cut), np.int32), np.zeros(1, np.int32))
    assert request.n_levels == 1 and (request.window == before).all()
    request.observe(tree, np.ones(len(tree), np.int32), np.zeros(1, np.int32))
    assert request.n_levels == 2


def test_candidates_are_the_pool_ngrams_of_the_root_merged():
    request = JacobiDrafter(window=3, levels=4, pool_size=4).start(np.array([1, 2, 3], np.int32))
    for gram in ([2, 3, 4], [2, 3, 5], [6, 7, 8], [2, 9, 9]):  # all after first token 1; [2, 9, 9] newest
        K.pool_insert(request.pool, 1, np.array(gram, np.int32))
    K.pool_insert(request.pool, 5, np.array([1, 1, 1], np.int32))  # another key: not a candidate
    tree = request.candidates(1, 32)
    tree.check()
    paths = {tuple(tree.path_tokens(leaf)[1:].tolist()) for leaf in tree.leaves()}
    assert paths == {(2, 3, 4), (2, 3, 5), (6, 7, 8), (2, 9, 9)}
    assert len(tree) == 1 + 9  # 2 shared by three n-grams, (2, 3) by two
    deepest_first = int(np.flatnonzero(tree.depths == 3)[0])
    assert tree.path_tokens(deepest_first).tolist() == [1, 2, 9, 9]  # the most recent n-gram first
    assert np.all(np.diff(tree.scores[1:]) <= 0)
    small = request.candidates(1, 3)
    assert small.n_draft == 3 and small.tokens.tolist() == tree.tokens[:4].tolist()
    assert request.candidates(1, 0).tokens.tolist() == [1] and request.candidates(4, 8).tokens.tolist() == [4]


# -- a planted wrong window mask --------------------------------------------------------------------------------
class CapturingDrafter:
    """Wraps a drafter and keeps every request it starts (to read a request's pool afterwards)."""

    concurrent_requests = True

    def __init__(self, inner):
        self.inner, self.requests = inner, []

    def start(self, prompt):
        request = self.inner.start(prompt)
        self.requests.append(request)
        return request


def two_token_model(seed: int) -> ToyModel:
    """A ToyModel whose argmax is always table[prev2, prev1]: logits_from_hash boosts that token by
    `sharpness` unless hash % surprise_every == 0 (never, in practice, at 10**9), and 60 is far above
    the N(0, 1) noise."""
    return ToyModel(vocab_size=16, seed=seed, surprise_every=10**9, sharpness=60.0)


def harvested_violations(model: ToyModel, n_prompts: int = 4, n_new: int = 48, **jacobi) -> int:
    """Runs speculate with a JacobiDrafter on `n_prompts` prompts and counts harvested pool n-grams
    g whose token g[k + 1] is not the model's table[g[k - 1], g[k]] (k >= 1). Also asserts that the
    output is plain greedy and that n-grams were harvested at all."""
    rng = np.random.default_rng(7)
    drafter = CapturingDrafter(JacobiDrafter(**jacobi))
    violations = checked = 0
    for _ in range(n_prompts):
        prompt = rng.integers(0, model.vocab_size, 12).astype(np.int32)
        result = draftcore.speculate(ToyVerifier(model), prompt, max_new_tokens=n_new, drafter=drafter, budget=8)
        assert result.tokens.tolist() == model.greedy(prompt, n_new).tolist()  # window nodes are never accepted
        assert result.stats.lookahead_nodes > 0
        pool = drafter.requests[-1].pool
        for first, grams in jacobi_pool_contents(pool).values():
            for tail, _ in grams:
                g = (first,) + tail
                checked += 1
                violations += sum(g[k + 1] != model.table[g[k - 1], g[k]] for k in range(1, len(g) - 1))
    assert checked > 10, "nothing harvested: the check proved nothing"
    return violations


def planted_window_parents(n_levels, width, base, out):
    """Wrong mask: a level-l (l >= 1) token hangs below the level-l token one position before it
    (instead of the level-(l-1) one). Still a valid tree with the same depths."""
    for l in range(n_levels):
        for j in range(width):
            i = l * width + j
            out[i] = 0 if j == 0 else base + l * width + j - 1


def test_two_token_model_is_what_the_check_assumes():
    model = two_token_model(1)
    seq = [3, 5]
    for _ in range(40):
        seq.append(int(np.argmax(model.logits(seq))))
        assert seq[-1] == model.table[seq[-3], seq[-2]]


@pytest.mark.parametrize("window, levels", [(4, 4), (3, 3), (6, 5)])
def test_harvested_ngrams_follow_the_model(window, levels):
    assert harvested_violations(two_token_model(1), window=window, levels=levels) == 0


@pytest.mark.parametrize("window, levels", [(4, 4), (3, 3)])
def test_planted_wrong_window_mask_is_caught(monkeypatch, window, levels):
    monkeypatch.setattr(jacobi_kernels, "window_parents", planted_window_parents)
    request = JacobiDrafter(window=window, levels=levels).start(np.arange(8, dtype=np.int32))
    request.n_levels = levels - 1
    request.with_window(DraftTree.root_only(7)).check()  # the planted mask is a valid tree
    assert harvested_violations(two_token_model(1), window=window, levels=levels) > 0


# -- boundaries ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, name", [
    (dict(pool_rows=3), "pool_rows"),
    (dict(pool_rows=0), "pool_rows"),
    (dict(levels=1), "levels"),
    (dict(window=0), "window"),
    (dict(pool_size=0), "pool_size"),
    (dict(seed=-1), "seed"),
    (dict(window=2.0), "window"),
])
def test_bad_constructor_args_raise_config_error_naming_the_argument(kwargs, name):
    with pytest.raises(ConfigError) as info:
        JacobiDrafter(**kwargs)
    assert str(info.value).startswith(name), str(info.value)


def test_a_window_or_pool_beyond_what_a_verify_or_memory_holds_is_refused():
    """JacobiDrafter(window=10**9) was accepted and would put 2 * 10**9 lookahead nodes in every verify
    (its first start() drew 10**9 tokens); pool_rows=2**40 built a pool of petabytes at every start().
    Refused at construction, naming the limit."""
    with pytest.raises(ConfigError, match=r"^window: 1000000000 asks for trees of 2,000,000,000 nodes; expected "
                                          r"at most [0-9,]+"):
        JacobiDrafter(window=10**9)
    with pytest.raises(ConfigError, match=r"^pool_rows=1099511627776, pool_size=8, levels=3: each request's n-gram "
                                          r"pool would take [0-9,]+ bytes, more than this machine's physical memory"):
        JacobiDrafter(pool_rows=2**40)


def test_paper_configuration():
    d = JacobiDrafter.paper()
    assert (d.window, d.levels, d.pool_size, d.window_nodes) == (15, 5, 15, 60)


def test_bad_calls_raise_and_calls_after_finish_raise():
    prompt = np.array([1, 2, 3], np.int32)
    request = JacobiDrafter().start(prompt)
    window = request.window.copy()
    with pytest.raises(ConfigError, match="budget"):  # as TrieRequest.propose
        request.propose(prompt, -1)
    with pytest.raises(ConfigError, match="^budget: 1000000000000 asks for trees"):   # more than a verify holds
        request.propose(prompt, 10**12)
    with pytest.raises(InputError, match="context"):
        request.propose(np.array([], np.int32), 4)
    with pytest.raises(InputError, match="prompt"):
        JacobiDrafter().start([])
    assert (request.window == window).all() and request.n_levels == 1
    request.finish()
    request.finish()
    with pytest.raises(InputError, match="request: propose.*finished"):
        request.propose(prompt, 4)
    with pytest.raises(InputError, match="request: update.*finished"):
        request.update(prompt)


def test_window_initialisation_is_seeded():
    prompt = np.arange(40, dtype=np.int32)
    a, b = JacobiDrafter(seed=1).start(prompt), JacobiDrafter(seed=1).start(prompt)
    c = JacobiDrafter(seed=2).start(prompt)
    assert (a.window[0] == b.window[0]).all() and not (a.window[0] == c.window[0]).all()
