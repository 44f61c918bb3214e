"""Speculative sampling is exact: the distribution of generated sequences is plain sampling's.

The toy model (draftcore/tools/fixtures/toy.py) is small enough to enumerate: with 5 tokens, every 4-token
continuation's exact probability under plain sampling with the processors (tests/naive_sampling.py,
written like transformers' classes) is known. Speculative samples — many seeds, drafters that
propose rich trees (the model's likely tokens as several ordered children, random trees, chains,
the trie) — are compared to it with a chi-square goodness-of-fit test. The same test function
catches planted wrong acceptance rules at p < 1e-6, and the plain-sampling reference is itself
checked against the enumeration.

Statistics: Pearson's chi-square over the sequences, cells expected < 5 times pooled; the p-value
comes from the regularized incomplete gamma function (naive_sampling.chi2_sf: scipy is not a
dependency), checked against closed forms. Seeds are fixed, so every run sees the same samples.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import draftcore
import draftcore.acceptance
import draftcore.sampling
from draftcore import BackendError, ConfigError, DraftTree, InputError, SamplingParams, TrieDrafter
from draftcore.acceptance import position_uniforms, sample_step
from draftcore.processors import LogitsProcessor, softmax
from naive_sampling import (VARIANTS, chi2_sf, exact_sequence_probs, goodness_of_fit, naive_process,
                            naive_sample_accept, naive_sample_step)
from test_speculate import ChainDrafter, RandomTreeDrafter, _Base
from fixtures.toy import ToyModel, ToyVerifier, _mix

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

VOCAB = 5
PROMPT = [1, 2, 3]
LENGTH = 4             # sequences compared: the first LENGTH tokens (5^4 = 625 cells)
MAX_NEW = 8            # generated per sample: longer, so the first verify steps get room for real trees
BUDGET = 6
ALPHA = 1e-3           # a correct sampler fails with this probability (seeds fixed: it does not)
DETECT = 1e-6          # a planted wrong rule must fall below this

COMBOS = {
    "plain": dict(),
    "T0.7_top_p0.9": dict(temperature=0.7, top_p=0.9),
    "T1.5_top_k3": dict(temperature=1.5, top_k=3),
    "min_p0.2": dict(min_p=0.2),
    "penalties": dict(repetition_penalty=1.6, presence_penalty=0.4, frequency_penalty=0.3),
    "everything": dict(temperature=0.8, top_k=4, top_p=0.95, min_p=0.05, repetition_penalty=1.3,
                       presence_penalty=0.2, frequency_penalty=0.1),
}


class MemoToyModel(ToyModel):
    """ToyModel with its logits cached per prefix hash (the samples revisit a few hundred prefixes)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._memo = {}

    def logits_from_hash(self, h, prev1, prev2):
        key = (h, prev1, prev2)
        if key not in self._memo:
            self._memo[key] = super().logits_from_hash(h, prev1, prev2)
        return self._memo[key].copy()


MODEL = MemoToyModel(vocab_size=VOCAB, seed=1, sharpness=2.0)  # predictable, yet 4.1-5.0 nats over 4 tokens


class FastToyVerifier(ToyVerifier):
    """ToyVerifier's logits computed along parent links instead of through the mask (the same
    numbers, checked below; the mask-based original is too slow for tens of thousands of runs)."""

    def verify(self, tree, n_logits=0):
        n = len(tree)
        out = np.empty((n, self.vocab_size), np.float32)
        hashes = [0] * n
        for i in range(n):
            p = int(tree.parents[i])
            tok = int(tree.tokens[i])
            hashes[i] = _mix(self.hashes[-1] if p < 0 else hashes[p], self.n_past + int(tree.depths[i]), tok)
            prev2 = self.cache[-1] if p < 0 else int(tree.tokens[p])
            out[i] = self.model.logits_from_hash(hashes[i], tok, prev2)
        self.pending = tree
        self.n_verify += 1
        return out.argmax(axis=1).astype(np.int32), out[:n_logits]


def to_naive(params: dict) -> dict:
    p = SamplingParams(**params)
    return dict(temperature=p.temperature, top_k=p.top_k or 0, top_p=p.top_p, min_p=p.min_p or 0.0,
                repetition_penalty=p.repetition_penalty, presence_penalty=p.presence_penalty,
                frequency_penalty=p.frequency_penalty, greedy=p.is_greedy)


