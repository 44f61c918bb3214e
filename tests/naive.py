"""Slow, obviously-correct pure-Python twins of draftcore's jitted code (stumpy's tests/naive.py).

Tests run the real thing and the twin on the same inputs and require the same answer. The twins
use dicts and lists, walk from the root instead of keeping a `front`, search linearly instead of
keeping heaps and child lists, and share nothing with draftcore but the documented constants.

    NaiveTrie            the trie drafter's counting / pruning / elimination / retrieval rules, and
                         a request's learning of the model's tokens (fixtures.naive_trie)
    naive_trie_contents  {token path: (PROMPT, OUTPUT, RECENT)} of a NaiveTrie
    pool_contents        the same mapping read from a TrieDrafter's node-pool arrays
    naive_child_order    {token path: child tokens in the order of the pool's child lists}
    pool_child_order     the same read from the pool
    naive_branch_counts  OUTPUT counts straight from the definition (no capacity pressure)
    naive_greedy_accept  greedy acceptance of one verified tree
    NaiveRowDrafter      RowDrafter's row bookkeeping and cost rule, with known request identities
    naive_would_accept   what each node of a proposal would have done, from the emitted tokens
    naive_expected_accepted  the auto budget's tree-consistent expected accepted tokens per prefix
    naive_learn_outcomes     the auto budget's counting of a proposal's outcomes, and the prefix it
                             would pick on the calibration alone
    naive_count_verified     the composite's calibration counts from one verified tree
    naive_count_outcomes     the composite's calibration counts from what the emitted tokens settle
    naive_measured_growth    the auto budget's guess of a size's cost from the growth measured around it
    naive_cost_estimates     every menu size's cost as the auto budget's table guesses it (no prior)
    naive_menu_values        the auto budget's value of each menu size, the floor guard's cut, the best
                             entry and the hopeless test, as one choice makes them
"""
from __future__ import annotations

import math

import numpy as np

# The trie's twin lives with the fixtures, where benchmarks/trie_speed.py times it too.
from fixtures.naive_trie import NaiveTrie  # noqa: F401

F32 = np.float32


# -- whole-trie comparisons -----------------------------------------------------------------------
def naive_trie_contents(trie: NaiveTrie) -> dict:
    """{token path (tuple): (PROMPT, OUTPUT, RECENT)} of every node."""
    out = {}
    stack = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            out[path + (token,)] = (float(child.prompt), float(child.output), float(child.recent))
            stack.append((path + (token,), child))
    return out


def naive_child_order(trie: NaiveTrie) -> dict:
    """{token path: tuple of child tokens, newest first} for every node with children (root = ())."""
    out = {}
    stack = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        if node.children:
            out[path] = tuple(c.token for c in node.listed_children())
        for token, child in node.children.items():
            stack.append((path + (token,), child))
    return out


def _pool_walk(state):
    """Yield (path, node, child list) over a node pool (drafter.pool.state, a trie_pool_kernels.TrieState),
    root first (node -1, path ())."""
    from draftcore.drafters.trie_pool_kernels import CHILD, ROOT_FIRST, SIBLING, TOKEN
    links, meta = state.links, state.meta
    capacity = links.shape[0]

    def children(first):
        kids, c = [], int(first)
        while c >= 0:
            kids.append(c)
            assert len(kids) <= capacity, "cycle in a child list"
            c = int(links[c, SIBLING])
        return kids

    stack = [((), -1, children(meta[ROOT_FIRST]))]
    while stack:
        path, node, kids = stack.pop()
        yield path, node, kids
        for c in kids:
            stack.append((path + (int(links[c, TOKEN]),), c, children(links[c, CHILD])))
            assert len(stack) <= capacity + 1, "cycle in the pool"


def pool_contents(state) -> dict:
    """{token path: (PROMPT, OUTPUT, RECENT)} read from a pool's arrays (drafter.pool.state)."""
    from draftcore.drafters.trie_pool_kernels import OUTPUT, PROMPT, RECENT
    freq = state.freq
    return {path: (float(freq[node, PROMPT]), float(freq[node, OUTPUT]), float(freq[node, RECENT]))
            for path, node, _ in _pool_walk(state) if node >= 0}


def naive_own_contents(trie: NaiveTrie, request) -> dict:
    """{token path: (own PROMPT, own RECENT)} of one request, nodes where either is not zero."""
    out = {}
    stack = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            own = child.own.get(request.id)
            if own is not None and (own[0] != 0.0 or own[1] != 0.0):
                out[path + (token,)] = (float(own[0]), float(own[1]))
            stack.append((path + (token,), child))
    return out


