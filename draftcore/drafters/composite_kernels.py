"""The composite drafter's per-step bookkeeping in two numba calls: its sources' trees merged by
calibrated priority (`merge_sources`; the score bins come from `tree.score_bins_of`, the one
rule), and the calibration counted from what the model accepted (`count_verified`) or, by default,
from what the emitted tokens show of every proposed node (`count_outcomes`). In numpy
these were ~15 small array operations a step, ~45 us of a composite step's ~80 us of drafting on
the recorded traces (the trie alone drafts in ~22 us)."""
from __future__ import annotations

import numba as nb
import numpy as np

from ..tree_kernels import would_accept
from .merge_kernels import merge


@nb.njit(cache=True)
def merge_sources(tokens, parents, scores, score_bin, lengths, source_ids, at_word, calibrated, budget, source,
                  index, out_tokens, out_parents, out_depths, out_scores, out_sources, first_child, next_sibling,
                  order_key, priority):
    """Merge trees, concatenated without their roots (tree t: `lengths[t]` nodes from source
    `source_ids[t]`, `parents` as the tree numbers its nodes, 0 for its root), into one tree of at
    most `budget` candidates (merge_kernels.merge). A node's priority is its own score where its
    source's scores are acceptance estimates (`at_word[source]`), else `calibrated[its source,
    score_bin[node]]`. Fills source (each input node's) and index (its index in the result, -1
    where cut); out_*[0] is the root, its token set by the caller. Returns the node count, root
    included."""
    offset = 0
    for t in range(lengths.shape[0]):
        s = source_ids[t]
        for k in range(lengths[t]):
            i = offset + k
            p = parents[i]
            parents[i] = p - 1 + offset if p > 0 else -1   # index the concatenation; -1 under the root
            source[i] = s
            priority[i] = scores[i] if at_word[s] else calibrated[s, score_bin[i]]
        offset += lengths[t]
    return merge(tokens, parents, priority, source, offset, budget, out_tokens, out_parents, out_depths,
                 out_scores, out_sources, first_child, next_sibling, index, order_key)


@nb.njit(cache=True, inline="always")
def _fade(offered, accepted, prior_offered, prior_accepted, keep):
    """Fade the counts towards their priors by `keep` (one step of memory)."""
    offered[:] = prior_offered + keep * (offered - prior_offered)
    accepted[:] = prior_accepted + keep * (accepted - prior_accepted)


@nb.njit(cache=True)
def count_verified(offered, accepted, prior_offered, prior_accepted, keep, source, score_bin, index, m, path):
    """Fade `offered` / `accepted` towards their priors by `keep`, then count each input node the
    verify offered to the model (0 < index < m) once offered and, when on `path`, once accepted."""
    _fade(offered, accepted, prior_offered, prior_accepted, keep)
    on_path = np.zeros(m, np.bool_)
    for k in range(path.shape[0]):
        on_path[path[k]] = True
    for i in range(index.shape[0]):
        r = index[i]
        if 0 < r < m:
            offered[source[i], score_bin[i]] += 1.0
            if on_path[r]:
                accepted[source[i], score_bin[i]] += 1.0


@nb.njit(cache=True)
def count_outcomes(offered, accepted, prior_offered, prior_accepted, keep, source, score_bin, index, parents,
                   depths, tokens, emitted):
    """Fade `offered` / `accepted` towards their priors by `keep`, then count each input node of a
    proposal (merged tree tokens / parents / depths, its node 0 the root; 0 < index < its size)
    whose outcome the `emitted` tokens (the step's accepted tokens and the model's next) settle: once
    offered and, when its path equals their start, once accepted. A node deeper than the emitted
    tokens under a node that came true is not settled (the stream has not shown it)."""
    _fade(offered, accepted, prior_offered, prior_accepted, keep)
    n = tokens.shape[0]
    state = would_accept(tokens, parents, depths, n, emitted)   # 1 came true, 0 did not, -1 not settled
    for i in range(index.shape[0]):
        r = index[i]
        if 0 < r < n and state[r] >= 0:
            offered[source[i], score_bin[i]] += 1.0
            if state[r] == 1:
                accepted[source[i], score_bin[i]] += 1.0


def warm_up() -> None:
    """Compile (or load from numba's cache) both kernels once with the types the composite passes."""
    tokens = np.array([5, 6, 5, 7], np.int32)
    parents = np.array([0, 1, 0, 1], np.int32)
    score_bin = np.array([18, 10, 16, 4], np.int64)
    lengths = np.array([2, 2], np.int64)
    calibrated = np.full((2, 20), 0.5)
    n, size = tokens.shape[0], tokens.shape[0] + 1
    source, index = np.zeros(n, np.int32), np.zeros(n, np.int32)
    out = np.zeros((4, size), np.int32)
    scores = np.array([0.9, 0.5, 0.8, 0.2], np.float32)
    m = merge_sources(tokens, parents, scores, score_bin, lengths, np.array([1, 0], np.int32),
                      np.array([True, False]), calibrated, 3, source, index,
                      out[0], out[1], out[2], out[3].view(np.float32), np.zeros(size, np.int32),
                      np.zeros(size, np.int32), np.zeros(size, np.int32), np.zeros(size, np.float32),
                      np.zeros(n, np.float32))
    counts = np.ones((2, 20))
    count_verified(counts, counts.copy(), counts.copy(), counts.copy(), 0.99, source, score_bin, index, m,
                   np.array([0, 1], np.int32))
    count_outcomes(counts, counts.copy(), counts.copy(), counts.copy(), 0.99, source, score_bin, index, out[1, :m],
                   out[2, :m], out[0, :m], np.array([5, 6], np.int32))