_EXACT = {}


def exact(params: dict) -> dict:
    key = tuple(sorted(params.items()))
    if key not in _EXACT:
        _EXACT[key] = exact_sequence_probs(MODEL.logits, PROMPT, LENGTH, VOCAB, **to_naive(params))
    return _EXACT[key]


# -- the plain-sampling reference ------------------------------------------------------------------
def plain_sample(source, prompt, n, params, rng) -> np.ndarray:
    """Plain sampling, one token at a time, with draftcore's processors: `source` is a ToyModel
    (logits(tokens)) or a Verifier (prefill, then one root-only verify per token)."""
    params = SamplingParams(**params) if isinstance(params, dict) else params
    vocab = source.vocab_size
    processor = LogitsProcessor.from_params(params, vocab)
    prompt = np.asarray(prompt, np.int32)
    processor.start(prompt)
    out = []
    is_model = hasattr(source, "logits")
    logits = source.logits(prompt) if is_model else source.prefill(prompt, 1)[1][0]
    while True:
        z = processor.process_next(np.asarray(logits, np.float32))
        if params.is_greedy:
            token = int(np.argmax(z))
        else:
            p = softmax(z).astype(np.float64)
            token = int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"))
            token = min(token, vocab - 1)
        out.append(token)
        processor.update(np.array([token], np.int32))
        if len(out) == n:
            return np.array(out, np.int32)
        if is_model:
            logits = source.logits(np.concatenate([prompt, np.array(out, np.int32)]))
        else:
            logits = source.verify(DraftTree.root_only(token), 1)[1][0]
            source.commit(np.zeros(1, np.int32))


# -- drafters ------------------------------------------------------------------------------------
class LikelyTreeDrafter(_Base):
    """Rich trees of the model's likely tokens: each node gets up to `width` children, the tokens
    the raw model ranks highest after that node's prefix, in a shuffled order (so the accepted
    child is often not the first), sometimes a duplicate sibling or a random token."""

    def __init__(self, model, seed, width=3):
        super().__init__()
        self.model, self.rng, self.width = model, np.random.default_rng(seed), width

    def propose(self, context, budget):
        rng = self.rng
        tokens, parents, prefixes = [int(context[-1])], [-1], [list(context)]
        frontier = [0]
        while frontier and len(tokens) - 1 < budget:
            u = frontier.pop(0)
            ranked = np.argsort(-self.model.logits(prefixes[u]))[:self.width].tolist()
            rng.shuffle(ranked)
            if rng.random() < 0.2:
                ranked.insert(int(rng.integers(0, len(ranked) + 1)), int(rng.integers(0, self.model.vocab_size)))
            for tok in ranked:
                if len(tokens) - 1 >= budget:
                    break
                tokens.append(int(tok))
                parents.append(u)
                prefixes.append(prefixes[u] + [int(tok)])
                frontier.append(len(tokens) - 1)
        return DraftTree.build(tokens, parents)


def make_drafter(kind, seed):
    if kind == "likely":
        return LikelyTreeDrafter(MODEL, seed)
    if kind == "random":
        return RandomTreeDrafter(VOCAB, seed)
    if kind == "chain":
        return ChainDrafter(MODEL, seed)
    if kind == "trie":
        return TrieDrafter(capacity=2000, branch_length=6, token_limit=VOCAB)
    raise ValueError(kind)


DRAFTER_KINDS = ("likely", "random", "chain", "trie")


def speculative_counts(params, kinds, n_samples, seed0=0, stats=None, verifier_cls=FastToyVerifier):
    """{first LENGTH tokens: count} over n_samples speculate runs, seeds seed0.., the drafter kind
    cycling through `kinds` (one drafter object per kind, kept across samples)."""
    drafters = {k: make_drafter(k, seed0) for k in kinds}
    counts = {}
    for i in range(n_samples):
        kind = kinds[i % len(kinds)]
        result = draftcore.speculate(verifier_cls(MODEL), PROMPT, max_new_tokens=MAX_NEW, drafter=drafters[kind],
                                     budget=BUDGET, sampling=dict(params, seed=seed0 + i))
        key = tuple(result.tokens[:LENGTH].tolist())
        counts[key] = counts.get(key, 0) + 1
        if stats is not None:
            for k, c in enumerate(result.stats.accepted_hist):
                stats[k] = stats.get(k, 0) + c
    return counts


