"""The trie drafter of "Lookahead: An Inference Acceleration Framework for Large Language Model with
Lossless Generation Accuracy" (Zhao et al., KDD 2024), §4.2–4.3: a thin class over the trie_*_kernels
modules, around one shared node pool (TriePool, trie_pool.py).

One trie lives across requests, and serves any number of them at once: `start(prompt)` returns a
`TrieRequest` that holds the request's own state (its token stream, its prompt branches' and its
output's own counts, in a slot of its own), while the output branches every request teaches are
shared (and decay when the pool is full). A request also learns, for itself only, the model's
tokens at its rejected candidates (`observe`; trie_model_kernels). A request's end removes only its
own prompt branches and what it learnt.
Every operation on the shared pool holds the pool's lock, so worker threads may share one
TrieDrafter, each with its own verifier. Save it with `save` (atomic, allowed at any time),
restore with `load`.

    parameter          default   meaning
    capacity           262144    nodes in the pool (68 bytes each); must exceed 2 * branch_length
    branch_length      24        tokens per inserted branch (L_b; the paper uses 12)
    max_match          8         longest context suffix matched at retrieval
    prompt_weight      16.0      factor on the current prompt's counts (branch weighting)
    recent_weight      16.0      extra factor on the current request's output counts (0: the paper)
    layout             "hierarchical" | "parallel" | "single" (the paper's Fig. 2–3; "single"
                                 drafts chains, for a chain-only verifier)
    token_limit        262144    token ids must be below this (size of the root index)
    max_requests       32        requests in progress at once; the first 4 keep their own counts in
                                 the node rows, each further one 8 bytes per pool node (allocated
                                 as requests arrive)
    learn_context      4         most prefix tokens a continuation the request learnt from the
                                 model (below) is matched by
    learn_capacity     1024      such continuations a request keeps (the oldest is forgotten first)
    research           None      TrieResearch(...) (trie_research.py): the switches that exist to
                                 measure a variant, the paper's ablations among them; None: all on

By default retrieval runs in stages, shorter suffixes filling the budget (merged, deduplicated),
a last stage drafting the most frequent tokens when nothing else fits; candidates are scored by
how often such candidates came true (per context length and relative-weight bin, learnt from this
drafter's own proposals) and all stages ranked together (trie_calibration_kernels); and the
model's token at each verified candidate off the accepted path (`observe`) counts, for this
request only, as a prompt-like continuation of that candidate's prefix (trie_model_kernels).

The configuration is fixed at construction (the kernels get it as one Settings value), so the
retrieval settings are read-only attributes. Defaults were tuned by replaying real SmolLM2 traces
(benchmarks/replay_table.py); the paper's exact configuration is `TrieDrafter.paper()`.
"""
from __future__ import annotations

import collections
import inspect
import os
import tempfile
import weakref

import numpy as np

from ..checks import check_observation
from ..errors import ConfigError, InputError, describe
from ..tree import DraftTree
from ..validate import fits_in_memory, positive_float, positive_int, token_array, tree_size
from ..jit import kernels
from .trie_pool import SAVED_ARRAYS, TriePool, pool_bytes, saved_problem
from .trie_research import TrieResearch

LAYOUTS = ("hierarchical", "parallel", "single")
_SAVE_FORMAT = 2      # 2 adds the calibration (`cal`); format-1 files load with the prior
_POOL = "draftcore.drafters.trie_pool_kernels"            # Settings and the node layout
_COUNT = "draftcore.drafters.trie_count_kernels"          # a request's counting and its end
_RETRIEVAL = "draftcore.drafters.trie_retrieval_kernels"  # drafting, one step in one call
_CALIBRATION = "draftcore.drafters.trie_calibration_kernels"   # learning what came true
_MODEL = "draftcore.drafters.trie_model_kernels"          # learning the model's tokens
_DEFAULT_BUDGET = 64  # draft buffers are sized for this many nodes until a larger budget comes
_FIRST_SLOTS = 4      # request slots allocated up front; more (up to max_requests) as requests arrive
_FILE_OPTIONS = ("capacity", "branch_length", "token_limit")  # what `load` takes from the file
_PENDING = 16         # drafts a request remembers for the calibration; an older one is judged as it stands


