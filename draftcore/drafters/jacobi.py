"""The Jacobi lookahead drafter of "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding" (Fu et al., 2024), §3.1-3.3: a thin class over draftcore.drafters.jacobi_kernels.

Each request keeps a 2-D window of N - 1 levels x W positions, initialised with tokens drawn from
its prompt, that rides in every verify as lookahead nodes (the tree's last nodes; see
`jacobi_kernels` for their parents). The model's token at each window node (`observe`) is one Jacobi
iteration: the newest level extends every trajectory, each diagonal that spans all levels is an
n-gram the model produced token by token, and it goes to the request's n-gram pool (keyed by its
first token, at most G per key, least recently used evicted); then the window moves one position on.
The draft candidates are up to G pool n-grams that start with the root (the last accepted token),
merged into a tree where they share a prefix. Window nodes are never accepted (the protocol's
choice: acceptance walks candidates only).

    parameter   default  meaning
    window      8        W: positions per level
    levels      3        N: n-gram length; the window has N - 1 levels
    pool_size   8        G: n-grams kept per first token, and candidates verified per step at most
    pool_rows   4096     first tokens the pool holds (a power of two; a new key evicts its row's)
    seed        0        window initialisation (tokens drawn from the prompt)

The paper's W=15, N=5, G=15 (7B models on an A100) means 60 window nodes in every verify; on a CPU
that costs far more than it brings, so the defaults are smaller (measured: docs/drafters.md). The
cost-aware budget keeps a window only while it adds little to a step's cost
(`CostAwareBudget(window_cost=0.1)`): on a GPU, where a verify of 60 more nodes is nearly free, it
rides along; on a CPU it is dropped.
"""
from __future__ import annotations

import numpy as np

from ..checks import check_observation
from ..errors import ConfigError, InputError
from ..jit import kernels
from ..tree import DraftTree
from ..validate import fits_in_memory, positive_int, token_array, tree_size, within_tree_limit
from .merge import merge_trees

_KERNELS = "draftcore.drafters.jacobi_kernels"
_DEPTH_DECAY = 0.8    # candidate score: recency of its n-gram x this per token of depth
_RANK_DECAY = 0.85


class JacobiDrafter:
    """Lookahead decoding's window and n-gram pool, per request."""

    concurrent_requests = True  # every request has its own window and pool

    def __init__(self, *, window: int = 8, levels: int = 3, pool_size: int = 8, pool_rows: int = 4096, seed: int = 0):
        self.window = positive_int("window", window)
        self.levels = positive_int("levels", levels, minimum=2)
        if self.window < self.levels - 1:
            raise ConfigError(f"window: expected at least levels - 1 = {self.levels - 1} positions (an n-gram is "
                              f"harvested along a diagonal through all {self.levels - 1} levels), got {window}")
        self.pool_size = positive_int("pool_size", pool_size)
        self.pool_rows = positive_int("pool_rows", pool_rows)
        if self.pool_rows & (self.pool_rows - 1):
            raise ConfigError(f"pool_rows: expected a power of two (a key's row is its hash, masked), got {pool_rows}")
        self.seed = positive_int("seed", seed, minimum=0)
        # The window rides in every verify as (N - 1) x W lookahead nodes: no more than one verify holds.
        within_tree_limit("window", self.window, self.window_nodes)
        # Every request's pool at start (jacobi_kernels.new_pool): per row a key (int32) and G n-grams of
        # N - 1 int32 tokens with a stamp (int64) each.
        row_bytes = 4 + self.pool_size * (4 * (self.levels - 1) + 8)
        fits_in_memory(self.pool_rows * row_bytes, "each request's n-gram pool", pool_rows=self.pool_rows,
                       pool_size=self.pool_size, levels=self.levels)

    @classmethod
    def paper(cls, **options) -> "JacobiDrafter":
        """The paper's configuration for 7B models on an A100: W = 15, N = 5, G = 15."""
        config = dict(window=15, levels=5, pool_size=15)
        config.update(options)
        return cls(**config)

    @property
    def window_nodes(self) -> int:
        """Lookahead nodes in every verify once the window has filled: (N - 1) x W."""
        return (self.levels - 1) * self.window

    def __repr__(self) -> str:
        return f"JacobiDrafter(window={self.window}, levels={self.levels}, pool_size={self.pool_size})"

    def start(self, prompt) -> "JacobiRequest":
        return JacobiRequest(self, token_array("prompt", prompt))


