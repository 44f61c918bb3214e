"""`TriePool`: the one owner of a trie's node pool, shared by a TrieDrafter's requests (trie.py) and
by the rows of every RowDrafter drafting from that TrieDrafter (rows.py).

    state      the pool's arrays (a TrieState, trie_pool_kernels); the kernels change them in place,
               and the pool replaces them when the request slots grow or a saved pool is restored
    settings   the fixed configuration every kernel takes (a Settings)
    lock       held by every kernel call on `state`, so that threads may share the pool
    slots      each request in progress holds one; its own counts live there (`take_slot`,
               `reserve_slots`, `release_slots`)
    abandoned  the ends of requests dropped without finish: a finalizer hands them over (`abandon`),
               the next operation runs them (`end_abandoned`)

The pool knows nothing of streams or drafts: a request calls the counting and drafting kernels
itself, on `pool.state` with `pool.settings`, holding `pool.lock`. Every method but `abandon` (and
the read-only properties) expects its caller to hold `lock`, so that a caller can do several
things as one.
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from ..errors import BusyError, ConfigError
from ..jit import kernels

_POOL = "draftcore.drafters.trie_pool_kernels"
_CANDIDATES = "draftcore.drafters.trie_candidate_kernels"
_CALIBRATION = "draftcore.drafters.trie_calibration_kernels"
_CHECKS = "draftcore.drafters.trie_check_kernels"

SAVED_ARRAYS = ("links", "freq", "free", "root", "meta", "cal")   # the TrieState fields a saved pool holds


class TriePool:
    """A trie's node pool with its lock, settings, request slots and abandoned requests."""

    def __init__(self, settings, *, capacity: int, token_limit: int, max_requests: int, first_slots: int):
        self._K = kernels(_POOL)
        for name in (_CANDIDATES, _CALIBRATION, _CHECKS):   # loaded now, not inside a timed step
            kernels(name)
        self.settings = settings
        self.capacity = capacity
        self.max_requests = max_requests
        # Slots past the first few grow with the requests in progress (take_slot), not up front.
        self.state = self._K.new_state(capacity, token_limit, min(first_slots, max_requests))
        self.lock = threading.Lock()
        # A finalizer may run inside any thread, even one holding the lock: it only appends here.
        self._abandoned: collections.deque = collections.deque()

    # -- reading (no lock: a snapshot, as it stands) ------------------------------------------------
    @property
    def n_nodes(self) -> int:
        """Live nodes in the pool."""
        return self.capacity - int(self.state.meta[self._K.N_FREE])

    @property
    def requests_in_progress(self) -> int:
        """Slots a request (or a RowDrafter's state) holds."""
        return int(self.state.live.sum())

    @property
    def prunes(self) -> int:
        """Prune passes so far: a request's cursor is valid for one value (trie_count_kernels)."""
        return int(self.state.meta[self._K.N_PRUNES])

    # -- request slots --------------------------------------------------------------------------------
    def take_slot(self) -> int:
        """A free request slot, growing the slot arrays (up to max_requests) when all are taken."""
        state = self.state
        free = np.flatnonzero(~state.live)
        if free.size == 0:
            n = state.live.shape[0]
            if n >= self.max_requests:
                raise BusyError(f"drafter: all max_requests={self.max_requests} request slots of this TrieDrafter "
                                f"are in use; finish (or close the streams of) requests in progress, or "
                                f"construct it with a larger max_requests")
            state = self.state = self._K.with_slots(state, min(2 * n, self.max_requests))
            free = np.flatnonzero(~state.live)
        slot = int(free[0])
        state.live[slot] = True
        return slot

    def reserve_slots(self, n: int) -> np.ndarray:
        """Take n free slots for good (a RowDrafter's max_rows = n states, one each). The slot arrays
        grow once, straight to their size: growing by doubling would copy (and so make resident)
        every earlier slot's zero pages."""
        state = self.state
        n_free = int(np.count_nonzero(~state.live))
        if n_free < n:
            wanted = state.live.shape[0] + n - n_free
            if wanted > self.max_requests:
                raise ConfigError(f"drafter: needs max_rows = {n} free request slots and has {n_free} of "
                                  f"max_requests = {self.max_requests}; build it with max_requests >= {wanted}")
            state = self.state = self._K.with_slots(state, wanted)
        slots = np.flatnonzero(~state.live)[:n].astype(np.int64)
        state.live[slots] = True
        return slots

    def release_slots(self, slots) -> None:
        """Give a slot (or an array of them) back; its own counts must be zero by now."""
        self.state.live[slots] = False

    # -- requests dropped without finish ------------------------------------------------------------
    def abandon(self, end) -> None:
        """Queue `end()` of a request dropped without finish, for the next operation to run; the one
        method a finalizer calls, so it takes no lock."""
        self._abandoned.append(end)

    def end_abandoned(self) -> None:
        """End the requests dropped since the last call."""
        while self._abandoned:
            self._abandoned.popleft()()

    # -- integrity, save, restore ---------------------------------------------------------------------
    def find_corruption(self) -> tuple[int, int]:
        """(code, node) of the first broken invariant, (0, -1) if none (trie_check_kernels)."""
        return kernels(_CHECKS).find_corruption(self.state)

    def saved_arrays(self) -> dict:
        """Copies of what a saved pool holds, by SAVED_ARRAYS name: the node rows' links and shared
        counts, the PROMPT and RECENT sums zeroed (they are the live requests' own, not the trie's),
        the free list, root index, meta and calibration."""
        K, state = self._K, self.state
        freq = state.freq[:, K.PROMPT:K.RECENT + 1].copy()
        freq[:, [0, K.RECENT - K.PROMPT]] = 0.0
        return dict(links=state.links[:, :K.SIBLING + 1].copy(), freq=freq, free=state.free.copy(),
                    root=state.root.copy(), meta=state.meta.copy(), cal=state.cal.copy())

    def restore(self, arrays: dict) -> tuple[int, int]:
        """Take a saved pool's arrays (`saved_arrays`, checked by `saved_problem`; without "cal", the
        calibration's prior). Returns find_corruption's (code, node) for them, and changes nothing
        unless that is (0, -1)."""
        K = self._K
        links = K.new_rows(self.capacity)   # the saved columns, packed into node rows
        links[:, :K.SIBLING + 1] = arrays["links"]
        freq = links.view(np.float32)
        freq[:, K.PROMPT:K.RECENT + 1] = arrays["freq"]
        cal = arrays["cal"] if "cal" in arrays else kernels(_CALIBRATION).new_calibration()
        free, root, meta, cal = (np.ascontiguousarray(a) for a in (arrays["free"], arrays["root"], arrays["meta"], cal))
        state = self.state._replace(links=links, freq=freq, free=free, root=root, meta=meta, cal=cal)
        code, node = kernels(_CHECKS).find_corruption(state)
        if code:
            return code, node
        self.state = state
        kernels(_CANDIDATES).refresh_top(state, self.settings)
        return 0, -1