def _setting(name: str) -> property:
    return property(lambda self: getattr(self.pool.settings, name), doc=f"{name} (fixed at construction)")


class TrieDrafter:
    """Drafts hierarchical multi-branch trees from a trie of the n-grams seen so far; shared safely
    by concurrent requests (`start` returns each its own `TrieRequest`)."""

    concurrent_requests = True  # start() gives every request its own state: speculate need not claim it
    max_match = _setting("max_match")
    prompt_weight = _setting("prompt_weight")
    recent_weight = _setting("recent_weight")
    min_stage_nodes = _setting("min_stage_nodes")
    fill = _setting("fill")
    use_top = _setting("use_top")
    calibrate = _setting("calibrated")

    def __init__(self, *, capacity: int = 1 << 18, branch_length: int = 24, max_match: int = 8,
                 prompt_weight: float = 16.0, recent_weight: float = 16.0, layout: str = "hierarchical",
                 token_limit: int = 1 << 18, max_requests: int = 32, learn_context: int = 4,
                 learn_capacity: int = 1024, research: TrieResearch | None = None):
        for name in (_COUNT, _RETRIEVAL, _CALIBRATION, _MODEL):   # loaded now, not inside a timed step
            kernels(name)
        K = kernels(_POOL)
        self.branch_length = positive_int("branch_length", branch_length, minimum=2)
        self.capacity = positive_int("capacity", capacity)
        if self.capacity <= 2 * self.branch_length:
            raise ConfigError(f"capacity: expected more than 2 * branch_length = {2 * self.branch_length} "
                              f"nodes (one token may create branch_length nodes), got {capacity}")
        fits_in_memory(pool_bytes(self.capacity), "the trie's node pool", capacity=self.capacity)
        if layout not in LAYOUTS:
            raise ConfigError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        if research is None:
            research = TrieResearch()
        elif not isinstance(research, TrieResearch):
            raise ConfigError(f"research: expected None or a TrieResearch (draftcore.drafters.trie_research), "
                              f"got {describe(research)}")
        self.research = research
        # Plain int / float / bool fields: the types warm_up compiled the kernels for. `calibrated`
        # is resolved here, once: the kernels, requests and replay read only this flag.
        settings = K.Settings(
            max_match=positive_int("max_match", max_match),
            prompt_weight=positive_float("prompt_weight", prompt_weight, minimum=0.0, inclusive=True),
            recent_weight=positive_float("recent_weight", recent_weight, minimum=0.0, inclusive=True),
            min_stage_nodes=research.min_stage_nodes, fill=research.fill, use_top=research.use_top,
            mode=K.MODE_SINGLE if layout == "single" else K.MODE_HIERARCHICAL,
            calibrated=research.calibrate and research.fill and layout != "single")
        self.layout = layout
        self.token_limit = positive_int("token_limit", token_limit)
        fits_in_memory(4 * self.token_limit, "the trie's root index", token_limit=self.token_limit)   # int32 per id
        self.max_requests = positive_int("max_requests", max_requests)
        self.insert_prompt, self.insert_output = research.insert_prompt, research.insert_output
        self.eliminate_prompt, self.learn_from_model = research.eliminate_prompt, research.learn_from_model
        self.learn_context = positive_int("learn_context", learn_context)
        self.learn_capacity = positive_int("learn_capacity", learn_capacity)
        # every request's ring (trie_model_kernels.new_learnt): a snippet's tokens and its length, int32
        fits_in_memory(4 * self.learn_capacity * (self.learn_context + 2), "each request's ring of snippets",
                       learn_capacity=self.learn_capacity, learn_context=self.learn_context)
        # The node pool, its lock, settings and request slots: shared with any RowDrafter drafting from it.
        self.pool = TriePool(settings, capacity=self.capacity, token_limit=self.token_limit,
                             max_requests=self.max_requests, first_slots=_FIRST_SLOTS)

    @classmethod
    def paper(cls, **options) -> "TrieDrafter":
        """The paper's configuration: branch length 12, one retrieval stage, prompt branches
        weighted, output branches not boosted, no stage 0, no calibration, nothing learnt from
        the model's tokens."""
        config = dict(branch_length=12, recent_weight=0.0, prompt_weight=16.0, research=TrieResearch.paper())
        config.update(options)
        return cls(**config)

    def __repr__(self) -> str:
        # The pool as it stands: tokens a request appended since its last propose are not counted yet.
        return (f"TrieDrafter(capacity={self.capacity}, nodes_in_use={self.n_nodes}, requests_in_progress="
                f"{self.requests_in_progress}, branch_length={self.branch_length}, layout={self.layout!r})")

    # -- Drafter protocol -------------------------------------------------------------------------
    def start(self, prompt) -> "TrieRequest":
        """Begin a request: insert the prompt's branches (every start position) as the request's
        own PROMPT counts. Returns the request's handle (propose, update, finish)."""
        prompt = token_array("prompt", prompt, vocab_size=self.token_limit)
        with self.pool.lock:
            self.pool.end_abandoned()
            core = _RequestCore(self, prompt)
            core.count()
        return TrieRequest(self, core)

    # -- beyond the protocol ----------------------------------------------------------------------
    def propose(self, context, budget: int) -> DraftTree:
        """A one-off draft continuing `context` from what the trie has learnt, outside any request
        (no request's own counts weigh in): to inspect the trie, or to draft without a request."""
        context = token_array("context", context, vocab_size=self.token_limit)
        budget = tree_size("budget", budget)   # its buffers are sized by it
        pool, R = self.pool, kernels(_RETRIEVAL)
        with pool.lock:
            pool.end_abandoned()
            core = _RequestCore(self, context[:0], count_prompt=False)
            core.buffers = R.new_buffers(budget)
            try:
                n = R.retrieve(pool.state, pool.settings, core.cursor, core.buffers, context, budget)
            finally:
                pool.release_slots(core.slot)  # nothing was counted: the slot is still all zero
        return core.tree(n, self.layout, budget)

    @property
    def requests_in_progress(self) -> int:
        """Requests started and not finished (nor dropped and cleaned up)."""
        return self.pool.requests_in_progress

    def warm_up(self, sequences) -> None:
        """Insert a corpus of token sequences (e.g. past outputs) as persistent OUTPUT branches;
        requests in progress are unaffected but for what they learn from it."""
        sequences = [token_array(f"sequences[{i}]", seq, vocab_size=self.token_limit, allow_empty=True)
                     for i, seq in enumerate(sequences)]
        with self.pool.lock:
            self.pool.end_abandoned()
            for seq in sequences:  # each a request of its own, all output
                core = _RequestCore(self, seq[:0], count_prompt=False)
                core.count_output = True  # a corpus is inserted whatever insert_output says
                core.append(seq)
                core.end()

    @property
    def n_nodes(self) -> int:
        """Live nodes in the pool (never more than capacity); a request's tokens are counted at its
        next propose."""
        return self.pool.n_nodes

    def check_integrity(self) -> None:
        """Raise InputError if the pool's links, free list or counts are inconsistent (for tests)."""
        with self.pool.lock:
            code, node = self.pool.find_corruption()
        if code:
            raise InputError(f"trie: corrupt node pool (check {code}) at node {node}; see find_corruption")

    def save(self, path) -> None:
        """Write what the trie has learnt to `path` as plain arrays (.npz, no pickle), atomically: a
        temporary file in the same folder, flushed to disk, then renamed over `path`, so a failed
        write leaves the previous file as it was. Allowed while requests are in progress: their
        own counts are not saved; the calibration learnt so far is (a loaded trie ranks its
        candidates as this one does). The file is written at `path` exactly (no .npz suffix)."""
        if not isinstance(path, (str, os.PathLike)) or os.path.isdir(path):
            raise InputError(f"path: expected the path of a file to write (str or os.PathLike, not a folder), "
                             f"got {path!r}")
        folder = os.path.dirname(os.path.abspath(os.fspath(path)))
        if not os.path.isdir(folder):
            raise InputError(f"path: {str(path)!r} is in {folder!r}, which is not an existing folder")
        config = np.array([_SAVE_FORMAT, self.capacity, self.branch_length, self.token_limit], np.int64)
        with self.pool.lock:
            arrays = self.pool.saved_arrays()
        _write_atomically(path, folder, lambda f: np.savez(f, config=config, **arrays))

    @classmethod
    def load(cls, path, **options) -> "TrieDrafter":
        """Read a trie written by `save`, validating every array before using any; `options` as
        for the constructor, except capacity, branch_length and token_limit, which the file holds."""
        fixed = sorted(set(options) & set(_FILE_OPTIONS))
        unknown = sorted(set(options) - set(inspect.signature(cls.__init__).parameters))
        if unknown:
            raise ConfigError(f"{unknown[0]}: not an option of TrieDrafter (load takes the constructor's options "
                              f"except {', '.join(_FILE_OPTIONS)}); got {unknown[0]}={options[unknown[0]]!r}")
        if fixed:
            raise ConfigError(f"{fixed[0]}: TrieDrafter.load takes {', '.join(_FILE_OPTIONS)} from the file; "
                              f"got {fixed[0]}={options[fixed[0]]!r} as well (drop it)")
        expected = f"a TrieDrafter file (.npz of config, {', '.join(SAVED_ARRAYS)})"
        try:
            with np.load(path, allow_pickle=False) as data:
                config = np.asarray(data["config"])
                # Format 1 (before the calibration was saved) has no `cal`: it loads with the prior.
                names = SAVED_ARRAYS[:-1] if config.shape == (4,) and config[0] == 1 else SAVED_ARRAYS
                arrays = {name: np.asarray(data[name]) for name in names}
        except Exception as exc:  # zip, pickle, key, type errors alike: the file is not ours
            raise InputError(f"path: {str(path)!r} is not {expected}: {type(exc).__name__}: {exc}") from exc
        if config.shape != (4,) or config.dtype != np.int64 or config[0] not in (1, _SAVE_FORMAT):
            raise InputError(f"path: {str(path)!r} has config {config!r}; expected int64[4] = "
                             f"[{_SAVE_FORMAT} (or 1), capacity, branch_length, token_limit]")
        capacity, branch_length, token_limit = (int(v) for v in config[1:])
        problem = saved_problem(arrays, capacity, token_limit)   # format 1, without `cal`: the prior
        if problem:
            raise InputError(f"path: {str(path)!r} {problem}")
        # The shapes match the config, so the drafter allocates no more than the file holds.
        try:
            drafter = cls(capacity=capacity, branch_length=branch_length, token_limit=token_limit, **options)
        except ConfigError as exc:
            raise InputError(f"path: {str(path)!r} holds an unusable configuration: {exc}") from exc
        with drafter.pool.lock:
            code, node = drafter.pool.restore(arrays)
        if code:
            raise InputError(f"path: {str(path)!r} holds a corrupt trie (check {code} fails at node {node})")
        return drafter