class JacobiRequest:
    """One request's window and pool, from `JacobiDrafter.start(prompt)`."""

    returns_valid_trees = True
    lookahead_optional = True   # propose(..., lookahead=False): the pool's candidates, no window

    def __init__(self, drafter: JacobiDrafter, prompt: np.ndarray):
        K = self._K = kernels(_KERNELS)
        self._drafter = drafter
        self.window = np.zeros((drafter.levels - 1, drafter.window), np.int32)
        rng = np.random.default_rng([drafter.seed, prompt.shape[0]])
        self.window[0] = prompt[rng.integers(0, prompt.shape[0], drafter.window)]
        self.n_levels = 1
        self.pool = K.new_pool(drafter.pool_rows, drafter.pool_size, drafter.levels - 1)
        self._grams = np.empty((drafter.pool_size, drafter.levels - 1), np.int32)
        self._window_parents = np.empty(drafter.window * (drafter.levels - 1), np.int32)
        self._n_window = 0  # window nodes in the last proposal
        self._ended = False
        # What walking the window would have added (greedy): the protocol's choice, measured.
        self.window_extra_tokens = 0
        self.window_steps = 0

    def __repr__(self) -> str:
        return f"JacobiRequest(levels={self.n_levels}/{self._drafter.levels - 1}" + (", finished)" if self._ended else ")")

    def propose(self, context, budget: int, lookahead: bool = True) -> DraftTree:
        """The pool's candidates for the root, with the window as lookahead nodes when `lookahead`
        (the loop asks for none while its budget policy keeps dropping the window: a CPU)."""
        context = token_array("context", context)
        budget = tree_size("budget", budget)
        self._check_open("propose")
        candidates = self.candidates(int(context[-1]), budget)
        if not lookahead:
            self._n_window = 0
            return candidates
        return self.with_window(candidates)

    def candidates(self, root: int, budget: int) -> DraftTree:
        """The pool's n-grams that start with `root`, most recent first, merged where they share a
        prefix, cut to `budget` candidates (no window)."""
        K, G = self._K, self._drafter.pool_size
        n_grams = K.pool_lookup(self.pool, root, self._grams)
        if n_grams == 0 or budget == 0:
            return DraftTree.root_only(root)
        length = self._grams.shape[1]
        n = n_grams * length
        tokens = self._grams[:n_grams].reshape(-1).copy()
        parents = np.arange(-1, n - 1, dtype=np.int32)
        parents[::length] = -1
        depth = np.tile(np.arange(1, length + 1), n_grams)
        rank = np.repeat(np.arange(n_grams), length)
        priority = (_RANK_DECAY ** rank * _DEPTH_DECAY ** depth).astype(np.float32)
        return merge_trees(root, tokens, parents, priority, np.zeros(n, np.int32), budget)[0]

    def with_window(self, candidates: DraftTree) -> DraftTree:
        """`candidates` with this request's window appended as lookahead nodes."""
        W = self._drafter.window
        n_window = self.n_levels * W
        m = len(candidates)
        parents = self._window_parents[:n_window]
        self._K.window_parents(self.n_levels, W, m, parents)
        tokens = np.concatenate([candidates.tokens, self.window[:self.n_levels].reshape(-1)])
        depths = np.concatenate([candidates.depths, np.tile(np.arange(1, W + 1, dtype=np.int32), self.n_levels)])
        scores = None if candidates.scores is None else np.concatenate(
            [candidates.scores, np.zeros(n_window, np.float32)])
        self._n_window = n_window
        return DraftTree(tokens, np.concatenate([candidates.parents, parents]), depths, scores, n_window)

    def update(self, tokens) -> None:
        token_array("tokens", tokens, allow_empty=True)
        self._check_open("update")

    def observe(self, tree: DraftTree, node_tokens: np.ndarray, path: np.ndarray) -> None:
        """One Jacobi iteration from the model's tokens at the window nodes (when the window rode
        in this verify; a window the loop dropped leaves it as it was)."""
        self.observe_checked(tree, *check_observation(tree, node_tokens, path))

    def observe_checked(self, tree: DraftTree, node_tokens: np.ndarray, path: np.ndarray) -> None:
        """`observe` with the arguments `check_observation` returned (a composite checks once)."""
        if self._ended or tree.n_lookahead != self._n_window or self._n_window == 0:
            return
        first = len(tree) - self._n_window
        self.window_steps += 1
        self.window_extra_tokens += max(0, _window_walk(tree, node_tokens, first) - (path.shape[0] - 1))
        outs = node_tokens[first:].reshape(self.n_levels, self._drafter.window)
        self.n_levels = self._K.window_step(self.window, self.n_levels, np.ascontiguousarray(outs), self.pool)

    def finish(self) -> None:
        self._ended = True

    def _check_open(self, what: str) -> None:
        if self._ended:
            raise InputError(f"request: {what}() called on {self!r}, which has finished; start a new request")



def _window_walk(tree: DraftTree, node_tokens: np.ndarray, first: int) -> int:
    """Tokens a greedy walk from the root through window nodes only (nodes first..) would accept."""
    node, accepted = 0, 0
    while True:
        want = node_tokens[node]
        nxt = -1
        for i in range(first, len(tree)):
            if tree.parents[i] == node and tree.tokens[i] == want:
                nxt = i
                break
        if nxt < 0 or want < 0:
            return accepted
        node, accepted = nxt, accepted + 1