def check_distribution(params, kinds=DRAFTER_KINDS, n_samples=5_000, seed0=0, verifier_cls=FastToyVerifier):
    """(p-value, chi-square, degrees of freedom, accepted-length histogram) of speculative samples'
    first LENGTH tokens against the exact distribution."""
    stats = {}
    counts = speculative_counts(params, kinds, n_samples, seed0, stats, verifier_cls)
    p, stat, df = goodness_of_fit(counts, exact(params))
    return p, stat, df, stats


# -- exactness -------------------------------------------------------------------------------------
def test_chi2_sf_matches_closed_forms():
    for df in (2, 4, 10, 40, 200):
        for x in (0.5, 3.0, df * 0.8, df, df * 1.5 + 10, df * 4 + 50):
            h = x / 2
            closed = math.exp(-h) * sum(h ** k / math.factorial(k) for k in range(df // 2))
            assert chi2_sf(x, df) == pytest.approx(closed, rel=1e-9, abs=1e-300), (x, df)
    for x in (0.01, 1.0, 3.841458820694124, 30.0):
        assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9)
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)


def test_fast_toy_verifier_equals_toy_verifier():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        prompt = rng.integers(0, VOCAB, int(rng.integers(1, 6))).astype(np.int32)
        tree = DraftTree.build(np.r_[prompt[-1], rng.integers(0, VOCAB, n - 1)],
                               [-1] + [int(rng.integers(0, i)) for i in range(1, n)])
        slow, fast = ToyVerifier(MODEL), FastToyVerifier(MODEL)
        slow.prefill(prompt[:-1] if len(prompt) > 1 else prompt, 1)
        fast.prefill(prompt[:-1] if len(prompt) > 1 else prompt, 1)
        for a, b in zip(slow.verify(tree, len(tree)), fast.verify(tree, len(tree))):
            np.testing.assert_array_equal(a, b)


def test_exact_enumeration_is_a_distribution():
    for params in COMBOS.values():
        probs = exact(params)
        assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)
        assert len(probs) == VOCAB ** LENGTH


@pytest.mark.parametrize("combo", list(COMBOS))
def test_plain_sample_reference_matches_enumeration(combo):
    """The reference itself is right: plain_sample (draftcore's processors, one token at a time)
    matches the enumeration built with the transformers-style twins."""
    params = COMBOS[combo]
    rng = np.random.default_rng(1234)
    counts = {}
    for _ in range(5_000):
        key = tuple(plain_sample(MODEL, PROMPT, LENGTH, params, rng).tolist())
        counts[key] = counts.get(key, 0) + 1
    p, stat, df = goodness_of_fit(counts, exact(params))
    assert p > ALPHA, (combo, p, stat, df)


@pytest.mark.parametrize("combo", list(COMBOS))
def test_speculative_sampling_matches_plain_sampling(combo):
    """Every processor combination, all four drafters interleaved (the trie and the likely-token
    trees accept multi-token paths through non-first children)."""
    p, stat, df, accepted = check_distribution(COMBOS[combo])
    assert p > ALPHA, (combo, p, stat, df)
    n_steps = sum(accepted.values())
    assert sum(c for k, c in accepted.items() if k >= 2) > 0.02 * n_steps, accepted  # real trees accepted


@pytest.mark.parametrize("kind", DRAFTER_KINDS)
def test_speculative_sampling_matches_with_each_drafter(kind):
    p, stat, df, accepted = check_distribution(COMBOS["T0.7_top_p0.9"], kinds=(kind,), n_samples=3_000, seed0=10**6,
                                               verifier_cls=ToyVerifier)
    assert p > ALPHA, (kind, p, stat, df)
    if kind != "random":
        assert sum(c for k, c in accepted.items() if k >= 1) > 0.2 * sum(accepted.values()), accepted


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "exact"])
def test_planted_wrong_acceptance_is_detected(monkeypatch, variant):
    """The same test function fails a wrong rule: the acceptance step the loop calls is replaced
    by a planted variant of the naive twin (and passes with the twin's exact variant)."""
    def planted(tokens, parents, n_walk, u, p, uniform):
        return naive_sample_step(tokens, parents, n_walk, u, p, uniform, variant)

    monkeypatch.setattr(draftcore.acceptance, "sample_step", planted)
    p, stat, df, _ = check_distribution(COMBOS["plain"], kinds=("likely",), n_samples=3_000, seed0=77)
    assert p < DETECT, (variant, p, stat, df)