def pool_own_contents(state, slot: int) -> dict:
    """The same read from a pool's `own` arrays (the request's slot)."""
    from draftcore.drafters.trie_pool_kernels import own_counts
    own = own_counts(state, slot)
    return {path: (float(own[node, 0]), float(own[node, 1])) for path, node, _ in _pool_walk(state)
            if node >= 0 and (own[node, 0] != 0.0 or own[node, 1] != 0.0)}


def pool_child_order(state) -> dict:
    from draftcore.drafters.trie_pool_kernels import TOKEN
    links = state.links
    return {path: tuple(int(links[c, TOKEN]) for c in kids) for path, _, kids in _pool_walk(state) if kids}


def naive_branch_counts(requests, branch_length: int) -> dict:
    """{path: (PROMPT, OUTPUT, RECENT)} from the definition after (prompt, output) requests, none
    running, nothing pruned: OUTPUT = the number of branches that start in an output and pass
    through the path; prompt branches are gone and RECENT is zero."""
    counts = {}
    for prompt, output in requests:
        stream = list(prompt) + list(output)
        for s in range(len(prompt), len(stream)):
            for e in range(s + 1, min(s + branch_length, len(stream)) + 1):
                key = tuple(stream[s:e])
                counts[key] = counts.get(key, 0) + 1
    return {k: (0.0, float(v), 0.0) for k, v in counts.items()}


# -- acceptance -----------------------------------------------------------------------------------
def naive_greedy_accept(tokens, parents, model_tokens):
    """(path of node indices root first, next token): follow the first child holding the model's
    token until there is none."""
    path = [0]
    while True:
        u = path[-1]
        kids = [v for v in range(len(tokens)) if parents[v] == u and tokens[v] == model_tokens[u]]
        if not kids:
            return path, int(model_tokens[u])
        path.append(kids[0])


# -- the n-gram drafters (draftcore.drafters.ngram_kernels, jacobi_kernels, merge_kernels) ---------------
# Twins of the n-gram tables, the Jacobi window step and its n-gram pool, and the merge of draft trees,
# written from those modules' docstrings with dicts and lists: no arrays, no "front" buffers.
#
#   NaiveNGramTables     the set-associative n-gram tables: insert / ingest / longest, contents()
#   ngram_tables_rows    the same rows read from the kernels' `Tables` arrays
#   naive_ngram_draft    ngram_kernels.draft: best-first over the tables' continuations
#   NaivePool            the Jacobi n-gram pool: insert / lookup, contents()
#   jacobi_pool_contents the same read from the kernels' `Pool` arrays
#   naive_window_step    jacobi_kernels.window_step: harvest, then the time and position shift
#   naive_merge_trees    merge_kernels.merge (draftcore.drafters.merge.merge_trees)

NGRAM_WAYS = 4  # ngram_kernels.WAYS: rows per set
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_U64 = (1 << 64) - 1


def fnv1a(tokens) -> int:
    """FNV-1a 64-bit over the tokens' uint32 values, token by token (order-aware)."""
    h = _FNV_OFFSET
    for t in tokens:
        h = ((h ^ (int(t) & 0xFFFFFFFF)) * _FNV_PRIME) & _U64
    return h


def hash_bucket(tokens, n_buckets: int) -> int:
    """The set (or pool row) of a key: the hash with its high bits folded in, masked (n_buckets is a
    power of two)."""
    h = fnv1a(tokens)
    return (h ^ (h >> 29)) & (n_buckets - 1)


class _NGramRow:
    __slots__ = ("key", "nexts", "stamp")

    def __init__(self, key: tuple):
        self.key = key
        self.nexts: list = []  # [token, count], best first
        self.stamp = 0


