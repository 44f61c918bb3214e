"""Numba kernel that checks a trie node pool (trie_pool_kernels) for consistency: what
TrieDrafter.check_integrity and TrieDrafter.load run, and what the tests run after every operation."""
import numba as nb
import numpy as np

from .trie_pool_kernels import (CHILD, FREE, N_FREE, OUTPUT, OWN_PROMPT, OWN_RECENT, PARENT, PROMPT, RECENT,
                                ROOT, ROOT_FIRST, SIBLING, TOKEN, new_state, own_view)


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
            slot_own = own_view(state, slot)
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
    """Compile (or load from numba's cache) `find_corruption` on a throwaway pool (draftcore.jit)."""
    find_corruption(new_state(64, 16, 2))
