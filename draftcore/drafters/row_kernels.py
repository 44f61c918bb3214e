"""Numba kernels of RowDrafter (rows.py): one call per engine step drafts a chain for every row of
a batch, over the trie drafter's shared node pool (trie_pool_kernels).

A serving engine hands its drafter rows of token ids, not requests: row r holds some request's
tokens rows[r, :n_tokens[r]] (prompt first, the token just sampled last), and between steps rows
are reused by new requests, swapped and condensed. The kernels keep each request's state (its own
copy of its tokens, its trie slot and cursor, the chain proposed for it) in a *state* of a table,
and find every row's state again at each step by content alone:

    a row holds state s  iff  s's tokens are a prefix of the row:  table.tokens[s, :n] == rows[r, :n]

That test is exact, not a fingerprint: what a state holds is a function of its tokens only (counts,
cursor), so a row that passes it continues exactly the state a fresh request with those tokens
would have built, whichever request the engine calls it; a row that fails it never sees the state.
Each step (`step_rows`):

    1. rows that still hold the state they held last step keep it;
    2. a row that lost its state looks for an unclaimed state it holds (a request moved rows);
    3. a state that no row holds any more ends (trie_count_kernels.end_request: its prompt counts
       go, what it generated stays in the shared pool);
    4. each active row: a new state if it has none (everything before the last token is its prompt);
       the tokens new since the last step are checked (ids in [0, token_limit)), learnt from (the
       chain proposed last step: how many of its tokens the row now holds) and appended;
    5. each active row: the trie drafts its best-first tree; the chain of first children (each
       node's best child) is cut by the cost rule below and written to out_tokens[r, :out_len[r]].
       Every row is cut with the calibration of step 4, so a row's chain does not depend on where
       the other rows sit in the batch.

Cost rule (the bare call's CostAwareBudget rule, on a cost model instead of a clock, so that every
tensor-parallel rank computes the same drafts from the same rows): the chain's j-th token is
accepted with probability p_j, the trie's score calibrated against what rows really accepted
(per score bin and chain position, a weak prior that the score is right, evidence fading over
`memory` steps), plus explore / sqrt(evidence) where evidence is thin, so that a cell that lost
early is offered again instead of never again; a step that verifies m drafted tokens costs
(1 + c * m) times its own share of a step, and the chain kept is the m in 0..limit maximising
(1 + p_1 + ... + p_m) / (1 + c * m). With one row, c = token_cost; with n rows sharing a step, a
row's share of it shrinks and c grows (`_token_cost`: a step costs a + b * rows + d * drafted,
token_cost = d / (a + b), row_cost = b / a): drafting tuned for one row lost to plain decoding
with 8 rows where the same drafts gained at batch 1 (docs/drafters.md). m = 0 (no draft) wins
where a draft is unlikely to pay.

Match-length rule (vLLM's suffix method's, made cost-aware): before the cut, a row's chain is
limited to max(1, match_cost / c) times the longest suffix of its context (up to the trie's
max_match) that occurred before with a continuation. A chain continuing a 1-token match is a guess
however confident the trie's count ratios look; cells calibrated over chains of every match length
priced the long matches' chains down and the short ones' up. Replayed, it drafts where the matches
are long (docs/drafters.md).

    RowTable       the states, built by `new_table`; arrays changed in place
        tokens     int32[n_states, max_len]   each state's copy of its request's tokens
        n_stream   int64[n_states]            tokens held (its request's length at its last step)
        n_counted  int64[n_states]            tokens whose branches the trie has counted
        n_prompt   int64[n_states]            the first n_prompt tokens are the prompt
        cursors    int64[n_states, CURSOR_FRONT + branch_length]  trie cursors; each owns a trie
                                              slot for good (cursor[CURSOR_SLOT])
        in_use     bool[n_states]
        row_state  int64[max_rows]            the state each row held at the last step (-1: none)
        chain      int32[n_states, max_draft] the chain proposed at a state's last step ...
        chain_bin  int64[n_states, max_draft] ... the calibration cell of each of its tokens ...
        chain_len  int64[n_states]            ... its length (0: nothing awaits an outcome)
    Calibration    offered, accepted float64[BINS, RANKS] (decayed towards prior_offered /
                   prior_accepted), probability float64[BINS, RANKS] (accepted / offered)
    RowSettings    max_draft, tree_nodes (size of the tree drafted per row), token_cost, row_cost, keep
                   (1 - 1/memory: evidence kept per step), token_limit, explore, match_cost
"""
from collections import namedtuple

import numba as nb
import numpy as np

