"""The trie drafter of "Lookahead: An Inference Acceleration Framework for Large Language Model with
Lossless Generation Accuracy" (Zhao et al., KDD 2024), §4.2–4.3: a thin class over the kernels in
trie_kernels.

One trie lives across requests: output branches persist (and decay when the pool is full), each
request's prompt branches are removed when it finishes. Save it with `save`, restore with `load`.

    parameter          default   meaning
    capacity           262144    nodes in the pool (36 bytes each); must exceed 2 * branch_length
    branch_length      24        tokens per inserted branch (L_b; the paper uses 12)
    max_match          8         longest context suffix matched at retrieval
    prompt_weight      16.0      factor on the current prompt's counts (branch weighting)
    recent_weight      16.0      extra factor on the current request's output counts (0: the paper)
    min_stage_nodes    8         paper mode: a stage offering fewer nodes falls to a shorter suffix
    fill               True      shorter suffixes keep filling the budget (merged, deduplicated)
    use_top            True      a last stage drafts the most frequent tokens when nothing else fits
    layout             "hierarchical" | "parallel" | "single" (the paper's Fig. 2–3)
    token_limit        262144    token ids must be below this (size of the root index)
    insert_prompt, insert_output, eliminate_prompt: the paper's ablations (Table 3), all True

The configuration is fixed at construction (the kernels get it as one Settings value), so the
retrieval settings are read-only attributes. Defaults were tuned by replaying real SmolLM2 traces
(benchmarks/replay_table.py); the paper's exact configuration is `TrieDrafter.paper()`.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError, InputError
from ..tree import DraftTree
from ..validate import positive_float, positive_int, token_array
from ..jit import kernels

LAYOUTS = ("hierarchical", "parallel", "single")
_SAVE_FORMAT = 1
_KERNELS = "draftcore.drafters.trie_kernels"
_SAVED_ARRAYS = ("links", "freq", "free", "root", "meta")  # the TrieState fields a file holds
_DEFAULT_BUDGET = 64  # draft buffers are sized for this many nodes until a larger budget comes


def _setting(name: str) -> property:
    return property(lambda self: getattr(self._settings, name), doc=f"{name} (fixed at construction)")


class TrieDrafter:
    """Drafts hierarchical multi-branch trees from a trie of the n-grams seen so far."""

    returns_valid_trees = True  # its trees are built valid by construction: speculate skips the check
    max_match = _setting("max_match")
    prompt_weight = _setting("prompt_weight")
    recent_weight = _setting("recent_weight")
    min_stage_nodes = _setting("min_stage_nodes")
    fill = _setting("fill")
    use_top = _setting("use_top")

    def __init__(self, *, capacity: int = 1 << 18, branch_length: int = 24, max_match: int = 8,
                 prompt_weight: float = 16.0, recent_weight: float = 16.0, min_stage_nodes: int = 8, fill: bool = True,
                 use_top: bool = True, layout: str = "hierarchical", token_limit: int = 1 << 18,
                 insert_prompt: bool = True, insert_output: bool = True, eliminate_prompt: bool = True):
        K = self._K = kernels(_KERNELS)
        self.branch_length = positive_int("branch_length", branch_length, minimum=2)
        self.capacity = positive_int("capacity", capacity)
        if self.capacity <= 2 * self.branch_length:
            raise ConfigError(f"capacity: expected more than 2 * branch_length = {2 * self.branch_length} "
                              f"nodes (one token may create branch_length nodes), got {capacity}")
        # Plain int / float / bool fields: the types warm_up compiled the kernels for.
        self._settings = K.Settings(
            max_match=positive_int("max_match", max_match),
            prompt_weight=positive_float("prompt_weight", prompt_weight, minimum=0.0, inclusive=True),
            recent_weight=positive_float("recent_weight", recent_weight, minimum=0.0, inclusive=True),
            min_stage_nodes=positive_int("min_stage_nodes", min_stage_nodes),
            fill=bool(fill), use_top=bool(use_top),
            mode=K.MODE_SINGLE if layout == "single" else K.MODE_HIERARCHICAL)
        if layout not in LAYOUTS:
            raise ConfigError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        self.layout = layout
        self.token_limit = positive_int("token_limit", token_limit)
        self.insert_prompt, self.insert_output = bool(insert_prompt), bool(insert_output)
        self.eliminate_prompt = bool(eliminate_prompt)
        self._state = K.new_state(self.capacity, self.branch_length, self.token_limit)
        self._buffers = K.new_buffers(_DEFAULT_BUDGET)
        self._stream = np.zeros(0, np.int32)
        self._n_stream = self._n_prompt = self._n_counted = 0
        self._active = False

    @classmethod
    def paper(cls, **options) -> "TrieDrafter":
        """The paper's configuration: branch length 12, one retrieval stage, prompt branches
        weighted, output branches not boosted, no stage 0."""
        config = dict(branch_length=12, fill=False, use_top=False, recent_weight=0.0, prompt_weight=16.0)
        config.update(options)
        return cls(**config)

    def __repr__(self) -> str:
        # The pool as it stands: counting the pending tokens here would make repr change the trie.
        in_use = self.capacity - int(self._state.meta[self._K.N_FREE])
        pending = self._n_stream - self._n_counted
        return (f"TrieDrafter(capacity={self.capacity}, nodes_in_use={in_use}"
                + (f" (+{pending} tokens not counted yet)" if pending else "")
                + f", branch_length={self.branch_length}, layout={self.layout!r})")

    # -- Drafter protocol -------------------------------------------------------------------------
    def start(self, prompt) -> None:
        """Insert the prompt's branches (every start position) as PROMPT counts."""
        prompt = token_array("prompt", prompt, vocab_size=self.token_limit)
        if self._active:
            self.finish()
        self._stream = np.empty(max(64, 2 * prompt.shape[0]), np.int32)
        self._stream[:prompt.shape[0]] = prompt
        self._n_stream = self._n_prompt = prompt.shape[0]
        self._n_counted = 0 if self.insert_prompt else self._n_prompt
        self._state.front[:] = -1  # no branch of this request is counted yet
        self._active = True
        self._count_pending()

    def update(self, tokens) -> None:
        """Append accepted tokens; their branches are counted at the next propose (one kernel call
        per step) or whenever the trie is read."""
        tokens = token_array("tokens", tokens, vocab_size=self.token_limit, allow_empty=True)
        if not self._active:
            raise InputError("tokens: update() called before start(prompt)")
        begin = self._n_stream
        end = begin + tokens.shape[0]
        if end > self._stream.shape[0]:
            grown = np.empty(max(2 * self._stream.shape[0], end), np.int32)
            grown[:begin] = self._stream[:begin]
            self._stream = grown
        self._stream[begin:end] = tokens
        self._n_stream = end
        if not self.insert_output:
            self._n_counted = end

    def propose(self, context, budget: int) -> DraftTree:
        """Best-first draft tree of at most `budget` nodes continuing `context` (root = context[-1]).

        The tree's arrays view this drafter's buffers: they stay valid until the next propose.
        """
        context = token_array("context", context, vocab_size=self.token_limit)
        if type(budget) is not int or budget >= self._buffers.tokens.shape[0]:
            budget = positive_int("budget", budget, minimum=0)
            if budget >= self._buffers.tokens.shape[0]:
                self._buffers = self._K.new_buffers(budget)
        n = self._K.step(self._state, self._settings, self._request_stream(), self._buffers, context, budget)
        self._n_counted = self._n_stream
        b = self._buffers
        if self.layout == "parallel":
            return DraftTree(*_unmerge(b.tokens[:n], b.parents[:n], b.depths[:n], b.scores[:n], budget))
        return DraftTree(b.tokens[:n], b.parents[:n], b.depths[:n], b.scores[:n])

    def finish(self) -> None:
        """Branch eliminating: drop this request's prompt counts; output counts persist."""
        if not self._active:
            return
        self._count_pending()
        self._K.end_request(self._state, self._settings, self._request_stream(), not self.eliminate_prompt)
        self._active = False
        self._n_stream = self._n_prompt = self._n_counted = 0

    # -- beyond the protocol ----------------------------------------------------------------------
    def warm_up(self, sequences) -> None:
        """Insert a corpus of token sequences (e.g. past outputs) as persistent OUTPUT branches."""
        if self._active:
            raise InputError("sequences: warm_up() called during a request; call finish() first")
        K = self._K
        for i, seq in enumerate(sequences):
            seq = token_array(f"sequences[{i}]", seq, vocab_size=self.token_limit, allow_empty=True)
            stream = K.Stream(tokens=seq, begin=0, end=seq.shape[0], n_prompt=0, count_from=0)
            self._state.front[:] = -1  # each sequence is a request of its own, all output
            K.extend(self._state, self._settings, stream)
            K.end_request(self._state, self._settings, stream, False)

    @property
    def n_nodes(self) -> int:
        """Live nodes in the pool (never more than capacity), after counting the pending tokens."""
        self._count_pending()
        return self.capacity - int(self._state.meta[self._K.N_FREE])

    def check_integrity(self) -> None:
        """Raise InputError if the pool's links, free list or counts are inconsistent (for tests)."""
        self._count_pending()
        code, node = self._K.find_corruption(self._state)
        if code:
            raise InputError(f"trie: corrupt node pool (check {code}) at node {node}; see find_corruption")

    def save(self, path) -> None:
        """Write the trie (not a request in progress) to `path` as plain arrays (.npz, no pickle).
        The file is written at `path` exactly (no .npz suffix is added)."""
        if self._active:
            raise InputError(f"path: cannot save {path!r} during a request; call finish() first")
        K, state = self._K, self._state
        config = np.array([_SAVE_FORMAT, self.capacity, self.branch_length, self.token_limit], np.int64)
        with open(path, "wb") as f:
            np.savez(f, config=config, links=state.links[:, :K.SIBLING + 1], freq=state.freq[:, K.PROMPT:K.RECENT + 1],
                     free=state.free, root=state.root, meta=state.meta)

    @classmethod
    def load(cls, path, **options) -> "TrieDrafter":
        """Read a trie written by `save`, validating every array before using any; `options` as
        for the constructor (capacity, branch_length and token_limit come from the file)."""
        K = kernels(_KERNELS)
        expected = f"a TrieDrafter file (.npz of config, {', '.join(_SAVED_ARRAYS)})"
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: np.asarray(data[name]) for name in ("config",) + _SAVED_ARRAYS}
        except Exception as exc:  # zip, pickle, key, type errors alike: the file is not ours
            raise InputError(f"path: {str(path)!r} is not {expected}: {type(exc).__name__}: {exc}") from exc
        config = arrays["config"]
        if config.shape != (4,) or config.dtype != np.int64 or config[0] != _SAVE_FORMAT:
            raise InputError(f"path: {str(path)!r} has config {config!r}; expected int64[4] = "
                             f"[{_SAVE_FORMAT}, capacity, branch_length, token_limit]")
        capacity, branch_length, token_limit = (int(v) for v in config[1:])
        shapes = {"links": ((capacity, K.SIBLING + 1), np.int32), "freq": ((capacity, 3), np.float32),
                  "free": ((capacity,), np.int32), "root": ((token_limit,), np.int32), "meta": ((8,), np.int64)}
        for name, (shape, dtype) in shapes.items():
            got = arrays[name]
            if got.shape != shape or got.dtype != dtype:
                raise InputError(f"path: {str(path)!r} array {name!r} has shape {got.shape} dtype {got.dtype}; "
                                 f"expected shape {shape} dtype {np.dtype(dtype)}")
        # The shapes match the config, so the drafter allocates no more than the file holds.
        try:
            drafter = cls(capacity=capacity, branch_length=branch_length, token_limit=token_limit, **options)
        except ConfigError as exc:
            raise InputError(f"path: {str(path)!r} holds an unusable configuration: {exc}") from exc
        links = np.full((capacity, K.ROW), -1, np.int32)   # the saved columns, packed into node rows
        links[:, :K.SIBLING + 1] = arrays["links"]
        freq = links.view(np.float32)
        freq[:, K.PROMPT:K.RECENT + 1] = arrays["freq"]
        free, root, meta = (np.ascontiguousarray(arrays[n]) for n in ("free", "root", "meta"))
        state = drafter._state._replace(links=links, freq=freq, free=free, root=root, meta=meta)
        code, node = K.find_corruption(state)
        if code:
            raise InputError(f"path: {str(path)!r} holds a corrupt trie (check {code} fails at node {node})")
        if freq[:, K.RECENT].any():
            raise InputError(f"path: {str(path)!r} was saved during a request (RECENT counts are not zero)")
        drafter._state = state
        K.refresh_top(state, drafter._settings)
        return drafter

    # -- internals --------------------------------------------------------------------------------
    def _request_stream(self):
        """The request's tokens as the kernels take them: Stream(tokens, begin, end, n_prompt,
        count_from), built positionally (half the cost of keywords, and it is built every step)."""
        return self._K.Stream(self._stream, self._n_counted, self._n_stream, self._n_prompt,
                              0 if self.insert_prompt else self._n_prompt)

    def _count_pending(self) -> None:
        """Count the branches of tokens appended since the last count."""
        if self._n_counted < self._n_stream:
            self._K.extend(self._state, self._settings, self._request_stream())
            self._n_counted = self._n_stream


def _unmerge(tokens, parents, depths, scores, budget):
    """Parallel layout: lay the best branches (root-to-leaf paths of the merged tree, best leaf
    first) side by side under the root, shared prefixes repeated, until `budget` nodes are used."""
    n = tokens.shape[0]
    is_leaf = np.ones(n, bool)
    is_leaf[parents[1:]] = False
    is_leaf[0] = False
    leaves = np.flatnonzero(is_leaf)
    leaves = leaves[np.argsort(-scores[leaves], kind="stable")]
    out_t, out_p, out_d, out_s = [tokens[0]], [-1], [0], [1.0]
    for leaf in leaves:
        path = []
        node = leaf
        while node > 0:
            path.append(node)
            node = parents[node]
        parent = 0
        for node in reversed(path):
            if len(out_t) > budget:
                break
            out_t.append(tokens[node]), out_p.append(parent), out_d.append(depths[node]), out_s.append(scores[node])
            parent = len(out_t) - 1
    return (np.array(out_t, np.int32), np.array(out_p, np.int32), np.array(out_d, np.int32),
            np.array(out_s, np.float32))
