"""Numba kernels of the n-gram drafters: the multi-level n-gram tables of ANPD ("Lossless
Acceleration of Large Language Model via Adaptive N-gram Parallel Decoding", Ou et al., 2024,
Algorithms 1-2), the Jacobi window and n-gram pool of Lookahead Decoding (Fu et al., 2024, §3.1-3.3),
and the merge of several draft trees into one.

N-gram tables (`Tables`). Level i (n = i + 2) maps the last n - 1 tokens to the tokens that
followed them, with counts. Each level is a set-associative table of `rows` rows, `WAYS` rows per
set: a key's set is an order-aware hash of its tokens (FNV-1a, token by token: (a, b) and (b, a)
land apart; an XOR of per-token hashes would not), the row holds the whole key, so a hash collision
never returns another key's tokens. Eviction: a new key takes an empty row of its set, else the
row touched least recently (`stamps`: a per-table clock). Each row keeps its `choices` most
frequent next tokens, best first (a count that overtakes its neighbour moves ahead; equal counts
keep the older first); a new next token in a full row replaces the last one.

    keys    int32[levels, rows, levels]   the key of level i in columns 0..i
    nexts   int32[levels, rows, choices]  next tokens, best first; -1: empty
    counts  int32[levels, rows, choices]  how often each followed the key
    stamps  int64[levels, rows]           last touch (0: empty row)
    clock   int64[1]

Jacobi window (`window`: int32[N - 1, W]): level l, position j. As tree nodes (after the
candidates, `window_parents`): level-0 token j's parent is level-0 token j - 1 (the root for j = 0);
a level-l token's parent is the level-(l-1) token one position before it (the root for j = 0), so
every node at position j sits at depth j + 1. The model's token at node (l, j) continues that
node's prefix, i.e. it is a guess for position j + 1 one Jacobi iteration newer.

Pool (`Pool`): direct-mapped by the n-gram's first token (a new key evicts the row's old key and
its n-grams); each row holds at most G n-grams (the N - 1 tokens after the key), least recently
used evicted.

    key     int32[rows]                 first token (-1: empty)
    grams   int32[rows, G, N - 1]
    stamps  int64[rows, G]              last use (0: empty)
    clock   int64[1]
"""
from collections import namedtuple

import numba as nb
import numpy as np

Tables = namedtuple("Tables", "keys nexts counts stamps clock")
Pool = namedtuple("Pool", "key grams stamps clock")

WAYS = 4
FNV_OFFSET = np.uint64(14695981039346656037)
FNV_PRIME = np.uint64(1099511628211)
_SHIFT = np.uint64(29)


def new_tables(levels: int, rows: int, choices: int) -> Tables:
    """Empty tables: `levels` levels (n = 2 .. levels + 1) of `rows` rows (a multiple of WAYS, the
    number of sets a power of two), `choices` next tokens per row. np.zeros: pages the tables never
    touch cost nothing."""
    return Tables(keys=np.zeros((levels, rows, levels), np.int32), nexts=np.full((levels, rows, choices), -1, np.int32),
                  counts=np.zeros((levels, rows, choices), np.int32), stamps=np.zeros((levels, rows), np.int64),
                  clock=np.zeros(1, np.int64))


def new_pool(rows: int, per_key: int, gram_tail: int) -> Pool:
    return Pool(key=np.full(rows, -1, np.int32), grams=np.zeros((rows, per_key, gram_tail), np.int32),
                stamps=np.zeros((rows, per_key), np.int64), clock=np.zeros(1, np.int64))


# -- hashing ---------------------------------------------------------------------------------------
@nb.njit(cache=True, inline="always")
def key_hash(tokens, begin, length):
    """FNV-1a over the 32-bit values of tokens[begin:begin+length] (order-aware)."""
    h = FNV_OFFSET
    for i in range(begin, begin + length):
        h = (h ^ np.uint64(np.uint32(tokens[i]))) * FNV_PRIME
    return h


@nb.njit(cache=True, inline="always")
def _bucket(h, n_buckets):
    """Fold the high bits in (FNV's low bits mix least), then mask: n_buckets is a power of two."""
    return np.int64((h ^ (h >> _SHIFT)) & np.uint64(n_buckets - 1))


