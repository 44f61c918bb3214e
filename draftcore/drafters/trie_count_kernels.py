"""Numba kernels that count a request's tokens into the trie's node pool (trie_pool_kernels) and
take its own counts back at its end: branch inserting and eliminating of Lookahead (Zhao et al.,
KDD 2024, §4.2-4.3).

    cursor  int64[CURSOR_FRONT + branch_length]: where one request stands in the shared trie —
            cursor[CURSOR_SLOT] its slot, cursor[CURSOR_SEEN] the N_PRUNES its front was computed
            at (any prune may free a front node), cursor[CURSOR_FRONT + k] = front[k] = node of the
            n-gram stream[p-k .. p] after token p. One array, not a tuple of three: every kernel
            call unboxes each argument it takes, at a cost per array (docs/drafters.md).
    Stream  a request's tokens: tokens[:end] is the stream so far (prompt first, n_prompt tokens),
            tokens[begin:end] the tokens not counted yet; branches starting before count_from are
            never counted (0, or n_prompt to leave the prompt out)

Counting. Every start position s of a request's stream (prompt + output) opens a branch of at most
`branch_length` tokens: a PROMPT branch when s lies in the prompt, an OUTPUT branch otherwise. A
node's count of a kind is the number of branches of that kind through it, so (until a decay) a
parent counts at least as much as each child. Branches grow on the fly: when token p arrives, the
node of stream[s..p] gains one count for each s in (p - branch_length, p]; the node of
stream[s..p-1] is front[p-1-s], so a token costs branch_length child look-ups, not branch_length².
RECENT repeats the OUTPUT counts of the request in progress (RECENT <= OUTPUT), so the request's
own text — prompt and output — can be weighted above the history of earlier requests (the weight,
trie_pool_kernels: w = prompt_weight * PROMPT + recent_weight * RECENT + OUTPUT).
At the end of a request its PROMPT counts are removed (branch eliminating), RECENT is zeroed and
the nodes of its branches that fell below 1 are freed; OUTPUT counts persist across requests.

Concurrent requests. Any number of requests may be in progress on one trie (their kernel calls
are serialised by the TriePool's lock). OUTPUT is shared: every request's output teaches every
other one. A request's PROMPT and RECENT counts are its own: they live in its slot of `own`, and a
request's weights (retrieval stages 1 and longer) read only its own, so one request never drafts
from another's prompt. The node rows' PROMPT and RECENT columns hold the sums over live requests:
they keep a live prompt branch from being pruned and rank the root's children for stage 0 (`top`,
shared). With one request in progress the two agree exactly and everything reads as written for
one request. A request's own PROMPT counts also hold the model's tokens it learnt at its rejected
candidates (trie_model_kernels: counted on single nodes, not branches, and taken back before its
branch eliminating).
"""
from collections import namedtuple

import numba as nb
import numpy as np

from .trie_candidate_kernels import raise_in_top, refresh_top
from .trie_pool_kernels import (N_FREE, N_PRUNES, OUTPUT, OWN_PROMPT, OWN_RECENT, PROMPT, RECENT, ROOT, TOP_K,
                                add_child, find_child, find_path, give_back_prompt, make_room, new_state, own_view,
                                prune_lists, warm_up_settings, weight)

CURSOR_SLOT, CURSOR_SEEN, CURSOR_FRONT = 0, 1, 2
Stream = namedtuple("Stream", "tokens begin end n_prompt count_from")


def new_cursor(slot: int, branch_length: int, n_prunes: int) -> np.ndarray:
    """A request's cursor: no branch counted yet (front all -1, valid until the next prune)."""
    cursor = np.full(CURSOR_FRONT + branch_length, -1, np.int64)
    cursor[CURSOR_SLOT], cursor[CURSOR_SEEN] = slot, n_prunes
    return cursor


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
        front[k] = find_path(state, tokens, s, n_stream)


@nb.njit(cache=True)
def extend(state, settings, stream, cursor):
    """Count the branches that stream.tokens[begin:end] extend (module docstring, "Counting") for
    the request at `cursor`; its front describes tokens[:begin] unless a prune came since."""
    links, freq, meta, top, top_w = state.links, state.freq, state.meta, state.top, state.top_w
    own = own_view(state, cursor[CURSOR_SLOT])
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
                parent = find_path(state, tokens, p - k, p)
            node = -1
            if k == 0 or parent >= 0:
                node = find_child(links, state.root, parent, token)
                if node < 0:
                    node = add_child(state, parent, token)
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
                    raise_in_top(top, top_w, node, token, weight(freq, node, settings))
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
    own = own_view(state, cursor[CURSOR_SLOT])
    branch_length, n_stream = cursor.shape[0] - CURSOR_FRONT, stream.end
    touched = [ROOT][:0]  # parents of nodes that fell below 1 (ROOT included), typed int64
    for s in range(n_stream):
        counted_prompt = stream.count_from <= s < stream.n_prompt
        node = ROOT
        for q in range(s, min(s + branch_length, n_stream)):
            parent = node
            node = find_child(links, root, parent, tokens[q])
            if node < 0:
                break
            if counted_prompt:
                give_back_prompt(freq, own, node)
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
    prune_lists(state, touched)
    refresh_top(state, settings)


def warm_up() -> None:
    """Compile (or load from numba's cache) both kernels on a throwaway pool, with the argument types
    TrieRequest passes (draftcore.jit)."""
    state = new_state(64, 16, 2)
    settings = warm_up_settings()
    tokens = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3], np.int32)
    cursor = new_cursor(1, 4, int(state.meta[N_PRUNES]))
    state.live[1] = True
    extend(state, settings, Stream(tokens=tokens, begin=0, end=9, n_prompt=4, count_from=0), cursor)
    end_request(state, settings, Stream(tokens=tokens, begin=9, end=9, n_prompt=4, count_from=0), cursor, False)
