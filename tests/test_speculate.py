"""speculate() is lossless: with any drafter, its output equals plain greedy decoding token for token.

The toy model's logits depend on the whole prefix (draftcore/tools/fixtures/toy.py), so a wrong mask, position,
commit or acceptance changes the output. Drafters range from the trie to adversarial random trees,
an oracle that mixes the true continuation with wrong siblings (multi-token, non-first-child and
non-contiguous acceptance), and chains. A planted bug (a verifier that commits the wrong sibling)
shows the property can fail.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import draftcore
from draftcore import BackendError, ConfigError, DraftcoreError, DraftTree, InputError, TrieDrafter
from draftcore.acceptance import greedy_accept
from draftcore.tools.variants import research_trie
from naive import naive_greedy_accept, pool_contents
from fixtures.toy import ToyModel, ToyVerifier, _mix

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- reference ------------------------------------------------------------------------------------
def continuation(model: ToyModel, tokens, n: int) -> list:
    """model.greedy(tokens, n) with an incremental hash (the oracle drafter calls it every step)."""
    tokens = [int(t) for t in tokens]
    h = model.prefix_hash(tokens)
    seq = tokens[-2:]
    out = []
    for pos in range(len(tokens), len(tokens) + n):
        prev1 = seq[-1] if seq else 0
        prev2 = seq[-2] if len(seq) >= 2 else 0
        tok = int(np.argmax(model.logits_from_hash(h, prev1, prev2)))
        out.append(tok)
        h = _mix(h, pos, tok)
        seq = [prev1, tok]
    return out


def expected_output(model, prompt, max_new_tokens, eos_ids=(), stops=()):
    """Plain greedy decoding (ToyModel.greedy), cut like speculate cuts: EOS first, then a stop
    sequence completed inside the generated tokens, then max_new_tokens."""
    full = model.greedy(prompt, max_new_tokens).tolist()
    out = []
    for tok in full:
        out.append(tok)
        if tok in eos_ids:
            return out, "eos"
        if any(len(out) >= len(s) and out[-len(s):] == list(s) for s in stops):
            return out, "stop_sequence"
    return out, "max_new_tokens"


def check_result(result, expected, reason, verifier=None, budget=None):
    assert result.tokens.dtype == np.int32
    assert result.tokens.tolist() == expected, (result.tokens.tolist(), expected)
    assert result.stop_reason == reason
    s = result.stats
    assert s.new_tokens == len(expected)
    assert sum(s.accepted_hist) == s.steps - 1
    assert s.tokens_per_step == pytest.approx(s.new_tokens / s.steps)
    emitted = 1 + sum((k + 1) * c for k, c in enumerate(s.accepted_hist))
    assert len(expected) <= emitted  # the last step's tokens may be cut by a stop
    assert s.drafted_tokens == sum(k * c for k, c in s.budget_hist.items())
    assert sum(s.budget_hist.values()) == s.steps - 1
    if isinstance(budget, int):
        assert max(s.budget_hist, default=0) <= budget
    if verifier is not None:
        assert verifier.n_verify == s.steps - 1
        assert verifier.n_past == len(verifier.cache)


# -- drafters ------------------------------------------------------------------------------------------
class _Base:
    def __init__(self):
        self.started = self.finished = 0
        self.seen = []

    def start(self, prompt):
        self.started += 1
        self.seen = [int(t) for t in prompt]

    def update(self, tokens):
        self.seen += [int(t) for t in tokens]

    def finish(self):
        self.finished += 1


class RandomTreeDrafter(_Base):
    """Adversarial: random valid trees (duplicate siblings allowed) of random size <= budget."""

    def __init__(self, vocab, seed):
        super().__init__()
        self.vocab, self.rng = vocab, np.random.default_rng(seed)

    def propose(self, context, budget):
        assert self.seen == context.tolist()
        n = int(self.rng.integers(0, budget + 1))
        parents = [-1] + [int(self.rng.integers(0, i)) for i in range(1, n + 1)]
        tokens = [int(context[-1])] + self.rng.integers(0, self.vocab, size=n).tolist()
        return DraftTree.build(tokens, parents)


class OracleDrafter(_Base):
    """Knows the true continuation; grows a random tree where a node on the true path gets the
    right child or a wrong one at random (wrong siblings often come first), so acceptance is long,
    often not through a first child, and the accepted nodes are not contiguous."""

    def __init__(self, model, seed, p_right=0.5):
        super().__init__()
        self.model, self.rng, self.p_right = model, np.random.default_rng(seed), p_right
        self.n_accepted_max = 0

    def propose(self, context, budget):
        rng = self.rng
        truth = continuation(self.model, context, budget)
        n = int(rng.integers(budget // 2, budget + 1))
        tokens, parents, right = [int(context[-1])], [-1], [True]  # right: on the true path
        depths = [0]
        for i in range(1, n + 1):
            on_path = [j for j in range(i) if right[j]]
            p = int(rng.choice(on_path)) if rng.random() < 0.7 else int(rng.integers(0, i))
            d = depths[p]
            if right[p] and d < len(truth) and rng.random() < self.p_right:
                tok, ok = truth[d], True
            else:
                tok = int(rng.integers(0, self.model.vocab_size))
                ok = right[p] and d < len(truth) and tok == truth[d]
            tokens.append(tok), parents.append(p), depths.append(d + 1), right.append(ok)
        return DraftTree.build(tokens, parents)


class ChainDrafter(_Base):
    """Chains: a random-length prefix of the truth, then random tokens."""

    def __init__(self, model, seed):
        super().__init__()
        self.model, self.rng = model, np.random.default_rng(seed)

    def propose(self, context, budget):
        n = int(self.rng.integers(0, budget + 1))
        k = int(self.rng.integers(0, n + 1))
        draft = continuation(self.model, context, k) + self.rng.integers(0, self.model.vocab_size, size=n - k).tolist()
        return DraftTree.chain(int(context[-1]), draft)


def make_drafter(kind, model, seed, layout="hierarchical"):
    if kind == "trie":
        rng = np.random.default_rng(seed)
        return research_trie(capacity=int(rng.choice([40, 200, 5000])), branch_length=int(rng.integers(2, 9)),
                             max_match=int(rng.integers(1, 9)), layout=layout, fill=bool(rng.random() < 0.5),
                             use_top=bool(rng.random() < 0.5), recent_weight=float(rng.choice([0.0, 16.0])),
                             min_stage_nodes=int(rng.integers(1, 9)), token_limit=model.vocab_size)
    if kind == "random":
        return RandomTreeDrafter(model.vocab_size, seed)
    if kind == "oracle":
        return OracleDrafter(model, seed)
    if kind == "chain":
        return ChainDrafter(model, seed)
    raise ValueError(kind)


# -- the property ---------------------------------------------------------------------------------------
@st.composite
def requests(draw):
    vocab = draw(st.integers(2, 40))
    model_seed = draw(st.integers(0, 2**16))
    prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=30))
    max_new = draw(st.integers(1, 60))
    budget = draw(st.one_of(st.integers(0, 64), st.just("auto"), st.none()))
    eos = draw(st.one_of(st.none(), st.integers(0, vocab - 1), st.lists(st.integers(0, vocab - 1), max_size=3)))
    stops = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3), max_size=2))
    slack = draw(st.sampled_from([0, 0, 1, 100]))  # 0: the cache holds exactly prompt + max_new_tokens
    seed = draw(st.integers(0, 2**16))
    return vocab, model_seed, prompt, max_new, budget, eos, stops, slack, seed


def eos_list(eos):
    return () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))


def run_lossless(kind, req, verifier_cls=ToyVerifier, layout="hierarchical"):
    vocab, model_seed, prompt, max_new, budget, eos, stops, slack, seed = req
    model = ToyModel(vocab_size=vocab, seed=model_seed)
    verifier = verifier_cls(model, max_context=len(prompt) + max_new + slack)
    drafter = make_drafter(kind, model, seed, layout)
    result = draftcore.speculate(verifier, np.array(prompt, np.int32), max_new_tokens=max_new, drafter=drafter,
                                 budget=budget, eos_token_id=eos, stop_sequences=stops)
    expected, reason = expected_output(model, prompt, max_new, eos_list(eos), stops)
    check_result(result, expected, reason, verifier, budget)
    if isinstance(drafter, _Base):
        assert drafter.started == drafter.finished == 1
        # update saw the whole output, its last step's tokens too (a trie counts them)
        assert drafter.seen == list(prompt) + result.tokens.tolist()
    return result


@SETTINGS
@given(requests())
def test_lossless_with_trie(req):
    run_lossless("trie", req)


@SETTINGS
@given(requests(), st.sampled_from(["parallel", "single"]))
def test_lossless_with_trie_layouts(req, layout):
    run_lossless("trie", req, layout=layout)


@SETTINGS
@given(requests())
def test_lossless_with_random_trees(req):
    run_lossless("random", req)


@SETTINGS
@given(requests())
def test_lossless_with_oracle_trees(req):
    run_lossless("oracle", req)


@SETTINGS
@given(requests())
def test_lossless_with_chains(req):
    run_lossless("chain", req)


def test_oracle_exercises_long_non_first_child_non_contiguous_acceptance():
    """The oracle runs accept >= 3 tokens in some steps, through a child that is not its parent's
    first, along paths whose node indices are not contiguous."""
    seen = dict(long=0, not_first=0, gap=0)

    class Spy(ToyVerifier):
        def commit(self, path):
            tree = self.pending
            path = np.asarray(path)
            seen["long"] += len(path) >= 4
            seen["gap"] += bool(np.any(np.diff(path) > 1))
            for a, b in zip(path[:-1], path[1:]):
                siblings = np.flatnonzero(tree.parents == a)
                seen["not_first"] += int(b) != int(siblings[0])
            super().commit(path)

    for seed in range(6):
        model = ToyModel(vocab_size=12, seed=seed)
        prompt = np.array([1, 2, 3, 4], np.int32)
        verifier = Spy(model)
        result = draftcore.speculate(verifier, prompt, max_new_tokens=60, drafter=OracleDrafter(model, seed),
                                     budget=24)
        check_result(result, *expected_output(model, prompt, 60), verifier)
        assert len(result.stats.accepted_hist) >= 4  # some step accepted >= 3 drafted tokens
    assert seen["long"] > 10 and seen["not_first"] > 10 and seen["gap"] > 10, seen


def test_continuation_helper_is_greedy():
    model = ToyModel(vocab_size=9, seed=4)
    for prompt in ([0], [3, 1], [1, 2, 3, 4, 5]):
        assert continuation(model, prompt, 20) == model.greedy(prompt, 20).tolist()


def test_one_trie_across_requests_stays_lossless_and_drops_prompts():
    model = ToyModel(vocab_size=16, seed=3)
    trie = TrieDrafter(capacity=300, branch_length=6, token_limit=16)
    rng = np.random.default_rng(0)
    total_accepted = 0
    for i in range(8):
        prompt = rng.integers(0, 16, size=int(rng.integers(1, 20))).astype(np.int32)
        verifier = ToyVerifier(model)
        result = draftcore.speculate(verifier, prompt, max_new_tokens=50, drafter=trie, budget=int(rng.integers(1, 30)))
        check_result(result, *expected_output(model, prompt.tolist(), 50), verifier)
        total_accepted += sum(k * c for k, c in enumerate(result.stats.accepted_hist))
        trie.check_integrity()
        assert all(c[0] == 0 for c in pool_contents(trie.pool.state).values())  # no prompt counts left
    assert total_accepted > 20  # the toy text repeats: the trie drafts something useful


def test_budget_zero_is_plain_decoding():
    model = ToyModel(vocab_size=10, seed=1)
    verifier = ToyVerifier(model)
    result = draftcore.speculate(verifier, [1, 2, 3], max_new_tokens=20, drafter=OracleDrafter(model, 0), budget=0)
    check_result(result, *expected_output(model, [1, 2, 3], 20), verifier)
    assert result.stats.steps == 20 and result.stats.drafted_tokens == 0


def test_default_drafter_is_the_verifiers_session_trie():
    model = ToyModel(vocab_size=10, seed=2)
    verifier = ToyVerifier(model)
    result = draftcore.speculate(verifier, [4, 5], max_new_tokens=30)
    check_result(result, *expected_output(model, [4, 5], 30))
    session = draftcore.Session.of(verifier)
    assert isinstance(session.drafter, TrieDrafter) and session.drafter.token_limit == 10
    assert isinstance(session.budget, draftcore.CostAwareBudget)


def test_a_call_that_names_its_drafter_builds_no_other(monkeypatch):
    """A call with its own drafter takes only the budget from the verifier's session: the session's
    default trie (a node pool and its kernels) is built on first use, never for that call."""
    built, original = [], TrieDrafter.__init__

    def counting_init(self, *args, **kwargs):
        built.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(TrieDrafter, "__init__", counting_init)
    model = ToyModel(vocab_size=10, seed=2)
    verifier = ToyVerifier(model)
    result = draftcore.speculate(verifier, [4, 5], max_new_tokens=30, drafter=draftcore.NGramDrafter())
    check_result(result, *expected_output(model, [4, 5], 30))
    assert isinstance(draftcore.Session.of(verifier).budget, draftcore.CostAwareBudget) and built == []
    assert isinstance(draftcore.Session.of(verifier).drafter, TrieDrafter) and len(built) == 1   # on first use


def test_text_prompt_with_encode_decode():
    class TextVerifier(ToyVerifier):
        def encode(self, text):
            return np.array([ord(c) - ord("a") for c in text], np.int32)

        def decode(self, tokens):
            return "".join(chr(int(t) + ord("a")) for t in tokens)

    model = ToyModel(vocab_size=26, seed=5)
    result = draftcore.speculate(TextVerifier(model), "hello", max_new_tokens=12)
    expected, _ = expected_output(model, [7, 4, 11, 11, 14], 12)
    assert result.tokens.tolist() == expected
    assert result.text == "".join(chr(t + 97) for t in expected)
    with pytest.raises(InputError, match="prompt"):
        draftcore.speculate(ToyVerifier(model), "hello", max_new_tokens=3)


# -- streaming -------------------------------------------------------------------------------------------
@SETTINGS
@given(requests(), st.sampled_from(["trie", "oracle"]))
def test_stream_yields_the_same_tokens(req, kind):
    vocab, model_seed, prompt, max_new, budget, eos, stops, slack, seed = req
    model = ToyModel(vocab_size=vocab, seed=model_seed)
    stream = draftcore.speculate_stream(ToyVerifier(model, max_context=len(prompt) + max_new + slack), prompt,
                                        max_new_tokens=max_new, drafter=make_drafter(kind, model, seed),
                                        budget=budget, eos_token_id=eos, stop_sequences=stops)
    assert stream.result is None
    chunks = list(stream)
    assert all(c.dtype == np.int32 and c.ndim == 1 and c.shape[0] >= 1 for c in chunks)
    tokens = np.concatenate(chunks).tolist()
    expected, reason = expected_output(model, prompt, max_new, eos_list(eos), stops)
    assert tokens == expected
    assert stream.result is not None and stream.result.tokens.tolist() == expected
    assert stream.result.stop_reason == reason
    assert len(chunks) == stream.result.stats.steps


def test_stream_is_lazy_and_finishes_the_drafter_when_closed():
    model = ToyModel(vocab_size=10, seed=0)
    drafter = OracleDrafter(model, 0)
    verifier = ToyVerifier(model)
    stream = draftcore.speculate_stream(verifier, [1, 2], max_new_tokens=40, drafter=drafter, budget=8)
    assert drafter.started == 0 and verifier.n_past == 0  # nothing runs before iteration
    for chunk in stream:
        break
    assert drafter.started == 1 and drafter.finished == 0  # the stream still holds its request...
    stream.close()
    assert drafter.finished == 1                            # ...until it is closed
    assert stream.result is None
    stream.close()  # idempotent
    assert drafter.finished == 1


def test_stream_result_survives_a_second_iteration():
    model = ToyModel(vocab_size=10, seed=0)
    stream = draftcore.speculate_stream(ToyVerifier(model), [1, 2], max_new_tokens=10)
    list(stream)
    result = stream.result
    assert list(stream) == []
    assert stream.result is result


# -- acceptance -------------------------------------------------------------------------------------
def random_tree(rng, n, vocab):
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    tokens = rng.integers(0, vocab, size=n).astype(np.int32)
    return tokens, np.array(parents, np.int32)


def test_greedy_accept_matches_naive():
    rng = np.random.default_rng(0)
    n_long = 0
    for _ in range(3000):
        n = int(rng.integers(1, 40))
        vocab = int(rng.integers(1, 6))
        tokens, parents = random_tree(rng, n, vocab)
        model = rng.integers(0, vocab, size=n).astype(np.int32)
        if rng.random() < 0.5:  # make the model agree along a random path
            node = int(rng.integers(0, n))
            while node > 0:
                model[parents[node]] = tokens[node]
                node = parents[node]
        path, nxt = greedy_accept(tokens, parents, model, n)
        ref_path, ref_next = naive_greedy_accept(tokens.tolist(), parents.tolist(), model.tolist())
        assert path.tolist() == ref_path and int(nxt) == ref_next
        assert path.dtype == np.int32
        n_long += len(ref_path) >= 4
    assert n_long > 100


@given(st.integers(1, 30).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 3), min_size=n, max_size=n),
    st.lists(st.integers(0, 10**6), min_size=n, max_size=n),
    st.lists(st.integers(0, 3), min_size=n, max_size=n))))
@SETTINGS
def test_greedy_accept_matches_naive_hypothesis(t):
    tokens, parent_draw, model = t
    parents = [-1] + [parent_draw[i] % i for i in range(1, len(tokens))]
    path, nxt = greedy_accept(np.array(tokens, np.int32), np.array(parents, np.int32), np.array(model, np.int32),
                              len(tokens))
    assert (path.tolist(), int(nxt)) == naive_greedy_accept(tokens, parents, model)


# -- bad input: refused up front, nothing changes -----------------------------------------------------
def _busy_trie():
    trie = TrieDrafter(capacity=500, branch_length=4, token_limit=10)
    trie.warm_up([[1, 2, 3, 1, 2, 4]])
    return trie


BAD_CALLS = [
    # (kwargs overriding the good call, error class, words the message must contain)
    (dict(prompt=np.array([], np.int32)), InputError, ["prompt", "empty"]),
    (dict(prompt=[]), InputError, ["prompt", "empty"]),
    (dict(prompt=np.array([1, 10], np.int32)), InputError, ["prompt", "10", "[0, 10)"]),
    (dict(prompt=np.array([1, -1], np.int32)), InputError, ["prompt", "-1"]),
    (dict(prompt=np.array([1.0, 2.0])), InputError, ["prompt", "float64"]),
    (dict(prompt=np.array([1, 2], np.float32)), InputError, ["prompt", "float32"]),
    (dict(prompt=np.array([[1, 2]], np.int32)), InputError, ["prompt", "(1, 2)"]),
    (dict(prompt=[True, False]), InputError, ["prompt", "bool"]),
    (dict(prompt=None), InputError, ["prompt"]),
    (dict(prompt=np.array([1, 2**40])), InputError, ["prompt", str(2**40)]),
    (dict(max_new_tokens=0), ConfigError, ["max_new_tokens", "0"]),
    (dict(max_new_tokens=-3), ConfigError, ["max_new_tokens", "-3"]),
    (dict(max_new_tokens=2.5), ConfigError, ["max_new_tokens", "2.5"]),
    (dict(max_new_tokens="8"), ConfigError, ["max_new_tokens", "'8'"]),
    (dict(max_new_tokens=True), ConfigError, ["max_new_tokens", "True"]),
    (dict(max_new_tokens=60), InputError, ["max_new_tokens", "60", "50"]),  # 3 + 60 > max_context 50
    (dict(prompt=np.zeros(50, np.int32)), InputError, ["prompt: 50 tokens", "max_context 50"]),  # no room left
    (dict(eos_token_id=10), InputError, ["eos_token_id", "10"]),
    (dict(eos_token_id=[1, -2]), InputError, ["eos_token_id", "-2"]),
    (dict(eos_token_id=1.5), InputError, ["eos_token_id"]),
    (dict(stop_sequences=[[]]), InputError, ["stop_sequences[0]", "empty"]),
    (dict(stop_sequences=[[1], [3, 99]]), InputError, ["stop_sequences[1]", "99"]),
    (dict(budget=-1), ConfigError, ["budget", "-1"]),
    (dict(budget=2.0), ConfigError, ["budget", "2.0"]),
    (dict(budget="fast"), ConfigError, ["budget", "'fast'"]),
    (dict(budget=[4]), ConfigError, ["budget", "[4]"]),
    (dict(budget=10**12), ConfigError, ["budget", str(10**12), "expected at most"]),   # more than one verify holds
    (dict(stop_sequences=5), InputError, ["stop_sequences", "5"]),
    (dict(drafter=object()), ConfigError, ["drafter", "propose"]),
    (dict(drafter=TrieDrafter), ConfigError, ["drafter", "class TrieDrafter"]),
    (dict(clock=3.0), ConfigError, ["clock", "3.0"]),
    (dict(clock=lambda: "x"), ConfigError, ["clock", "'x'"]),
    (dict(clock=lambda: float("nan")), ConfigError, ["clock", "nan"]),
]


@pytest.mark.parametrize("override, error, words", BAD_CALLS, ids=[str(c[0])[:40] for c in BAD_CALLS])
@pytest.mark.parametrize("entry", ["speculate", "speculate_stream"])
def test_bad_input_is_refused_before_any_state_changes(override, error, words, entry):
    model = ToyModel(vocab_size=10, seed=0)
    verifier = ToyVerifier(model, max_context=50)
    verifier.prefill(np.array([5, 6, 7], np.int32))
    cache_before = list(verifier.cache)
    trie = _busy_trie()
    trie_before = pool_contents(trie.pool.state)
    kwargs = dict(prompt=np.array([1, 2, 3], np.int32), max_new_tokens=8, drafter=trie, budget=4)
    kwargs.update(override)
    prompt = kwargs.pop("prompt")
    with pytest.raises(error) as info:
        getattr(draftcore, entry)(verifier, prompt, **kwargs)
    assert isinstance(info.value, DraftcoreError)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert verifier.cache == cache_before and verifier.n_verify == 0
    assert pool_contents(trie.pool.state) == trie_before and trie.n_nodes == len(trie_before)
    trie.check_integrity()


def test_a_clock_that_runs_backwards_is_refused_before_the_budget_learns_from_it():
    """The budget learns step costs from the clock's differences; a negative one, kept, would steer
    every later choice of the verifier's session."""
    verifier = ToyVerifier(ToyModel(vocab_size=10, seed=0))
    times = iter(range(1000, 0, -1))
    with pytest.raises(ConfigError, match="clock: .*non-decreasing"):
        draftcore.speculate(verifier, [1, 2, 3], max_new_tokens=8, clock=lambda: next(times))
    budget = draftcore.Session.of(verifier).budget
    assert budget._step == 0
    with pytest.raises(InputError, match="seconds: .*-1.0"):
        budget.observe(DraftTree.root_only(1), np.zeros(1, np.int32), -1.0)
    assert budget._step == 0


