"""Numba kernels that draft from the trie's node pool (trie_pool_kernels): Lookahead's multi-stage
retrieval (Zhao et al., KDD 2024, §4.3), and one decode step (count, then draft) in one call.

    DraftBuffers  where retrieval writes, built by `new_buffers(budget)`: the draft's tokens,
                  parents, depths, scores and calibration cells, its child lists (first_child,
                  next_sibling), and the candidate list (cand_scores, cand_items rows (trie node,
                  draft parent, token, cell); trie_candidate_kernels)

Retrieval (multi-stage). Stages run from the longest context suffix (at most max_match tokens) to
the shortest, then stage 0, the empty suffix: the root's heaviest children (`top`), one token deep
(the most frequent tokens, a last resort; their continuations are not worth the budget). A stage
matched at node u offers u's sub-trie best-first, a node v scored w(v) / w(u) (an estimate that
the whole path is accepted). Without `fill` (the paper) the first stage that offers at least min_stage_nodes
nodes is used alone (if none does, the longest that offers any). With `fill`, stages accumulate
until the budget is spent, later stages only adding continuations the earlier ones lack (merged
where their token paths coincide). Candidates are ordered by (score desc, draft parent asc, token
asc, cell desc), so results are deterministic and match tests/naive.py exactly. Calibrated
retrieval (`calibrated`, the default) scores candidates by their cells' rates instead and lets
every stage offer into one list (`_all_stages`; trie_calibration_kernels).
"""
from collections import namedtuple

import numba as nb
import numpy as np

from .trie_calibration_kernels import CAL_BINS, calibrated_score
from .trie_candidate_kernels import offer
from .trie_count_kernels import CURSOR_FRONT, CURSOR_SLOT, Stream, end_request, extend, new_cursor
from .trie_pool_kernels import (CHILD, MODE_HIERARCHICAL, MODE_SINGLE, N_PRUNES, PARENT, ROOT, SIBLING, TOKEN,
                                TOP_K, find_path, new_state, own_view, own_weight, warm_up_settings)

CANDIDATES = 1 << 12   # candidate workspace (at least 4 * (budget + 2)): the list, kept in its
                       # middle, never holds more than 2 * budget + 1 entries
DraftBuffers = namedtuple("DraftBuffers",
                          "tokens parents depths scores cells first_child next_sibling cand_scores cand_items")


def new_buffers(budget: int) -> DraftBuffers:
    """Buffers for drafts of at most `budget` nodes besides the root. The draft's tokens, parents,
    depths, scores and cells are the rows of one int32[5, budget + 1] block (`tokens.base`; scores
    seen as float32), so a caller copies a draft out in one go."""
    n, n_candidates = budget + 1, max(CANDIDATES, 4 * (budget + 2))
    block = np.empty((5, n), np.int32)
    return DraftBuffers(tokens=block[0], parents=block[1], depths=block[2], scores=block[3].view(np.float32),
                        cells=block[4], first_child=np.empty(n, np.int32), next_sibling=np.empty(n, np.int32),
                        cand_scores=np.empty(n_candidates, np.float32), cand_items=np.empty((n_candidates, 4), np.int32))


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
    return find_path(state, context, n_context - m, n_context)


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
        w_node = own_weight(freq, own, node, settings)
        if w_node <= 0.0 or not expand or (calibrated and cell < CAL_BINS):
            continue
        c = links[node, CHILD]
        while c >= 0:
            ratio = own_weight(freq, own, c, settings) / w_node
            if calibrated:
                child_score, child_cell = calibrated_score(cal, score, cell // CAL_BINS + 1, ratio)
                lo, hi = offer(cs, ci, lo, hi, room, child_score, c, d, links[c, TOKEN], child_cell)
            else:
                lo, hi = offer(cs, ci, lo, hi, budget + n_start - n_out, np.float32(score * ratio), c, d,
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
                lo, hi = offer(cs, ci, lo, hi, room, np.float32(top_w[i] / total), node, 0, token, -1)
    else:
        w_matched = own_weight(freq, own, matched, settings)
        if w_matched <= 0.0:
            return n_out
        c = links[matched, CHILD]
        while c >= 0:
            lo, hi = offer(cs, ci, lo, hi, room, np.float32(own_weight(freq, own, c, settings) / w_matched),
                            c, 0, links[c, TOKEN], -1)
            c = links[c, SIBLING]
    return _select(state, settings, own, buffers, n_out, budget, lo, hi, matched != ROOT, -1)


@nb.njit(cache=True)
def _all_stages(state, settings, own, front, buffers, context, budget):
    """Calibrated retrieval (trie_calibration_kernels): every stage offers its first candidates into
    one list, scored by their cells' rates; then one best-first selection. Returns n (root included)."""
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
                    score, cell = calibrated_score(cal, np.float32(1.0), 0, np.float32(top_w[i] / total))
                    lo, hi = offer(cs, ci, lo, hi, room, score, node, 0, token, cell)
            continue
        matched = _match(state, front, context, m)
        if matched < 0:
            continue
        w_matched = own_weight(freq, own, matched, settings)
        if w_matched <= 0.0:
            continue
        c = links[matched, CHILD]
        while c >= 0:
            score, cell = calibrated_score(cal, np.float32(1.0), m, own_weight(freq, own, c, settings) / w_matched)
            lo, hi = offer(cs, ci, lo, hi, room, score, c, 0, links[c, TOKEN], cell)
            c = links[c, SIBLING]
    return _select(state, settings, own, buffers, 1, budget, lo, hi, True, room)


@nb.njit(cache=True)
def retrieve(state, settings, cursor, buffers, context, budget):
    """Draft tree continuing `context` (module docstring, "Retrieval"), written to buffers.tokens,
    parents, depths and scores; returns its node count n (root included, at most budget + 1),
    nodes in best-first order, weighted for the request at `cursor`. The buffers must hold
    budget + 1 nodes (new_buffers(budget))."""
    own = own_view(state, cursor[CURSOR_SLOT])
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
    """One decode step in one call (a numba dispatch is not free: docs/drafters.md): count the tokens
    accepted since the last step, then draft the continuation of `context` (usually the stream
    itself, whose suffix nodes the cursor's front already holds; any other context is matched from the root)."""
    extend(state, settings, stream, cursor)
    return retrieve(state, settings, cursor, buffers, context, budget)


def warm_up() -> None:
    """Compile (or load from numba's cache) `retrieve` and `step` on a throwaway pool, with the
    argument types TrieDrafter and its requests pass (draftcore.jit)."""
    state = new_state(64, 16, 2)
    tokens = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3], np.int32)
    buffers = new_buffers(8)
    for fill, calibrated in ((True, True), (True, False), (False, False)):
        settings = warm_up_settings(fill=fill, mode=MODE_HIERARCHICAL if fill else MODE_SINGLE, calibrated=calibrated)
        cursor = new_cursor(1, 4, int(state.meta[N_PRUNES]))
        state.live[1] = True
        extend(state, settings, Stream(tokens=tokens, begin=0, end=5, n_prompt=4, count_from=0), cursor)
        retrieve(state, settings, cursor, buffers, tokens[:5], 8)
        step(state, settings, Stream(tokens=tokens, begin=5, end=9, n_prompt=4, count_from=0), cursor, buffers,
             tokens, 8)
        end_request(state, settings, Stream(tokens=tokens, begin=9, end=9, n_prompt=4, count_from=0), cursor, False)
        state.live[1] = False