def test_naive_exact_variant_passes_the_same_test(monkeypatch):
    def twin(tokens, parents, n_walk, u, p, uniform):
        return naive_sample_step(tokens, parents, n_walk, u, p, uniform, "exact")

    monkeypatch.setattr(draftcore.acceptance, "sample_step", twin)
    p, stat, df, _ = check_distribution(COMBOS["plain"], kinds=("likely",), n_samples=3_000, seed0=77)
    assert p > ALPHA, (p, stat, df)


def test_planted_stale_uniform_is_detected(monkeypatch):
    """A walk that reuses its step's first uniform at every depth (draws keyed by step, not by
    position) gives a later token the same draw as the one before it: the same test fails it."""
    keyed = position_uniforms

    def stale(key, first, n):
        return np.full(n, keyed(key, first, 1)[0])

    monkeypatch.setattr(draftcore.acceptance, "position_uniforms", stale)
    p, stat, df, _ = check_distribution(COMBOS["plain"], kinds=("likely",), n_samples=3_000, seed0=77)
    assert p < DETECT, (p, stat, df)


def test_position_uniforms_are_keyed_by_position_alone():
    """Any block of positions gives the same numbers as the positions one by one; another key or a
    shifted start gives others; the numbers are uniform and consecutive ones independent."""
    key = np.uint64(0x1234_5678_9ABC_DEF0)
    whole = position_uniforms(key, 0, 4096)
    assert whole.dtype == np.float64 and 0.0 <= whole.min() and whole.max() < 1.0
    for first, n in ((0, 1), (7, 5), (4000, 96)):
        np.testing.assert_array_equal(position_uniforms(key, first, n), whole[first:first + n])
    assert not np.array_equal(position_uniforms(np.uint64(1), 0, 64), whole[:64])
    many = position_uniforms(key, 0, 200_000)
    counts = np.histogram2d(many[:-1], many[1:], bins=10, range=[[0, 1], [0, 1]])[0]
    expected = (many.shape[0] - 1) / 100
    p = chi2_sf(float(((counts - expected) ** 2 / expected).sum()), 99)
    assert p > ALPHA, p


def test_the_same_seed_gives_the_same_tokens_whatever_was_drafted():
    """The sampled output is a function of the seed, the model and the options alone: equal over
    repeated calls with a learning drafter and the auto budget (its tree sizes follow measured
    step times), equal to budget=0 (no draft), equal across drafters and fixed budgets."""
    model = ToyModel(vocab_size=8, seed=1)
    opts = dict(max_new_tokens=60, sampling=dict(temperature=0.9, top_p=0.95, seed=7))
    plain = draftcore.speculate(ToyVerifier(model), [1, 2, 3], budget=0, **opts)
    learning, verifier = TrieDrafter(token_limit=8), ToyVerifier(model)
    runs = [draftcore.speculate(verifier, [1, 2, 3], drafter=learning, budget="auto", **opts) for _ in range(4)]
    runs += [draftcore.speculate(ToyVerifier(model), [1, 2, 3], drafter=LikelyTreeDrafter(model, s), budget=b, **opts)
             for s, b in ((0, 2), (1, 8), (2, 30))]
    runs.append(draftcore.speculate(ToyVerifier(model), [1, 2, 3], drafter="composite", **opts))
    for run in runs:
        assert run.tokens.tolist() == plain.tokens.tolist() and run.seed == 7
    assert sum(run.stats.steps for run in runs[4:7]) < 3 * plain.stats.steps   # drafts were accepted
    other = draftcore.speculate(ToyVerifier(model), [1, 2, 3], budget=0, **dict(opts, sampling=dict(
        temperature=0.9, top_p=0.95, seed=8)))
    assert other.tokens.tolist() != plain.tokens.tolist()


