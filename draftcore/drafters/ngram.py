"""The multi-level n-gram drafter of "Lossless Acceleration of Large Language Model via Adaptive
N-gram Parallel Decoding" (ANPD, Ou et al., 2024): a thin class over draftcore.drafters.ngram_kernels.

Each request keeps its own tables for n = 2 .. max_n, keyed by the last n - 1 tokens, filled from
its prompt and then from every accepted token (the paper's "adaptive" update); a draft queries the
longest key first (Algorithm 2) and feeds its own predictions back (Algorithm 1). Nothing is shared
between requests, so one NGramDrafter serves any number of concurrent requests.

    parameter       default  meaning
    max_n           5        longest n-gram (N): tables for n = 2 .. N (the paper's best, Fig. 4-5)
    draft_length    12       most tokens along one branch (K; the paper's best is 7 for its chain)
    branching       4        children per node: 1 is the paper's chain; more drafts a tree of the
                             `branching` most frequent continuations of every node, best first
    rows            8192     rows per level per request (bounded memory: 56 bytes a row per level
                             with 4 choices; a full set evicts its least recently touched key)
    choices         4        next tokens kept per key (the most frequent)
    learn_from_model True    the model's token at a rejected candidate is counted as a
                             continuation of that candidate's prefix (needs `observe`)

The defaults were chosen by replaying recorded SmolLM2 traces (benchmarks/drafter_replay.py; the
figures: docs/drafters.md); `NGramDrafter.paper()` is the paper's configuration exactly (a chain,
no learning from the model).
"""
from __future__ import annotations

import numpy as np

from ..checks import check_observation
from ..errors import ConfigError, InputError
from ..jit import kernels
from ..tree import DraftTree
from ..validate import fits_in_memory, flag, positive_int, token_array, tree_size

_KERNELS = "draftcore.drafters.ngram_kernels"


class NGramDrafter:
    """Drafts from multi-level n-gram tables of the request's own prompt and output."""

    concurrent_requests = True  # every request has its own tables: nothing is shared

    def __init__(self, *, max_n: int = 5, draft_length: int = 12, branching: int = 4, rows: int = 8192,
                 choices: int = 4, learn_from_model: bool = True):
        self.max_n = positive_int("max_n", max_n, minimum=2)
        self.draft_length = positive_int("draft_length", draft_length)
        self.choices = positive_int("choices", choices)
        self.branching = positive_int("branching", branching)
        if self.branching > self.choices:
            raise ConfigError(f"branching: expected at most choices={self.choices} (a node's children are "
                              f"its key's most frequent next tokens), got {branching}")
        WAYS = kernels(_KERNELS).WAYS  # construction loads the kernels (never `import draftcore`)
        self.rows = positive_int("rows", rows, minimum=WAYS)
        n_sets = self.rows // WAYS
        if self.rows % WAYS or n_sets & (n_sets - 1):
            raise ConfigError(f"rows: expected {WAYS} x a power of two (rows are grouped in sets of {WAYS}, a "
                              f"key's set chosen by masking its hash), got {rows}")
        self.learn_from_model = flag("learn_from_model", learn_from_model)
        # Every request builds its tables at start (ngram_kernels.new_tables): per level and row, a
        # key of max_n - 1 int32s, `choices` next tokens and counts (int32) and a stamp (int64).
        levels = self.max_n - 1
        fits_in_memory(levels * self.rows * (4 * levels + 8 * self.choices + 8), "each request's n-gram tables",
                       rows=self.rows, max_n=self.max_n, choices=self.choices)

    @classmethod
    def paper(cls, **options) -> "NGramDrafter":
        """ANPD as published: N = 5, K = 7, one chain, tables updated with accepted tokens only."""
        config = dict(max_n=5, draft_length=7, branching=1, learn_from_model=False)
        config.update(options)
        return cls(**config)

    def __repr__(self) -> str:
        return (f"NGramDrafter(max_n={self.max_n}, draft_length={self.draft_length}, branching={self.branching}, "
                f"rows={self.rows})")

    def start(self, prompt) -> "NGramRequest":
        return NGramRequest(self, token_array("prompt", prompt))

    def propose(self, context, budget: int) -> DraftTree:
        """A one-off draft from `context` alone (tables built from it, then dropped)."""
        tree_size("budget", budget)   # before any table is built
        request = self.start(context)
        return request.propose(context, budget)