from .trie_count_kernels import CURSOR_FRONT, CURSOR_SEEN, CURSOR_SLOT, Stream, end_request, extend
from .trie_pool_kernels import CHILD, N_PRUNES, new_state, warm_up_settings
from .trie_retrieval_kernels import _match, new_buffers, step

BINS = 20    # score bins of the calibration, as CostAwareBudget's
RANKS = 6    # chain positions 1, 2-3, 4-7, 8-15, 16-31, 32+

RowTable = namedtuple("RowTable",
                      "tokens n_stream n_counted n_prompt cursors in_use row_state chain chain_bin chain_len")
Calibration = namedtuple("Calibration", "offered accepted prior_offered prior_accepted probability")
RowSettings = namedtuple("RowSettings", "max_draft tree_nodes token_cost row_cost keep token_limit explore match_cost")


def new_table(n_states: int, max_rows: int, max_len: int, max_draft: int, branch_length: int,
              slots: np.ndarray) -> RowTable:
    """A table of `n_states` free states, state s owning trie slot slots[s]. `tokens` is allocated
    zeroed (pages are touched, so resident, only as requests fill them)."""
    cursors = np.full((n_states, CURSOR_FRONT + branch_length), -1, np.int64)
    cursors[:, CURSOR_SLOT] = slots
    return RowTable(tokens=np.zeros((n_states, max_len), np.int32), n_stream=np.zeros(n_states, np.int64),
                    n_counted=np.zeros(n_states, np.int64), n_prompt=np.zeros(n_states, np.int64),
                    cursors=cursors, in_use=np.zeros(n_states, np.bool_), row_state=np.full(max_rows, -1, np.int64),
                    chain=np.zeros((n_states, max_draft), np.int32), chain_bin=np.zeros((n_states, max_draft), np.int64),
                    chain_len=np.zeros(n_states, np.int64))


def new_calibration() -> Calibration:
    """Two pseudo-observations per cell that the score is right (CostAwareBudget's prior)."""
    centres = (np.arange(BINS) + 0.5) / BINS
    offered = np.full((BINS, RANKS), 2.0)
    accepted = np.repeat(2.0 * centres[:, None], RANKS, axis=1)
    return Calibration(offered=offered, accepted=accepted, prior_offered=offered.copy(),
                       prior_accepted=accepted.copy(), probability=accepted / offered)


@nb.njit(cache=True, inline="always")
def _holds(table, s, row, n_row):
    """Whether the row's tokens begin with state s's tokens (the exact test of the module docstring)."""
    n = table.n_stream[s]
    if n > n_row:
        return False
    mine = table.tokens[s]
    for i in range(n - 1, -1, -1):   # from the end: another request usually differs there first
        if mine[i] != row[i]:
            return False
    return True


@nb.njit(cache=True)
def _in_range(row, begin, end, token_limit):
    for i in range(begin, end):
        if row[i] < 0 or row[i] >= token_limit:
            return False
    return True


@nb.njit(cache=True)
def _end_state(state, settings, table, s):
    """The request of state s is gone: branch eliminating, then the state is free (its slot stays its own)."""
    n = table.n_stream[s]
    stream = Stream(table.tokens[s], table.n_counted[s], n, table.n_prompt[s], 0)
    cursor = table.cursors[s]
    extend(state, settings, stream, cursor)   # count what arrived since its last draft first
    end_request(state, settings, Stream(table.tokens[s], n, n, table.n_prompt[s], 0), cursor, False)
    table.in_use[s] = False
    table.n_stream[s] = table.n_counted[s] = table.n_prompt[s] = table.chain_len[s] = 0


@nb.njit(cache=True)
def _start_state(state, table, row, n_row):
    """A free state for a request first seen with tokens row[:n_row]; -1 if none is free."""
    for s in range(table.in_use.shape[0]):
        if not table.in_use[s]:
            table.in_use[s] = True
            table.tokens[s, :n_row] = row[:n_row]
            table.n_stream[s] = n_row
            table.n_counted[s] = 0
            table.n_prompt[s] = n_row - 1   # the last token is the first the model sampled
            table.chain_len[s] = 0
            cursor = table.cursors[s]
            cursor[CURSOR_FRONT:] = -1
            cursor[CURSOR_SEEN] = state.meta[N_PRUNES]
            return s
    return -1