# -- the kernel and the processors against their twins ------------------------------------------------
@st.composite
def trees_with_probs(draw):
    n = draw(st.integers(1, 12))
    vocab = draw(st.integers(1, 6))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(vocab, 0.5), size=n).astype(np.float32)
    if draw(st.booleans()):  # some zero-probability tokens, as after top-k / top-p
        probs[rng.random(probs.shape) < 0.3] = 0.0
        probs[np.arange(n), rng.integers(0, vocab, n)] += 0.1
    uniforms = rng.random(n)
    return np.array(tokens, np.int32), np.array(parents, np.int32), probs, uniforms


def sample_accept(tokens, parents, probs, uniforms):
    """The keyed sampling walk from the root down with the kernel's sample_step (as the rule runs
    it): the node at depth d draws with uniforms[d]."""
    path = [0]
    while True:
        child, token = sample_step(tokens, parents, tokens.shape[0], path[-1], probs[path[-1]], uniforms[len(path) - 1])
        if child < 0:
            return np.array(path, np.int32), int(token)
        path.append(int(child))


@SETTINGS
@given(trees_with_probs())
def test_sample_accept_matches_naive(case):
    tokens, parents, probs, uniforms = case
    path, token = sample_accept(tokens, parents, probs, uniforms)
    ref_path, ref_token = naive_sample_accept(tokens, parents, probs, uniforms)
    assert path.tolist() == ref_path.tolist() and int(token) == ref_token
    assert path.dtype == np.int32 and path[0] == 0
    assert all(parents[b] == a for a, b in zip(path[:-1], path[1:]))
    assert probs[path[-1], token] > 0  # never a token of probability 0
    if path.shape[0] > 1:  # an accepted child never has probability 0 either
        assert all(probs[parents[c], tokens[c]] > 0 for c in path[1:])


def test_sample_step_matches_naive_over_vocabularies_of_many_blocks():
    """The kernel finds the draw through per-block partial sums (acceptance._BLOCK tokens each):
    vocabularies across block boundaries, with zero-mass tokens and whole zero blocks, draw what the
    naive token-by-token inverse CDF draws, for uniforms spread over [0, 1) and at its ends."""
    rng = np.random.default_rng(5)
    root, no_parent = np.zeros(1, np.int32), np.full(1, -1, np.int32)
    for _ in range(400):
        vocab = int(rng.integers(1, 3000))
        p = rng.dirichlet(np.full(vocab, 0.3)).astype(np.float32)
        p[rng.random(vocab) < 0.4] = 0.0
        if vocab > 600:
            start = int(rng.integers(0, vocab - 300))
            p[start:start + 300] = 0.0   # at least one whole block without mass
        p[rng.integers(0, vocab)] += 0.05
        for uniform in (*rng.random(3), 0.0, 1.0 - 2.0 ** -53):
            got = sample_step(root, no_parent, 1, 0, p, uniform)
            want = naive_sample_step(root, no_parent, 1, 0, p, uniform)
            assert got == want, (vocab, uniform)
            assert p[got[1]] > 0


def test_sample_accept_single_node_distribution():
    """A leaf (here the root alone) draws from its whole distribution."""
    probs = np.array([[0.1, 0.0, 0.6, 0.3]], np.float32)
    rng = np.random.default_rng(0)
    draws = [int(sample_accept(np.zeros(1, np.int32), np.full(1, -1, np.int32), probs, rng.random(1))[1])
             for _ in range(20_000)]
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert np.abs(freq - probs[0]).max() < 0.015 and freq[1] == 0


@st.composite
def processing_cases(draw):
    vocab = draw(st.integers(2, 40))
    n = draw(st.integers(1, 10))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12))
    generated = draw(st.lists(st.integers(0, vocab - 1), max_size=12))
    params = dict(
        temperature=draw(st.sampled_from([0.0, 0.3, 1.0, 1.7])),
        top_k=draw(st.sampled_from([None, 0, 1, 3, 50])),
        top_p=draw(st.sampled_from([1.0, 0.0, 0.5, 0.9, 0.99])),
        min_p=draw(st.sampled_from([None, 0.0, 0.05, 0.5])),
        repetition_penalty=draw(st.sampled_from([1.0, 0.7, 1.3, 3.0])),
        presence_penalty=draw(st.sampled_from([0.0, 0.5, -0.4])),
        frequency_penalty=draw(st.sampled_from([0.0, 0.25, -0.1])),
    )
    seed = draw(st.integers(0, 2**32 - 1))
    logits = (np.random.default_rng(seed).normal(0, 3, (n, vocab))).astype(np.float32)
    return vocab, tokens, parents, prompt, generated, params, logits


