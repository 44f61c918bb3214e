"""Numba kernels with which a trie request learns the model's tokens at rejected candidates.

After a verify, the model's token at a candidate off the accepted path is a real continuation of
that candidate's prefix (the context, then the path to it), one the stream will never show: the
request took another branch. A request counts each such continuation as its own, for the rest of
the request only. Counting them across requests, as output branches are, was measured and
rejected: on SmolLM2 it helped HumanEval and cost MT-Bench (docs/design.md, Drafters, "The trie
learns the model's tokens"); what the model says after a prefix that did not happen helps the
request that said it.

A learnt continuation is kept as a snippet: the last `tail` tokens (at most; `Learnt.tokens.shape[1]
- 1`) of the candidate's prefix, then the model's token t. For each suffix of the prefix part (1 ..
tail tokens) whose node the trie holds, the child t of that node (created where missing) gains one
PROMPT count, in the request's own counts and in the sums. The suffix node itself gains nothing:
its other continuations keep their relative weights, and t is offered after that suffix with the
weight of one prompt occurrence (prompt_weight). Counting the whole branch, suffix nodes included,
as a prompt branch is counted, was measured first and lost on MT-Bench (it dilutes every other
continuation of the suffix; docs/drafters.md).

Learnt nodes are at depth 2 or more, so the root's children and stage 0 (`top`) never change
here, but for decay. Such a count does not hold up its parent as a prompt branch does: when decay
frees the suffix node, the learnt child goes with it (its counts with the node). So forgetting is
by walking again: a snippet forgotten takes one own PROMPT count (not below 0) from each learnt
child still in the trie, and a child that falls below 1 is freed with what is below it (a local
prune, as trie_count_kernels.end_request does). The request's end forgets every snippet, which leaves its
own counts of them exactly zero (every count was given by one snippet, and every snippet walks
again). The snippets live in a ring of bounded size (`Learnt`): when it is full, the oldest is
forgotten to make room.

    Learnt   a request's snippets: tokens int32[capacity, tail + 1] (a snippet right-aligned, its
             first `tail + 1 - length` entries unused), lengths int32[capacity], ring int64[2]
             (index of the oldest, count)
"""
from collections import namedtuple

import numba as nb
import numpy as np

from .trie_candidate_kernels import refresh_top
from .trie_count_kernels import Stream, extend, new_cursor
from .trie_pool_kernels import (N_FREE, OUTPUT, OWN_PROMPT, PROMPT, ROOT, add_child, find_child, find_path,
                                give_back_prompt, make_room, new_state, own_view, prune_lists, warm_up_settings)

Learnt = namedtuple("Learnt", "tokens lengths ring")
RING_OLDEST, RING_COUNT = 0, 1


def new_learnt(capacity: int, tail: int) -> Learnt:
    return Learnt(tokens=np.zeros((capacity, tail + 1), np.int32), lengths=np.zeros(capacity, np.int32),
                  ring=np.zeros(2, np.int64))


@nb.njit(cache=True, inline="always")
def _learnt_node(state, snippet, s):
    """(suffix node, its child holding the model's token) for the suffix snippet[s:-1]; -1 where
    missing."""
    last = snippet.shape[0] - 1
    parent = find_path(state, snippet, s, last)
    if parent < 0:
        return -1, -1
    return parent, find_child(state.links, state.root, parent, snippet[last])


@nb.njit(cache=True)
def _count_snippet(state, own, snippet, first):
    """One own PROMPT count for the model's token after each suffix of snippet[first:-1] the trie
    holds (module docstring); the child is created where missing and the pool has a node."""
    freq = state.freq
    last = snippet.shape[0] - 1
    for s in range(first, last):
        parent, node = _learnt_node(state, snippet, s)
        if parent < 0:
            continue
        if node < 0:
            node = add_child(state, parent, snippet[last])
            if node < 0:
                continue
        freq[node, PROMPT] += 1.0
        own[node, OWN_PROMPT] += 1.0


@nb.njit(cache=True)
def _uncount_snippet(state, own, snippet, first, touched):
    """Take back what _count_snippet gave, where the nodes still stand; the parent of a child that
    fell below 1 goes to `touched` (for prune_lists)."""
    freq = state.freq
    for s in range(first, snippet.shape[0] - 1):
        parent, node = _learnt_node(state, snippet, s)
        if node < 0:
            continue
        give_back_prompt(freq, own, node)
        if freq[node, PROMPT] + freq[node, OUTPUT] < 1.0:
            touched.append(parent)


