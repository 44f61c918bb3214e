"""Trace replay: the real `speculate` loop against recorded greedy outputs, with no model.

`TraceVerifier` answers as the model did when the trace was recorded: at a node whose path from
the root continues the recorded output, the model's token is the next recorded token; anywhere
else the model's token is unknown, and the verifier says so (-1, `draftcore.checks.MISSING`).
Greedy acceptance only follows recorded tokens, so a replay accepts exactly what the model would
have, and tokens per step are the loop's own.

One TraceVerifier serves a whole replay (`load(trace)` re-arms it), so with no drafter and no
budget given, `replay` makes the library's bare call `draftcore.speculate(verifier, prompt)`,
whose drafter and budget live in `draftcore.Session.of(verifier)` and carry over from trace to
trace as they do from request to request. A `SimulatedClock` prices every verify from a measured
cost table (`cost_model`), so the auto budget replays reproducibly and the replay reports a
simulated speedup over plain decoding. Drafting is timed for real, separately.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..acceptance import greedy_accept
from ..budget import as_budget_policy
from ..checks import MISSING, check_n_logits, check_path, check_tree
from ..errors import BackendError, ConfigError, InputError
from ..result import add_histogram
from ..session import Session, default_drafter
from ..speculate import speculate
from ..tree import DraftTree
from ..validate import positive_int
from . import variants  # noqa: F401  (registers the measured variants: replay runs them by name)
from .cost_model import CostModel, SimulatedClock
from .oracle_budget import ASSISTS, AssistedBudget, OracleBudget
from .traces import Trace


class TraceVerifier:
    """A Verifier whose "model" is one recorded greedy trace at a time.

    vocab_size, max_context: fixed for the verifier's life; `TraceVerifier.for_traces(traces)`
        sizes both to hold every trace of a set.
    clock: a SimulatedClock charged one forward per prefill (as one token: plain decoding pays the
        same prefill) and per verify (as its tree's nodes); None charges nothing.
    """

    def __init__(self, vocab_size: int, max_context: int, *, clock: SimulatedClock | None = None):
        self.vocab_size = positive_int("vocab_size", vocab_size)
        self.max_context = positive_int("max_context", max_context)
        self.clock = clock
        self._trace: Trace | None = None
        self._n_out_cached = 0          # output tokens whose "KV" is committed
        self._prefilled = False
        self._tree: DraftTree | None = None

    @classmethod
    def for_traces(cls, traces, *, vocab_size: int | None = None, clock: SimulatedClock | None = None):
        """A TraceVerifier that can load any of `traces` (vocab_size default: their largest id + 1)."""
        longest = max(_context_needed(t) for t in traces)
        return cls(vocab_size or vocab_size_of(traces), longest, clock=clock)

    def load(self, trace: Trace) -> None:
        """Answer as `trace`'s model from now on (the next call must be a prefill of its prompt)."""
        top = int(max(trace.prompt_ids.max(), trace.output_ids.max()))
        if top >= self.vocab_size:
            raise InputError(f"trace: {trace.dataset}/{trace.idx} holds token id {top}, outside this "
                             f"TraceVerifier's vocabulary [0, {self.vocab_size})")
        if _context_needed(trace) > self.max_context:
            raise InputError(f"trace: {trace.dataset}/{trace.idx} needs a context of {_context_needed(trace)} "
                             f"tokens, more than this TraceVerifier's max_context {self.max_context}")
        self._trace = trace
        self._n_out_cached = 0
        self._prefilled = False
        self._tree = None

    @property
    def n_past(self) -> int:
        trace = self._trace
        return 0 if trace is None or not self._prefilled else trace.prompt_ids.shape[0] + self._n_out_cached

    def prefill(self, prompt, n_logits=0):
        trace = self._loaded("prefill")
        _refuse_logits(n_logits, 1)
        if not np.array_equal(prompt, trace.prompt_ids):
            raise InputError(f"prompt: not the prompt of the loaded trace {trace.dataset}/{trace.idx}")
        self._n_out_cached, self._prefilled, self._tree = 0, True, None
        self._charge(1)
        return trace.output_ids[:1].astype(np.int32), self._no_logits()

    def verify(self, tree, n_logits=0):
        trace = self._loaded("verify")
        check_tree(tree, self.vocab_size)
        _refuse_logits(n_logits, len(tree))
        if not self._prefilled:
            raise InputError("verify: called before prefill")
        tokens = self._model_tokens(trace.output_ids, tree)
        self._tree = tree
        self._charge(len(tree))
        return tokens, self._no_logits()

    def commit(self, path) -> None:
        if self._tree is None:
            raise InputError("commit: no verified tree to commit a path of (call verify first)")
        self._n_out_cached += check_path(path, self._tree).shape[0]
        self._tree = None

    def accepted_by_prefix(self, tree) -> np.ndarray:
        """int64[n]: [k] the tokens greedy acceptance takes beyond the root if only the tree's first
        k + 1 nodes were verified now (what an oracle budget knows; changes no state)."""
        trace = self._loaded("accepted_by_prefix")
        check_tree(tree, self.vocab_size)
        model_tokens = self._model_tokens(trace.output_ids, tree)
        return np.array([greedy_accept(tree.tokens, tree.parents, model_tokens, k + 1)[0].shape[0] - 1
                         for k in range(len(tree))], np.int64)

    # -- internals ----------------------------------------------------------------------------
    def _model_tokens(self, out: np.ndarray, tree: DraftTree) -> np.ndarray:
        """int32[n]: the recorded next token at every node on the recorded path, MISSING elsewhere."""
        base = self._n_out_cached                 # the root is output token `base`
        if base >= out.shape[0] or tree.tokens[0] != out[base]:
            raise InputError(f"tree: root token {int(tree.tokens[0])} is not the trace's output token at "
                             f"{base}; the replay left its trace")
        at = base + tree.depths.astype(np.int64)  # the output position each node would stand at
        matches = (at < out.shape[0]) & (tree.tokens == out[np.minimum(at, out.shape[0] - 1)])
        on_trace = _on_path(matches.tolist(), tree.parents.tolist())
        known = on_trace & (at + 1 < out.shape[0])
        tokens = np.full(len(tree), MISSING, np.int32)
        tokens[known] = out[at[known] + 1]
        if tokens[0] == MISSING:
            raise InputError(f"max_new_tokens: the trace's output ends at token {base}; a replay cannot "
                             f"decode past its recorded output")
        return tokens

    def _loaded(self, where: str) -> Trace:
        if self._trace is None:
            raise InputError(f"{where}: no trace loaded; call TraceVerifier.load(trace) first")
        return self._trace

    def _charge(self, n_nodes: int) -> None:
        if self.clock is not None:
            self.clock.charge(n_nodes)

    def _no_logits(self) -> np.ndarray:
        return np.zeros((0, self.vocab_size), np.float32)


def _refuse_logits(n_logits, n_nodes: int) -> None:
    if check_n_logits(n_logits, n_nodes):
        raise InputError(f"n_logits: a TraceVerifier knows the recorded greedy tokens only, not logits; "
                         f"expected 0 (greedy decoding without penalties), got {n_logits}")


def _on_path(matches: list, parents: list) -> np.ndarray:
    """Nodes whose every node from the root down matches (the root always does). Plain lists:
    a Python loop over ~65 nodes is faster than numpy calls per depth level."""
    on = [True] * len(matches)
    for i in range(1, len(matches)):
        on[i] = matches[i] and on[parents[i]]
    return np.array(on, bool)


def _context_needed(trace: Trace) -> int:
    """Prompt + output + one draft node: what replaying `trace` puts in the context at most."""
    return trace.prompt_ids.shape[0] + trace.output_ids.shape[0] + 1


def vocab_size_of(traces) -> int:
    """The smallest vocabulary that holds every token of `traces`."""
    return 1 + max(int(max(t.prompt_ids.max(), t.output_ids.max())) for t in traces)


class _TimedDrafter:
    """Stands in for a drafter and measures, in real time, what each verify step spends in it
    (update + propose + observe): the simulated clock the loop runs on prices verifies only."""

    def __init__(self, inner):
        self.inner = inner
        self.request = None  # the inner drafter's request in progress (the inner drafter itself if it serves it)
        self.returns_valid_trees = False
        self.step_seconds: list[float] = []
        self._pending = 0.0

    def start(self, prompt) -> None:  # None: this wrapper serves the request itself, one at a time
        self.request = self.inner.start(prompt) or self.inner
        self.returns_valid_trees = getattr(self.request, "returns_valid_trees", False)

    def update(self, tokens) -> None:
        t0 = time.perf_counter()
        self.request.update(tokens)
        self._pending += time.perf_counter() - t0

    @property
    def lookahead_optional(self) -> bool:   # the loop's question goes to the timed request
        return getattr(self.request, "lookahead_optional", False) is True

    def propose(self, context, budget, **lookahead):
        t0 = time.perf_counter()
        tree = self.request.propose(context, budget, **lookahead)
        self._pending += time.perf_counter() - t0
        return tree

    def observe(self, tree, node_tokens, path) -> None:  # called once per verify step
        t0 = time.perf_counter()
        inner_observe = getattr(self.request, "observe", None)
        if inner_observe is not None:
            inner_observe(tree, node_tokens, path)
        self.step_seconds.append(self._pending + time.perf_counter() - t0)
        self._pending = 0.0

    def finish(self) -> None:
        if self.request is not None:
            self.request.finish()
        self.request = None
        self._pending = 0.0


@dataclass
class ReplaySummary:
    """Totals over the traces of one dataset."""

    requests: int = 0
    new_tokens: int = 0
    steps: int = 0                                       # forwards, the prefill included
    accepted_hist: list = field(default_factory=list)    # [k]: steps that accepted k drafted tokens
    budget_hist: dict = field(default_factory=dict)      # {candidates verified: steps}
    draft_seconds: list = field(default_factory=list)    # real drafting time of every verify step
    simulated_seconds: float = 0.0                       # the cost model's time of the replay
    plain_seconds: float = 0.0                           # plain decoding of the same tokens, simulated

    @property
    def tokens_per_step(self) -> float:
        """Output tokens over forward steps (the prefill counted), summed over requests."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def speedup(self) -> float | None:
        """Simulated plain decoding time over simulated speculative time; None without a cost model."""
        return self.plain_seconds / self.simulated_seconds if self.simulated_seconds else None

    def draft_us(self, q: float) -> float:
        return float(np.quantile(self.draft_seconds, q) * 1e6) if self.draft_seconds else 0.0

    def add(self, stats, draft_seconds: list, cost: CostModel | None) -> None:
        """One request: its `SpeculateStats` (on the simulated clock when `cost` is given)."""
        self.requests += 1
        self.new_tokens += stats.new_tokens
        self.steps += stats.steps
        add_histogram(self.accepted_hist, stats.accepted_hist)
        for size, count in stats.budget_hist.items():
            self.budget_hist[size] = self.budget_hist.get(size, 0) + count
        self.draft_seconds.extend(draft_seconds)
        if cost is not None:
            self.simulated_seconds += stats.time_total
            self.plain_seconds += stats.new_tokens * cost.seconds(1)


class ReplayReport(dict):
    """dataset -> ReplaySummary, in the order datasets first appear; also what the replay ran with:
    `drafter` (the one that served the last trace), `budget` (the policy) and `cost` (or None)."""

    def __init__(self, cost: CostModel | None):
        super().__init__()
        self.cost = cost
        self.drafter = None
        self.budget = None


def replay(traces, drafter=None, *, budget=None, cost="hf-cpu", eos_token_id=None,
           reset_per_request: bool = False, vocab_size: int | None = None) -> ReplayReport:
    """Replay `traces` in order through one TraceVerifier; a summary per dataset.

    drafter: None (the library's default: the verifier's session drafter, kept across traces), a
        name from drafter_names() or a Drafter object (kept across traces), or a callable returning a
        new Drafter. A replay knows the model's token only at nodes on the recorded output, so a
        Jacobi window learns only where its guesses match the recording (-1 elsewhere): replay
        measures the Jacobi pool pessimistically; a real model is needed for it.
    budget: None or "auto" (the library's default: the session's CostAwareBudget), an int, a
        budget policy (kept across traces), or "oracle": each step the prefix of the proposal with
        the most tokens per second by the recorded output (tools.oracle_budget; needs `cost`), or
        "oracle-skip" / "oracle-extend": the auto budget told one thing the recording knows
        (tools.oracle_budget.AssistedBudget).
    cost: a built-in cost table's name, a table "nodes:ms,...", a CostModel, or None (the loop then
        runs on the real clock, the auto budget learns this replay's own timings, and no speedup is
        reported).
    reset_per_request: a new drafter for every trace (needs drafter None or a callable).
    vocab_size: the verifier's vocabulary; default the traces' largest token id + 1.
    """
    traces = list(traces)
    if not traces:
        raise InputError("traces: expected at least one Trace, got none")
    cost_model = None if cost is None else CostModel.named(cost)
    clock = None if cost_model is None else SimulatedClock(cost_model)
    verifier = TraceVerifier.for_traces(traces, vocab_size=vocab_size, clock=clock)
    session = Session.of(verifier)
    make_drafter = _drafter_factory(drafter, session, reset_per_request)
    if isinstance(budget, str) and budget == "oracle":
        if cost_model is None:
            raise ConfigError("budget: 'oracle' weighs tokens against the cost table's seconds; expected a cost, "
                              "got cost=None")
        policy = OracleBudget(verifier, cost_model)
    elif isinstance(budget, str) and budget in ASSISTS:
        policy = AssistedBudget(verifier, budget)
    else:
        policy = None if budget is None or budget == "auto" else as_budget_policy(budget)
    report = ReplayReport(cost_model)
    inner = make_drafter()
    try:
        for i, trace in enumerate(traces):
            if reset_per_request and i:
                inner = make_drafter()
            timed = _TimedDrafter(inner)
            result = _replay_one(verifier, trace, timed, drafter is None, policy, eos_token_id, clock)
            report.setdefault(trace.dataset, ReplaySummary()).add(result.stats, timed.step_seconds, cost_model)
    finally:
        if drafter is None:
            session.drafter = inner  # the session's own drafter again, not the timer around it
    report.drafter = inner
    report.budget = session.budget if policy is None else policy
    return report


def _drafter_factory(drafter, session: Session, reset_per_request: bool):
    """() -> the drafter for the next trace (called once, or per trace with reset_per_request)."""
    if drafter is None:
        if reset_per_request:
            return lambda: default_drafter(session.verifier)
        return lambda: session.drafter
    if isinstance(drafter, str):
        from ..drafters import make_drafter
        make_drafter(drafter, session.verifier.vocab_size)  # refuse an unknown name now
        if reset_per_request:
            return lambda: make_drafter(drafter, session.verifier.vocab_size)
        named = make_drafter(drafter, session.verifier.vocab_size)
        return lambda: named
    if not isinstance(drafter, type) and callable(getattr(drafter, "start", None)):
        if reset_per_request:
            raise ConfigError("drafter: reset_per_request needs a new drafter per trace; pass a callable "
                              "returning one (e.g. lambda: TrieDrafter(...)) or None, not a Drafter object")
        return lambda: drafter
    if not callable(drafter):
        raise ConfigError(f"drafter: expected None, a Drafter or a callable returning one, got {drafter!r}")
    return drafter


def _replay_one(verifier, trace, timed, bare_call: bool, policy, eos_token_id, clock):
    """One trace through `speculate`: the bare call (the session's drafter, here wrapped in a timer)
    when no drafter was given, else with the given drafter; checked against the recording."""
    verifier.load(trace)
    options = dict(max_new_tokens=trace.output_ids.shape[0], eos_token_id=eos_token_id, clock=clock)
    if policy is not None:
        options["budget"] = policy
    if bare_call:
        Session.of(verifier).drafter = timed
    else:
        options["drafter"] = timed
    result = speculate(verifier, trace.prompt_ids, **options)
    n = result.tokens.shape[0]
    if not np.array_equal(result.tokens, trace.output_ids[:n]):
        first = int(np.flatnonzero(result.tokens != trace.output_ids[:n])[0])
        raise BackendError(f"replay: {trace.dataset}/{trace.idx} diverged from its recorded output at "
                           f"token {first}: speculative decoding must reproduce greedy decoding exactly")
    return result
