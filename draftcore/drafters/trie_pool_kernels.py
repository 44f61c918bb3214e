"""Numba kernels of the trie drafter's node pool (Lookahead, Zhao et al., KDD 2024, §4.3): the trie
as flat arrays plus a free list, the request slots' own counts, and decay and pruning when the pool
is full. One TriePool (trie_pool.py) owns a pool; trie_count_kernels counts into it,
trie_retrieval_kernels drafts from it, trie_check_kernels checks it.

The kernels take grouped, named values (module-level namedtuples, which numba compiles as plain
structs and caches like arrays; no jitclass, no dicts of dicts):

    TrieState     the trie, built by `new_state`; its arrays are changed in place:
        links   int32[capacity, ROW] TOKEN, PARENT, CHILD (first child), SIBLING (next sibling), then
                                     the counts; PARENT == ROOT (-1) for a child of the (virtual)
                                     root, PARENT == FREE (-2) for a node on the free list
        freq    float32[capacity, ROW] the same memory seen as float32: PROMPT, OUTPUT, RECENT branch
                                     counts (trie_count_kernels) in columns 4-6, the own counts of
                                     request slots 0 .. INLINE-1 in columns 8-15. One 64-byte row per
                                     node, so a node's links and counts share a cache line (retrieval
                                     reads both for every candidate, and misses dominate its time).
        free    int32[capacity]      stack of free node ids; meta[N_FREE] of them are valid
        root    int32[token_limit]   token -> child of the root holding it, or -1 (O(1) first step)
        meta    int64[8]             N_FREE, ROOT_FIRST (head of the root's child list), N_PRUNES
                                     (prune passes so far: a request's front is valid for one value)
        top     int32[TOP_K, 2]      (node, token) of the root's heaviest children, best first (-1:
                                     none; trie_candidate_kernels keeps it)
        top_w   float32[TOP_K + 1]   their weights; top_w[TOP_K] is the total weight of the root's
                                     children (exact at all times: kept up to date as counts grow,
                                     recomputed after anything that lowers counts)
        own     float32[slots - INLINE, capacity, 2]  the own counts (OWN_PROMPT, OWN_RECENT) of
                                     slots INLINE and up; those of slots 0 .. INLINE-1 live in columns
                                     OWN_COL.. of the node rows, so a request's weight is read from the
                                     cache line that holds the node's links (`own_view` hides where).
                                     Zero for a free node and for a slot no request holds.
        live    bool[slots]          which slots a request holds
        cal     float64[2, CAL_CELLS]  the calibration of retrieval scores (trie_calibration_kernels),
                                     shared by requests
    Settings      the drafter's fixed configuration: max_match, prompt_weight, recent_weight,
                  min_stage_nodes, fill, use_top, mode (MODE_HIERARCHICAL or MODE_SINGLE), calibrated
                  (set only with fill and MODE_HIERARCHICAL: TrieDrafter resolves it)

Weights. A node's weight for one request (`own_weight`: retrieval stages 1 and longer) reads the
request's own PROMPT and RECENT counts; its weight over every live request (`weight`: stage 0 and
`top`) reads the sums:
    w = prompt_weight * PROMPT + recent_weight * RECENT + OUTPUT

Capacity. A token creates at most branch_length nodes. Before each token, if fewer are free, OUTPUT
and RECENT (shared and every live request's own) are halved and every node whose PROMPT + OUTPUT
falls below 1 is freed with its subtree (node pruning, `make_room`), repeated until an eighth of
the pool is free or nothing more can be freed (only live prompt branches remain); then a node that
cannot be allocated is simply not created.
"""
from collections import namedtuple

import numba as nb
import numpy as np

from .trie_calibration_kernels import new_calibration

TOKEN, PARENT, CHILD, SIBLING = 0, 1, 2, 3
PROMPT, OUTPUT, RECENT = 4, 5, 6  # float32 columns of the node rows
OWN_PROMPT, OWN_RECENT = 0, 1     # columns of a request's own counts
OWN_COL = 8            # columns 8 .. 15 of a node row: the own counts of the first INLINE slots
INLINE = 4             # request slots whose own counts live in the node row (one cache line)
ROW = OWN_COL + 2 * INLINE
N_FREE, ROOT_FIRST, N_PRUNES = 0, 1, 2
ROOT, FREE = -1, -2
MODE_HIERARCHICAL, MODE_SINGLE = 0, 1
TOP_K = 64             # stage-0 candidates kept

TrieState = namedtuple("TrieState", "links freq free root meta top top_w own live cal")
Settings = namedtuple("Settings", "max_match prompt_weight recent_weight min_stage_nodes fill use_top mode "
                                   "calibrated")