class TrieRequest:
    """One request in progress on a TrieDrafter, from `TrieDrafter.start(prompt)`: the Drafter
    protocol's per-request calls. Its trees own their arrays. A request belongs to one decode loop
    (one thread at a time); a request dropped without `finish` is ended by the drafter's next call."""

    returns_valid_trees = True  # its trees are built valid by construction: speculate skips the check
    scores_estimate_acceptance = True   # w(v) / w(u): a composite takes them at their word

    def __init__(self, drafter: TrieDrafter, core: "_RequestCore"):
        self._core = core
        pool = self._pool = drafter.pool
        self._finalizer = weakref.finalize(self, pool.abandon, core.end)
        # What every step reads, looked up once (a step's host work is short, so lookups add up).
        self._lock, self._settings, self._step = pool.lock, pool.settings, kernels(_RETRIEVAL).step
        self._new_buffers = kernels(_RETRIEVAL).new_buffers
        self._token_limit, self._layout = drafter.token_limit, drafter.layout
        self._calibrating = drafter.calibrate
        self._learn_model = kernels(_MODEL).learn

    def __repr__(self) -> str:
        core = self._core
        return (f"TrieRequest(slot={core.slot}, tokens={core.n_stream}, prompt={core.n_prompt}"
                + (", finished" if core.ended else "") + ")")

    def update(self, tokens) -> None:
        """Append accepted tokens; their branches are counted at the next propose (one kernel call
        per step) or when the request finishes."""
        tokens = token_array("tokens", tokens, vocab_size=self._token_limit, allow_empty=True)
        core = self._core
        if core.ended:
            self._refuse("update")
        core.append(tokens)

    def propose(self, context, budget: int) -> DraftTree:
        """Best-first draft tree of at most `budget` nodes continuing `context` (root = context[-1]),
        weighted by this request's own prompt and output; the tree owns its arrays."""
        core = self._core
        context = token_array("context", context, vocab_size=self._token_limit)
        buffers = core.buffers
        if type(budget) is not int or not 0 <= budget < buffers.tokens.shape[0]:
            budget = tree_size("budget", budget)   # before the buffers grow to it
            if budget >= buffers.tokens.shape[0]:
                buffers = core.buffers = self._new_buffers(budget)
        if core.ended:
            self._refuse("propose")
        pool = self._pool
        with self._lock:
            pool.end_abandoned()
            if core.proposals:
                core.learn(final=False)
            n = self._step(pool.state, self._settings, core.stream(), core.cursor, buffers, context, budget)
            core.n_counted = core.n_stream
        tree = core.tree(n, self._layout, budget)  # from this request's own buffers, outside the lock
        if self._calibrating and context.shape[0] == core.n_stream:
            core.remember(n)   # a draft of the stream itself: its outcome will show in the stream
        core.context = context
        return tree

    def observe(self, tree: DraftTree, node_tokens, path) -> None:
        """The model's token at each candidate of the verified `tree` off the accepted `path`
        continues that candidate's prefix: count it as this request's own (learn_from_model;
        trie_model_kernels). `tree` continues the context of the last propose; one observe each."""
        if self._core.ended:
            self._refuse("observe")
        # tokens at or beyond token_limit are the model's too: the kernels skip them (the trie cannot hold them)
        self.observe_checked(tree, *check_observation(tree, node_tokens, path))

    def observe_checked(self, tree: DraftTree, node_tokens: np.ndarray, path: np.ndarray) -> None:
        """`observe` with the arguments `check_observation` returned (a composite checks once for all
        its sources)."""
        core = self._core
        if core.ended:
            self._refuse("observe")
        if core.learnt is None or core.context is None:
            return
        _check_continues(tree, path, core.context)
        context, core.context = core.context, None
        m = tree.n_candidates
        if m <= 1:
            return
        pool = self._pool
        with self._lock:
            pool.end_abandoned()
            self._learn_model(pool.state, self._settings, core.slot, core.learnt, context, tree.tokens,
                              tree.parents, m, node_tokens, path)

    def finish(self) -> None:
        """Branch eliminating: drop this request's own prompt counts (output counts persist);
        idempotent."""
        if self._core.ended:
            return
        self._finalizer.detach()
        with self._lock:
            self._core.end()

    def _refuse(self, what: str) -> None:
        raise InputError(f"request: {what}() called on {self!r}, which has finished; start a new request")


