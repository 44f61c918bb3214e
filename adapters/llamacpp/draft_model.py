"""`DraftcoreDraftModel`: draftcore's drafting inside llama-cpp-python's own speculative loop.

    from draftcore.adapters.llamacpp import speculative_llama
    llm = speculative_llama("model.gguf", n_ctx=4096)   # a llama_cpp.Llama (SpeculativeLlama), drafting
                                                       # with draftcore; computes only the logits it reads
    # or, by hand: logits_all=True is required once n_ctx exceeds n_batch (below), and every row's
    # logits are computed and copied (slow prompts on large vocabularies)
    llm = Llama(model_path="model.gguf", n_ctx=4096, logits_all=True, draft_model=DraftcoreDraftModel())

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

Checks of the Llama served, since llama-cpp-python's own settings can break or change its output:
  * logits_all (a Llama built by hand only): a draft model makes llama-cpp-python keep every position's
    logits, but it sizes that buffer (`Llama.scores`) from the constructor's `logits_all`: without
    logits_all=True it holds n_batch rows, and `Llama.eval` fails with a numpy broadcast ValueError
    once prompt + output pass n_batch (512 by default) positions. The first call from each Llama raises
    a ConfigError instead. It cannot catch a first prompt already longer than n_batch: that fails
    inside the prompt's evaluation, before any draft-model call. A SpeculativeLlama
    (speculative_llama.py) has no such case: it writes that buffer only when built with logits_all=True.
  * one step, one batch: llama-cpp-python samples from the last llama_decode's logits rows only, so
    the model's token and the chain must fit one batch: max_draft_tokens + 1 <= n_batch (ConfigError).
  * batch exactness: the first Llama served (or `speculative_llama`, at construction) is
    self-checked as `LlamaCppVerifier` is: a 5-node tree against one-token decoding, on a small
    context of its own with the Llama's settings (verifier.llama_batch_error), so the Llama's KV cache
    is not disturbed. Where multi-token batches differ (quantized weights with flash attention off,
    K-quants) it warns once (InexactBatchWarning, naming what to change): greedy output can then
    differ from plain decoding at near-ties, as it does with llama-cpp-python's own prompt lookup.
    It warns too where the Llama's settings (flash attention, an F16/F32 KV cache, several threads)
    make one-token decoding split its attention across threads past 256 tokens of context and a
    batch not (numerics.split_attention_from): long prompts' output then drifts from plain greedy.
  * the cost of logits_all (a Llama built by hand only): on the first such Llama served it times a prompt
    batch with every row's logits against the last row's only (logits_cost.py) and warns once
    (AllLogitsCostWarning, naming speculative_llama) where that makes prompts much slower, as a large
    vocabulary over a small model does.
The draft model is called with `Llama.input_ids[:n]` only: it finds the Llama as the caller's `self`
(Llama.generate's frame), confirmed by `llm.draft_model is self` and the buffer the ids view; a call
from anywhere else (a test calling it directly) is not checked. The Llama is never modified.
"""
from __future__ import annotations

import sys
import threading
import time
import weakref

import numpy as np
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaDraftModel

from draftcore import BusyError, ConfigError, CostAwareBudget, DraftTree
from draftcore.budget import as_budget_policy
from draftcore.errors import describe
from draftcore.validate import flag, positive_int

from .context import DEFAULT_N_BATCH, import_llama_cpp, offloads_layers
from .logits_cost import all_logits_slowdown, warn_if_slow
from .numerics import CPU_TREE_NODES, check_split_attention, warn_if_inexact
from .verifier import llama_batch_error

# The menu's drafters that need nothing but the text. A Jacobi window learns from the model's outputs
# at its nodes (`observe`), which a chain-only loop never reports: "jacobi" is refused, and
# "composite" is built without its window.
_TEXT_DRAFTERS = ("trie", "ngram", "composite")
_TOKEN_LIMIT = 1 << 18   # token ids the trie indexes (the draft model is never told the vocabulary size)
# llama-cpp-python evaluates the model's token and the drafted chain in one `Llama.eval`, cut into
# llama_decode calls of n_batch tokens: with the default n_batch (512) a chain of up to 511 drafted
# tokens is one forward, one verify step; a longer one costs several full forwards per step (each
# reads every weight) and can never pay. The bound also keeps the CostAwareBudget small (its tables
# grow with max_nodes: max_draft_tokens=10**9 took 37 s to build).
MAX_DRAFT_TOKENS = DEFAULT_N_BATCH - 1


