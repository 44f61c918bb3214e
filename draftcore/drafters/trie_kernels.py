"""Numba kernels of the trie drafter of "Lookahead: An Inference Acceleration Framework for Large
Language Model with Lossless Generation Accuracy" (Zhao et al., KDD 2024), §4.3: a node pool of
flat arrays plus a free list.

The kernels take grouped, named values (module-level namedtuples, which numba compiles as plain
structs and caches like arrays; no jitclass, no dicts of dicts):

    TrieState     the trie, built by `new_state`; its arrays are changed in place:
        links   int32[capacity, ROW] TOKEN, PARENT, CHILD (first child), SIBLING (next sibling), then
                                     the counts; PARENT == ROOT (-1) for a child of the (virtual)
                                     root, PARENT == FREE (-2) for a node on the free list
        freq    float32[capacity, ROW] the same memory seen as float32: PROMPT, OUTPUT, RECENT branch
                                     counts (below) in columns 4-6, the own counts of request slots
                                     0 .. INLINE-1 in columns 8-15. One 64-byte row per node, so a
                                     node's links and counts share a cache line (retrieval reads both
                                     for every candidate, and misses dominate its time).
        free    int32[capacity]      stack of free node ids; meta[N_FREE] of them are valid
        root    int32[token_limit]   token -> child of the root holding it, or -1 (O(1) first step)
        meta    int64[8]             N_FREE, ROOT_FIRST (head of the root's child list), N_PRUNES
                                     (prune passes so far: a request's front is valid for one value)
        top     int32[TOP_K, 2]      (node, token) of the root's heaviest children, best first (-1: none)
        top_w   float32[TOP_K + 1]   their weights; top_w[TOP_K] is the total weight of the root's
                                     children (exact at all times: kept up to date as counts grow,
                                     recomputed after anything that lowers counts)
        own     float32[slots - INLINE, capacity, 2]  the own counts (OWN_PROMPT, OWN_RECENT) of
                                     slots INLINE and up; those of slots 0 .. INLINE-1 live in columns
                                     OWN_COL.. of the node rows, so a request's weight is read from the
                                     cache line that holds the node's links (`_own_view` hides where).
                                     Zero for a free node and for a slot no request holds.
        live    bool[slots]          which slots a request holds
        cal     float64[2, CAL_CELLS]  the calibration of retrieval scores (below): per cell, the
                                     candidates whose parent path came true (row 0) and those of them
                                     that came true too (row 1), a prior included; shared by requests
    cursor        int64[CURSOR_FRONT + branch_length]: where one request stands in the shared trie —
                  cursor[CURSOR_SLOT] its slot, cursor[CURSOR_SEEN] the N_PRUNES its front was
                  computed at (any prune may free a front node), cursor[CURSOR_FRONT + k] = front[k]
                  = node of the n-gram stream[p-k .. p] after token p. One array, not a tuple of
                  three, because every kernel call unboxes its arguments (~0.2 µs an array).
    Settings      the drafter's fixed configuration: max_match, prompt_weight, recent_weight,
                  min_stage_nodes, fill, use_top, mode (MODE_HIERARCHICAL or MODE_SINGLE), calibrated
                  (set only with fill and MODE_HIERARCHICAL: TrieDrafter resolves it)
    Stream        a request's tokens: tokens[:end] is the stream so far (prompt first, n_prompt
                  tokens), tokens[begin:end] the tokens not counted yet; branches starting before
                  count_from are never counted (0, or n_prompt to leave the prompt out)
    DraftBuffers  where retrieval writes, built by `new_buffers(budget)`: the draft's tokens,
                  parents, depths, scores and calibration cells, its child lists (first_child,
                  next_sibling), and the candidate list (cand_scores, cand_items rows (trie node,
                  draft parent, token, cell))

Counting. Every start position s of a request's stream (prompt + output) opens a branch of at most
`branch_length` tokens: a PROMPT branch when s lies in the prompt, an OUTPUT branch otherwise. A
node's count of a kind is the number of branches of that kind through it, so (until a decay) a
parent counts at least as much as each child. Branches grow on the fly: when token p arrives, the
node of stream[s..p] gains one count for each s in (p - branch_length, p]; the node of
stream[s..p-1] is front[p-1-s], so a token costs branch_length child look-ups, not branch_length².
RECENT repeats the OUTPUT counts of the request in progress (RECENT <= OUTPUT), so the request's
own text — prompt and output — can be weighted above the history of earlier requests:
    weight w = prompt_weight * PROMPT + recent_weight * RECENT + OUTPUT
At the end of a request its PROMPT counts are removed (branch eliminating), RECENT is zeroed and
the nodes of its branches that fell below 1 are freed; OUTPUT counts persist across requests.

Concurrent requests. Any number of requests may be in progress on one trie (their kernel calls
are serialised by the caller). OUTPUT is shared: every request's output teaches every other one.
A request's PROMPT and RECENT counts are its own: they live in its slot of `own`, and a request's
weights (retrieval stages 1 and longer) read only its own, so one request never drafts from
another's prompt. The node rows' PROMPT and RECENT columns hold the sums over live requests: they
keep a live prompt branch from being pruned and rank the root's children for stage 0 (`top`,
shared). With one request in progress the two agree exactly and everything below reads as
written for one request. A request's own PROMPT counts also hold the model's tokens it learnt at
its rejected candidates (trie_model_kernels: counted on single nodes, not branches, and taken back
before its branch eliminating).

Capacity. A token creates at most branch_length nodes. Before each token, if fewer are free, OUTPUT
and RECENT (shared and every live request's own) are halved and every node whose PROMPT + OUTPUT falls below 1 is freed with its subtree
(node pruning), repeated until an eighth of the pool is free or nothing more can be freed (only
live prompt branches remain); then a node that cannot be allocated is simply not created.

Retrieval (multi-stage). Stages run from the longest context suffix (at most max_match tokens) to
the shortest, then stage 0, the empty suffix: the root's heaviest children (`top`), one token deep
(the most frequent tokens, a last resort; their continuations are not worth the budget). A stage
matched at node u offers u's sub-trie best-first, a node v scored w(v) / w(u) (an estimate that
the whole path is accepted). Without `fill` (the paper) the first stage that offers at least min_stage_nodes
nodes is used alone (if none does, the longest that offers any). With `fill`, stages accumulate
until the budget is spent, later stages only adding continuations the earlier ones lack (merged
where their token paths coincide). Candidates are ordered by (score desc, draft parent asc, token
asc, cell desc), so results are deterministic and match tests/naive.py exactly.

Calibrated retrieval (`calibrated`, with `fill` and the hierarchical layout; the default). A
relative weight w(v) / w(u) means little on its own: replayed on SmolLM2's traces, a first token
at w / w(u) between 0.05 and 0.10 came true 6 % of the time after a 1-token match, 35 % after a
4-token match and 77 % after a 5-token one. So each candidate gets a cell, (its context length
m_eff, the bin of its relative weight): a child of the stage matched on m tokens has m_eff = m
(stage 0: 0), a deeper node its parent's m_eff + 1 (capped at CAL_ROWS - 1), and the bin is
where w(v) / w(u) falls among CAL_EDGES. Its score is its parent's times the cell's observed rate
(cal[1] / cal[0]), and all stages offer into one candidate list, so a likely continuation of a
short match outranks an unlikely one of a long match, which plain `fill` always drafts first.
The rates are learnt from the drafter's own proposals (`learn`: a node whose parent's path came
true counts once in its cell, and a hit when its own token came true too), starting from a prior
of 2 candidates at the bin's centre; a cell's counts halve when they reach CAL_CAP, so they follow
the workload. Replayed on the recorded SmolLM2 traces with the auto budget (`draftcore replay
--drafter trie` against `--drafter trie-uncalibrated`, the hf-cpu cost table): 2.59 / 1.59 tokens
per step against 2.48 / 1.55 (HumanEval / MT-Bench), a simulated speedup of 1.94x / 1.35x against
1.83x / 1.28x; at a fixed 16 candidates 2.86 / 1.86 against 2.82 / 1.82.
"""
from collections import namedtuple

