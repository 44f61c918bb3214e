"""Numba kernels of the trie's sorted candidate lists: retrieval's best-first list of candidates
(`offer`; trie_retrieval_kernels takes from its front) and the root's heaviest children (`top`,
the candidates of stage 0: `refresh_top`, `raise_in_top`), both in the order of `better`.

A candidate list lives in a workspace of two arrays, cs (float32 scores) and ci (int32 rows of
trie node, draft parent, token, cell); the list is cs/ci[lo:hi], best first. It sits in the middle
of the workspace and grows at whichever end is nearer a newcomer's place, so the best is taken
from `lo` and the worst dropped from `hi` in O(1), and an insertion moves the fewer entries.
"""
import numba as nb
import numpy as np

from .trie_pool_kernels import ROOT_FIRST, SIBLING, TOKEN, TOP_K, new_state, warm_up_settings, weight


@nb.njit(cache=True, inline="always")
def better(s1, p1, t1, c1, s2, p2, t2, c2):
    """Candidate order: higher score first, then smaller draft parent, then smaller token, then
    larger cell (a longer context; two candidates equal in all four have the same token path,
    score and cell, so whichever comes first drafts the same node)."""
    if s1 != s2:
        return s1 > s2
    if p1 != p2:
        return p1 < p2
    if t1 != t2:
        return t1 < t2
    return c1 > c2


@nb.njit(cache=True, inline="always")
def _move(cs, ci, dst, src):
    cs[dst] = cs[src]
    ci[dst, 0], ci[dst, 1], ci[dst, 2], ci[dst, 3] = ci[src, 0], ci[src, 1], ci[src, 2], ci[src, 3]


@nb.njit(cache=True)
def offer(cs, ci, lo, hi, room, score, node, draft_parent, token, cell):
    """Offer a candidate to the list cs/ci[lo:hi], sorted best first; returns the new (lo, hi).

    At most `room` more nodes can be drafted, so once the list holds `room` candidates a newcomer
    worse than all of them can never be chosen and is not kept; a better newcomer replaces the
    worst. ci rows are (trie node, draft parent, token, cell). The list lives in the middle of the
    workspace and grows at whichever end is nearer the newcomer's place, so the best is popped
    from `lo` and the worst dropped from `hi` in O(1), and an insertion moves the fewer entries.
    The list never holds more than half the workspace, so one end always has room."""
    if hi - lo >= room or hi - lo >= cs.shape[0] // 2:
        if hi == lo or not better(score, draft_parent, token, cell, cs[hi - 1], ci[hi - 1, 1], ci[hi - 1, 2],
                                   ci[hi - 1, 3]):
            return lo, hi
        hi -= 1  # drop the worst
    a, b = lo, hi  # binary search: first entry the newcomer beats
    while a < b:
        mid = (a + b) // 2
        if better(score, draft_parent, token, cell, cs[mid], ci[mid, 1], ci[mid, 2], ci[mid, 3]):
            b = mid
        else:
            a = mid + 1
    pos = a
    if lo > 0 and (pos - lo < hi - pos or hi == cs.shape[0]):
        for j in range(lo, pos):  # shift the better entries one to the left
            _move(cs, ci, j - 1, j)
        lo -= 1
        pos -= 1
    else:  # hi < cs.shape[0] here: the list holds at most half the workspace
        for j in range(hi, pos, -1):  # shift the worse entries one to the right
            _move(cs, ci, j, j - 1)
        hi += 1
    cs[pos] = score
    ci[pos, 0], ci[pos, 1], ci[pos, 2], ci[pos, 3] = node, draft_parent, token, cell
    return lo, hi


@nb.njit(cache=True)
def refresh_top(state, settings):
    """Recompute state.top from scratch: the root's TOP_K heaviest children and the root's total."""
    links, freq, top, top_w = state.links, state.freq, state.top, state.top_w
    cs = np.empty(2 * TOP_K + 2, np.float32)
    ci = np.empty((2 * TOP_K + 2, 4), np.int32)
    lo = hi = TOP_K + 1
    total = 0.0
    c = state.meta[ROOT_FIRST]
    while c >= 0:
        w = weight(freq, c, settings)
        total += w
        lo, hi = offer(cs, ci, lo, hi, TOP_K, w, c, 0, links[c, TOKEN], 0)
        c = links[c, SIBLING]
    for i in range(TOP_K):
        j = lo + i  # best first
        if j < hi:
            top[i, 0], top[i, 1], top_w[i] = ci[j, 0], ci[j, 2], cs[j]
        else:
            top[i, 0], top[i, 1], top_w[i] = -1, -1, 0.0
    top_w[TOP_K] = total


@nb.njit(cache=True)
def raise_in_top(top, top_w, node, token, weight):
    """A root child's weight grew to `weight`: move it up in `top`, or in if it now beats the last."""
    i = 0
    while i < TOP_K and top[i, 0] != node and top[i, 0] >= 0:
        i += 1
    if i == TOP_K:  # not in a full list: enter in place of the last if better
        i = TOP_K - 1
        if not better(weight, 0, token, 0, top_w[i], 0, top[i, 1], 0):
            return
    top[i, 0], top[i, 1], top_w[i] = node, token, weight
    while i > 0 and better(top_w[i], 0, top[i, 1], 0, top_w[i - 1], 0, top[i - 1, 1], 0):
        top[i, 0], top[i - 1, 0] = top[i - 1, 0], top[i, 0]
        top[i, 1], top[i - 1, 1] = top[i - 1, 1], top[i, 1]
        top_w[i], top_w[i - 1] = top_w[i - 1], top_w[i]
        i -= 1


def warm_up() -> None:
    """Compile (or load from numba's cache) `refresh_top`, which the Python side calls after a load,
    on a throwaway pool (draftcore.jit)."""
    refresh_top(new_state(64, 16, 2), warm_up_settings())
