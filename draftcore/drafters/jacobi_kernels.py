"""Numba kernels of the Jacobi drafter: the Jacobi window and n-gram pool of Lookahead Decoding
(Fu et al., 2024, §3.1-3.3).

Jacobi window (`window`: int32[N - 1, W]): level l, position j. As tree nodes (after the
candidates, `window_parents`): level-0 token j's parent is level-0 token j - 1 (the root for j = 0);
a level-l token's parent is the level-(l-1) token one position before it (the root for j = 0), so
every node at position j sits at depth j + 1. The model's token at node (l, j) continues that
node's prefix, i.e. it is a guess for position j + 1 one Jacobi iteration newer.

Pool (`Pool`): direct-mapped by the n-gram's first token (its row: ngram_kernels' hash; a new key
evicts the row's old key and its n-grams); each row holds at most G n-grams (the N - 1 tokens
after the key), least recently used evicted.

    key     int32[rows]                 first token (-1: empty)
    grams   int32[rows, G, N - 1]
    stamps  int64[rows, G]              last use (0: empty)
    clock   int64[1]
"""
from collections import namedtuple

import numba as nb
import numpy as np

from .ngram_kernels import bucket, key_hash

Pool = namedtuple("Pool", "key grams stamps clock")


def new_pool(rows: int, per_key: int, gram_tail: int) -> Pool:
    return Pool(key=np.full(rows, -1, np.int32), grams=np.zeros((rows, per_key, gram_tail), np.int32),
                stamps=np.zeros((rows, per_key), np.int64), clock=np.zeros(1, np.int64))


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
    return bucket(key_hash(key, 0, 1), pool.stamps.shape[0])


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


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel once with the types JacobiDrafter passes."""
    window = np.zeros((2, 3), np.int32)
    pool = new_pool(8, 2, 2)
    window_parents(2, 3, 1, np.zeros(6, np.int32))
    levels = window_step(window, 1, np.ones((1, 3), np.int32), pool)
    window_step(window, levels, np.ones((2, 3), np.int32), pool)
    pool_lookup(pool, 1, np.zeros((2, 2), np.int32))
