"""Slow, obviously-correct twins of draftcore's sampling code, and the statistics the tests use.

    naive_process        one row of logits processed for an explicit prefix, written the way
                         transformers' processors are (full ascending sort and cumsum for top-p)
    naive_sample_accept  tree sampling acceptance (naive_sample_step from the root down), plus
                         planted wrong variants the tests must catch
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
VARIANTS = ("exact", "no_removal", "unmodified_residual", "unnormalised")


def naive_sample_accept(tokens, parents, probs, uniforms, variant="exact"):
    """Tree sampling acceptance with lists: naive_sample_step from the root down.

    variant "exact": children in order, accept c with p(c) / mass left, remove a rejected child's
    mass, draw the next token from what is left. The wrong ones, planted for the tests to catch:
        "no_removal"           a rejected child's mass stays (accept each child with p(c), draw from p)
        "unmodified_residual"  rejections renormalise the children, but the final draw is from all of p
        "unnormalised"         a rejected child's mass is removed but later children are accepted with
                               their original p(c), not renormalised
    """
    path = [0]
    i_draw = 0
    while True:
        child, token, i_draw = naive_sample_step(tokens, parents, len(tokens), path[-1], probs[path[-1]], uniforms,
                                                 i_draw, None, variant)
        if child < 0:
            return np.array(path, np.int32), token
        path.append(child)


def naive_sample_step(tokens, parents, n_walk, u, p, uniforms, i_draw, left=None, variant="exact"):
    """One node of the walk, with the signature of draftcore.acceptance.sample_step (`left` unused):
    (accepted child, -1, i_draw) or (-1, drawn token, i_draw); children among nodes < n_walk."""
    p = [float(x) for x in p]
    total = sum(p)
    p = [x / total for x in p]
    left = list(p)
    mass = 1.0
    for c in [c for c in range(u + 1, n_walk) if int(parents[c]) == u]:
        r = uniforms[i_draw]
        i_draw += 1
        t = int(tokens[c])
        if variant in ("exact", "unmodified_residual"):
            accept = r * mass < left[t]
        elif variant == "no_removal":
            accept = r < p[t]
        else:  # unnormalised
            accept = r < left[t]
        if accept:
            return c, -1, i_draw
        if variant != "no_removal":
            mass -= left[t]
            left[t] = 0.0
    final = p if variant in ("no_removal", "unmodified_residual") else left
    target = uniforms[i_draw] * sum(final)
    i_draw += 1
    acc = 0.0
    for v, w in enumerate(final):
        if w > 0:
            acc += w
            if acc > target:
                return -1, v, i_draw
    return -1, int(np.argmax(p)), i_draw  # as the kernel: only reached by rounding


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