def new_state(capacity: int, token_limit: int, slots: int) -> TrieState:
    links = new_rows(capacity)
    links[:, PARENT] = FREE
    free = np.arange(capacity - 1, -1, -1, dtype=np.int32)  # pop order 0, 1, 2, ...
    root = np.full(token_limit, -1, np.int32)
    meta = np.zeros(8, np.int64)
    meta[N_FREE] = capacity
    meta[ROOT_FIRST] = -1
    return TrieState(links=links, freq=links.view(np.float32), free=free, root=root, meta=meta,
                     top=np.full((TOP_K, 2), -1, np.int32), top_w=np.zeros(TOP_K + 1, np.float32),
                     own=np.zeros((max(slots - INLINE, 0), capacity, 2), np.float32), live=np.zeros(slots, np.bool_),
                     cal=new_calibration())


def new_rows(capacity: int) -> np.ndarray:
    """int32[capacity, ROW] node rows: links -1, every count (as float32) 0."""
    links = np.full((capacity, ROW), -1, np.int32)
    freq = links.view(np.float32)
    freq[:, PROMPT:RECENT + 1] = 0.0
    freq[:, OWN_COL:] = 0.0
    return links


def with_slots(state: TrieState, slots: int) -> TrieState:
    """The same trie with room for `slots` concurrent requests (the live ones keep theirs)."""
    own = np.zeros((max(slots - INLINE, 0),) + state.own.shape[1:], np.float32)
    live = np.zeros(slots, np.bool_)
    n = min(own.shape[0], state.own.shape[0])
    own[:n] = state.own[:n]
    n = min(slots, state.live.shape[0])
    live[:n] = state.live[:n]
    return state._replace(own=own, live=live)


def own_counts(state: TrieState, slot: int) -> np.ndarray:
    """float32[capacity, 2] view of one slot's own counts (for tests and reports)."""
    if slot < INLINE:
        return state.freq[:, OWN_COL + 2 * slot:OWN_COL + 2 * slot + 2]
    return state.own[slot - INLINE]


def warm_up_settings(**changes) -> Settings:
    """Settings of the types TrieDrafter builds (plain int, float and bool fields), for the kernel
    modules' warm-ups: kernels compiled for other types would compile again at the drafter's first call."""
    values = dict(max_match=3, prompt_weight=2.0, recent_weight=2.0, min_stage_nodes=2, fill=True, use_top=True,
                  mode=MODE_HIERARCHICAL, calibrated=True)
    values.update(changes)
    return Settings(**values)


# -- finding nodes and weighing them -----------------------------------------------------------------

@nb.njit(cache=True, inline="always")
def find_child(links, root, parent, token):
    if parent == ROOT:
        return root[token] if 0 <= token < root.shape[0] else -1
    c = links[parent, CHILD]
    while c >= 0:
        if links[c, TOKEN] == token:
            return c
        c = links[c, SIBLING]
    return -1


@nb.njit(cache=True)
def find_path(state, tokens, begin, end):
    """Node of the token path tokens[begin:end] from the root, or -1."""
    node = ROOT
    for q in range(begin, end):
        node = find_child(state.links, state.root, node, tokens[q])
        if node < 0:
            return -1
    return node


@nb.njit(cache=True, inline="always")
def own_view(state, slot):
    """[capacity, 2] view of a slot's own counts: columns of the node rows for the first INLINE
    slots (read with the node's links, no further cache miss), the `own` array for the rest."""
    if slot < INLINE:
        return state.freq[:, OWN_COL + 2 * slot:OWN_COL + 2 * slot + 2]
    return state.own[slot - INLINE, :, :]


@nb.njit(cache=True, inline="always")
def weight(freq, node, settings):
    """A node's weight over every live request (stage 0 and `top`)."""
    return (settings.prompt_weight * freq[node, PROMPT] + settings.recent_weight * freq[node, RECENT]
            + freq[node, OUTPUT])


@nb.njit(cache=True, inline="always")
def own_weight(freq, own, node, settings):
    """A node's weight for one request (`own`: its slot): its own prompt and recent counts."""
    return (settings.prompt_weight * own[node, OWN_PROMPT] + settings.recent_weight * own[node, OWN_RECENT]
            + freq[node, OUTPUT])


# -- allocating and freeing ----------------------------------------------------------------------------

@nb.njit(cache=True, inline="always")
def give_back_prompt(freq, own, node):
    """Take one of a request's own PROMPT counts from `node` (not below 0), and as much from the sum."""
    before = own[node, OWN_PROMPT]
    after = max(before - 1.0, 0.0)
    own[node, OWN_PROMPT] = after
    freq[node, PROMPT] = max(freq[node, PROMPT] - (before - after), 0.0)