@SETTINGS
@given(processing_cases())
def test_process_tree_matches_naive_per_prefix(case):
    """Row i of process_tree is naive_process of that row for node i's own prefix."""
    vocab, tokens, parents, prompt, generated, params, logits = case
    tokens = np.array([(prompt + generated)[-1]] + tokens[1:], np.int32)  # the root ends the context
    processor = LogitsProcessor.from_params(SamplingParams(**params), vocab)
    processor.start(np.array(prompt, np.int32))
    if generated:
        processor.update(np.array(generated, np.int32))
    tree = DraftTree.build(tokens, parents)
    z = processor.process_tree(logits, tree.tokens, tree.parents)
    assert z.dtype == np.float32 and z.shape == logits.shape
    context = prompt + generated
    for i in range(len(tree)):
        prefix = context + tree.path_tokens(i)[1:].tolist()
        want = naive_process(logits[i], prefix, len(prompt), **to_naive(params))
        assert np.array_equal(np.isinf(z[i]), np.isinf(want)), (i, z[i], want)
        finite = np.isfinite(want)
        assert np.array_equal(z[i][finite], want[finite]), (i, z[i], want)
        assert np.isfinite(z[i]).any()  # at least one token always survives
    if not SamplingParams(**params).is_greedy:  # what the sampler uses: softmax of one node's row
        for i in range(len(tree)):
            probs = processor.probs_node(logits, tree.tokens, tree.parents, i)
            assert np.array_equal(probs == 0, np.isinf(z[i]))
            np.testing.assert_allclose(probs, softmax(z[i]), rtol=2e-6, atol=1e-7)


def test_processors_match_transformers():
    """Against transformers' own classes in its order: RepetitionPenalty → Temperature → TopK →
    TopP → MinP (presence / frequency are not transformers features: checked against the twin)."""
    torch = pytest.importorskip("torch")
    lp = pytest.importorskip("transformers.generation.logits_process")
    rng = np.random.default_rng(0)
    n_checked = 0
    for trial in range(300):
        vocab = int(rng.integers(2, 300))
        prefix = rng.integers(0, vocab, int(rng.integers(1, 30))).astype(np.int32)
        logits = rng.normal(0, 3, vocab).astype(np.float32)
        params = dict(temperature=float(rng.choice([0.5, 1.0, 1.6])), top_k=int(rng.choice([0, 1, 5, 40])),
                      top_p=float(rng.choice([1.0, 0.3, 0.9])), min_p=float(rng.choice([0.0, 0.02, 0.3])),
                      repetition_penalty=float(rng.choice([1.0, 1.2, 2.5])))
        processors = []
        if params["repetition_penalty"] != 1.0:
            processors.append(lp.RepetitionPenaltyLogitsProcessor(params["repetition_penalty"]))
        if params["temperature"] != 1.0:
            processors.append(lp.TemperatureLogitsWarper(params["temperature"]))
        if params["top_k"]:
            processors.append(lp.TopKLogitsWarper(params["top_k"]))
        if params["top_p"] < 1.0:
            processors.append(lp.TopPLogitsWarper(params["top_p"]))
        if params["min_p"] > 0.0:
            processors.append(lp.MinPLogitsWarper(params["min_p"]))
        ids = torch.from_numpy(prefix.astype(np.int64))[None]
        scores = torch.from_numpy(logits.copy())[None]
        for proc in processors:
            scores = proc(ids, scores)
        want = scores[0].numpy()
        processor = LogitsProcessor.from_params(SamplingParams(**params), vocab)
        processor.start(prefix)
        got = processor.process_next(logits)
        assert np.array_equal(np.isinf(got), np.isinf(want)), (trial, params)
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-6)
        n_checked += int((~finite).any())
    assert n_checked > 100  # most trials filtered something