@pytest.mark.parametrize("attr, value, word", [("vocab_size", 0, "vocab_size"), ("vocab_size", None, "vocab_size"),
                                               ("max_context", 0, "max_context"), ("max_context", 2.0, "max_context")])
def test_bad_verifier_attributes(attr, value, word):
    verifier = ToyVerifier(ToyModel(vocab_size=10))
    setattr(verifier, attr, value)
    with pytest.raises(DraftcoreError, match=word):
        draftcore.speculate(verifier, [1, 2], max_new_tokens=4)


# -- a misbehaving verifier or drafter: BackendError, and the request is closed ----------------------
class BadVerifier(ToyVerifier):
    def __init__(self, model, mode, **kw):
        super().__init__(model, **kw)
        self.mode = mode

    def prefill(self, prompt, n_logits=0):
        tokens, logits = super().prefill(prompt, n_logits)
        i32 = lambda v: np.array(v, np.int32)  # noqa: E731
        return {"prefill_oob": (i32([self.vocab_size]), logits), "prefill_missing": (i32([-1]), logits),
                "prefill_float": (np.array([1.5]), logits), "prefill_bare_int": int(tokens[0]),
                "prefill_logits": np.zeros(self.vocab_size, np.float32), "prefill_none": None,
                "prefill_two_rows": (i32([1, 2]), logits)}.get(self.mode, (tokens, logits))

    def verify(self, tree, n_logits=0):
        tokens, logits = super().verify(tree, n_logits)
        if self.n_verify < 2:
            return tokens, logits
        n = len(tree)
        missing_path = tokens.copy()
        missing_path[0] = -1
        return {"long": (np.zeros(n + 1, np.int32), logits), "short": (tokens[:-1], logits),
                "2d": (tokens[None, :], logits), "float": (tokens.astype(np.float32), logits),
                "oob": (np.full(n, self.vocab_size, np.int32), logits), "neg": (np.full(n, -2, np.int32), logits),
                "missing_root": (missing_path, logits), "list": (tokens.tolist(), logits), "none": None,
                "bare_array": tokens, "logits_rows": (tokens, np.zeros((n + 1, self.vocab_size), np.float32)),
                "triple": (tokens, logits, None)}.get(self.mode, (tokens, logits))