@nb.njit(cache=True)
def add_child(state, parent, token):
    """Allocate a node for `token` under `parent` (ROOT allowed); -1 when the pool is exhausted."""
    links, freq, meta = state.links, state.freq, state.meta
    if meta[N_FREE] == 0:
        return -1
    meta[N_FREE] -= 1
    node = state.free[meta[N_FREE]]
    links[node, TOKEN] = token
    links[node, PARENT] = parent
    links[node, CHILD] = -1
    freq[node, PROMPT] = freq[node, OUTPUT] = freq[node, RECENT] = 0.0
    if parent == ROOT:
        links[node, SIBLING] = meta[ROOT_FIRST]
        meta[ROOT_FIRST] = node
        state.root[token] = node
    else:
        links[node, SIBLING] = links[parent, CHILD]
        links[parent, CHILD] = node
    return node


@nb.njit(cache=True)
def _free_subtree(state, top_node):
    """Return `top_node` and everything below it to the free list (it must be unlinked already)."""
    links, freq, meta = state.links, state.freq, state.meta
    stack = [top_node]
    while len(stack) > 0:
        node = stack.pop()
        c = links[node, CHILD]
        while c >= 0:
            stack.append(c)
            c = links[c, SIBLING]
        if links[node, PARENT] == ROOT:
            state.root[links[node, TOKEN]] = -1
        links[node, PARENT] = FREE
        links[node, CHILD] = -1
        links[node, SIBLING] = -1
        freq[node, PROMPT] = freq[node, OUTPUT] = freq[node, RECENT] = 0.0
        for col in range(OWN_COL, ROW):
            freq[node, col] = 0.0
        for slot in range(state.own.shape[0]):
            state.own[slot, node, OWN_PROMPT] = state.own[slot, node, OWN_RECENT] = 0.0
        state.free[meta[N_FREE]] = node
        meta[N_FREE] += 1


@nb.njit(cache=True)
def _sweep_children(state, first):
    """Free every node of the child list starting at `first` whose PROMPT + OUTPUT is below 1
    (with its subtree), relink the survivors and return the new head of the list."""
    links, freq = state.links, state.freq
    head = -1
    prev = -1
    c = first
    while c >= 0:
        nxt = links[c, SIBLING]
        if freq[c, PROMPT] + freq[c, OUTPUT] < 1.0:
            links[c, SIBLING] = -1
            _free_subtree(state, c)
        else:
            if prev < 0:
                head = c
            else:
                links[prev, SIBLING] = c
            prev = c
        c = nxt
    if prev >= 0:
        links[prev, SIBLING] = -1
    return head


@nb.njit(cache=True)
def _prune(state):
    """Free every node whose PROMPT + OUTPUT is below 1, with its subtree; return how many."""
    links, meta = state.links, state.meta
    before = meta[N_FREE]
    meta[ROOT_FIRST] = _sweep_children(state, meta[ROOT_FIRST])
    stack = []
    c = meta[ROOT_FIRST]
    while c >= 0:
        stack.append(c)
        c = links[c, SIBLING]
    while len(stack) > 0:
        node = stack.pop()
        links[node, CHILD] = _sweep_children(state, links[node, CHILD])
        c = links[node, CHILD]
        while c >= 0:
            stack.append(c)
            c = links[c, SIBLING]
    meta[N_PRUNES] += 1
    return meta[N_FREE] - before


@nb.njit(cache=True)
def prune_lists(state, parents):
    """Free the children below 1 (with their subtrees) of each node in `parents` (ROOT: the root's
    children) that is still live; counts as one prune pass."""
    links, meta = state.links, state.meta
    root_done = False
    for parent in parents:
        if parent == ROOT:
            if not root_done:
                meta[ROOT_FIRST] = _sweep_children(state, meta[ROOT_FIRST])
                root_done = True
        elif links[parent, PARENT] != FREE:
            links[parent, CHILD] = _sweep_children(state, links[parent, CHILD])
    meta[N_PRUNES] += 1


@nb.njit(cache=True)
def make_room(state, target):
    """Halve OUTPUT and RECENT (the live requests' own RECENT too) and prune until `target` nodes
    are free or nothing more can be freed."""
    links, freq, meta = state.links, state.freq, state.meta
    capacity = links.shape[0]
    live = np.flatnonzero(state.live)
    for _ in range(64):
        if meta[N_FREE] >= target:
            return
        largest_output = 0.0
        for i in range(capacity):
            if links[i, PARENT] != FREE:
                freq[i, OUTPUT] *= 0.5
                freq[i, RECENT] *= 0.5
                for slot in live:
                    own = own_view(state, slot)
                    own[i, OWN_RECENT] *= 0.5
                largest_output = max(largest_output, freq[i, OUTPUT])
        freed = _prune(state)
        if freed == 0 and largest_output < 1.0:
            return  # only prompt branches of live requests are left


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel the Python side may call here, on a throwaway
    pool (draftcore.jit); the others compile with the kernels that call them."""
    make_room(new_state(64, 16, 2), 60)