import numba as nb
import numpy as np

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
CANDIDATES = 1 << 12   # candidate workspace (at least 4 * (budget + 2)): the list, kept in its
                       # middle, never holds more than 2 * budget + 1 entries

CAL_EDGES = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 0.999)   # relative-weight bin edges
CAL_BINS = len(CAL_EDGES) + 1
CAL_ROWS = 13          # context lengths 0 .. 12 (longer counts as 12)
CAL_CELLS = CAL_ROWS * CAL_BINS
CAL_CAP = 1024.0       # a cell's count halves (with its hits) on reaching this
CAL_PRIOR = 2.0        # prior candidates per cell, at the bin's centre

TrieState = namedtuple("TrieState", "links freq free root meta top top_w own live cal")
CURSOR_SLOT, CURSOR_SEEN, CURSOR_FRONT = 0, 1, 2
Settings = namedtuple("Settings", "max_match prompt_weight recent_weight min_stage_nodes fill use_top mode "
                                   "calibrated")
Stream = namedtuple("Stream", "tokens begin end n_prompt count_from")
DraftBuffers = namedtuple("DraftBuffers",
                          "tokens parents depths scores cells first_child next_sibling cand_scores cand_items")


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


def new_calibration() -> np.ndarray:
    """float64[2, CAL_CELLS]: the prior of every cell, CAL_PRIOR candidates at its bin's centre."""
    edges = (0.0,) + CAL_EDGES + (1.0,)
    centres = np.array([(edges[b] + edges[b + 1]) / 2 for b in range(CAL_BINS)])
    cal = np.empty((2, CAL_CELLS))
    cal[0] = CAL_PRIOR
    cal[1] = np.tile(CAL_PRIOR * centres, CAL_ROWS)
    return cal


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