@nb.njit(cache=True)
def _learn_outcome(table, calib, s, row, n_row):
    """The chain proposed at state s's last step, against the row's tokens now: its first tokens that
    the row holds were accepted (the row also holds the model's own next token after them)."""
    m = table.chain_len[s]
    if m == 0:
        return
    at = table.n_stream[s]
    n_new = n_row - at
    accepted = 0
    while accepted < m and accepted < n_new - 1 and row[at + accepted] == table.chain[s, accepted]:
        accepted += 1
    for j in range(m):
        cell = table.chain_bin[s, j]
        b, k = cell // RANKS, cell % RANKS
        calib.offered[b, k] += 1.0
        if j < accepted:
            calib.accepted[b, k] += 1.0
        calib.probability[b, k] = calib.accepted[b, k] / calib.offered[b, k]
    table.chain_len[s] = 0


@nb.njit(cache=True)
def _fade(calib, keep):
    if keep >= 1.0:
        return
    for b in range(BINS):
        for k in range(RANKS):
            po, pa = calib.prior_offered[b, k], calib.prior_accepted[b, k]
            calib.offered[b, k] = po + keep * (calib.offered[b, k] - po)
            calib.accepted[b, k] = pa + keep * (calib.accepted[b, k] - pa)
            calib.probability[b, k] = calib.accepted[b, k] / calib.offered[b, k]


@nb.njit(cache=True, inline="always")
def _rank(j):
    """Calibration rank bucket of chain position j (1-based): 1, 2-3, 4-7, 8-15, 16-31, 32+."""
    k = 0
    while j > 1 and k < RANKS - 1:
        j >>= 1
        k += 1
    return k


@nb.njit(cache=True, inline="always")
def _token_cost(rs, n_rows):
    """What one more drafted token costs relative to one row's share of a step with n_rows rows. A
    step costs a + b * rows + d * drafted; token_cost = d / (a + b) (one row), row_cost = b / a, so
    a row's share, a / n + b, shrinks as rows share the step while a drafted token's d does not."""
    if n_rows <= 1:
        return rs.token_cost
    return rs.token_cost * (1.0 + rs.row_cost) / (1.0 / n_rows + rs.row_cost)


@nb.njit(cache=True)
def _continued_match(state, settings, cursor, context):
    """The longest context suffix (at most max_match tokens) that occurred before with a
    continuation: its trie node has a child (0: none has)."""
    front = cursor[CURSOR_FRONT:]
    for m in range(min(settings.max_match, context.shape[0]), 0, -1):
        node = _match(state, front, context, m)
        if node >= 0 and state.links[node, CHILD] >= 0:
            return m
    return 0


@nb.njit(cache=True)
def _draft_chain(table, calib, rs, token_cost, buffers, n_tree, s, limit, out_tokens, out_len, r):
    """The tree's chain of first children (candidates come best first, so a node's first child is its
    best), cut by the cost rule; written to out_tokens[r] and remembered for its outcome."""
    parents, tokens, scores = buffers.parents, buffers.tokens, buffers.scores
    m, last = 0, 0
    best_m, best_value, expected = 0, 1.0, 1.0
    for i in range(1, n_tree):
        if m >= limit:
            break
        if parents[i] != last:
            continue
        b = min(max(int(scores[i] * BINS), 0), BINS - 1)
        k = _rank(m + 1)
        table.chain[s, m] = tokens[i]
        table.chain_bin[s, m] = b * RANKS + k
        m += 1
        last = i
        expected += min(calib.probability[b, k] + rs.explore / np.sqrt(calib.offered[b, k]), 1.0)
        value = expected / (1.0 + token_cost * m)
        if value > best_value:
            best_m, best_value = m, value
    out_tokens[r, :best_m] = table.chain[s, :best_m]
    out_len[r] = best_m
    table.chain_len[s] = best_m