@nb.njit(cache=True)
def _forget_oldest(state, own, learnt, touched):
    tail_plus = learnt.tokens.shape[1]
    i = learnt.ring[RING_OLDEST]
    _uncount_snippet(state, own, learnt.tokens[i], tail_plus - learnt.lengths[i], touched)
    learnt.lengths[i] = 0
    learnt.ring[RING_OLDEST] = (i + 1) % learnt.lengths.shape[0]
    learnt.ring[RING_COUNT] -= 1


@nb.njit(cache=True)
def learn(state, settings, slot, learnt, context, tokens, parents, n_candidates, node_tokens, path):
    """Count, for the request in `slot`, the model's token at every evaluated candidate of the
    verified tree (tokens, parents: root first, its root context[-1]) that is off the accepted
    `path` (node indices; path nodes' continuations arrive as accepted tokens), after up to `tail`
    tokens of its prefix; a full ring forgets its oldest snippet first. When fewer than `tail`
    nodes are free, make_room runs first (as `extend` does before a token)."""
    own = own_view(state, slot)
    token_limit = state.root.shape[0]
    capacity = state.links.shape[0]
    tail_plus = learnt.tokens.shape[1]
    n_ring = learnt.lengths.shape[0]
    snippet = np.empty(tail_plus, np.int32)
    on_path = np.zeros(n_candidates, np.bool_)
    for j in range(path.shape[0]):
        on_path[path[j]] = True
    touched = [ROOT][:0]
    decayed = False
    for i in range(1, n_candidates):
        model_token = node_tokens[i]
        if on_path[i] or model_token < 0 or model_token >= token_limit:
            continue
        first = tail_plus - 1
        snippet[first] = model_token
        node = i
        while node > 0 and first > 0:
            first -= 1
            snippet[first] = tokens[node]
            node = parents[node]
        q = context.shape[0] - 1
        while first > 0 and q >= 0:
            first -= 1
            snippet[first] = context[q]
            q -= 1
        if learnt.ring[RING_COUNT] == n_ring:
            _forget_oldest(state, own, learnt, touched)
        if state.meta[N_FREE] < tail_plus - 1:
            make_room(state, max(tail_plus - 1, capacity // 8))
            decayed = True
            touched.clear()   # make_room freed every node below 1, these included
        _count_snippet(state, own, snippet, first)
        at = (learnt.ring[RING_OLDEST] + learnt.ring[RING_COUNT]) % n_ring
        learnt.tokens[at, :] = snippet
        learnt.lengths[at] = tail_plus - first
        learnt.ring[RING_COUNT] += 1
    if len(touched) > 0:
        prune_lists(state, touched)
    if decayed:
        refresh_top(state, settings)


@nb.njit(cache=True)
def forget_all(state, slot, learnt):
    """Take back every snippet's counts (a request's end, before its branch eliminating) and free
    the learnt children that fell below 1; the ring is left empty."""
    own = own_view(state, slot)
    touched = [ROOT][:0]
    while learnt.ring[RING_COUNT] > 0:
        _forget_oldest(state, own, learnt, touched)
    learnt.ring[RING_OLDEST] = 0
    if len(touched) > 0:
        prune_lists(state, touched)


def warm_up() -> None:
    """Compile (or load from numba's cache) both kernels on a throwaway pool, with the argument
    types TrieRequest passes (draftcore.jit)."""
    state = new_state(64, 16, 1)
    state.live[0] = True
    settings = warm_up_settings()
    context = np.array([1, 2, 3], np.int32)
    extend(state, settings, Stream(tokens=context, begin=0, end=3, n_prompt=3, count_from=0), new_cursor(0, 4, 0))
    learnt = new_learnt(2, 3)
    tokens = np.array([3, 4, 5, 6], np.int32)
    parents = np.array([-1, 0, 1, 0], np.int32)
    node_tokens = np.array([4, 7, 8, 9], np.int32)
    path = np.array([0, 1], np.int32)
    for _ in range(2):   # the second call fills the ring and forgets
        learn(state, settings, 0, learnt, context, tokens, parents, 4, node_tokens, path)
    forget_all(state, 0, learnt)
