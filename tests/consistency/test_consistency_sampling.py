"""Sampling is exact on every backend: speculative samples of the tiny Llama's first LENGTH tokens
follow the distribution that plain sampling from that backend's own logits gives (chi-square), and
the same test function catches a planted wrong acceptance rule on every backend.

top_k=3 keeps the support enumerable (3**LENGTH sequences); one TrieDrafter is carried across the
samples, so it learns the sampled continuations and proposes branching trees whose non-first
children get accepted (where the wrong rules differ from the right one)."""
import numpy as np
import pytest

import draftcore
import draftcore.acceptance
from draftcore import TrieDrafter

from consistency_backends import BACKENDS
from naive_sampling import goodness_of_fit, naive_probs, naive_process, naive_sample_step

PROMPT = [0, 300, 301, 302, 300, 301]
LENGTH = 3
PARAMS = dict(temperature=1.0, top_k=3)
N_SAMPLES = 1_500
ALPHA = 1e-3     # a correct sampler fails with this probability (seeds fixed: it does not)
DETECT = 1e-6    # a planted wrong rule must fall below this


def exact_probs(verifier) -> dict:
    """{sequence: probability} of plain sampling, from the backend's own one-sequence logits."""
    out = {}

    def expand(prefix, prob):
        if len(prefix) == LENGTH:
            out[tuple(prefix)] = prob
            return
        tokens = list(PROMPT) + prefix
        logits = verifier.prefill(np.asarray(tokens, np.int32), 1)[1][0]
        p = naive_probs(naive_process(logits, tokens, len(PROMPT), **PARAMS))
        for token in np.flatnonzero(p > 0):
            expand(prefix + [int(token)], prob * float(p[token]))

    expand([], 1.0)
    return out


def sample_fit(verifier):
    """(p-value, chi-square, df, tokens accepted from drafts) of N_SAMPLES speculative samples."""
    drafter = TrieDrafter()
    counts, accepted = {}, 0
    for seed in range(N_SAMPLES):
        result = draftcore.speculate(verifier, np.asarray(PROMPT, np.int32), max_new_tokens=LENGTH, drafter=drafter,
                                     budget=6, sampling=dict(PARAMS, seed=seed))
        key = tuple(result.tokens[:LENGTH].tolist())
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(k * c for k, c in enumerate(result.stats.accepted_hist))
    p, stat, df = goodness_of_fit(counts, exact_probs(verifier))
    return p, stat, df, accepted


@pytest.mark.parametrize("backend", BACKENDS)
def test_speculative_sampling_follows_plain_sampling(make_verifier, backend):
    p, stat, df, accepted = sample_fit(make_verifier(backend))
    assert p > ALPHA, (backend, p, stat, df)
    assert accepted > 0.3 * N_SAMPLES, f"{backend}: only {accepted} drafted tokens accepted"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_planted_wrong_rule_is_caught(make_verifier, backend, monkeypatch):
    def planted(tokens, parents, n_walk, u, p, uniform):
        return naive_sample_step(tokens, parents, n_walk, u, p, uniform, "child_coins")

    monkeypatch.setattr(draftcore.acceptance, "sample_step", planted)
    p, stat, df, _ = sample_fit(make_verifier(backend))
    assert p < DETECT, (backend, p, stat, df)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_seed_replays_whatever_was_drafted(make_verifier, backend):
    """The same seed gives the same tokens over repeated calls with a learning drafter and the auto
    budget, and the same tokens as budget=0 (no draft): every draw is keyed by its output position.
    The prompt repeats, so the trie learns it and the auto budget's trees differ from call to call."""
    verifier = make_verifier(backend)
    prompt = np.asarray(PROMPT * 3, np.int32)
    options = dict(max_new_tokens=40, sampling=dict(temperature=0.8, top_p=0.95, seed=11))
    plain = draftcore.speculate(verifier, prompt, budget=0, **options)
    drafter, accepted = TrieDrafter(), 0
    for budget in ("auto", "auto", "auto", 8, 3):
        run = draftcore.speculate(verifier, prompt, drafter=drafter, budget=budget, **options)
        assert run.tokens.tolist() == plain.tokens.tolist(), (backend, budget)
        accepted += sum(k * c for k, c in enumerate(run.stats.accepted_hist))
    assert accepted > 0, backend   # drafts were accepted: the equality covered drafted steps