@pytest.mark.parametrize("mode, where", [
    ("prefill_oob", "verifier.prefill"), ("prefill_missing", "verifier.prefill"), ("prefill_float", "verifier.prefill"),
    ("prefill_bare_int", "verifier.prefill"), ("prefill_logits", "verifier.prefill"),
    ("prefill_none", "verifier.prefill"), ("prefill_two_rows", "verifier.prefill"),
    ("long", "verifier.verify"), ("short", "verifier.verify"), ("2d", "verifier.verify"), ("float", "verifier.verify"),
    ("oob", "verifier.verify"), ("neg", "verifier.verify"), ("missing_root", "verifier.verify"),
    ("list", "verifier.verify"), ("none", "verifier.verify"), ("bare_array", "verifier.verify"),
    ("logits_rows", "verifier.verify"), ("triple", "verifier.verify"),
])
def test_misbehaving_verifier_raises_backend_error(mode, where):
    model = ToyModel(vocab_size=10, seed=0)
    trie = _busy_trie()
    with pytest.raises(BackendError, match=where.replace(".", r"\.")):
        draftcore.speculate(BadVerifier(model, mode), [1, 2, 3], max_new_tokens=30, drafter=trie, budget=4)
    assert trie.requests_in_progress == 0  # the request was finished: its prompt counts are gone
    assert all(c[0] == 0 for c in pool_contents(trie.pool.state).values())
    trie.check_integrity()