class NaiveNGramTables:
    """ANPD's multi-level n-gram tables, the long way: level i (n = i + 2) holds keys of i + 1
    tokens in sets of NGRAM_WAYS rows; `sets[level][s][way]` is a row or None (empty)."""

    def __init__(self, levels: int, rows: int, choices: int):
        assert rows % NGRAM_WAYS == 0
        self.levels, self.rows, self.choices = levels, rows, choices
        self.n_sets = rows // NGRAM_WAYS
        self.sets = [[[None] * NGRAM_WAYS for _ in range(self.n_sets)] for _ in range(levels)]
        self.clock = 0  # one clock for every level, ticked by every insert

    def _find(self, level: int, key: tuple):
        ways = self.sets[level][hash_bucket(key, self.n_sets)]
        for row in ways:
            if row is not None and row.key == key:
                return row
        return None

    def insert(self, level: int, key, next_token: int) -> None:
        """Count `next_token` after `key` (level + 1 tokens) at `level`."""
        key = tuple(int(t) for t in key)
        assert len(key) == level + 1
        next_token = int(next_token)
        self.clock += 1
        row = self._find(level, key)
        if row is None:
            ways = self.sets[level][hash_bucket(key, self.n_sets)]
            empty = [w for w in range(NGRAM_WAYS) if ways[w] is None]
            if empty:
                way = empty[0]
            else:  # the least recently touched row is evicted
                way = min(range(NGRAM_WAYS), key=lambda w: ways[w].stamp)
            row = ways[way] = _NGramRow(key)
        row.stamp = self.clock
        known = [t for t, _ in row.nexts]
        if next_token in known:
            i = known.index(next_token)
        elif len(row.nexts) < self.choices:
            row.nexts.append([next_token, 0])
            i = len(row.nexts) - 1
        else:  # a full row: the new token replaces the last one
            row.nexts[-1] = [next_token, 0]
            i = self.choices - 1
        row.nexts[i][1] += 1
        while i > 0 and row.nexts[i][1] > row.nexts[i - 1][1]:  # overtakes its left neighbour
            row.nexts[i - 1], row.nexts[i] = row.nexts[i], row.nexts[i - 1]
            i -= 1

    def ingest(self, tokens, begin: int, end: int) -> None:
        """Every n-gram (every level) that ends at positions begin .. end - 1."""
        tokens = [int(t) for t in tokens]
        for p in range(begin, end):
            for level in range(self.levels):
                if p - level - 1 < 0:
                    break
                self.insert(level, tokens[p - level - 1:p], tokens[p])

    def longest(self, tail):
        """(level, row) of the longest key that ends `tail` (real tokens, oldest first), or None."""
        tail = [int(t) for t in tail]
        for level in range(min(self.levels, len(tail)) - 1, -1, -1):
            row = self._find(level, tuple(tail[len(tail) - level - 1:]))
            if row is not None:
                return level, row
        return None

    def contents(self) -> dict:
        """{(level, key): [(next, count), ...] best first}."""
        return {(level, row.key): [tuple(x) for x in row.nexts]
                for level in range(self.levels) for ways in self.sets[level] for row in ways if row is not None}

    def rows_by_index(self) -> dict:
        """{(level, row index = set * NGRAM_WAYS + way): (key, [(next, count), ...], stamp)}: where
        each key lives, to compare placement and eviction too."""
        out = {}
        for level in range(self.levels):
            for s, ways in enumerate(self.sets[level]):
                for w, row in enumerate(ways):
                    if row is not None:
                        out[(level, s * NGRAM_WAYS + w)] = (row.key, [tuple(x) for x in row.nexts], row.stamp)
        return out


def ngram_tables_rows(tables) -> dict:
    """NaiveNGramTables.rows_by_index read from the kernels' `Tables` arrays."""
    out = {}
    levels, rows = tables.stamps.shape
    for level in range(levels):
        for r in range(rows):
            if tables.stamps[level, r] == 0:
                continue
            key = tuple(int(t) for t in tables.keys[level, r, :level + 1])
            nexts = []
            for c in range(tables.nexts.shape[2]):
                if tables.nexts[level, r, c] < 0:
                    break
                nexts.append((int(tables.nexts[level, r, c]), int(tables.counts[level, r, c])))
            out[(level, r)] = (key, nexts, int(tables.stamps[level, r]))
    return out


def ngram_tables_contents(tables) -> dict:
    """NaiveNGramTables.contents read from the kernels' `Tables` arrays."""
    return {(level, key): nexts for (level, _), (key, nexts, _) in ngram_tables_rows(tables).items()}


def naive_ngram_draft(tables: NaiveNGramTables, context, budget: int, max_depth: int, branching: int):
    """(tokens, parents, depths, scores) of ngram_kernels.draft: every node's children are the
    `branching` best continuations of the longest key ending at that node (context + path), scored
    parent score * count / row total; the best frontier entry is added next (ties: the earliest
    pushed), up to `budget` candidates."""
    context = [int(t) for t in context]
    tokens, parents, depths, scores = [context[-1]], [-1], [0], [F32(1.0)]
    tails = [context[-tables.levels:]]
    frontier = []  # (score, parent, token) in push order
    node = 0
    while True:
        if depths[node] < max_depth:
            hit = tables.longest(tails[node])
            if hit is not None:
                _, row = hit
                total = sum(c for _, c in row.nexts)
                for token, count in row.nexts[:branching]:
                    # float32 parent score times a float64 ratio, rounded to float32 (as the kernel)
                    frontier.append((F32(float(scores[node]) * count / total), node, token))
        if len(tokens) > budget or not frontier:
            break
        best = max(range(len(frontier)), key=lambda f: (frontier[f][0], -f))
        score, parent, token = frontier.pop(best)
        tokens.append(token)
        parents.append(parent)
        depths.append(depths[parent] + 1)
        scores.append(score)
        tails.append((tails[parent] + [token])[-tables.levels:])
        node = len(tokens) - 1
    return tokens, parents, depths, scores