def saved_problem(arrays: dict, capacity: int, token_limit: int) -> str | None:
    """What is wrong with a saved pool's arrays (SAVED_ARRAYS, "cal" optional), for a message that
    names the file; None when they fit a pool of `capacity` nodes and `token_limit` tokens."""
    cal_cells, cal_cap = kernels(_CALIBRATION).CAL_CELLS, kernels(_CALIBRATION).CAL_CAP
    shapes = {"links": ((capacity, kernels(_POOL).SIBLING + 1), np.int32), "freq": ((capacity, 3), np.float32),
              "free": ((capacity,), np.int32), "root": ((token_limit,), np.int32), "meta": ((8,), np.int64),
              "cal": ((2, cal_cells), np.float64)}
    for name, got in arrays.items():
        shape, dtype = shapes[name]
        if got.shape != shape or got.dtype != dtype:
            return (f"array {name!r} has shape {got.shape} dtype {got.dtype}; expected shape {shape} dtype "
                    f"{np.dtype(dtype)}")
    if arrays["freq"][:, [0, 2]].any():
        return "holds a request's own counts (PROMPT or RECENT not zero); files written by save() never do"
    if "cal" in arrays:
        # what learning could have produced, per cell: candidates in (0, cap) (the prior is positive;
        # a count halves on reaching cap) and hits in [0, candidates]
        counts, hits = arrays["cal"]
        bad = ~(np.isfinite(counts) & np.isfinite(hits) & (counts > 0) & (counts < cal_cap) & (hits >= 0)
                & (hits <= counts))
        if bad.any():
            cell = int(np.flatnonzero(bad)[0])
            return (f"array 'cal' has cell {cell} = (candidates {counts[cell]!r}, hits {hits[cell]!r}); expected "
                    f"0 < candidates < {cal_cap:g} and 0 <= hits <= candidates")
    return None


def pool_bytes(capacity: int) -> int:
    """Bytes a trie's node pool of `capacity` nodes takes: a node row (trie_pool_kernels.ROW int32s:
    links, counts, the first request slots' own counts) and a free-list entry each."""
    return capacity * 4 * (kernels(_POOL).ROW + 1)