def new_cursor(slot: int, branch_length: int, n_prunes: int) -> np.ndarray:
    """A request's cursor: no branch counted yet (front all -1, valid until the next prune)."""
    cursor = np.full(CURSOR_FRONT + branch_length, -1, np.int64)
    cursor[CURSOR_SLOT], cursor[CURSOR_SEEN] = slot, n_prunes
    return cursor


def new_buffers(budget: int) -> DraftBuffers:
    """Buffers for drafts of at most `budget` nodes besides the root. The draft's tokens, parents,
    depths, scores and cells are the rows of one int32[5, budget + 1] block (`tokens.base`; scores
    seen as float32), so a caller copies a draft out in one go."""
    n, n_candidates = budget + 1, max(CANDIDATES, 4 * (budget + 2))
    block = np.empty((5, n), np.int32)
    return DraftBuffers(tokens=block[0], parents=block[1], depths=block[2], scores=block[3].view(np.float32),
                        cells=block[4], first_child=np.empty(n, np.int32), next_sibling=np.empty(n, np.int32),
                        cand_scores=np.empty(n_candidates, np.float32), cand_items=np.empty((n_candidates, 4), np.int32))


# -- the pool ------------------------------------------------------------------------------------

@nb.njit(cache=True, inline="always")
def _child(links, root, parent, token):
    if parent == ROOT:
        return root[token] if 0 <= token < root.shape[0] else -1
    c = links[parent, CHILD]
    while c >= 0:
        if links[c, TOKEN] == token:
            return c
        c = links[c, SIBLING]
    return -1


@nb.njit(cache=True)
def _find_path(state, tokens, begin, end):
    """Node of the token path tokens[begin:end] from the root, or -1."""
    node = ROOT
    for q in range(begin, end):
        node = _child(state.links, state.root, node, tokens[q])
        if node < 0:
            return -1
    return node


@nb.njit(cache=True, inline="always")
def _give_back_prompt(freq, own, node):
    """Take one of a request's own PROMPT counts from `node` (not below 0), and as much from the sum."""
    before = own[node, OWN_PROMPT]
    after = max(before - 1.0, 0.0)
    own[node, OWN_PROMPT] = after
    freq[node, PROMPT] = max(freq[node, PROMPT] - (before - after), 0.0)


@nb.njit(cache=True, inline="always")
def _own_view(state, slot):
    """[capacity, 2] view of a slot's own counts: columns of the node rows for the first INLINE
    slots (read with the node's links, no further cache miss), the `own` array for the rest."""
    if slot < INLINE:
        return state.freq[:, OWN_COL + 2 * slot:OWN_COL + 2 * slot + 2]
    return state.own[slot - INLINE, :, :]


@nb.njit(cache=True)
def _add_child(state, parent, token):
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
                    own = _own_view(state, slot)
                    own[i, OWN_RECENT] *= 0.5
                largest_output = max(largest_output, freq[i, OUTPUT])
        freed = _prune(state)
        if freed == 0 and largest_output < 1.0:
            return  # only prompt branches of live requests are left


# -- counting ------------------------------------------------------------------------------------

@nb.njit(cache=True)
def _refresh_front(state, stream, front, n_stream):
    """Recompute front[k] = node of tokens[n_stream-1-k .. n_stream-1] (after a prune); branches
    starting before stream.count_from are not counted, so they get no front node."""
    tokens = stream.tokens
    for k in range(front.shape[0]):
        front[k] = -1
        s = n_stream - 1 - k
        if s < stream.count_from:
            continue
        front[k] = _find_path(state, tokens, s, n_stream)