class NaivePool:
    """Lookahead decoding's n-gram pool: `rows` rows, direct-mapped by the hash of an n-gram's first
    token (a new first token evicts the row's old one and its n-grams); a row keeps at most
    `per_key` n-grams (the `gram_len` tokens after the first), the least recently used evicted."""

    def __init__(self, rows: int, per_key: int, gram_len: int):
        self.rows, self.per_key, self.gram_len = rows, per_key, gram_len
        self.table = [None] * rows  # row -> [first token, {gram tuple: last use}]
        self.clock = 0

    def insert(self, first: int, gram) -> None:
        first, gram = int(first), tuple(int(t) for t in gram)
        assert len(gram) == self.gram_len
        row = hash_bucket([first], self.rows)
        self.clock += 1
        if self.table[row] is None or self.table[row][0] != first:
            self.table[row] = [first, {}]
        grams = self.table[row][1]
        if gram not in grams and len(grams) == self.per_key:
            del grams[min(grams, key=grams.get)]
        grams[gram] = self.clock

    def lookup(self, first: int) -> list:
        """The n-grams (tails) that start with `first`, most recently used first."""
        entry = self.table[hash_bucket([int(first)], self.rows)]
        if entry is None or entry[0] != int(first):
            return []
        return sorted(entry[1], key=entry[1].get, reverse=True)

    def contents(self) -> dict:
        """{row: (first token, [(gram, last use), ...] most recent first)}."""
        return {r: (e[0], sorted(e[1].items(), key=lambda kv: -kv[1])) for r, e in enumerate(self.table)
                if e is not None}


def jacobi_pool_contents(pool) -> dict:
    """NaivePool.contents read from the kernels' `Pool` arrays."""
    out = {}
    for r in range(pool.key.shape[0]):
        if pool.key[r] < 0:
            continue
        used = [(tuple(int(t) for t in pool.grams[r, g]), int(pool.stamps[r, g]))
                for g in range(pool.stamps.shape[1]) if pool.stamps[r, g] > 0]
        out[r] = (int(pool.key[r]), sorted(used, key=lambda kv: -kv[1]))
    return out


def window_node_parent(l: int, j: int):
    """The window node (l, j)'s parent as (level, position), or None for the root: level 0 is a
    chain; a level-l token hangs below the level-(l-1) token one position before it."""
    if j == 0:
        return None
    return (0, j - 1) if l == 0 else (l - 1, j - 1)


def naive_window_step(window, n_levels: int, outs, pool: NaivePool):
    """(new window as lists, new level count) after one verify, as jacobi_kernels.window_step; `pool`
    (a NaivePool) receives the harvested n-grams. window: (N - 1) x W tokens, its first n_levels
    levels in use; outs: n_levels x W, the model's token at each window node, -1: not evaluated."""
    old = [[int(t) for t in level] for level in window]
    outs = [[int(t) for t in level] for level in outs]
    top_max, width = len(old), len(old[0])
    top = n_levels - 1
    new = [list(level) for level in old]

    def out_at(node):
        return outs[node[0]][node[1]]

    if n_levels == top_max:
        # Harvest: each top node whose diagonal reaches level 0 (down-left, one level and one
        # position per step) ends an n-gram: the diagonal's tokens, then the model's token there.
        for j in range(width):
            diagonal = [(l, j - (top - l)) for l in range(top + 1)]
            if diagonal[0][1] < 0 or out_at((top, j)) < 0:
                continue
            gram = [old[l][p] for l, p in diagonal] + [out_at((top, j))]
            pool.insert(gram[0], gram[1:])
        # Time + position shift: each lower level takes the next level's guesses one position on
        # (new (l, j) holds old (l + 1, j + 1)); the top takes the model's tokens in place.
        for l in range(top):
            for j in range(width - 1):
                new[l][j] = old[l + 1][j + 1]
            # The last position: the model's token at the old node that now sits at its parent.
            # Its new parent is (l - 1, W - 2), or (0, W - 2) for level 0, which holds old
            # (l, W - 1), resp. old (1, W - 1) (with W = 1 the kernel takes the same nodes).
            source = (l, width - 1) if l > 0 else (1, width - 1)
            new[l][width - 1] = out_at(source) if out_at(source) >= 0 else old[l + 1][width - 1]
        for j in range(width):
            new[top][j] = out_at((top, j)) if out_at((top, j)) >= 0 else old[top][j]
        return new, n_levels
    # Filling: each level moves one position on, its last position the model's token at the old node
    # now at its parent; a new level above takes the top's tokens (a guess one iteration newer).
    for l in range(n_levels):
        for j in range(width - 1):
            new[l][j] = old[l][j + 1]
        parent_source = (l - 1, width - 1) if l > 0 else (0, width - 1)  # new parent's old node
        if out_at(parent_source) >= 0:
            new[l][width - 1] = out_at(parent_source)
    for j in range(width):
        new[n_levels][j] = out_at((top, j)) if out_at((top, j)) >= 0 else old[top][j]
    return new, n_levels + 1


