"""Slow, obviously-correct twins of draftcore's sampling code, and the statistics the tests use.

    naive_process        one row of logits processed for an explicit prefix, written the way
                         transformers' processors are (full ascending sort and cumsum for top-p)
    naive_sample_accept  the keyed tree sampling walk (naive_sample_step from the root down),
                         plus planted wrong variants the tests must catch
    exact_sequence_probs every length-L continuation's exact probability under plain sampling
    chi2_sf              chi-square survival function (scipy is not a dependency)
    goodness_of_fit      chi-square test of observed counts against exact probabilities
"""
from __future__ import annotations

import itertools
import math

import numpy as np

F32 = np.float32


# -- processing -------------------------------------------------------------------------------------
def naive_process(logits, prefix, n_prompt, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                  repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, greedy=False):
    """float32[vocab]: `logits` (the row after `prefix`) processed; prefix[:n_prompt] is the prompt.

    Repetition penalty over the whole prefix; presence / frequency over prefix[n_prompt:]; then,
    unless greedy, temperature, top-k, top-p, min-p — each step as its transformers class does it.
    """
    z = np.array(logits, F32)
    vocab = z.shape[0]
    generated = [int(t) for t in prefix[n_prompt:]]
    for t in sorted(set(int(t) for t in prefix)):
        if repetition_penalty != 1.0:
            theta = F32(repetition_penalty)
            z[t] = z[t] * theta if z[t] < 0 else z[t] / theta
    for t in sorted(set(generated)):
        count = generated.count(t)
        z[t] = z[t] - F32(frequency_penalty) * F32(count)
        z[t] = z[t] - F32(presence_penalty)
    if greedy:
        return z
    if temperature != 1.0:
        z = z / F32(temperature)
    if top_k and top_k < vocab:
        kth = np.sort(z)[::-1][top_k - 1]
        z = np.where(z < kth, F32(-np.inf), z)
    if top_p < 1.0:
        order = np.argsort(z, kind="stable")  # ascending, like TopPLogitsWarper
        sorted_z = z[order].astype(np.float64)
        probs = np.exp(sorted_z - sorted_z.max())
        probs /= probs.sum()
        cumulative = np.cumsum(probs)
        remove = cumulative <= 1.0 - top_p
        remove[-1] = False
        z = z.copy()
        z[order[remove]] = -np.inf
    if min_p > 0.0:
        probs = np.exp(z.astype(np.float64) - z.max())
        probs /= probs.sum()
        z = np.where(probs < min_p * probs.max(), F32(-np.inf), z)
    return z.astype(F32)


def naive_probs(z):
    p = np.exp(np.asarray(z, np.float64) - np.max(z))
    return p / p.sum()


# -- acceptance ------------------------------------------------------------------------------------------
VARIANTS = ("exact", "child_coins", "mode_shortcut")


def naive_sample_accept(tokens, parents, probs, uniforms, variant="exact"):
    """The keyed sampling walk with lists: naive_sample_step from the root down, the node at depth d
    drawing with uniforms[d] (the uniform of its output position)."""
    path = [0]
    while True:
        child, token = naive_sample_step(tokens, parents, len(tokens), path[-1], probs[path[-1]],
                                         uniforms[len(path) - 1], variant)
        if child < 0:
            return np.array(path, np.int32), token
        path.append(child)


def naive_sample_step(tokens, parents, n_walk, u, p, uniform, variant="exact"):
    """One node of the walk, with the signature of draftcore.acceptance.sample_step: (the child of u
    among nodes < n_walk holding the drawn token, or -1; the drawn token).

    variant "exact": draw the token by inverse CDF of the normalised p at `uniform`, then look for a
    child holding it. The wrong ones, planted for the tests to catch:
        "child_coins"    each child c in order is accepted when uniform < p(c) (a coin per child from
                         the same uniform), and only then is a token drawn
        "mode_shortcut"  a first child holding p's most likely token is accepted outright, as greedy
                         would; otherwise the exact draw
    """
    p = [float(x) for x in p]
    total = sum(p)
    p = [x / total for x in p]
    children = [c for c in range(u + 1, n_walk) if int(parents[c]) == u]
    if variant == "child_coins":
        for c in children:
            if uniform < p[int(tokens[c])]:
                return c, int(tokens[c])
    if variant == "mode_shortcut" and children and int(tokens[children[0]]) == int(np.argmax(p)):
        return children[0], int(tokens[children[0]])
    token, acc = -1, 0.0
    for v, w in enumerate(p):
        if w > 0:
            acc += w
            token = v
            if acc > uniform:
                break
    for c in children:
        if int(tokens[c]) == token:
            return c, token
    return -1, token


# -- exact distribution ------------------------------------------------------------------------------------
def exact_sequence_probs(next_logits, prompt, length, vocab, **params):
    """{sequence tuple: probability} of every `length`-token continuation under plain sampling.

    next_logits(tokens) -> float32[vocab]: the model's raw logits after `tokens`.
    """
    prompt = [int(t) for t in prompt]
    out = {}
    probs_after = {}

    def dist(prefix):
        if prefix not in probs_after:
            z = naive_process(next_logits(list(prompt) + list(prefix)), list(prompt) + list(prefix),
                              len(prompt), **params)
            probs_after[prefix] = naive_probs(z)
        return probs_after[prefix]

    for seq in itertools.product(range(vocab), repeat=length):
        prob = 1.0
        for i in range(length):
            prob *= dist(seq[:i])[seq[i]]
            if prob == 0.0:
                break
        out[seq] = prob
    return out


# -- statistics -------------------------------------------------------------------------------------------
def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, x/2)
    (series below a + 1, Lentz's continued fraction above; Numerical Recipes §6.2)."""
    a, x = df / 2.0, x / 2.0
    if x <= 0.0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        ap = a
        for _ in range(100_000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(log_front) * h


def goodness_of_fit(counts: dict, probs: dict, min_expected: float = 5.0):
    """(p-value, chi-square statistic, degrees of freedom) of `counts` ({cell: n}) against `probs`
    ({cell: probability}). Cells expected fewer than `min_expected` times are pooled into one (the
    usual validity condition of the chi-square approximation); an observed cell of probability 0
    gives p = 0."""
    n = sum(counts.values())
    if any(c > 0 and probs.get(k, 0.0) == 0.0 for k, c in counts.items()):
        return 0.0, math.inf, 0
    observed, expected = [], []
    pooled_o = pooled_e = 0.0
    for k, p in probs.items():
        e = n * p
        o = counts.get(k, 0)
        if e >= min_expected:
            observed.append(o)
            expected.append(e)
        else:
            pooled_o += o
            pooled_e += e
    if pooled_e > 0:
        if pooled_e < min_expected and expected:  # still too small: fold into the smallest cell
            i = int(np.argmin(expected))
            observed[i] += pooled_o
            expected[i] += pooled_e
        else:
            observed.append(pooled_o)
            expected.append(pooled_e)
    o = np.array(observed, float)
    e = np.array(expected, float)
    stat = float(((o - e) ** 2 / e).sum())
    df = len(o) - 1
    return chi2_sf(stat, df), stat, df