@nb.njit(cache=True)
def extend(state, settings, stream, cursor):
    """Count the branches that stream.tokens[begin:end] extend (module docstring, "Counting") for
    the request at `cursor`; its front describes tokens[:begin] unless a prune came since."""
    links, freq, meta, top, top_w = state.links, state.freq, state.meta, state.top, state.top_w
    own = _own_view(state, cursor[CURSOR_SLOT])
    front = cursor[CURSOR_FRONT:]
    tokens, n_prompt, count_from = stream.tokens, stream.n_prompt, stream.count_from
    capacity = links.shape[0]
    branch_length = front.shape[0]
    if cursor[CURSOR_SEEN] != meta[N_PRUNES]:  # this or another request pruned: front nodes may be gone
        _refresh_front(state, stream, front, stream.begin)
        cursor[CURSOR_SEEN] = meta[N_PRUNES]
    pruned = False
    for p in range(stream.begin, stream.end):
        if meta[N_FREE] < branch_length:
            make_room(state, max(branch_length, capacity // 8))
            _refresh_front(state, stream, front, p)
            cursor[CURSOR_SEEN] = meta[N_PRUNES]
            pruned = True
        token = tokens[p]
        # From the longest branch down, so front[k-1] is read before it is overwritten.
        for k in range(min(branch_length - 1, p - count_from), -1, -1):
            parent = ROOT if k == 0 else front[k - 1]
            if parent < 0 and k > 0:
                # The branch lost a node (pool full, or pruned): look again, as a node for it may
                # have been made since (another request's branch, or a learnt continuation). Rare:
                # with room in the pool every branch in range has its node.
                parent = _find_path(state, tokens, p - k, p)
            node = -1
            if k == 0 or parent >= 0:
                node = _child(links, state.root, parent, token)
                if node < 0:
                    node = _add_child(state, parent, token)
            if node >= 0:
                if p - k < n_prompt:
                    freq[node, PROMPT] += 1.0
                    own[node, OWN_PROMPT] += 1.0
                    added = settings.prompt_weight
                else:
                    freq[node, OUTPUT] += 1.0
                    freq[node, RECENT] += 1.0
                    own[node, OWN_RECENT] += 1.0
                    added = 1.0 + settings.recent_weight
                if k == 0:
                    top_w[TOP_K] += added
                    _raise_in_top(top, top_w, node, token, _weight(freq, node, settings))
            front[k] = node
    if pruned:
        refresh_top(state, settings)


@nb.njit(cache=True)
def end_request(state, settings, stream, cursor, keep_prompt):
    """Branch eliminating for the request at `cursor`: walk every branch of stream.tokens[:end],
    remove its own PROMPT counts (with `keep_prompt` they become OUTPUT counts instead) and its own
    RECENT counts, from its slot and from the sums; then free what fell below 1 on those branches
    (a local prune: the child lists the walk touched, not the whole pool, so a request's end costs
    its own length, not the pool's size). The slot is left all zero."""
    links, freq, root, tokens = state.links, state.freq, state.root, stream.tokens
    own = _own_view(state, cursor[CURSOR_SLOT])
    branch_length, n_stream = cursor.shape[0] - CURSOR_FRONT, stream.end
    touched = [ROOT][:0]  # parents of nodes that fell below 1 (ROOT included), typed int64
    for s in range(n_stream):
        counted_prompt = stream.count_from <= s < stream.n_prompt
        node = ROOT
        for q in range(s, min(s + branch_length, n_stream)):
            parent = node
            node = _child(links, root, parent, tokens[q])
            if node < 0:
                break
            if counted_prompt:
                _give_back_prompt(freq, own, node)
                if keep_prompt:
                    freq[node, OUTPUT] += 1.0
            recent = own[node, OWN_RECENT]
            if recent != 0.0:
                freq[node, RECENT] = max(freq[node, RECENT] - recent, 0.0)
                own[node, OWN_RECENT] = 0.0
            # Prompt walks come first and only lower counts (or, with keep_prompt, never lower
            # them), so a node below 1 here stays below 1: it goes with its subtree, and the rest
            # of this walk lies in that subtree.
            if freq[node, PROMPT] + freq[node, OUTPUT] < 1.0:
                touched.append(parent)
                break
    _prune_lists(state, touched)
    refresh_top(state, settings)


@nb.njit(cache=True)
def _prune_lists(state, parents):
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


# -- retrieval -----------------------------------------------------------------------------------

@nb.njit(cache=True, inline="always")
def _weight(freq, node, settings):
    """A node's weight over every live request (stage 0 and `top`)."""
    return (settings.prompt_weight * freq[node, PROMPT] + settings.recent_weight * freq[node, RECENT]
            + freq[node, OUTPUT])


@nb.njit(cache=True, inline="always")
def _own_weight(freq, own, node, settings):
    """A node's weight for one request (`own`: its slot): its own prompt and recent counts."""
    return (settings.prompt_weight * own[node, OWN_PROMPT] + settings.recent_weight * own[node, OWN_RECENT]
            + freq[node, OUTPUT])


@nb.njit(cache=True, inline="always")
def _better(s1, p1, t1, c1, s2, p2, t2, c2):
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
def _offer(cs, ci, lo, hi, room, score, node, draft_parent, token, cell):
    """Offer a candidate to the list cs/ci[lo:hi], sorted best first; returns the new (lo, hi).

    At most `room` more nodes can be drafted, so once the list holds `room` candidates a newcomer
    worse than all of them can never be chosen and is not kept; a better newcomer replaces the
    worst. ci rows are (trie node, draft parent, token, cell). The list lives in the middle of the
    workspace and grows at whichever end is nearer the newcomer's place, so the best is popped
    from `lo` and the worst dropped from `hi` in O(1), and an insertion moves the fewer entries.
    The list never holds more than half the workspace, so one end always has room."""
    if hi - lo >= room or hi - lo >= cs.shape[0] // 2:
        if hi == lo or not _better(score, draft_parent, token, cell, cs[hi - 1], ci[hi - 1, 1], ci[hi - 1, 2],
                                   ci[hi - 1, 3]):
            return lo, hi
        hi -= 1  # drop the worst
    a, b = lo, hi  # binary search: first entry the newcomer beats
    while a < b:
        mid = (a + b) // 2
        if _better(score, draft_parent, token, cell, cs[mid], ci[mid, 1], ci[mid, 2], ci[mid, 3]):
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
        w = _weight(freq, c, settings)
        total += w
        lo, hi = _offer(cs, ci, lo, hi, TOP_K, w, c, 0, links[c, TOKEN], 0)
        c = links[c, SIBLING]
    for i in range(TOP_K):
        j = lo + i  # best first
        if j < hi:
            top[i, 0], top[i, 1], top_w[i] = ci[j, 0], ci[j, 2], cs[j]
        else:
            top[i, 0], top[i, 1], top_w[i] = -1, -1, 0.0
    top_w[TOP_K] = total


@nb.njit(cache=True)
def _raise_in_top(top, top_w, node, token, weight):
    """A root child's weight grew to `weight`: move it up in `top`, or in if it now beats the last."""
    i = 0
    while i < TOP_K and top[i, 0] != node and top[i, 0] >= 0:
        i += 1
    if i == TOP_K:  # not in a full list: enter in place of the last if better
        i = TOP_K - 1
        if not _better(weight, 0, token, 0, top_w[i], 0, top[i, 1], 0):
            return
    top[i, 0], top[i, 1], top_w[i] = node, token, weight
    while i > 0 and _better(top_w[i], 0, top[i, 1], 0, top_w[i - 1], 0, top[i - 1, 1], 0):
        top[i, 0], top[i - 1, 0] = top[i - 1, 0], top[i, 0]
        top[i, 1], top[i - 1, 1] = top[i - 1, 1], top[i, 1]
        top_w[i], top_w[i - 1] = top_w[i - 1], top_w[i]
        i -= 1


@nb.njit(cache=True)
def _match(state, front, context, m):
    """Node of the last m context tokens, or -1. front[m-1] usually is that node already (the
    context is the stream `extend` has seen); checking it costs m parent hops, no sibling scans,
    and holds even if a prune freed or reused the node (the hops would not lead to the root)."""
    links = state.links
    n_context = context.shape[0]
    if m <= front.shape[0]:
        node = front[m - 1]
        q = n_context - 1
        while node >= 0 and q >= n_context - m and links[node, TOKEN] == context[q]:
            node = links[node, PARENT]
            q -= 1
        if q == n_context - m - 1 and node == ROOT:
            return front[m - 1]
    return _find_path(state, context, n_context - m, n_context)


@nb.njit(cache=True, inline="always")
def _cell(m_eff, ratio):
    """Calibration cell of a candidate: its context length (capped) and its relative weight's bin."""
    b = 0
    while b < CAL_BINS - 1 and ratio >= CAL_EDGES[b]:
        b += 1
    return min(m_eff, CAL_ROWS - 1) * CAL_BINS + b


@nb.njit(cache=True, inline="always")
def _calibrated(cal, score, m_eff, ratio):
    """(score, cell) of a candidate: its parent's score times its cell's observed rate; 0 where
    the node weighs nothing for this request (as uncalibrated: never drafted)."""
    cell = _cell(m_eff, ratio)
    if ratio <= 0.0:
        return np.float32(0.0), cell
    return np.float32(score * (cal[1, cell] / cal[0, cell])), cell


@nb.njit(cache=True)
def _select(state, settings, own, buffers, n_out, budget, lo, hi, expand, room):
    """Take candidates best-first from the list buffers.cand_*[lo:hi] into the draft (n_out nodes
    so far), offering each taken node's children in turn; a candidate whose (draft parent, token)
    exists already merges into that node. A child's score is its parent's times w(child) / w(parent)
    (calibrated: times its cell's rate; the children of stage-0 candidates, cell row 0, are never
    offered). Returns the new n_out.

    room: the list's bound, -1 for one stage's (uncalibrated): that stage needs no more than
    budget + 1 - n_out entries for new nodes plus one per node of earlier stages (each can absorb
    one merge from this stage, which costs no budget)."""
    links, freq, cal = state.links, state.freq, state.cal
    tokens, parents, depths, scores, cells = buffers.tokens, buffers.parents, buffers.depths, buffers.scores, \
        buffers.cells
    first, sibling = buffers.first_child, buffers.next_sibling
    cs, ci = buffers.cand_scores, buffers.cand_items
    calibrated = room >= 0
    n_start = n_out
    middle = cs.shape[0] // 2
    while hi > lo and n_out <= budget:
        score, node, dparent, token, cell = cs[lo], ci[lo, 0], ci[lo, 1], ci[lo, 2], ci[lo, 3]  # the best
        lo += 1
        if lo == hi:
            lo = hi = middle  # empty: recentre, so both ends have room again
        if score <= 0.0:
            continue
        d = first[dparent]
        while d >= 0 and tokens[d] != token:
            d = sibling[d]
        if d < 0:
            d = n_out
            tokens[d], parents[d], depths[d], scores[d] = token, dparent, depths[dparent] + 1, score
            cells[d] = cell
            first[d] = -1
            sibling[d] = first[dparent]
            first[dparent] = d
            n_out += 1
        if settings.mode == MODE_SINGLE:
            lo = hi = middle  # one branch: only children of the node just taken compete next
        w_node = _own_weight(freq, own, node, settings)
        if w_node <= 0.0 or not expand or (calibrated and cell < CAL_BINS):
            continue
        c = links[node, CHILD]
        while c >= 0:
            ratio = _own_weight(freq, own, c, settings) / w_node
            if calibrated:
                child_score, child_cell = _calibrated(cal, score, cell // CAL_BINS + 1, ratio)
                lo, hi = _offer(cs, ci, lo, hi, room, child_score, c, d, links[c, TOKEN], child_cell)
            else:
                lo, hi = _offer(cs, ci, lo, hi, budget + n_start - n_out, np.float32(score * ratio), c, d,
                                links[c, TOKEN], -1)
            c = links[c, SIBLING]
    return n_out


@nb.njit(cache=True)
def _stage(state, settings, own, buffers, matched, n_out, budget):
    """Offer one stage's first candidates (children of `matched`, or state.top for stage 0 when
    matched == ROOT) and select from them; returns the new n_out."""
    links, freq, top, top_w = state.links, state.freq, state.top, state.top_w
    cs, ci = buffers.cand_scores, buffers.cand_items
    lo = hi = cs.shape[0] // 2
    room = budget  # = budget + 1 - n_out new nodes + up to n_out - 1 merges (see _select)
    if matched == ROOT:
        total = top_w[TOP_K]
        for i in range(TOP_K):
            node, token = top[i, 0], top[i, 1]
            if node >= 0 and total > 0.0:
                lo, hi = _offer(cs, ci, lo, hi, room, np.float32(top_w[i] / total), node, 0, token, -1)
    else:
        w_matched = _own_weight(freq, own, matched, settings)
        if w_matched <= 0.0:
            return n_out
        c = links[matched, CHILD]
        while c >= 0:
            lo, hi = _offer(cs, ci, lo, hi, room, np.float32(_own_weight(freq, own, c, settings) / w_matched),
                            c, 0, links[c, TOKEN], -1)
            c = links[c, SIBLING]
    return _select(state, settings, own, buffers, n_out, budget, lo, hi, matched != ROOT, -1)


@nb.njit(cache=True)
def _all_stages(state, settings, own, front, buffers, context, budget):
    """Calibrated retrieval (module docstring): every stage offers its first candidates into one
    list, scored by their cells' rates; then one best-first selection. Returns n (root included)."""
    links, freq, top, top_w, cal = state.links, state.freq, state.top, state.top_w, state.cal
    cs, ci = buffers.cand_scores, buffers.cand_items
    lo = hi = cs.shape[0] // 2
    # A candidate taken either drafts a node (budget + 1 at most) or merges into one; a draft node
    # absorbs at most one merge per stage (max_match + 1 of them), so no dropped newcomer could
    # ever have been taken.
    room = min(cs.shape[0] // 2, (budget + 1) * (settings.max_match + 2))
    last = 0 if settings.use_top else 1
    for m in range(min(settings.max_match, context.shape[0]), last - 1, -1):
        if m == 0:
            total = top_w[TOP_K]
            for i in range(TOP_K):
                node, token = top[i, 0], top[i, 1]
                if node >= 0 and total > 0.0:
                    score, cell = _calibrated(cal, np.float32(1.0), 0, np.float32(top_w[i] / total))
                    lo, hi = _offer(cs, ci, lo, hi, room, score, node, 0, token, cell)
            continue
        matched = _match(state, front, context, m)
        if matched < 0:
            continue
        w_matched = _own_weight(freq, own, matched, settings)
        if w_matched <= 0.0:
            continue
        c = links[matched, CHILD]
        while c >= 0:
            score, cell = _calibrated(cal, np.float32(1.0), m, _own_weight(freq, own, c, settings) / w_matched)
            lo, hi = _offer(cs, ci, lo, hi, room, score, c, 0, links[c, TOKEN], cell)
            c = links[c, SIBLING]
    return _select(state, settings, own, buffers, 1, budget, lo, hi, True, room)


@nb.njit(cache=True)
def learn(state, stream, pos, tokens, parents, depths, cells, final):
    """Teach the calibration what became of one proposal drafted when the stream held `pos` tokens
    (its root the last of them): a node whose parent's path came true counts in its cell, and as a
    hit when its own token came true too. Nodes beyond the stream are not judged; unless `final`,
    nothing is learnt (False returned) until the stream reaches the proposal's deepest node."""
    known = stream.shape[0] - pos
    n = tokens.shape[0]
    if not final:
        for i in range(1, n):
            if depths[i] > known:
                return False
    cal = state.cal
    came_true = np.zeros(n, np.bool_)
    came_true[0] = True
    for i in range(1, n):
        cell = cells[i]
        if cell < 0 or not came_true[parents[i]] or depths[i] > known:
            continue
        hit = stream[pos + depths[i] - 1] == tokens[i]
        cal[0, cell] += 1.0
        if hit:
            cal[1, cell] += 1.0
        if cal[0, cell] >= CAL_CAP:
            cal[0, cell] *= 0.5
            cal[1, cell] *= 0.5
        came_true[i] = hit
    return True


@nb.njit(cache=True)
def retrieve(state, settings, cursor, buffers, context, budget):
    """Draft tree continuing `context` (module docstring, "Retrieval"), written to buffers.tokens,
    parents, depths and scores; returns its node count n (root included, at most budget + 1),
    nodes in best-first order, weighted for the request at `cursor`. The buffers must hold
    budget + 1 nodes (new_buffers(budget))."""
    own = _own_view(state, cursor[CURSOR_SLOT])
    front = cursor[CURSOR_FRONT:]
    buffers.tokens[0], buffers.parents[0], buffers.depths[0] = context[context.shape[0] - 1], -1, 0
    buffers.first_child[0] = buffers.next_sibling[0] = -1
    buffers.scores[0] = 1.0
    buffers.cells[0] = -1
    if settings.calibrated:
        return _all_stages(state, settings, own, front, buffers, context, budget)
    n_out = 1
    fallback = -2  # paper mode: the longest suffix that offered anything (-2: none)
    last = 0 if settings.use_top else 1
    for m in range(min(settings.max_match, context.shape[0]), last - 1, -1):
        if n_out > budget:
            break
        matched = ROOT if m == 0 else _match(state, front, context, m)
        if matched < 0 and m > 0:
            continue
        if settings.fill:
            n_out = _stage(state, settings, own, buffers, matched, n_out, budget)
        else:
            buffers.first_child[0] = -1
            n_got = _stage(state, settings, own, buffers, matched, 1, budget)
            if n_got - 1 >= settings.min_stage_nodes:
                return n_got
            if n_got > 1 and fallback == -2:
                fallback = m
        if settings.mode == MODE_SINGLE and n_out > 1:
            break  # a single branch comes from one stage
    if fallback != -2:  # redo the stage that won (cheaper than keeping a copy of every stage)
        matched = ROOT if fallback == 0 else _match(state, front, context, fallback)
        buffers.first_child[0] = -1
        n_out = _stage(state, settings, own, buffers, matched, 1, budget)
    return n_out


@nb.njit(cache=True)
def step(state, settings, stream, cursor, buffers, context, budget):
    """One decode step in one call (a numba dispatch costs about a microsecond): count the tokens
    accepted since the last step, then draft the continuation of `context` (usually the stream
    itself, whose suffix nodes the cursor's front already holds; any other context is matched from the root)."""
    extend(state, settings, stream, cursor)
    return retrieve(state, settings, cursor, buffers, context, budget)


# -- checks --------------------------------------------------------------------------------------


@nb.njit(cache=True)
def find_corruption(state):
    """Return (code, node) for the first broken invariant of the pool (links, freq, free, root,
    meta), or (0, -1) when it is consistent.

    1 bad free list, 2 bad token / parent, 3 root index disagrees, 4 child list broken (a node
    reached twice, from the wrong parent, or a live node unreachable), 5 a count negative or not
    finite, or RECENT above OUTPUT, 6 two siblings hold the same token, 7 a request's own counts
    disagree with the sums (PROMPT exactly, RECENT to rounding), are negative, or are not zero
    where no request or no node holds them.
    """
    links, freq, free, root, meta = state.links, state.freq, state.free, state.root, state.meta
    live = state.live
    capacity, token_limit = links.shape[0], root.shape[0]
    n_free = meta[N_FREE]
    if n_free < 0 or n_free > capacity or meta[ROOT_FIRST] < -1 or meta[ROOT_FIRST] >= capacity:
        return 1, -1
    on_free = np.zeros(capacity, np.bool_)
    for i in range(n_free):
        node = free[i]
        if node < 0 or node >= capacity or on_free[node] or links[node, PARENT] != FREE:
            return 1, node
        on_free[node] = True
    for node in range(capacity):
        p = links[node, PARENT]
        if p == FREE:
            if not on_free[node]:
                return 1, node
            continue
        t = links[node, TOKEN]
        if t < 0 or t >= token_limit or p < ROOT or p >= capacity or (p >= 0 and links[p, PARENT] == FREE):
            return 2, node
        if p == ROOT and root[t] != node:
            return 3, node
        for f in (PROMPT, OUTPUT, RECENT):
            if not (freq[node, f] >= 0.0 and np.isfinite(freq[node, f])):
                return 5, node
        if freq[node, RECENT] > freq[node, OUTPUT]:
            return 5, node
    for node in range(capacity):
        node_free = links[node, PARENT] == FREE
        own_prompt = 0.0
        own_recent = 0.0
        for slot in range(live.shape[0]):
            slot_own = _own_view(state, slot)
            p_own, r_own = slot_own[node, OWN_PROMPT], slot_own[node, OWN_RECENT]
            if (node_free or not live[slot]) and (p_own != 0.0 or r_own != 0.0):
                return 7, node
            if not (p_own >= 0.0 and r_own >= 0.0 and np.isfinite(p_own) and np.isfinite(r_own)):
                return 7, node
            own_prompt += p_own
            own_recent += r_own
        if not node_free and (own_prompt != freq[node, PROMPT]
                              or abs(own_recent - freq[node, RECENT]) > 1e-3 * max(1.0, freq[node, RECENT])):
            return 7, node
    for t in range(token_limit):
        node = root[t]
        if node != -1 and (node < 0 or node >= capacity or links[node, PARENT] != ROOT or links[node, TOKEN] != t):
            return 3, node
    seen = np.zeros(capacity, np.bool_)
    n_seen = 0
    stack = [ROOT]
    while len(stack) > 0:
        parent = stack.pop()
        c = meta[ROOT_FIRST] if parent == ROOT else links[parent, CHILD]
        first = c
        while c >= 0:
            if c >= capacity or seen[c] or links[c, PARENT] != parent:
                return 4, c
            seen[c] = True
            n_seen += 1
            other = first
            while other != c:
                if links[other, TOKEN] == links[c, TOKEN]:
                    return 6, c
                other = links[other, SIBLING]
            stack.append(c)
            c = links[c, SIBLING]
    if n_seen + n_free != capacity:
        return 4, -1
    return 0, -1


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel once, on a throwaway pool (draftcore.jit).
    The argument types must be those TrieDrafter passes, or its first call compiles again."""
    state = new_state(64, 16, 2)
    tokens = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3], np.int32)
    buffers = new_buffers(8)
    for fill, calibrated in ((True, True), (True, False), (False, False)):
        settings = Settings(max_match=3, prompt_weight=2.0, recent_weight=2.0, min_stage_nodes=2, fill=fill,
                            use_top=True, mode=MODE_HIERARCHICAL if fill else MODE_SINGLE, calibrated=calibrated)
        cursor = new_cursor(1, 4, int(state.meta[N_PRUNES]))
        state.live[1] = True
        extend(state, settings, Stream(tokens=tokens, begin=0, end=5, n_prompt=4, count_from=0), cursor)
        n = retrieve(state, settings, cursor, buffers, tokens[:5], 8)
        rows = buffers.tokens.base[:, :n].copy()
        learn(state, tokens, 5, rows[0], rows[1], rows[2], rows[4], True)
        step(state, settings, Stream(tokens=tokens, begin=5, end=9, n_prompt=4, count_from=0), cursor, buffers,
             tokens, 8)
        make_room(state, 60)
        refresh_top(state, settings)
        end_request(state, settings, Stream(tokens=tokens, begin=9, end=9, n_prompt=4, count_from=0), cursor, False)
        state.live[1] = False
    find_corruption(state)
