"""`SamplingParams(logits_processors=...)`: user functions of (prefix, logits), applied at every
drafted node with that node's own prefix. Greedy output equals a plain loop that applies the same
functions; sampling matches the exact distribution (chi-square), and a planted wrong prefix (every
node given the root's) is caught by the same test."""
from __future__ import annotations

import numpy as np
import pytest

import draftcore
from draftcore import BackendError, ConfigError, SamplingParams
from draftcore.processors import LogitsProcessor
from naive_sampling import exact_sequence_probs, goodness_of_fit
from test_sampling import BUDGET, LENGTH, MAX_NEW, MODEL, PROMPT, VOCAB, FastToyVerifier, make_drafter
from fixtures.toy import ToyModel, ToyVerifier


def favour_next_of_last(prefix, logits):
    """+2.5 on (last token + 1) mod vocab: a strong effect that differs between sibling nodes."""
    out = logits.copy()
    out[(int(prefix[-1]) + 1) % out.shape[0]] += 2.5
    return out


def ban_even_length_argmax(prefix, logits):
    """On prefixes of even length, the raw argmax is banned: changes greedy output often."""
    out = logits.copy()
    if len(prefix) % 2 == 0:
        out[int(np.argmax(logits))] = -np.inf
    return out


def accepted(stats) -> int:
    return sum(k * c for k, c in enumerate(stats.accepted_hist))


def plain_processed_greedy(model, prompt, n, functions):
    tokens = [int(t) for t in prompt]
    for _ in range(n):
        z = model.logits(tokens).astype(np.float32)
        for fn in functions:
            z = fn(np.array(tokens, np.int64), z)
        tokens.append(int(np.argmax(z)))
    return np.array(tokens[len(prompt):], np.int32)


@pytest.mark.parametrize("drafter", ["trie", "composite"])
def test_greedy_with_prefix_functions_equals_the_plain_processed_loop(drafter):
    model = ToyModel(vocab_size=24, seed=3)
    prompt = np.array([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], np.int32)
    functions = (ban_even_length_argmax, favour_next_of_last)
    expected = plain_processed_greedy(model, prompt, 60, functions)
    unprocessed = plain_processed_greedy(model, prompt, 60, ())
    assert not np.array_equal(expected, unprocessed)   # the functions matter: the test can fail
    verifier = ToyVerifier(model)
    # a fixed budget: the auto budget times the toy's steps, and on a busy machine may find no draft worth it
    session = draftcore.Session(verifier, drafter=drafter, budget=8)
    for _ in range(2):   # the second run drafts from what the first taught the drafter
        result = session.speculate(prompt, max_new_tokens=60,
                                   sampling=SamplingParams(do_sample=False, logits_processors=functions))
        np.testing.assert_array_equal(result.tokens, expected)
    assert accepted(result.stats) > 0


def exact_with(function):
    return exact_sequence_probs(lambda tokens: function(np.array(tokens, np.int64),
                                                        MODEL.logits(tokens).astype(np.float32)),
                                PROMPT, LENGTH, VOCAB, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def counts_with(function, n_samples, seed0=0):
    counts, n_accepted = {}, 0
    drafters = {k: make_drafter(k, seed0) for k in ("likely", "chain")}
    for i in range(n_samples):
        kind = ("likely", "chain")[i % 2]
        result = draftcore.speculate(FastToyVerifier(MODEL), PROMPT, max_new_tokens=MAX_NEW, drafter=drafters[kind],
                                     budget=BUDGET, sampling=dict(seed=seed0 + i, logits_processors=[function]))
        key = tuple(result.tokens[:LENGTH].tolist())
        counts[key] = counts.get(key, 0) + 1
        n_accepted += accepted(result.stats)
    return counts, n_accepted / n_samples


def test_sampling_with_a_prefix_function_is_exact():
    counts, accepted_per_sample = counts_with(favour_next_of_last, 3000)
    p, _, _ = goodness_of_fit(counts, exact_with(favour_next_of_last))
    assert accepted_per_sample > 1.0   # drafts were accepted, so non-root rows were processed
    assert p > 1e-3


def test_a_function_given_the_wrong_prefix_is_caught(monkeypatch):
    """Planted: every row processed with the root's prefix (the context) instead of its own."""
    def root_prefix_for_all(self, z, tokens, parents, nodes):
        context = self._context[:self._n_context].copy()
        for r in range(z.shape[0]):
            for fn in self.logits_processors:
                z[r] = fn(context, z[r])
    monkeypatch.setattr(LogitsProcessor, "_apply_prefix_functions", root_prefix_for_all)
    counts, _ = counts_with(favour_next_of_last, 3000)
    p, _, _ = goodness_of_fit(counts, exact_with(favour_next_of_last))
    assert p < 1e-6


def test_bad_logits_processors_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"logits_processors\[1\]: expected a callable"):
        SamplingParams(logits_processors=[favour_next_of_last, 3])
    with pytest.raises(ConfigError, match="logits_processors: expected a sequence"):
        SamplingParams(logits_processors=favour_next_of_last)


def test_a_function_returning_the_wrong_shape_raises_naming_it():
    verifier = ToyVerifier(ToyModel(vocab_size=24, seed=3))
    with pytest.raises(BackendError, match=r"logits_processors\[0\]: .* returned array\(shape=\(3,\), dtype=float32\); "
                                           r"expected a float32 or float64 numpy array of shape \(24,\)"):
        draftcore.speculate(verifier, [1, 2, 3], max_new_tokens=4,
                            sampling=dict(do_sample=False, logits_processors=[lambda prefix, z: z[:3]]))


@pytest.mark.parametrize("returns, named", [
    (lambda prefix, z: z.tolist(), r"returned list \[.*; expected a float32 or float64 numpy array of shape \(24,\)"),
    (lambda prefix, z: z.astype(np.int64), r"returned array\(shape=\(24,\), dtype=int64\); expected a float32 or "
                                           r"float64 numpy array of shape \(24,\)"),
    (lambda prefix, z: 7, r"returned int 7; expected"),
])
def test_a_function_returning_a_list_or_an_integer_row_is_refused_and_changes_nothing(returns, named):
    """A list or an int64 row went through np.asarray silently: an integer row rounds the logits, a
    list hides a processor that returns the wrong thing. Refused, naming the function; the verifier
    is left free, and the next call runs as on a fresh one."""
    verifier = ToyVerifier(ToyModel(vocab_size=24, seed=3))
    bad = dict(do_sample=False, logits_processors=[favour_next_of_last, returns])
    with pytest.raises(BackendError, match=r"logits_processors\[1\]: <function .*> " + named):
        draftcore.speculate(verifier, [1, 2, 3], max_new_tokens=4, sampling=bad)
    good = dict(do_sample=False, logits_processors=[favour_next_of_last])
    got = draftcore.speculate(verifier, [1, 2, 3], max_new_tokens=6, sampling=good)
    want = draftcore.speculate(ToyVerifier(ToyModel(vocab_size=24, seed=3)), [1, 2, 3], max_new_tokens=6,
                               sampling=good)
    assert got.tokens.tolist() == want.tokens.tolist()