class MissingOffPathVerifier(ToyVerifier):
    """Reports -1 (not evaluated) for every node greedy acceptance does not walk, as a llama.cpp
    context that holds one branch at a time does: legal, and the output stays exact."""

    def verify(self, tree, n_logits=0):
        tokens, logits = super().verify(tree, n_logits)
        path, _ = naive_greedy_accept(tree.tokens.tolist(), tree.parents.tolist(), tokens.tolist())
        reported = np.full_like(tokens, -1)
        reported[path] = tokens[path]
        reported[:max(1, n_logits)] = tokens[:max(1, n_logits)]
        return reported, logits


class MissingOnPathVerifier(ToyVerifier):
    """Planted: reports -1 for a node greedy acceptance reaches (other than the root)."""

    def verify(self, tree, n_logits=0):
        tokens, logits = super().verify(tree, n_logits)
        path, _ = naive_greedy_accept(tree.tokens.tolist(), tree.parents.tolist(), tokens.tolist())
        if len(path) > 1:
            tokens = tokens.copy()
            tokens[path[-1]] = -1
        return tokens, logits


def test_nodes_reported_missing_are_fine_off_the_path_and_refused_on_it():
    model = ToyModel(vocab_size=12, seed=3)
    prompt = [1, 2, 3, 1, 2]
    result = draftcore.speculate(MissingOffPathVerifier(model), prompt, max_new_tokens=40,
                                 drafter=OracleDrafter(model, 0), budget=12)
    check_result(result, *expected_output(model, prompt, 40))
    with pytest.raises(BackendError, match="missing"):
        draftcore.speculate(MissingOnPathVerifier(model), prompt, max_new_tokens=40, drafter=OracleDrafter(model, 0),
                            budget=12)