class _RequestCore:
    """A request's own state, apart from its handle so that a finalizer can end it: its slot of the
    pool and front (the kernels' cursor array), its token stream and its draft buffers. Built, and
    its count / learn / end called, with the pool's lock held."""

    def __init__(self, drafter: TrieDrafter, prompt: np.ndarray, count_prompt: bool = True):
        pool = self.pool = drafter.pool
        C = kernels(_COUNT)
        self.slot = pool.take_slot()
        self.cursor = C.new_cursor(self.slot, drafter.branch_length, pool.prunes)
        self.tokens = np.empty(max(64, 2 * prompt.shape[0]), np.int32)
        self.tokens[:prompt.shape[0]] = prompt
        self.n_stream = self.n_prompt = prompt.shape[0]
        self.count_from = 0 if drafter.insert_prompt and count_prompt else self.n_prompt
        self.n_counted = self.count_from
        self.count_output = drafter.insert_output
        self.keep_prompt = not drafter.eliminate_prompt
        self.buffers = kernels(_RETRIEVAL).new_buffers(_DEFAULT_BUDGET)
        self.make_stream = C.Stream
        self.learn_kernel = kernels(_CALIBRATION).learn
        self.proposals: collections.deque = collections.deque()   # (stream length, draft rows) not yet learnt from
        self.learnt = (kernels(_MODEL).new_learnt(drafter.learn_capacity, drafter.learn_context)
                       if drafter.learn_from_model and count_prompt else None)   # the model's tokens learnt
        self.context = None   # the context of the last propose, until its tree is observed
        self.ended = False

    def append(self, tokens: np.ndarray) -> None:
        begin = self.n_stream
        end = begin + tokens.shape[0]
        if end > self.tokens.shape[0]:
            grown = np.empty(max(2 * self.tokens.shape[0], end), np.int32)
            grown[:begin] = self.tokens[:begin]
            self.tokens = grown
        self.tokens[begin:end] = tokens
        self.n_stream = end
        if not self.count_output:
            self.n_counted = end

    def tree(self, n: int, layout: str, budget: int) -> DraftTree:
        """The draft the kernels wrote to this request's buffers (n nodes), in arrays of its own."""
        b = self.buffers
        if layout == "parallel":
            return DraftTree(*_unmerge(b.tokens[:n], b.parents[:n], b.depths[:n], b.scores[:n], budget))
        # The four output buffers are rows of one block (new_buffers): one copy, then row views.
        rows = b.tokens.base[:, :n].copy()
        return DraftTree(rows[0], rows[1], rows[2], rows[3].view(np.float32))

    def remember(self, n: int) -> None:
        """Keep the draft just written to the buffers (n nodes), to learn from once the stream shows
        what became of it (`learn`, at the next propose)."""
        self.proposals.append((self.n_stream, self.buffers.tokens.base[:, :n].copy()))

    def learn(self, final: bool) -> None:
        """Teach the pool's calibration (shared by its requests) what became of the remembered drafts
        the stream now settles: all of them when `final`, and the oldest as it stands when more than
        _PENDING wait (a long chain may take many steps)."""
        stream = self.tokens[:self.n_stream]
        cal = self.pool.state.cal
        while self.proposals:
            pos, rows = self.proposals[0]
            if not self.learn_kernel(cal, stream, pos, rows[0], rows[1], rows[2], rows[4],
                                     final or len(self.proposals) > _PENDING):
                break
            self.proposals.popleft()

    def stream(self):
        """The tokens as the kernels take them: Stream(tokens, begin, end, n_prompt, count_from),
        built positionally (cheaper than keywords, and it is built every step)."""
        return self.make_stream(self.tokens, self.n_counted, self.n_stream, self.n_prompt, self.count_from)

    def count(self) -> None:
        """Count the branches of the tokens appended since the last count."""
        if self.n_counted < self.n_stream:
            kernels(_COUNT).extend(self.pool.state, self.pool.settings, self.stream(), self.cursor)
            self.n_counted = self.n_stream

    def end(self) -> None:
        """Branch eliminating: take this request's own counts back and free its slot; idempotent
        (finish, or the pool's end_abandoned for a request dropped without it)."""
        if self.ended:
            return
        self.count()
        if self.proposals:
            self.learn(final=True)
        pool, M = self.pool, kernels(_MODEL)
        if self.learnt is not None and self.learnt.ring[M.RING_COUNT]:   # anything learnt
            M.forget_all(pool.state, self.slot, self.learnt)
        kernels(_COUNT).end_request(pool.state, pool.settings, self.stream(), self.cursor, self.keep_prompt)
        pool.release_slots(self.slot)
        self.ended = True


def _check_continues(tree: DraftTree, path: np.ndarray, context: np.ndarray) -> None:
    """InputError unless the observed tree (checked) grew from `context`, the last propose's, and
    its accepted path runs through candidates only."""
    m = tree.n_candidates
    if int(path.max()) >= m:
        raise InputError(f"path: expected root-first candidate indices (0 first, each below {m}), got {path.tolist()}")
    if int(tree.tokens[0]) != int(context[-1]):
        raise InputError(f"tree: its root token {int(tree.tokens[0])} is not the last token {int(context[-1])} "
                         f"of the context proposed for; observe the tree of the last propose")


def _write_atomically(path, folder: str, write) -> None:
    """write(f) into a temporary file in `folder`, flush it to disk, then rename it to `path`."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".draftcore-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
