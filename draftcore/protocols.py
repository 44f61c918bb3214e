"""The three small interfaces everything else plugs into.

A backend implements `Verifier`; a drafting strategy implements `Drafter`; what decides how much of
each draft to verify implements `BudgetPolicy`. All are structural (`typing.Protocol`): no base
class to inherit. What crosses them is numpy: token ids are contiguous 1-D int32 arrays, "no draft"
is a root-only tree, never None.

Optional members, all read in one place at the start of a call (`draftcore.capabilities`; a request's
when it starts), which the loop, the session and the drafters then ask:

    Verifier.max_tree_nodes   int   most nodes one verify takes (llama.cpp: n_batch); default max_context
    Verifier.max_tree_leaves  int   most leaves one tree may have (llama.cpp: n_seq_max - 1); default none
    Verifier.encode(text)     -> int32[T]   both present: `speculate` accepts and returns text
    Verifier.decode(ids)      -> str
    Verifier.advance(token)   -> int   verify(DraftTree.root_only(token)) + commit([0]) in one call,
                                       returning that verify's token: the loop takes it for every
                                       root-only step that reads no logits (budget 0, a pause), where
                                       a backend's one-token path costs less host time than the tree
                                       protocol (llama.cpp). A wrapper that overrides verify or commit
                                       and forwards other attributes must override advance too.
    DraftRequest.observe(tree, node_tokens, path)  feedback from every verify (below)
    DraftRequest.observe_checked(tree, node_tokens, path)  observe without its own check of the
                                            arguments, which the loop's are by construction: called
                                            instead of observe for a request that also
                                            returns_valid_trees (draftcore's own drafters)
    DraftRequest.returns_valid_trees  bool  True: `speculate` skips its check of the trees
                                            (draftcore's own drafters build them valid)
    DraftRequest.lookahead_optional   bool  True: propose also takes `lookahead=False`, asking for
                                            no lookahead window this step (the budget policy's
                                            `wants_lookahead`; JacobiDrafter, CompositeDrafter)
    DraftRequest.scores_estimate_acceptance  bool  True: its tree scores estimate acceptance (the
                                            trie), so CompositeDrafter merges them as they are
                                            rather than re-calibrating them
    Drafter.concurrent_requests  bool   True: concurrent requests may share it (below); speculate
                                        claims any drafter or budget policy that does not say so
                                        (it then serves one request at a time: it runs all the same)
    BudgetPolicy.at_context(n_past)       told the cached context before each step (below)
    BudgetPolicy.keep_lookahead(tree, k)  -> bool   whether the window rides along (below)
    BudgetPolicy.wants_lookahead()        -> bool   whether to ask for a window this step (below)
    BudgetPolicy.observe_outcomes(tree, verified, outcome)  every proposed node's outcome (below)
    BudgetPolicy.concurrent_requests      bool      as Drafter's

Errors, the same in every backend: `InputError` for a call's arguments or call order (a bad
`n_logits`, a path that is not in the last tree, verify before prefill) — refused before any state
changes; `ConfigError` for construction options; `BackendError` when the framework or model
misbehaves. `draftcore.checks` holds the shared validation; `draftcore.selfcheck` the construction
check that a backend honours the tree mask.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from .tree import DraftTree


@runtime_checkable
class Verifier(Protocol):
    """One model deployment that can run a tree-masked forward and roll its KV cache back.

    Attributes:
        vocab_size: number of logits per position.
        n_past: tokens whose KV is in the cache (the committed context).
        max_context: the most tokens the cache can hold (prompt + generated + one draft tree).
    """

    vocab_size: int
    n_past: int
    max_context: int

    def prefill(self, prompt: np.ndarray, n_logits: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Start a new sequence from `prompt` (int32[T]), dropping any previous one.

        Returns the last prompt position's result in `verify`'s form for a 1-node tree:
        (int32[1] its argmax, float32[n_logits, vocab_size] its logits), n_logits 0 or 1.
        Afterwards n_past == T. A verifier may keep the cached KV of a prefix the prompt shares
        with its previous sequence and run only the rest (HFVerifier's reuse_prefix); the result is
        the same within the backend's float noise.
        """

    def verify(self, tree: DraftTree, n_logits: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """One forward over every node of `tree` (positions n_past + depths, tree-masked).

        Returns (tokens, logits):
            tokens  int32[n]: the argmax of each node's raw logits, computed where the logits live
                    (on a GPU only n ints reach the host); -1 for a node the backend did not
                    evaluate (a llama.cpp context that holds one branch at a time evaluates the
                    branches acceptance walks) — never a made-up token. The root and the first
                    n_logits nodes are always evaluated.
            logits  float32[n_logits, vocab_size]: the raw logits of nodes 0 .. n_logits - 1 (the
                    candidates, when the acceptance rule samples); float32[0, vocab_size] when 0.
        The KV of every node is held until `commit`; a second verify without a commit replaces the
        first tree (its KV is dropped). 0 <= n_logits <= n, else InputError.
        """

    def commit(self, path: np.ndarray) -> None:
        """Keep the KV of `path` (int32[k], tree node indices, root first, each the parent of the
        next) appended to the context; drop every other node of the last verified tree.
        Afterwards n_past grows by k."""


@runtime_checkable
class Drafter(Protocol):
    """A source of draft trees, and the sharing contract every drafter keeps.

    `start(prompt)` begins a request and returns its handle: an object with `propose`, `update`,
    `finish` and optionally `observe` (the `DraftRequest` below), holding that request's own state —
    its token stream, its prompt branches and their counts, a Jacobi window, an n-gram cursor —
    keyed by request, as serving engines key their suffix caches by request id. What persists
    across requests (the trie's output branches, an n-gram pool) lives in the drafter and is
    updated under the drafter's own lock. A drafter that keeps this contract declares
    `concurrent_requests = True`: any number of requests, from any threads, may then be in
    progress on it at once (TrieDrafter does).

    A simpler drafter may return None from `start` and serve the request itself (propose, update,
    finish on the drafter). It serves one request at a time: `speculate` claims it for the
    request's lifetime and a second concurrent request gets a `BusyError`, never a corrupted draft.
    """

    def start(self, prompt: np.ndarray) -> "DraftRequest | None":
        """A new request begins with `prompt` (int32[T]); returns its handle (or None, above)."""


class DraftRequest(Protocol):
    """One request's drafting, from `Drafter.start`. Used by one decode loop (one thread at a time).

    Optional: observe(tree, node_tokens, path) — called after every verify, once the step's path is
    committed and before `update` receives its tokens, with
        tree         the DraftTree as verified: after the budget cut its candidates (and dropped a
                     lookahead window that did not fit); it may differ from what `propose` returned
        node_tokens  int32[n]: the model's greedy token at every node of `tree` (the argmax of the
                     raw logits, also when sampling: a Jacobi window stays greedy), -1 where the
                     backend did not evaluate a node
        path         int32[k]: the accepted root-to-candidate path (node indices, root first)
    The model's token at a node is a real continuation of that node's prefix, accepted or not:
    a Jacobi window grows its n-gram pool from them. A request without `observe` is unaffected.
    """

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        """Return a tree of at most `budget` drafted candidates (plus the root, plus any lookahead
        nodes the drafter wants observed) continuing `context`.

        `context` is int32[m]: prompt + accepted tokens, ending with the root token
        (context[-1] == tree.tokens[0]). Candidates come first, best first (every prefix of them is
        the best draft of its size); a root-only tree means "no draft". The tree owns its arrays:
        nothing another request does may change it. A request with `lookahead_optional = True`
        also takes a keyword `lookahead` (default True); `lookahead=False` asks for no window.
        """

    def update(self, tokens: np.ndarray) -> None:
        """`tokens` (int32[k]) were just accepted and appended to the context; called with every
        emitted token, the last step's too (before `finish`)."""

    def finish(self) -> None:
        """The request ended: drop its own state (its prompt branches, nobody else's), keep what
        should persist. Idempotent. A request dropped without `finish` (a stream collected
        unfinished) must end only itself, whenever and in whatever thread that happens."""


@runtime_checkable
class BudgetPolicy(Protocol):
    """How many drafted candidates to verify each step (draftcore.budget: `FixedBudget`,
    `CostAwareBudget`). `speculate` takes one as `budget=` (an int becomes a `FixedBudget`) and calls
    it once per step: `request_size`, then, if a tree was proposed, `choose` (again on the tree
    without its window, if the window is dropped), then `observe`.

    Optional members, read once per request by the loop (draftcore.drafting, draftcore.outcomes):
        at_context(n_past)      called before request_size: the step verifies after n_past cached
                                tokens (a verify's cost grows with them; `CostAwareBudget` keeps
                                its cost tables by context length)
        keep_lookahead(tree, k) -> bool  whether the tree's lookahead window rides along with its
                                first k candidates (default: always, as FixedBudget does); a window
                                is verified whole or not at all, and priced with the candidates
        wants_lookahead() -> bool  asked before proposing, of a drafter that can leave its window out
                                (`DraftRequest.lookahead_optional`): whether to build one this step at
                                all (default: always). `draftcore.budget.LookaheadProbe` answers it
                                from what keep_lookahead last decided.
        observe_outcomes(tree, verified, outcome)  what every node of a step's proposal would have
                                done, a few tokens later, verified or not (draftcore.outcomes)
        concurrent_requests     True: requests in progress at once may share it (FixedBudget: it
                                has no state); else speculate claims it for a request's lifetime
    """

    def request_size(self) -> int:
        """How many candidate nodes to ask the drafter for this step (0: no draft, and the drafter
        is not asked)."""

    def choose(self, tree: DraftTree) -> int:
        """How many of `tree`'s candidates to verify: a best-first prefix of them (at most
        tree.n_draft); the tree's lookahead nodes come on top, whole."""

    def observe(self, tree: DraftTree, path: np.ndarray, seconds: float) -> None:
        """The step that verified `tree` (as cut to the choice) took `seconds` (drafting, verify,
        commit); `path` (int32, root first) was accepted."""
