"""`DraftcoreDraftModel`: draftcore's drafting inside llama-cpp-python's own speculative loop.

    from llama_cpp import Llama
    from draftcore.adapters.llamacpp import DraftcoreDraftModel
    llm = Llama(model_path="model.gguf", draft_model=DraftcoreDraftModel())

llama-cpp-python calls its `draft_model` with the whole context (prompt + generated) before every
evaluation and verifies the chain it returns in its own loop (`Llama.generate`): every token is the
model's own, so `create_completion`, `create_chat_completion`, streaming and its OpenAI-compatible
server work unchanged. Only chains can be verified there (no tree, no Jacobi window); for trees use
`LlamaCppVerifier` and `draftcore.speculate`.

What the draft model does per call:
  * tells requests apart by their context: one that does not extend the previous context starts a
    new request (the previous one finishes, and the trie keeps what it generated);
  * learns how many of its last chain's tokens were accepted (the context's new tokens) and what the
    step cost (time between calls), and feeds both to a `CostAwareBudget`, which picks the chain
    length — or no draft at all when drafting does not pay (llama-cpp-python's own prompt lookup
    drafts every step, and runs below plain speed on a CPU);
  * proposes from its drafter and returns the best chain of the tree (each node's first child:
    candidates come best first).

One draft model serves one `Llama` at a time (llama-cpp-python's loop is sequential); a second
concurrent caller gets `BusyError`. Several may share one TrieDrafter (`drafter=`).
"""
from __future__ import annotations

import threading
import time

import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel

from draftcore import BusyError, ConfigError, CostAwareBudget, DraftTree
from draftcore.budget import as_budget_policy
from draftcore.errors import describe
from draftcore.validate import positive_int

# Drafters that need nothing but the text: the Jacobi ones learn from the model's outputs at their
# window's nodes (`observe`), which a chain-only loop never reports.
_TEXT_DRAFTERS = ("trie", "ngram", "ngram-paper", "composite-nowindow")
_TOKEN_LIMIT = 1 << 18   # token ids the trie indexes (the draft model is never told the vocabulary size)


class DraftcoreDraftModel(LlamaDraftModel):
    """A `llama_cpp.Llama(draft_model=...)` that drafts with draftcore.

    drafter: a Drafter, or one of "trie" (default), "ngram", "ngram-paper", "composite-nowindow";
        kept across requests (a TrieDrafter may be shared by several draft models).
    max_draft_tokens: the longest chain proposed (llama-cpp-python evaluates it in one batch).
    budget: "auto" (default: a CostAwareBudget choosing the chain length from measured step times
        and acceptance, pausing when drafting does not pay), an int (always up to that many tokens),
        or a budget policy object.
    """

    def __init__(self, drafter="trie", *, max_draft_tokens: int = 16, budget="auto"):
        if isinstance(drafter, str):
            if drafter not in _TEXT_DRAFTERS:
                raise ConfigError(f"drafter: expected a Drafter or one of {list(_TEXT_DRAFTERS)} (llama-cpp-python "
                                  f"verifies chains only, and reports no model outputs to a Jacobi window), "
                                  f"got {drafter!r}")
            from draftcore.drafters import make_drafter
            drafter = make_drafter(drafter, _TOKEN_LIMIT)
        elif not callable(getattr(drafter, "start", None)):
            raise ConfigError(f"drafter: expected a Drafter or a name, got {describe(drafter)}")
        self.drafter = drafter
        self.max_draft_tokens = positive_int("max_draft_tokens", max_draft_tokens)
        self.budget = CostAwareBudget(max_nodes=self.max_draft_tokens) if budget == "auto" \
            else as_budget_policy(budget)
        self._busy = threading.Lock()
        self._request = None
        self._context = np.empty(0, np.intc)   # the context of the last call
        self._chain: DraftTree | None = None   # the chain proposed then, awaiting its outcome
        self._called_at = 0.0
        self.steps = 0                         # calls, and the drafted / accepted tokens over them
        self.drafted_tokens = 0
        self.accepted_tokens = 0

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        if not self._busy.acquire(blocking=False):
            raise BusyError("draft_model: this DraftcoreDraftModel is drafting for another Llama call right now and "
                            "serves one at a time; give each Llama its own DraftcoreDraftModel (they may share "
                            "one TrieDrafter: drafter=...)")
        try:
            return self._draft(np.asarray(input_ids).astype(np.int32, copy=False))
        finally:
            self._busy.release()

    def _draft(self, context: np.ndarray) -> np.ndarray:
        now = time.perf_counter()
        n_old = self._context.shape[0]
        continues = (self._request is not None and context.shape[0] > n_old
                     and np.array_equal(context[:n_old], self._context))
        if continues:
            new = context[n_old:]
            self._learn_outcome(new, now - self._called_at)
            self._request.update(new)
        else:
            self._end_request()
            self._request = self.drafter.start(context[:-1].copy())
            if self._request is None:
                self._request = self.drafter
            self._request.update(context[-1:].copy())
        self._context = context.copy()
        self._called_at = now
        self.steps += 1
        chain = self._propose(context)
        self._chain = chain
        self.drafted_tokens += chain.n_draft
        return chain.tokens[1:].astype(np.intc)

    def _propose(self, context: np.ndarray) -> DraftTree:
        size = min(self.budget.request_size(), self.max_draft_tokens)
        root = int(context[-1])
        if size <= 0:
            return DraftTree.root_only(root)
        # llama.cpp verifies a chain here: a window would be dropped, so ask for none if we can
        if getattr(self._request, "lookahead_optional", False) is True:
            tree = self._request.propose(context, size, lookahead=False)
        else:
            tree = self._request.propose(context, size)
        if tree.n_lookahead:
            tree = tree.without_lookahead()
        chain = best_chain(tree)
        return chain.with_candidates(min(self.budget.choose(chain), chain.n_draft))

    def _learn_outcome(self, new: np.ndarray, seconds: float) -> None:
        """The last chain's drafted tokens that the context now holds were accepted; the new tokens
        are those plus the model's own next token."""
        chain = self._chain
        if chain is None:
            return
        drafted = chain.tokens[1:]
        n = min(drafted.shape[0], new.shape[0] - 1)
        accepted = int(np.argmin(np.append(drafted[:n] == new[:n], False)))
        self.accepted_tokens += accepted
        self.budget.observe(chain, np.arange(accepted + 1, dtype=np.int32), seconds)

    def _end_request(self) -> None:
        request, self._request, self._chain = self._request, None, None
        if request is not None:
            request.finish()   # the trie keeps what the request generated

    def __repr__(self) -> str:
        return (f"DraftcoreDraftModel({type(self.drafter).__name__}, max_draft_tokens={self.max_draft_tokens}, "
                f"steps={self.steps}, drafted={self.drafted_tokens}, accepted={self.accepted_tokens})")


def best_chain(tree: DraftTree) -> DraftTree:
    """The tree's best branch: from the root, each node's first child (candidates come best first)."""
    n = tree.n_candidates
    first_child = np.full(n, -1, np.int64)
    for i in range(n - 1, 0, -1):   # lowest index written last
        first_child[tree.parents[i]] = i
    nodes = [0]
    while first_child[nodes[-1]] >= 0:
        nodes.append(int(first_child[nodes[-1]]))
    nodes = np.array(nodes, np.int64)
    scores = None if tree.scores is None else tree.scores[nodes].copy()
    m = nodes.shape[0]
    return DraftTree(tree.tokens[nodes].copy(), np.arange(-1, m - 1, dtype=np.int32), np.arange(m, dtype=np.int32),
                     scores)