class BadDrafter(_Base):
    def __init__(self, mode, vocab=10):
        super().__init__()
        self.mode, self.vocab = mode, vocab

    def propose(self, context, budget):
        root = int(context[-1])
        i32 = lambda v: np.array(v, np.int32)  # noqa: E731
        m = self.mode
        if m == "none":
            return None
        if m == "tuple":
            return (i32([root]), i32([-1]), i32([0]))
        if m == "wrong_root":
            return DraftTree.chain((root + 1) % self.vocab, [1])
        if m == "over_budget":
            return DraftTree.chain(root, [1] * (budget + 1))
        if m == "parent_not_before":
            return DraftTree(i32([root, 1, 2]), i32([-1, 2, 0]), i32([0, 2, 1]))
        if m == "self_parent":
            return DraftTree(i32([root, 1]), i32([-1, 1]), i32([0, 1]))
        if m == "second_root":
            return DraftTree(i32([root, 1]), i32([-1, -1]), i32([0, 0]))
        if m == "bad_depth":
            return DraftTree(i32([root, 1, 2]), i32([-1, 0, 1]), i32([0, 1, 1]))
        if m == "token_oob":
            return DraftTree.chain(root, [self.vocab])
        if m == "token_negative":
            return DraftTree.chain(root, [-3])
        if m == "tokens_longer":
            return DraftTree(i32([root, 1, 2]), i32([-1, 0]), i32([0, 1]))
        if m == "tokens_shorter":
            return DraftTree(i32([root]), i32([-1, 0]), i32([0, 1]))
        if m == "depths_shorter":
            return DraftTree(i32([root, 1]), i32([-1, 0]), i32([0]))
        if m == "float_tokens":
            return DraftTree(np.array([root, 1.5]), i32([-1, 0]), i32([0, 1]))
        if m == "int64_parents":
            return DraftTree(i32([root, 1]), np.array([-1, 0], np.int64), i32([0, 1]))
        if m == "2d_tokens":
            return DraftTree(i32([[root, 1]]), i32([-1, 0]), i32([0, 1]))
        raise ValueError(m)