class NGramRequest:
    """One request's tables and draft buffers, from `NGramDrafter.start(prompt)`."""

    returns_valid_trees = True

    def __init__(self, drafter: NGramDrafter, prompt: np.ndarray):
        K = self._K = kernels(_KERNELS)
        self._drafter = drafter
        self._tables = K.new_tables(drafter.max_n - 1, drafter.rows, drafter.choices)
        K.ingest(self._tables, prompt, 0, prompt.shape[0])
        self._n_seen = prompt.shape[0]
        self._context = prompt
        self._buffers_for = -1
        self._ended = False

    def __repr__(self) -> str:
        return f"NGramRequest(tokens={self._n_seen}" + (", finished)" if self._ended else ")")

    def propose(self, context, budget: int) -> DraftTree:
        context = token_array("context", context)
        budget = tree_size("budget", budget)   # the draft buffers are sized by it
        self._check_open("propose")
        n_context = context.shape[0]
        if n_context < self._n_seen:
            raise InputError(f"context: {n_context} tokens, fewer than the {self._n_seen} this request has seen; "
                             f"expected the prompt plus every accepted token")
        K, d = self._K, self._drafter
        K.ingest(self._tables, context, self._n_seen, n_context)
        self._n_seen = n_context
        self._context = context
        if budget != self._buffers_for:
            self._allocate(budget)
        block, tails, widths, front_score, front_item = self._buffers
        n = K.draft(self._tables, context, n_context, budget, d.draft_length, d.branching, block[0], block[1],
                    block[2], block[3].view(np.float32), tails, widths, front_score, front_item)
        rows = block[:, :n].copy()
        return DraftTree(rows[0], rows[1], rows[2], rows[3].view(np.float32))

    def update(self, tokens) -> None:
        """Accepted tokens are counted from the context of the next `propose`."""
        token_array("tokens", tokens, allow_empty=True)
        self._check_open("update")

    def observe(self, tree: DraftTree, node_tokens: np.ndarray, path: np.ndarray) -> None:
        """Count the model's token at each candidate off the accepted path (learn_from_model)."""
        self.observe_checked(tree, *check_observation(tree, node_tokens, path))

    def observe_checked(self, tree: DraftTree, node_tokens: np.ndarray, path: np.ndarray) -> None:
        """`observe` with the arguments `check_observation` returned (a composite checks once)."""
        if not self._drafter.learn_from_model or self._ended:
            return
        m = tree.n_candidates
        if m <= 1:
            return
        on_path = np.zeros(m, np.bool_)
        on_path[path] = True
        tails = np.empty((m, self._drafter.max_n - 1), np.int32)
        widths = np.empty(m, np.int64)
        self._K.learn_from_model(self._tables, self._context, self._context.shape[0], tree.tokens, tree.parents, m,
                                 node_tokens, on_path, tails, widths)

    def finish(self) -> None:
        self._ended = True
        self._tables = None

    # -- internals ----------------------------------------------------------------------------------
    def _allocate(self, budget: int) -> None:
        d = self._drafter
        n = budget + 1
        self._buffers = (np.empty((4, n), np.int32), np.empty((n, d.max_n - 1), np.int32), np.empty(n, np.int64),
                         np.empty(n * d.branching + d.branching, np.float32),
                         np.empty((n * d.branching + d.branching, 2), np.int32))
        self._buffers_for = budget

    def _check_open(self, what: str) -> None:
        if self._ended:
            raise InputError(f"request: {what}() called on {self!r}, which has finished; start a new request")