def _text_drafter(name: str):
    """The drafter `name` names, built to need nothing but the text; ConfigError for "jacobi", for a
    registered drafter with a Jacobi window, and for a name nobody registered."""
    from draftcore.drafters import DRAFTER_NAMES, CompositeDrafter, JacobiDrafter, drafter_names, make_drafter

    if name == "composite":
        return CompositeDrafter(token_limit=_TOKEN_LIMIT, window=False)
    drafter = None
    if name in _TEXT_DRAFTERS or (name in drafter_names() and name not in DRAFTER_NAMES):
        drafter = make_drafter(name, _TOKEN_LIMIT)
    windowed = isinstance(drafter, JacobiDrafter) or (isinstance(drafter, CompositeDrafter) and drafter.window)
    if drafter is None or windowed:
        raise ConfigError(f"drafter: expected a Drafter, one of {list(_TEXT_DRAFTERS)} or a registered drafter "
                          f"without a Jacobi window (llama-cpp-python verifies chains only, and reports no "
                          f"model outputs to a Jacobi window), got {name!r}")
    return drafter


class DraftcoreDraftModel(LlamaDraftModel):
    """A `llama_cpp.Llama(draft_model=...)` that drafts with draftcore.

    drafter: a Drafter, or one of "trie" (default), "ngram", "composite" (without its Jacobi window),
        or a registered name (draftcore.drafters.register_drafter) whose drafter has no Jacobi window;
        kept across requests (a TrieDrafter may be shared by several draft models).
    max_draft_tokens: the longest chain proposed, at most MAX_DRAFT_TOKENS (511: llama-cpp-python
        evaluates the chain with the model's token in one batch, of at most n_batch = 512 by default).
    budget: "auto" (default: a CostAwareBudget choosing the chain length from measured step times
        and acceptance, pausing when drafting does not pay), an int (always up to that many tokens),
        or a budget policy object.
    self_check: run the batch self-check on the first Llama served (module docstring); warns with an
        InexactBatchWarning where multi-token batches differ from one-token decoding.

    self_check_error: that check's relative error (as LlamaCppVerifier.self_check_error); None until
    it ran.
    split_attention_from: as LlamaCppVerifier.split_attention_from, for that Llama; None until checked.
    """

    def __init__(self, drafter="trie", *, max_draft_tokens: int = 16, budget="auto", self_check: bool = True):
        if isinstance(drafter, str):
            drafter = _text_drafter(drafter)
        elif not callable(getattr(drafter, "start", None)):
            raise ConfigError(f"drafter: expected a Drafter or a name, got {describe(drafter)}")
        self.drafter = drafter
        self.max_draft_tokens = positive_int("max_draft_tokens", max_draft_tokens)
        if self.max_draft_tokens > MAX_DRAFT_TOKENS:
            raise ConfigError(f"max_draft_tokens: expected at most {MAX_DRAFT_TOKENS} (llama-cpp-python verifies "
                              f"the model's token and the chain in one batch of at most n_batch tokens, "
                              f"{DEFAULT_N_BATCH} by default), got {max_draft_tokens}")
        self.self_check = flag("self_check", self_check)
        self.self_check_error = None
        self.split_attention_from = None  # as LlamaCppVerifier's, for the first Llama checked
        self.all_logits_slowdown = None   # a prompt's evaluation with logits_all / without (logits_cost.py)
        self.budget = CostAwareBudget(max_nodes=self.max_draft_tokens) if budget == "auto" \
            else as_budget_policy(budget)
        self._served = weakref.WeakSet()       # the Llamas checked (check_llama)
        self._served_ids = _dead_ref           # the input_ids buffer of the last one: calls from it skip the look-up
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
            self._check_caller(input_ids, sys._getframe(1))
            return self._draft(np.asarray(input_ids).astype(np.int32, copy=False))
        finally:
            self._busy.release()

    def check_llama(self, llm) -> None:
        """Check `llm`, the llama_cpp.Llama this draft model serves (done on its first call from each
        Llama, and by SpeculativeLlama at construction; module docstring): ConfigError when a step
        cannot fit one batch, and, for a Llama built by hand, when its logits buffer cannot hold a
        row per position; on the first Llama checked, the batch self-check (InexactBatchWarning where
        batches are not exact, `self_check_error`); on the first Llama built by hand, the cost of
        logits_all (AllLogitsCostWarning, `all_logits_slowdown`). A warning turned into an error
        (warnings.simplefilter("error", InexactBatchWarning)) is raised by that one call;
        speculative_llama raises it at construction instead."""
        if not isinstance(llm, Llama):
            raise ConfigError(f"llm: expected a llama_cpp.Llama, got {describe(llm)}")
        check_step_fits_batch(self.max_draft_tokens, llm.n_batch)
        by_hand = computes_every_row(llm)
        if by_hand:
            check_logits_all(llm)
        lib = import_llama_cpp()
        if self.self_check and self.self_check_error is None:
            self.self_check_error = llama_batch_error(llm)
            warn_if_inexact(lib, self.self_check_error, ftype=int(lib.llama_model_ftype(llm.model)),
                            flash_attn_type=int(llm.context_params.flash_attn_type), who="DraftcoreDraftModel",
                            batch_limit=f"keep max_draft_tokens at most {CPU_TREE_NODES - 1}")
            self.split_attention_from = check_split_attention(
                lib, llm.ctx, llm.context_params, offloaded=offloads_layers(lib, llm.model_params.n_gpu_layers),
                who="DraftcoreDraftModel")
        if self.self_check and by_hand and self.all_logits_slowdown is None:
            self.all_logits_slowdown = all_logits_slowdown(lib, llm)
            warn_if_slow(self.all_logits_slowdown, llm.n_vocab())
        self._served.add(llm)

    def __getstate__(self):
        # pickle.dumps(llm) pickles its draft model (Llama.__getstate__ passes it to __init__ again).
        raise ConfigError("draft_model: a DraftcoreDraftModel cannot be pickled (its drafter's state lives in "
                          "compiled kernels), nor can a Llama holding one; expected the Llama to be built in the "
                          "process that uses it: speculative_llama(model_path, ...). A TrieDrafter's learnt "
                          "text moves with TrieDrafter.save(path) / TrieDrafter.load(path)")

    def _check_caller(self, input_ids, frame) -> None:
        """check_llama on the Llama making this call, the first time it calls: a call from the same
        Llama's input_ids buffer as the last one costs one identity test."""
        base = getattr(input_ids, "base", None)
        if base is not None and base is self._served_ids():
            return
        llm = serving_llama(self, input_ids, frame)
        if llm is None:
            return
        if llm not in self._served:
            self.check_llama(llm)
        self._served_ids = weakref.ref(base)

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
        at_context = getattr(self.budget, "at_context", None)   # optional (BudgetPolicy)
        if callable(at_context):
            at_context(context.shape[0] - 1)   # the cache holds all but the root
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


