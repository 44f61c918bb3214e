"""Numba kernel that merges several draft trees into one (merge.py's merge_trees; the composite's
merge by calibrated priority, composite_kernels, calls it too)."""
import numba as nb
import numpy as np


@nb.njit(cache=True)
def merge(tokens, parents, priority, source, n, budget, out_tokens, out_parents, out_depths, out_scores,
          out_sources, first_child, next_sibling, merged_of, order_key):
    """Merge several draft trees, concatenated (each tree's nodes after its own root, parents
    indexing the concatenation, -1 for a child of the common root), into one: identical prefixes
    share nodes, a node's priority is the best of its sources', `out_sources` ORs their bits
    (1 << source). Nodes come out by priority, best first (a child never outranks its parent, so
    this is topological), cut to `budget` candidates. out_*[0] is the root (its token set by the
    caller); `merged_of[i]` ends as input node i's index in the result (-1: cut). Returns the node
    count, root included."""
    m = 1
    first_child[0] = -1
    out_scores[0] = 1.0
    out_sources[0] = 0
    out_depths[0] = 0
    for i in range(n):
        mp = 0 if parents[i] < 0 else merged_of[parents[i]]
        child = first_child[mp]
        last = -1
        while child >= 0 and out_tokens[child] != tokens[i]:
            last = child
            child = next_sibling[child]
        if child < 0:
            child = m
            m += 1
            out_tokens[child] = tokens[i]
            out_parents[child] = mp
            out_depths[child] = out_depths[mp] + 1
            out_scores[child] = priority[i]
            out_sources[child] = 0
            first_child[child] = -1
            next_sibling[child] = -1
            if last < 0:
                first_child[mp] = child
            else:
                next_sibling[last] = child
        elif priority[i] > out_scores[child]:
            out_scores[child] = priority[i]
        out_sources[child] |= np.int32(1) << source[i]
        merged_of[i] = child
    # A child's priority may have risen above its parent's through another source: a node's
    # priority is the least along its path, so sorting keeps parents first.
    for c in range(1, m):
        p = out_parents[c]
        if p > 0 and out_scores[c] > out_scores[p]:
            out_scores[c] = out_scores[p]
    for c in range(m):
        order_key[c] = -out_scores[c] if c > 0 else -np.inf
    order = np.argsort(order_key[:m], kind="mergesort")
    keep = min(m, budget + 1)
    rank = np.empty(m, np.int32)
    for r in range(m):
        rank[order[r]] = r
    t, p, d, s, src = out_tokens[:m].copy(), out_parents[:m].copy(), out_depths[:m].copy(), out_scores[:m].copy(), \
        out_sources[:m].copy()
    for r in range(keep):
        c = order[r]
        out_tokens[r] = t[c]
        out_parents[r] = rank[p[c]] if c > 0 else -1
        out_depths[r] = d[c]
        out_scores[r] = s[c]
        out_sources[r] = src[c]
    for i in range(n):   # each input node's index in the result, -1 where the cut dropped it
        r = rank[merged_of[i]]
        merged_of[i] = r if r < keep else -1
    return keep


def warm_up() -> None:
    """Compile (or load from numba's cache) `merge` once with the types the drafters pass."""
    size = 9
    tokens = np.array([1, 2, 3, 4, 5, 6, 7, 8, 0], np.int32)
    parents = np.array([-1, 0, 1, 0, 3, -1, 5, 6, 0], np.int32)
    scores = np.linspace(1.0, 0.2, size).astype(np.float32)
    sources = np.zeros(size, np.int32)
    n = size - 1
    merge(tokens, parents, scores, sources, n, 8, tokens.copy(), parents.copy(), tokens.copy(), scores.copy(),
          sources.copy(), np.zeros(size, np.int32), np.zeros(size, np.int32), np.zeros(size, np.int32),
          np.zeros(size, np.float32))