def naive_merge_trees(root: int, tokens, parents, priority, sources, budget: int):
    """(tokens, parents, depths, scores, source bits, each input node's index) of
    merge_kernels.merge: the union of the trees' token paths (concatenated trees, parents -1 under
    the root); a path's priority is the least along it of the best priority any tree gives each of
    its prefixes; best first (ties: the order in which paths first appear), cut to `budget`
    candidates; an input node's index is its path's in the result, -1 where the cut dropped it."""
    best, bits, first_seen = {}, {}, []
    paths = []
    for i in range(len(tokens)):
        path = (paths[int(parents[i])] if parents[i] >= 0 else ()) + (int(tokens[i]),)
        paths.append(path)
        if path not in best:
            first_seen.append(path)
            best[path] = F32(priority[i])
            bits[path] = 0
        best[path] = max(best[path], F32(priority[i]))
        bits[path] |= 1 << int(sources[i])
    score = {}
    for path in first_seen:  # a prefix appears first, so its score is known
        score[path] = best[path] if len(path) == 1 else min(best[path], score[path[:-1]])
    order = sorted(range(len(first_seen)), key=lambda k: (-score[first_seen[k]], k))[:budget]
    kept = [first_seen[k] for k in order]
    index = {path: r + 1 for r, path in enumerate(kept)}
    out_tokens, out_parents, out_depths, out_scores, out_bits = [int(root)], [-1], [0], [F32(1.0)], [0]
    for path in kept:
        out_tokens.append(path[-1])
        out_parents.append(index[path[:-1]] if len(path) > 1 else 0)
        out_depths.append(len(path))
        out_scores.append(score[path])
        out_bits.append(bits[path])
    return out_tokens, out_parents, out_depths, out_scores, out_bits, [index.get(path, -1) for path in paths]


