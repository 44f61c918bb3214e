"""Numba kernels of the n-gram drafter: the multi-level n-gram tables of ANPD ("Lossless
Acceleration of Large Language Model via Adaptive N-gram Parallel Decoding", Ou et al., 2024,
Algorithms 1-2), and the order-aware hash they and the Jacobi pool (jacobi_kernels) key rows by.

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
"""
from collections import namedtuple

import numba as nb
import numpy as np

Tables = namedtuple("Tables", "keys nexts counts stamps clock")

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


# -- hashing ---------------------------------------------------------------------------------------
@nb.njit(cache=True, inline="always")
def key_hash(tokens, begin, length):
    """FNV-1a over the 32-bit values of tokens[begin:begin+length] (order-aware)."""
    h = FNV_OFFSET
    for i in range(begin, begin + length):
        h = (h ^ np.uint64(np.uint32(tokens[i]))) * FNV_PRIME
    return h


@nb.njit(cache=True, inline="always")
def bucket(h, n_buckets):
    """Fold the high bits in (FNV's low bits mix least), then mask: n_buckets is a power of two."""
    return np.int64((h ^ (h >> _SHIFT)) & np.uint64(n_buckets - 1))


# -- n-gram tables ---------------------------------------------------------------------------------
@nb.njit(cache=True)
def find_row(tables, level, tokens, begin):
    """Row of level `level` holding the key tokens[begin:begin+level+1], or -1."""
    length = level + 1
    base = bucket(key_hash(tokens, begin, length), tables.stamps.shape[1] // WAYS) * WAYS
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
        base = bucket(key_hash(tokens, begin, length), tables.stamps.shape[1] // WAYS) * WAYS
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