# -- behaviour of speculate(sampling=...) ------------------------------------------------------------------
class CountingVerifier(ToyVerifier):
    """Records what each call asked for: "argmax" (no logits), "logits" (every candidate's, or the
    prefill's row); asking for anything else fails."""

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        self.wants = []

    def prefill(self, prompt, n_logits=0):
        assert n_logits in (0, 1)
        self.wants.append("logits" if n_logits else "argmax")
        return super().prefill(prompt, n_logits)

    def verify(self, tree, n_logits=0):
        assert n_logits in (0, tree.n_candidates)
        self.wants.append("logits" if n_logits else "argmax")
        return super().verify(tree, n_logits)


def test_greedy_is_the_default_and_never_asks_for_logits():
    model = ToyModel(vocab_size=12, seed=3)
    for sampling in (None, dict(temperature=0.0), dict(do_sample=False, top_p=0.5),
                     SamplingParams(temperature=0.0, top_k=3)):
        verifier = CountingVerifier(model)
        result = draftcore.speculate(verifier, [1, 2, 3], max_new_tokens=30, sampling=sampling)
        assert result.tokens.tolist() == model.greedy([1, 2, 3], 30).tolist()
        assert set(verifier.wants) == {"argmax"} and result.seed is None


def test_greedy_with_penalties_matches_plain_penalised_greedy():
    """temperature 0 with a repetition / frequency penalty: argmax of the penalised logits at every
    node's own prefix, as transformers' do_sample=False with repetition_penalty."""
    for seed in range(5):
        model = MemoToyModel(vocab_size=10, seed=seed)
        params = dict(temperature=0.0, repetition_penalty=4.0, frequency_penalty=0.5)
        want = plain_sample(model, [1, 2, 3], 40, params, None)
        assert want.tolist() != model.greedy([1, 2, 3], 40).tolist()  # the penalty matters here
        for kind in ("likely", "trie", "random"):
            drafter = (LikelyTreeDrafter(model, seed) if kind == "likely" else
                       TrieDrafter(token_limit=10) if kind == "trie" else RandomTreeDrafter(10, seed))
            verifier = CountingVerifier(model)
            result = draftcore.speculate(verifier, [1, 2, 3], max_new_tokens=40, drafter=drafter, budget=8,
                                         sampling=params)
            assert result.tokens.tolist() == want.tolist(), kind
            assert set(verifier.wants) == {"logits"}


def test_same_seed_reproduces_and_result_seed_replays():
    model = ToyModel(vocab_size=8, seed=1)

    def run(seed):
        return draftcore.speculate(ToyVerifier(model), [1, 2], max_new_tokens=40, drafter=LikelyTreeDrafter(model, 0),
                                   budget=6, sampling=dict(temperature=1.2, top_k=6, seed=seed))

    a, b = run(5), run(5)
    assert a.tokens.tolist() == b.tokens.tolist() and a.seed == 5
    assert len({tuple(run(s).tokens.tolist()) for s in range(6)}) > 3
    fresh = run(None)
    assert isinstance(fresh.seed, int)
    assert run(fresh.seed).tokens.tolist() == fresh.tokens.tolist()
    gen = np.random.default_rng(3)
    first, second = run(gen), run(gen)  # a Generator is consumed: two different samples
    assert first.seed is None and first.tokens.tolist() != second.tokens.tolist()


def test_stream_equals_speculate_when_sampling():
    model = ToyModel(vocab_size=9, seed=2)
    opts = dict(max_new_tokens=50, budget=8, sampling=dict(temperature=0.9, top_p=0.8, seed=11), eos_token_id=4)
    whole = draftcore.speculate(ToyVerifier(model), [3, 1], drafter=LikelyTreeDrafter(model, 1), **opts)
    stream = draftcore.speculate_stream(ToyVerifier(model), [3, 1], drafter=LikelyTreeDrafter(model, 1), **opts)
    chunks = list(stream)
    assert np.concatenate(chunks).tolist() == whole.tokens.tolist() == stream.result.tokens.tolist()
    assert stream.result.stop_reason == whole.stop_reason


def test_sampling_over_a_verifier_uses_logits_and_accepts_drafts():
    model = ToyModel(vocab_size=16, seed=4)
    verifier = CountingVerifier(model)
    result = draftcore.speculate(verifier, [1, 2, 3, 4], max_new_tokens=120, drafter=TrieDrafter(token_limit=16),
                                 budget=8, sampling=dict(temperature=0.5, seed=0))
    assert set(verifier.wants) == {"logits"}
    assert result.stats.tokens_per_step > 1.2  # the toy text repeats: drafts are accepted under sampling too