# -- the row drafter --------------------------------------------------------------------------------
class NaiveRowDrafter:
    """RowDrafter's rules written out with the identities a test engine knows (tests/row_engine.py):
    one real TrieRequest per request id (the trie kernels have their own twin, NaiveTrie), started,
    updated and finished through the Drafter protocol; a request's state index is the lowest free
    one when it first drafts (RowDrafter's table order, which fixes the order requests end in); the
    chain of first children cut by the cost rule with a calibration kept in Python floats.

    `by_row=True` plants the bug the row drafter must not have: a row's state is the state its row
    held last step, whoever holds the row now."""

    BINS, RANKS = 20, 6

    def __init__(self, drafter, *, max_rows, max_len, max_draft, token_cost, tree_nodes, memory, explore=0.25,
                 row_cost=0.16, match_cost=0.07, by_row=False):
        self.drafter, self.max_rows, self.max_len, self.max_draft = drafter, max_rows, max_len, max_draft
        self.explore, self.row_cost, self.match_cost = explore, row_cost, match_cost
        self.token_cost, self.tree_nodes, self.by_row = token_cost, tree_nodes, by_row
        self.keep = 1.0 - 1.0 / memory
        centres = [(b + 0.5) / self.BINS for b in range(self.BINS)]
        self.prior = {(b, k): (2.0, 2.0 * centres[b]) for b in range(self.BINS) for k in range(self.RANKS)}
        self.cells = dict(self.prior)   # (bin, rank) -> [offered, accepted]
        self.states = {}                # request id -> dict(index, request, n, chain, cells)
        self.row_ids = {}               # by_row: row -> the id whose state that row held

    def propose(self, rows, n_tokens, active, ids):
        """ids[r]: the request in row r (None: empty). Returns (chains: list of lists)."""
        n = len(n_tokens)
        if self.by_row:   # the planted bug: a row keeps its state, whoever holds it now
            ids = [self.row_ids.get(r, ids[r]) if ids[r] is not None else None for r in range(n)]
            for r in range(n):
                if ids[r] is not None:
                    self.row_ids[r] = ids[r]
        present = {q for q in ids if q is not None}
        for q in sorted((q for q in self.states if q not in present), key=lambda q: self.states[q]["index"]):
            self.states.pop(q)["request"].finish()
        self.cells = {c: (self.prior[c][0] + self.keep * (o - self.prior[c][0]),
                          self.prior[c][1] + self.keep * (a - self.prior[c][1])) for c, (o, a) in self.cells.items()}
        chains = [[] for _ in range(n)]
        drafting = []
        for r in range(n):   # the rows' new tokens first: every row is cut with the same calibration
            q, n_row = ids[r], int(n_tokens[r])
            if q is None:
                continue
            st = self.states.get(q)
            if not active[r] or n_row == 0:
                if st is not None:
                    st["chain"], st["cells"] = [], []
                continue
            row = [int(t) for t in rows[r, :n_row]]
            if st is None:
                used = {s["index"] for s in self.states.values()}
                index = min(i for i in range(self.max_rows) if i not in used)
                request = self.drafter.start(np.array(row[:-1], np.int32))
                request.update(np.array(row[-1:], np.int32))
                st = self.states[q] = dict(index=index, request=request, n=n_row, chain=[], cells=[])
            else:
                self._learn(st, row)
                if n_row > st["n"]:
                    st["request"].update(np.array(row[st["n"]:], np.int32))
                st["n"] = n_row
            drafting.append((r, st, row))
        n = len(drafting)   # rows verified in this step share it: a drafted token costs more of a row's share
        cost = self.token_cost if n <= 1 else self.token_cost * (1.0 + self.row_cost) / (1.0 / n + self.row_cost)
        for r, st, row in drafting:
            limit = min(self.max_draft, self.max_len - 1 - len(row))
            if limit > 0:
                tree = st["request"].propose(np.array(row, np.int32), self.tree_nodes)
                if self.match_cost < math.inf and cost > 0.0:
                    factor = max(1.0, self.match_cost / cost)
                    limit = min(limit, math.ceil(factor * self._continued_match(row)))
                chains[r] = self._cut(st, tree, limit, cost)
        return chains

    def _continued_match(self, row) -> int:
        """The longest suffix of `row` (at most max_match tokens) whose trie path has a child."""
        from draftcore.drafters.trie_pool_kernels import CHILD, find_path
        state, context = self.drafter.pool.state, np.array(row, np.int32)
        for m in range(min(self.drafter.max_match, len(row)), 0, -1):
            node = find_path(state, context, len(row) - m, len(row))
            if node >= 0 and state.links[node, CHILD] >= 0:
                return m
        return 0

    def _learn(self, st, row):
        chain = st["chain"]
        new = row[st["n"]:]
        accepted = 0
        while accepted < len(chain) and accepted < len(new) - 1 and new[accepted] == chain[accepted]:
            accepted += 1
        for j, cell in enumerate(st["cells"]):
            o, a = self.cells[cell]
            self.cells[cell] = (o + 1.0, a + (1.0 if j < accepted else 0.0))
        st["chain"], st["cells"] = [], []

    def _cut(self, st, tree, limit, token_cost):
        chain, cells, last = [], [], 0
        for i in range(1, tree.n_candidates):
            if len(chain) >= limit:
                break
            if tree.parents[i] != last:
                continue
            b = min(max(int(float(tree.scores[i]) * self.BINS), 0), self.BINS - 1)
            k = min(int(np.log2(len(chain) + 1)), self.RANKS - 1)
            chain.append(int(tree.tokens[i]))
            cells.append((b, k))
            last = i
        best_m, best_value, expected = 0, 1.0, 1.0
        for m, cell in enumerate(cells, start=1):
            o, a = self.cells[cell]
            expected += min(a / o + self.explore / math.sqrt(o), 1.0)   # optimism where evidence is thin
            value = expected / (1.0 + token_cost * m)
            if value > best_value:
                best_m, best_value = m, value
        st["chain"], st["cells"] = chain[:best_m], cells[:best_m]
        return chain[:best_m]


# -- what a proposal would have done, and what the budget expects of it -----------------------------
def naive_would_accept(tokens, parents, continuation) -> list:
    """Per node: 1 if root..node's tokens after the root are a prefix of `continuation`, 0 if they
    differ from it somewhere, -1 if they agree with all of it but reach beyond it."""
    out = []
    for i in range(len(tokens)):
        path = []
        node = i
        while node > 0:
            path.append(int(tokens[node]))
            node = int(parents[node])
        path.reverse()
        known = [int(t) for t in continuation[:len(path)]]
        if path[:len(known)] != known:
            out.append(0)
        elif len(path) > len(continuation):
            out.append(-1)
        else:
            out.append(1)
    return out