# -- n-gram tables ---------------------------------------------------------------------------------
@nb.njit(cache=True)
def find_row(tables, level, tokens, begin):
    """Row of level `level` holding the key tokens[begin:begin+level+1], or -1."""
    length = level + 1
    base = _bucket(key_hash(tokens, begin, length), tables.stamps.shape[1] // WAYS) * WAYS
    for w in range(WAYS):
        row = base + w
        if tables.stamps[level, row] == 0:
            continue
        same = True
        for i in range(length):
            if tables.keys[level, row, i] != tokens[begin + i]:
                same = False
                break
        if same:
            return row
    return -1


@nb.njit(cache=True)
def insert(tables, level, tokens, begin, next_token):
    """Count `next_token` after the key tokens[begin:begin+level+1] at level `level`."""
    length = level + 1
    row = find_row(tables, level, tokens, begin)
    tables.clock[0] += 1
    if row < 0:
        base = _bucket(key_hash(tokens, begin, length), tables.stamps.shape[1] // WAYS) * WAYS
        row = base
        for w in range(1, WAYS):  # an empty row (stamp 0) first, else the least recently touched
            if tables.stamps[level, base + w] < tables.stamps[level, row]:
                row = base + w
        for i in range(length):
            tables.keys[level, row, i] = tokens[begin + i]
        tables.nexts[level, row, :] = -1
        tables.counts[level, row, :] = 0
    tables.stamps[level, row] = tables.clock[0]
    nexts, counts = tables.nexts, tables.counts
    choices = nexts.shape[2]
    slot = -1
    for c in range(choices):
        if nexts[level, row, c] == next_token:
            slot = c
            break
        if nexts[level, row, c] < 0:
            break
    if slot < 0:
        slot = choices - 1
        for c in range(choices):
            if nexts[level, row, c] < 0:
                slot = c
                break
        nexts[level, row, slot] = next_token
        counts[level, row, slot] = 0
    counts[level, row, slot] += 1
    while slot > 0 and counts[level, row, slot] > counts[level, row, slot - 1]:
        t, k = nexts[level, row, slot - 1], counts[level, row, slot - 1]
        nexts[level, row, slot - 1], counts[level, row, slot - 1] = nexts[level, row, slot], counts[level, row, slot]
        nexts[level, row, slot], counts[level, row, slot] = t, k
        slot -= 1


@nb.njit(cache=True)
def ingest(tables, tokens, begin, end):
    """Count every n-gram (every level) that ends at positions begin .. end-1 of `tokens`."""
    levels = tables.stamps.shape[0]
    for p in range(begin, end):
        for level in range(levels):
            if p - level - 1 < 0:
                break
            insert(tables, level, tokens, p - level - 1, tokens[p])


@nb.njit(cache=True)
def longest_row(tables, tail, width):
    """(level, row) of the longest key that ends `tail` (its last `width` entries are real tokens,
    the oldest first), longest first as ANPD's Algorithm 2; (-1, -1) when no level knows it."""
    levels = tables.stamps.shape[0]
    n = tail.shape[0]
    for level in range(min(levels, width) - 1, -1, -1):
        row = find_row(tables, level, tail, n - level - 1)
        if row >= 0:
            return level, row
    return -1, -1


@nb.njit(cache=True)
def _start_tail(tails, context, n_context):
    """tails[0] = the last tails.shape[1] tokens of the context (-1 before its start); returns how
    many are real."""
    width = tails.shape[1]
    real = min(width, n_context)
    for i in range(width):
        src = n_context - width + i
        tails[0, i] = context[src] if src >= 0 else -1
    return real


@nb.njit(cache=True)
def _push_tail(tails, parent, node, token):
    width = tails.shape[1]
    for i in range(width - 1):
        tails[node, i] = tails[parent, i + 1]
    tails[node, width - 1] = token


@nb.njit(cache=True)
def draft(tables, context, n_context, budget, max_depth, branching, out_tokens, out_parents, out_depths,
          out_scores, tails, widths, front_score, front_item):
    """A best-first draft of at most `budget` nodes after the root context[n_context-1].

    Each node's children are the `branching` best next tokens of the longest table key ending at
    that node (its tail: context + the draft path), with score = parent score * count / row total;
    the best frontier entry is added next, so the nodes come out best first and every prefix is a
    tree. branching = 1 is ANPD's chain: K = max_depth tokens, each the most frequent continuation
    of the longest known key, fed back as the next query. Returns the node count (root included)."""
    out_tokens[0] = context[n_context - 1]
    out_parents[0] = -1
    out_depths[0] = 0
    out_scores[0] = 1.0
    widths[0] = _start_tail(tails, context, n_context)
    n = 1
    n_front = 0
    node = 0
    while True:
        # expand `node`: its children join the frontier
        if out_depths[node] < max_depth:
            level, row = longest_row(tables, tails[node], widths[node])
            if level >= 0:
                total = 0
                for c in range(tables.counts.shape[2]):
                    total += tables.counts[level, row, c]
                for c in range(min(branching, tables.nexts.shape[2])):
                    token = tables.nexts[level, row, c]
                    if token < 0:
                        break
                    front_score[n_front] = out_scores[node] * tables.counts[level, row, c] / total
                    front_item[n_front, 0] = node
                    front_item[n_front, 1] = token
                    n_front += 1
        if n > budget or n_front == 0:
            break
        best = 0
        for f in range(1, n_front):  # ties: the earliest pushed (a parent's better child first)
            if front_score[f] > front_score[best]:
                best = f
        parent, token, score = front_item[best, 0], front_item[best, 1], front_score[best]
        for f in range(best, n_front - 1):  # keep push order (ties stay deterministic)
            front_score[f] = front_score[f + 1]
            front_item[f, 0] = front_item[f + 1, 0]
            front_item[f, 1] = front_item[f + 1, 1]
        n_front -= 1
        node = n
        out_tokens[node] = token
        out_parents[node] = parent
        out_depths[node] = out_depths[parent] + 1
        out_scores[node] = score
        _push_tail(tails, parent, node, token)
        widths[node] = min(widths[parent] + 1, tails.shape[1])
        n += 1
    return n


@nb.njit(cache=True)
def learn_from_model(tables, context, n_context, tokens, parents, n_candidates, node_tokens, on_path, tails, widths):
    """The model's token at every evaluated candidate off the accepted path continues that node's
    prefix (context + path to it): count it at every level. Path nodes are skipped: their
    continuations arrive as accepted tokens."""
    widths[0] = _start_tail(tails, context, n_context)
    width = tails.shape[1]
    levels = tables.stamps.shape[0]
    for i in range(n_candidates):
        if i > 0:
            _push_tail(tails, parents[i], i, tokens[i])
            widths[i] = min(widths[parents[i]] + 1, width)
        if on_path[i] or node_tokens[i] < 0:
            continue
        for level in range(min(levels, widths[i])):
            insert(tables, level, tails[i], width - level - 1, node_tokens[i])


# -- the Jacobi window and the n-gram pool ----------------------------------------------------------
@nb.njit(cache=True)
def window_parents(n_levels, width, base, out):
    """Parents of the window's nodes (level-major: node base + l * width + j), as in the module
    docstring; the root is node 0."""
    for l in range(n_levels):
        for j in range(width):
            i = l * width + j
            if j == 0:
                out[i] = 0
            elif l == 0:
                out[i] = base + j - 1
            else:
                out[i] = base + (l - 1) * width + j - 1


@nb.njit(cache=True, inline="always")
def _pool_row(pool, first):
    key = np.empty(1, np.int32)
    key[0] = first
    return _bucket(key_hash(key, 0, 1), pool.stamps.shape[0])


@nb.njit(cache=True)
def pool_insert(pool, first, gram):
    """Add the n-gram first + gram to the pool (or mark it used again)."""
    per_key = pool.stamps.shape[1]
    row = _pool_row(pool, first)
    pool.clock[0] += 1
    if pool.key[row] != first:  # a new key takes the row: the old key's n-grams go
        pool.key[row] = first
        pool.stamps[row, :] = 0
    slot = -1
    oldest = 0
    for g in range(per_key):
        if pool.stamps[row, g] == 0:
            if slot < 0:
                slot = g
            continue
        same = True
        for k in range(gram.shape[0]):
            if pool.grams[row, g, k] != gram[k]:
                same = False
                break
        if same:
            pool.stamps[row, g] = pool.clock[0]
            return
        if pool.stamps[row, g] < pool.stamps[row, oldest] or pool.stamps[row, oldest] == 0:
            oldest = g
    if slot < 0:
        slot = oldest
    pool.grams[row, slot, :] = gram
    pool.stamps[row, slot] = pool.clock[0]


@nb.njit(cache=True)
def pool_lookup(pool, first, out):
    """Copy the n-grams that start with `first` into out (most recent first); returns how many."""
    row = _pool_row(pool, first)
    if pool.key[row] != first:
        return 0
    n = 0
    order = np.argsort(-pool.stamps[row])
    for g in order:
        if pool.stamps[row, g] == 0:
            break
        out[n, :] = pool.grams[row, g]
        n += 1
    return n


@nb.njit(cache=True)
def window_step(window, n_levels, outs, pool):
    """After a verify: harvest the window's completed n-grams into the pool, then one Jacobi
    iteration and a shift by one position (the root moved on). `outs` int32[n_levels, W]: the
    model's token at each window node (-1: not evaluated; the old guess stays). Returns the new
    number of levels (they grow to N - 1 while the window fills)."""
    top_max, width = window.shape
    top = n_levels - 1
    if n_levels == top_max:  # full: every top-level node ends an n-gram along its diagonal
        gram = np.empty(top_max, np.int32)
        for j in range(top, width):
            ok = outs[top, j] >= 0
            for l in range(1, top_max):
                gram[l - 1] = window[l, j - top + l]
            gram[top_max - 1] = outs[top, j]
            if ok:
                pool_insert(pool, window[0, j - top], gram)
    old = window.copy()
    if n_levels == top_max:
        # time shift: level l takes level l + 1's guesses one position on; the top takes the outputs
        for l in range(top):
            for j in range(width - 1):
                window[l, j] = old[l + 1, j + 1]
            src_level = l + 1 if l == 0 else l  # the continuation of new(l, W-1)'s parent
            if outs[src_level, width - 1] >= 0:
                window[l, width - 1] = outs[src_level, width - 1]
            else:
                window[l, width - 1] = old[l + 1, width - 1]
        for j in range(width):
            window[top, j] = outs[top, j] if outs[top, j] >= 0 else old[top, j]
        return n_levels
    # filling: each level moves one position on; a new level holds the top's outputs
    for l in range(n_levels):
        for j in range(width - 1):
            window[l, j] = old[l, j + 1]
        src = l - 1 if l > 0 else 0
        if outs[src, width - 1] >= 0:
            window[l, width - 1] = outs[src, width - 1]
    for j in range(width):
        window[n_levels, j] = outs[top, j] if outs[top, j] >= 0 else old[top, j]
    return n_levels + 1


# -- merging draft trees ---------------------------------------------------------------------------
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
    """Compile (or load from numba's cache) every kernel once with the types the drafters pass."""
    tables = new_tables(3, 16, 2)
    stream = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3], np.int32)
    ingest(tables, stream, 0, stream.shape[0])
    size = 9
    tokens, parents, depths = (np.zeros(size, np.int32) for _ in range(3))
    scores = np.zeros(size, np.float32)
    tails, widths = np.zeros((size, 3), np.int32), np.zeros(size, np.int64)
    front_score, front_item = np.zeros(4 * size, np.float32), np.zeros((4 * size, 2), np.int32)
    n = draft(tables, stream, 5, 8, 7, 2, tokens, parents, depths, scores, tails, widths, front_score, front_item)
    on_path = np.zeros(size, np.bool_)
    learn_from_model(tables, stream, 5, tokens, parents, n, tokens.copy(), on_path, tails, widths)
    window = np.zeros((2, 3), np.int32)
    pool = new_pool(8, 2, 2)
    window_parents(2, 3, 1, np.zeros(6, np.int32))
    levels = window_step(window, 1, np.ones((1, 3), np.int32), pool)
    window_step(window, levels, np.ones((2, 3), np.int32), pool)
    pool_lookup(pool, 1, np.zeros((2, 2), np.int32))
    sources = np.zeros(size, np.int32)
    merge(tokens, parents - 1, scores, sources, n - 1, 8, tokens.copy(), parents.copy(), depths.copy(), scores.copy(),
          sources.copy(), np.zeros(size, np.int32), np.zeros(size, np.int32), np.zeros(size, np.int32),
          np.zeros(size, np.float32))