def test_plain_sample_through_a_verifier_matches_the_model():
    """plain_sample over ToyVerifier (prefill + root-only verifies) draws what it draws over the model."""
    for params in COMBOS.values():
        a = plain_sample(MODEL, PROMPT, 12, params, np.random.default_rng(9))
        b = plain_sample(ToyVerifier(MODEL), PROMPT, 12, params, np.random.default_rng(9))
        assert a.tolist() == b.tolist()


# -- bad options and bad backends --------------------------------------------------------------------------
@pytest.mark.parametrize("options, words", [
    (dict(temperature=-0.5), ["temperature", "-0.5", ">= 0"]),
    (dict(temperature=float("nan")), ["temperature", "nan"]),
    (dict(temperature="hot"), ["temperature", "'hot'"]),
    (dict(top_k=-1), ["top_k", "-1", ">= 0"]),
    (dict(top_k=2.5), ["top_k", "2.5"]),
    (dict(top_p=1.5), ["top_p", "1.5", "[0, 1]"]),
    (dict(min_p=-0.1), ["min_p", "-0.1"]),
    (dict(repetition_penalty=0.0), ["repetition_penalty", "0.0", "> 0"]),
    (dict(presence_penalty=float("inf")), ["presence_penalty", "inf"]),
    (dict(frequency_penalty=None, seed=-3), ["seed", "-3"]),
    (dict(do_sample="yes"), ["do_sample", "'yes'"]),
    (dict(top_pp=0.9), ["top_pp", "unknown"]),
    # finite in float64 but 0, subnormal or inf in float32, where the logits are divided or shifted by them
    (dict(temperature=1e-40), ["temperature", "1e-40", "float32"]),
    (dict(repetition_penalty=1e-50), ["repetition_penalty", "1e-50", "float32"]),
    (dict(frequency_penalty=-1e300), ["frequency_penalty", "-1e+300", "float32"]),
])
def test_bad_sampling_options_are_refused_up_front(options, words):
    verifier = ToyVerifier(ToyModel(vocab_size=5))
    with pytest.raises(ConfigError) as info:
        draftcore.speculate(verifier, [1, 2], max_new_tokens=4, sampling=options)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert verifier.n_past == 0


@pytest.mark.parametrize("do_sample", [True, False])
@pytest.mark.parametrize("processor", [lambda ids, z: z * np.nan, lambda ids, z: np.full_like(z, -np.inf),
                                       lambda ids, z: np.where(z > z.min(), np.inf, z)])   # overflowed
def test_processed_rows_with_nothing_to_choose_are_an_error_not_token_zero(processor, do_sample):
    """A processor (or options) leaving a row NaN, all -inf or overflowed: argmax and sampling would
    quietly pick token 0 from it; the loop says so instead."""
    with pytest.raises(InputError, match="sampling: the processed logits of a row"):
        draftcore.speculate(ToyVerifier(ToyModel(vocab_size=5)), [1, 2], max_new_tokens=6, budget=3,
                            sampling=dict(do_sample=do_sample, seed=0, logits_processors=[processor]))


def test_sampling_of_the_wrong_type_is_refused():
    with pytest.raises(ConfigError, match="sampling: expected None"):
        draftcore.speculate(ToyVerifier(ToyModel(vocab_size=5)), [1], max_new_tokens=2, sampling=0.7)


def test_backend_returning_bad_logits_is_refused():
    class Bad(ToyVerifier):
        def __init__(self, model, how):
            super().__init__(model)
            self.how = how

        def verify(self, tree, n_logits=0):
            tokens, out = super().verify(tree, n_logits)
            if self.how == "dead_row":
                out[-1] = -np.inf
                return tokens, out
            return tokens, (out[:, :-1] if self.how == "shape" else np.where(out > 0, np.nan, out))

    for how, match in (("shape", r"expected logits float32\[\d+, 5\]"), ("nan", "NaN"),
                       ("dead_row", "no finite logit")):
        with pytest.raises(BackendError, match=match):
            draftcore.speculate(Bad(ToyModel(vocab_size=5), how), [1, 2], max_new_tokens=10, budget=3,
                                sampling=dict(seed=0))