def naive_expected_accepted(p, parents, k: int) -> float:
    """Expected accepted candidates of the tree's first k candidates: each node's probability is its
    calibrated p scaled by min(1, parent's probability / sum of p over its siblings among the k)."""
    q = {0: 1.0}
    for i in range(1, k + 1):
        siblings = [j for j in range(1, k + 1) if parents[j] == parents[i]]
        total = sum(p[j] for j in siblings)
        q[i] = p[i] * min(1.0, q[int(parents[i])] / total)
    return sum(q[i] for i in range(1, k + 1))


def naive_menu_values(p, parents, sizes, estimates, correction: float, slack: float, max_loss: float,
                      hopeless_share: float):
    """One choice of the auto budget, from its definition, for the menu entries given (`sizes`,
    `estimates`: seconds each): value = (1 + correction * expected accepted candidates of the size) /
    seconds; hopeless where there are drafted entries, none of them NaN, and the best of them is
    worth less than `hopeless_share` of the root-only entry's; then, where the root-only entry costs
    more than 0, an entry whose seconds in root-only steps exceed 1 + max_loss + slack is worth 0;
    best: the first entry of the largest value, or the first NaN. Returns (values, best, hopeless)."""
    with np.errstate(divide="ignore", invalid="ignore"):   # a clock that never advanced: 0 seconds
        values = [(1.0 + correction * naive_expected_accepted(p, parents, int(size) - 1)) / estimates[j]
                  for j, size in enumerate(sizes)]
    drafted = values[1:]
    hopeless = bool(drafted) and not any(math.isnan(v) for v in drafted) \
        and max(drafted) < hopeless_share * values[0]
    if estimates[0] > 0:
        values = [v if j == 0 or estimates[j] / estimates[0] - (1.0 + max_loss) <= slack else 0.0
                  for j, v in enumerate(values)]
    nans = [j for j, v in enumerate(values) if math.isnan(v)]
    best = nans[0] if nans else values.index(max(values))
    return values, best, hopeless


def naive_learn_outcomes(offered, accepted, probability, cells, outcome, verified: int, parents, n: int, sizes,
                         seconds):
    """The auto budget's use of a proposal's outcomes, from its definition: the candidates after the
    first `verified` whose outcome is known (0 or 1) count once offered and `outcome` times accepted
    in their cell, and a cell counted reads accepted / offered. Returns (offered, accepted,
    probability) as new lists and (expected, hits): where the menu size (entries of `sizes` up to n
    nodes) with the best (1 + expected accepted) / seconds, the first of equals, holds more than
    `verified` candidates whose outcomes are all known, its expected accepted candidates and how
    many came true; else (-1.0, 0.0), as with no sizes."""
    offered, accepted, probability = list(offered), list(accepted), list(probability)
    for i in range(verified + 1, n):
        if outcome[i] in (0, 1):
            cell = int(cells[i])
            offered[cell] += 1.0
            accepted[cell] += float(outcome[i])
            probability[cell] = accepted[cell] / offered[cell]
    if len(sizes) == 0:
        return offered, accepted, probability, (-1.0, 0.0)
    p = [1.0] + [probability[int(cells[i])] for i in range(1, n)]
    values = [(1.0 + naive_expected_accepted(p, parents, int(size) - 1)) / seconds[j]
              for j, size in enumerate(sizes) if size <= n]
    k = int(sizes[values.index(max(values))]) - 1
    if k <= verified or any(outcome[i] not in (0, 1) for i in range(1, k + 1)):
        return offered, accepted, probability, (-1.0, 0.0)
    hits = sum(int(outcome[i]) for i in range(1, k + 1))
    return offered, accepted, probability, (naive_expected_accepted(p, parents, k), float(hits))


def _faded(counts, prior, keep: float) -> list:
    """Counts (rows of lists) one step closer to their prior: prior + keep * (count - prior)."""
    return [[prior[s][b] + keep * (counts[s][b] - prior[s][b]) for b in range(len(counts[s]))]
            for s in range(len(counts))]


def naive_count_verified(offered, accepted, prior_offered, prior_accepted, keep: float, source, score_bin, index,
                         m: int, path):
    """The composite's counts after one verified tree of m nodes, from the definition: faded one
    step, then every input node that landed among the verified candidates (merged index 1 .. m-1)
    offered once to its (source, score bin) and, where its merged node is on the accepted `path`,
    accepted once. Returns (offered, accepted) as lists of rows."""
    offered = _faded(offered.tolist(), prior_offered.tolist(), keep)
    accepted = _faded(accepted.tolist(), prior_accepted.tolist(), keep)
    on_path = {int(node) for node in path}
    for i in range(len(index)):
        if int(index[i]) in range(1, m):
            s, b = int(source[i]), int(score_bin[i])
            offered[s][b] += 1.0
            if int(index[i]) in on_path:
                accepted[s][b] += 1.0
    return offered, accepted