def _dead_ref():
    return None


def serving_llama(draft_model, input_ids, frame) -> Llama | None:
    """The llama_cpp.Llama whose `generate` called `draft_model` with `input_ids` from `frame`, or
    None. llama-cpp-python calls `self.draft_model(self.input_ids[:n])`: the caller's `self` is a
    Llama whose draft_model is this one and whose input_ids buffer `input_ids` views."""
    llm = frame.f_locals.get("self") if frame is not None else None
    if (isinstance(llm, Llama) and llm.draft_model is draft_model
            and getattr(input_ids, "base", None) is llm.input_ids):
        return llm
    return None


def computes_every_row(llm) -> bool:
    """Whether `llm` is a Llama built by hand, whose draft model makes llama-cpp-python compute and
    copy every row's logits; a SpeculativeLlama computes only the rows it samples."""
    from .speculative_llama import SpeculativeLlama   # here: that module builds on this one

    return not isinstance(llm, SpeculativeLlama)


def check_step_fits_batch(max_draft_tokens: int, n_batch: int) -> None:
    """ConfigError unless the model's token and a chain of `max_draft_tokens` fit one llama_decode of
    `n_batch` tokens: llama-cpp-python cuts a longer evaluation into several, and its sampler reads the
    last one's logits rows only (`llama_sampler_sample(ctx, idx - n_tokens)`)."""
    if max_draft_tokens + 1 > n_batch:
        raise ConfigError(f"max_draft_tokens: expected at most n_batch - 1 = {n_batch - 1} (llama-cpp-python "
                          f"samples a step's tokens from one llama_decode of at most n_batch={n_batch} tokens: "
                          f"the model's token and the chain), got {max_draft_tokens}; raise the Llama's n_batch "
                          f"or lower max_draft_tokens")


def check_logits_all(llm) -> None:
    """ConfigError unless `llm`'s scores buffer holds a logits row for every position it can evaluate.

    A draft model makes llama-cpp-python write every evaluated position's logits into `llm.scores`,
    which it sized from the constructor's logits_all: n_ctx rows with logits_all=True, n_batch rows
    without. Positions are bounded by n_ctx (llama.cpp rounds it up) and by the input_ids buffer
    (the n_ctx asked for)."""
    positions = min(int(llm.n_ctx()), llm.input_ids.shape[0])
    rows = llm.scores.shape[0]
    if rows < positions:
        raise ConfigError(
            f"logits_all: this Llama was built with logits_all=False and a draft model: llama-cpp-python "
            f"then keeps every position's logits in a buffer of n_batch={rows} rows, and fails (a numpy "
            f"broadcast ValueError in Llama.eval) once prompt + output pass {rows} of its n_ctx={positions} "
            f"positions. Expected draftcore.adapters.llamacpp.speculative_llama(model_path, ...), which "
            f"needs no logits_all and computes only the logits it reads, or logits_all=True: "
            f"Llama(..., logits_all=True, draft_model=...)")


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