BAD_DRAFTS = ["none", "tuple", "wrong_root", "over_budget", "parent_not_before", "self_parent", "second_root",
              "bad_depth", "token_oob", "token_negative", "tokens_longer", "tokens_shorter", "depths_shorter",
              "float_tokens", "int64_parents", "2d_tokens"]


@pytest.mark.parametrize("mode", BAD_DRAFTS)
def test_malformed_draft_raises_backend_error(mode):
    """A drafter's tree is checked before the verifier sees it: a backend would index its
    embedding table with the ids and build masks from the parents."""
    model = ToyModel(vocab_size=10, seed=0)
    drafter = BadDrafter(mode)
    verifier = ToyVerifier(model)
    with pytest.raises(BackendError, match=r"drafter\.propose"):
        draftcore.speculate(verifier, [1, 2, 3], max_new_tokens=10, drafter=drafter, budget=4)
    assert drafter.finished == 1
    assert verifier.n_verify == 0  # refused before any verify


# -- the property can fail --------------------------------------------------------------------------------
class SiblingCommitVerifier(ToyVerifier):
    """Planted bug: commits the accepted path, but with its last node replaced by a sibling."""

    def commit(self, path):
        path = np.array(path)
        tree = self.pending
        if len(path) >= 2:
            siblings = [int(v) for v in np.flatnonzero(tree.parents == path[-2]) if v != path[-1]]
            if siblings:
                path[-1] = siblings[0]
        super().commit(path)


class OffByOnePositionVerifier(ToyVerifier):
    """Planted bug: verifies drafted nodes one position too far (a wrong position id)."""

    def verify(self, tree, n_logits=0):
        shifted = DraftTree(tree.tokens, tree.parents, tree.depths + np.minimum(tree.depths, 1), None,
                            tree.n_lookahead)
        out = super().verify(shifted, n_logits)
        self.pending = tree
        return out


@pytest.mark.parametrize("verifier_cls", [SiblingCommitVerifier, OffByOnePositionVerifier])
def test_planted_bug_is_caught(verifier_cls):
    caught = 0
    for seed in range(6):
        req = (12, seed, [1, 2, 3, 1, 2], 40, 16, None, [], 100, seed)
        try:
            run_lossless("oracle", req, verifier_cls=verifier_cls)
        except AssertionError:
            caught += 1
    assert caught >= 4, caught