def naive_count_outcomes(offered, accepted, prior_offered, prior_accepted, keep: float, source, score_bin, index,
                         parents, tokens, emitted):
    """The composite's counts after the `emitted` tokens settle a merged proposal (`tokens`,
    `parents`, its node 0 the root), from the definition: faded one step, then every input node that
    landed on a candidate of the proposal whose outcome the tokens settle (naive_would_accept: 1 or
    0) offered once to its (source, score bin) and, where it came true, accepted once. Returns
    (offered, accepted) as lists of rows."""
    offered = _faded(offered.tolist(), prior_offered.tolist(), keep)
    accepted = _faded(accepted.tolist(), prior_accepted.tolist(), keep)
    outcome = naive_would_accept(tokens, parents, emitted)
    for i in range(len(index)):
        node = int(index[i])
        if node in range(1, len(tokens)) and outcome[node] in (0, 1):
            s, b = int(source[i]), int(score_bin[i])
            offered[s][b] += 1.0
            accepted[s][b] += float(outcome[node])
    return offered, accepted


def naive_measured_growth(known, sizes) -> list:
    """Per menu entry e (known[e]: seconds, NaN where never measured): NaN unless two sizes are
    measured and one at or below e is; else the cost of j, the largest measured entry at or below e,
    plus half the slope (never negative) to the next measured entry above j, or, with none above,
    from the smallest measured entry up to j, times the nodes from j's size to e's."""
    measured = [i for i, seconds in enumerate(known) if not math.isnan(seconds)]
    if len(measured) < 2:
        return [math.nan] * len(known)
    guess = []
    for e in range(len(known)):
        at_or_below = [i for i in measured if i <= e]
        if not at_or_below:
            guess.append(math.nan)
            continue
        j = at_or_below[-1]
        above = [i for i in measured if i > j]
        a, b = (j, above[0]) if above else (measured[0], j)
        slope = max((known[b] - known[a]) / (sizes[b] - sizes[a]), 0.0)
        guess.append(known[j] + 0.5 * slope * (sizes[e] - sizes[j]))
    return guess


def naive_cost_estimates(measured: dict, sizes, optimism: float, n_lookahead: int) -> list:
    """The cost table's estimates with `n_lookahead` lookahead nodes, from its tables `measured`
    ({window: seconds per menu size, NaN: never measured}) and no prior.
    Without a window: a measured size its own cost; an unmeasured one its measured-growth guess
    (naive_measured_growth), else the cheapest of the steps with the fewest nodes measured in any
    window, scaled from its nodes to the size's at `optimism` per node beyond a root-only tree.
    With one: a measured size its own cost; an unmeasured one the window-less estimate times the
    window's overhead (measured over window-less) at the measured sizes on either side of it,
    linearly in the size between two, that of the nearest beyond them; 1 where none was measured."""
    if n_lookahead:
        without = naive_cost_estimates(measured, sizes, optimism, 0)
        known = list(measured.get(n_lookahead, [math.nan] * len(sizes)))
        points = [(float(sizes[i]), known[i] / without[i]) for i in range(len(sizes)) if not math.isnan(known[i])]
        out = []
        for e in range(len(sizes)):
            if not math.isnan(known[e]):
                out.append(known[e])
                continue
            size = float(sizes[e])
            below = [p for p in points if p[0] <= size]
            above = [p for p in points if p[0] >= size]
            if not points:
                overhead = 1.0
            elif not below:
                overhead = above[0][1]
            elif not above:
                overhead = below[-1][1]
            else:
                (x0, y0), (x1, y1) = below[-1], above[0]
                overhead = y0 + (y1 - y0) * (size - x0) / (x1 - x0)
            out.append(without[e] * overhead)
        return out
    known = list(measured.get(0, [math.nan] * len(sizes)))
    growth = naive_measured_growth(known, sizes)
    firsts = []   # (nodes beyond a root-only tree, seconds) of each window's smallest measured size
    for window, table in measured.items():
        for i, seconds in enumerate(table):
            if not math.isnan(seconds):
                firsts.append((float(sizes[i]) + window - 1.0, float(seconds)))
                break
    base = 1.0
    if firsts:
        extra, seconds = min(firsts)
        base = seconds / (1.0 + optimism * extra)
    return [known[e] if not math.isnan(known[e]) else growth[e] if not math.isnan(growth[e])
            else base * (1.0 + optimism * (float(sizes[e]) - 1.0)) for e in range(len(sizes))]