@nb.njit(cache=True)
def step_rows(state, settings, table, calib, rs, buffers, rows, n_tokens, active, limits, out_tokens, out_len):
    """One engine step over rows 0 .. n-1 (n = n_tokens.shape[0]); see the module docstring.
    rows int32[>= n, >= max n_tokens]; n_tokens int64[n]; active bool[n] (rows to draft for);
    limits int64[n] (most tokens to draft for each row); out_tokens int32[>= n, max_draft] and
    out_len int32[>= n] receive the chains. Returns the number of active rows that got no state
    (more requests than states: they get no draft)."""
    n_rows = n_tokens.shape[0]
    n_states = table.in_use.shape[0]
    claimed = np.zeros(n_states, np.bool_)
    state_of = np.full(n_rows, -1, np.int64)
    for r in range(n_rows):                           # 1. the same row as last step
        out_len[r] = 0
        s = table.row_state[r] if r < table.row_state.shape[0] else -1
        if s >= 0 and table.in_use[s] and not claimed[s] and _holds(table, s, rows[r], n_tokens[r]):
            claimed[s] = True
            state_of[r] = s
    for r in range(n_rows):                           # 2. moved from another row
        if state_of[r] < 0 and n_tokens[r] > 0:
            for s in range(n_states):
                if table.in_use[s] and not claimed[s] and _holds(table, s, rows[r], n_tokens[r]):
                    claimed[s] = True
                    state_of[r] = s
                    break
    for s in range(n_states):                         # 3. gone
        if table.in_use[s] and not claimed[s]:
            _end_state(state, settings, table, s)
    _fade(calib, rs.keep)
    n_refused = 0
    for r in range(n_rows):                           # 4. take in the rows' new tokens
        s = state_of[r]
        n_row = n_tokens[r]
        if not active[r] or n_row <= 0:
            if s >= 0:
                table.chain_len[s] = 0   # no step verified its chain: no outcome to learn from
            continue
        row = rows[r]
        if s < 0:
            if not _in_range(row, 0, n_row, rs.token_limit):
                continue
            s = _start_state(state, table, row, n_row)
            if s < 0:
                n_refused += 1
                continue
            state_of[r] = s
            # Its prompt is counted now, as TrieDrafter.start counts a request's prompt.
            extend(state, settings, Stream(table.tokens[s], 0, n_row - 1, n_row - 1, 0), table.cursors[s])
            table.n_counted[s] = n_row - 1
        else:
            if not _in_range(row, table.n_stream[s], n_row, rs.token_limit):
                _end_state(state, settings, table, s)
                state_of[r] = -1
                continue
            _learn_outcome(table, calib, s, row, n_row)
            table.tokens[s, table.n_stream[s]:n_row] = row[table.n_stream[s]:n_row]
            table.n_stream[s] = n_row
    n_verified = 0
    for r in range(n_rows):
        if state_of[r] >= 0 and active[r] and n_tokens[r] > 0:
            n_verified += 1
    token_cost = _token_cost(rs, n_verified)
    # the match-length rule's factor (inf: no cap, where a drafted token is free or the rule is off)
    match_factor = max(1.0, rs.match_cost / token_cost) if token_cost > 0.0 else np.inf
    for r in range(n_rows):                           # 5. draft (every row cut with the same calibration)
        s = state_of[r]
        n_row = n_tokens[r]
        limit = min(limits[r], rs.max_draft)
        if s < 0 or not active[r] or n_row <= 0 or limit <= 0:
            continue   # tokens not drafted from are counted at the next draft, or at the end (as a TrieRequest's)
        stream = Stream(table.tokens[s], table.n_counted[s], n_row, table.n_prompt[s], 0)
        n_tree = step(state, settings, stream, table.cursors[s], buffers, table.tokens[s, :n_row], rs.tree_nodes)
        table.n_counted[s] = n_row
        if match_factor < np.inf:
            limit = min(limit, int(np.ceil(match_factor * _continued_match(state, settings, table.cursors[s],
                                                                           table.tokens[s, :n_row]))))
        _draft_chain(table, calib, rs, token_cost, buffers, n_tree, s, limit, out_tokens, out_len, r)
    table.row_state[:] = -1
    for r in range(min(n_rows, table.row_state.shape[0])):
        table.row_state[r] = state_of[r]
    return n_refused


@nb.njit(cache=True)
def end_all(state, settings, table):
    """End every state's request (the engine is shutting down, or the drafter is reset)."""
    for s in range(table.in_use.shape[0]):
        if table.in_use[s]:
            _end_state(state, settings, table, s)
    table.row_state[:] = -1


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel once, with the argument types RowDrafter
    passes (draftcore.jit)."""
    state = new_state(256, 16, 2)
    state.live[:] = True
    settings = warm_up_settings(calibrated=False)
    table = new_table(2, 2, 32, 4, 4, np.arange(2, dtype=np.int64))
    calib = new_calibration()
    rs = RowSettings(max_draft=4, tree_nodes=8, token_cost=0.1, row_cost=0.2, keep=0.999, token_limit=16,
                     explore=0.5, match_cost=0.07)
    buffers = new_buffers(8)
    rows = np.array([[1, 2, 3, 1, 2, 3, 1, 2] + [0] * 24, [4, 5, 4, 5, 4, 5, 4, 5] + [0] * 24], np.int32)
    out_tokens, out_len = np.zeros((2, 4), np.int32), np.zeros(2, np.int32)
    for n in (6, 8):
        step_rows(state, settings, table, calib, rs, buffers, rows, np.array([n, n], np.int64),
                  np.ones(2, np.bool_), np.full(2, 4, np.int64), out_tokens, out_len)
    end_all(state, settings, table)
