"""The speculative decoding loop, greedy or sampled, streaming or not.

    prompt ──prefill──▶ first token t
    repeat:
      tree          = request.propose(context, budget)   root = t (accepted, not yet in the KV cache)
      tokens, logits = verifier.verify(tree, n_logits)   one forward over every node, tree-masked
      path, next    = rule.accept(tree, tokens, logits)  longest agreed root-to-candidate path + one model token
      verifier.commit(path)                              the path's KV is kept, every other node's dropped
      request.observe(tree, tokens, path)                optional: the model's token at EVERY node
      emit path[1:] tokens + next; request.update(them); t = next
      policy.observe_outcomes(...)                       optional: once the emitted tokens tell, what
                                                         every proposed candidate would have done
    until eos / stop sequence / max_new_tokens

(`request` is what `drafter.start(prompt)` returned: the request's own drafting state; a drafter
whose start returns None serves the request itself.)

One loop for every acceptance rule (`draftcore.sampling`): greedy asks the verifier for no logits (it
returns every node's argmax, computed where the logits live); sampling, and greedy with penalties,
asks for the candidates' logits, processes each row for its own prefix and accepts exactly.
"""
from __future__ import annotations

import math
import time
import weakref
from typing import Iterator, Sequence

import numpy as np

from .budget import as_budget_policy
from .checks import VerifierLimits, check_node_results, check_tree
from .claims import BUDGET_ADVICE, DRAFTER_ADVICE, VERIFIER_ADVICE, Claim, serves_many
from .errors import BackendError, ConfigError, InputError, describe
from .outcomes import ProposalOutcomes
from .result import SpeculateResult, SpeculateStats
from .sampling import SamplingParams, as_sampling_params, make_rule
from .session import Session
from .text import IncrementalText
from .tree import DraftTree
from .validate import positive_int, token_array

_REQUEST_METHODS = ("propose", "update", "finish")
_FIRST_CONTEXT = 1024  # context buffer tokens after the prompt; it doubles as tokens arrive
_TEXT_CONTEXT = 4      # prompt tokens decoded before the first generated one (its leading space)


def speculate(verifier, prompt, *, max_new_tokens: int = 128, drafter=None, budget=None, eos_token_id=None,
              stop_sequences: Sequence[Sequence[int]] | None = (), sampling: SamplingParams | dict | None = None,
              clock=None) -> SpeculateResult:
    """Generate up to `max_new_tokens` tokens after `prompt`, exactly as plain decoding with
    `verifier` would: token for token when greedy, with the same distribution over sequences when
    sampling.

    prompt: int32 token ids, or a string when the verifier has `encode`.
    drafter: a Drafter; a name from `draftcore.DRAFTER_NAMES` ("trie", "ngram", "jacobi",
        "composite", ...: the verifier's session keeps one drafter per name, learning across calls);
        default: the verifier's session drafter (`Session.of(verifier).drafter`, which keeps
        learning from every request to this verifier).
    budget: drafted candidates verified per step: None or "auto" (default: the verifier's session
        budget, a `CostAwareBudget` that picks the tree size with the best expected tokens per second
        from measured step costs and acceptance, and keeps learning across calls), an int (fixed), or
        a budget policy object.
    eos_token_id: an id or a collection of ids that end generation (kept in the output).
    stop_sequences: token-id sequences that end generation once generated (kept in the output).
    sampling: None (greedy, the default), a `SamplingParams`, or a dict of its fields with
        transformers' names: temperature, top_k, top_p, min_p, repetition_penalty,
        presence_penalty, frequency_penalty, do_sample, seed. `result.seed` replays the run.
    clock: () -> seconds, what step times are measured with (default time.perf_counter); a
        synthetic clock makes the auto budget's choices reproducible (tests, trace replay).
    """
    stream = speculate_stream(verifier, prompt, max_new_tokens=max_new_tokens, drafter=drafter, budget=budget,
                              eos_token_id=eos_token_id, stop_sequences=stop_sequences, sampling=sampling,
                              clock=clock)
    with stream:
        for _ in stream:
            pass
    return stream.result


class SpeculationStream:
    """Iterates over int32 arrays of newly accepted tokens; `.result` is set once exhausted.

    Lifetime. A stream holds its request from creation: the verifier (and a drafter or budget
    policy that serves one request at a time) is claimed until the stream is exhausted, raises,
    is closed, or is garbage-collected; while it is held, another request on the same verifier
    raises `BusyError`. A server should close streams it abandons (a client that disconnects) —
    `with draftcore.speculate_stream(...) as stream:` does it on exit — rather than wait for the
    garbage collector. Closing or collecting a stream ends that stream's request only: a drafter
    shared with other requests keeps serving them."""

    def __init__(self, generator: Iterator[np.ndarray], lifetime: "_Lifetime", decode=None, prompt=None):
        self._generator = generator
        self._lifetime = lifetime
        self._decode, self._prompt = decode, prompt
        self.result: SpeculateResult | None = None
        # Collected unfinished: release the claims; the request's own finalizer (a TrieRequest's)
        # has the drafter end it at its next call, in whatever thread makes it.
        self._finalizer = weakref.finalize(self, lifetime.abandon)

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        try:
            return next(self._generator)
        except StopIteration as stop:
            if stop.value is not None:  # a second iteration finds the generator exhausted: keep the result
                self.result = stop.value
            self._end()
            raise StopIteration from None
        except BaseException:
            self._end()
            raise

    def text(self) -> Iterator[str]:
        """Iterate over the generated text instead of token arrays: pieces that never split a
        character (draftcore.text.IncrementalText over the verifier's `decode`). Consumes the stream;
        `.result` is set at the end as usual."""
        if self._decode is None:
            raise ConfigError("text: the verifier has no decode(); build it with a tokenizer, or iterate over "
                              "token ids")
        pieces = IncrementalText(self._decode, self._prompt[-_TEXT_CONTEXT:])
        for tokens in self:
            piece = pieces.push(tokens)
            if piece:
                yield piece
        rest = pieces.flush()
        if rest:
            yield rest

    def close(self) -> None:
        """End the request now (finished or not): its drafter state and claims are released."""
        self._generator.close()
        self._end()

    def __enter__(self) -> "SpeculationStream":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _end(self) -> None:
        self._finalizer.detach()
        self._lifetime.end()


class _Lifetime:
    """What a stream holds: its claims, then (once decoding starts) its drafter request."""

    def __init__(self, claims: list):
        self.claims = claims
        self.request = None
        self.request_is_drafter = False

    def start(self, drafter, prompt):
        """drafter.start(prompt): the request's own handle, or the drafter itself when it returns None."""
        request = drafter.start(prompt)
        if request is None:
            request, self.request_is_drafter = drafter, True
        self.request = request
        missing = [m for m in _REQUEST_METHODS if not callable(getattr(request, m, None))]
        if missing:
            raise ConfigError(f"drafter: {describe(drafter)}.start(prompt) returned {describe(request)}, which lacks "
                              f"{missing}; expected None or a request with propose(context, budget), "
                              f"update(tokens) and finish()")
        return request

    def end(self) -> None:
        """The request ended (normally, by an error, or closed): finish it, then release the claims."""
        request, self.request = self.request, None
        try:
            if request is not None and callable(getattr(request, "finish", None)):
                request.finish()
        finally:
            self._release()

    def abandon(self) -> None:
        """The stream was collected unfinished. A request of its own is dropped (a TrieRequest's
        finalizer has the drafter end it); a drafter serving the request itself is finished here."""
        request, self.request = self.request, None
        try:
            if request is not None and self.request_is_drafter:
                request.finish()
        finally:
            self._release()

    def _release(self) -> None:
        for claim in self.claims:
            claim.release()


def speculate_stream(verifier, prompt, *, max_new_tokens: int = 128, drafter=None, budget=None,
                     eos_token_id=None, stop_sequences: Sequence[Sequence[int]] | None = (),
                     sampling: SamplingParams | dict | None = None, clock=None) -> SpeculationStream:
    """Streaming twin of `speculate`: iterate to receive tokens as they are accepted.

    Every argument is validated here, before any verifier or drafter state changes; then the
    verifier is claimed for this request (see `SpeculationStream` for the lifetime).
    """
    was_text = isinstance(prompt, str)
    if was_text:
        if not callable(getattr(verifier, "encode", None)):
            raise InputError(f"prompt: got text, but {type(verifier).__name__} has no encode(); pass int32 token ids")
        prompt = verifier.encode(prompt)
    limits = VerifierLimits.of(verifier)
    prompt = token_array("prompt", prompt, vocab_size=limits.vocab_size)
    if prompt.shape[0] >= limits.max_context:
        raise InputError(f"prompt: {prompt.shape[0]} tokens; expected fewer than the verifier's max_context "
                         f"{limits.max_context} (the prompt and at least one new token must fit)")
    max_new_tokens = positive_int("max_new_tokens", max_new_tokens)
    if prompt.shape[0] + max_new_tokens > limits.max_context:
        raise InputError(
            f"max_new_tokens: prompt ({prompt.shape[0]} tokens) + max_new_tokens ({max_new_tokens}) = "
            f"{prompt.shape[0] + max_new_tokens} exceeds the verifier's max_context {limits.max_context}; "
            f"expected at most {limits.max_context - prompt.shape[0]}")
    stops = _Stops(eos_token_id, stop_sequences, limits.vocab_size)
    rule = make_rule(as_sampling_params(sampling), limits.vocab_size)
    if clock is None:
        clock = time.perf_counter
    elif not callable(clock):
        raise ConfigError(f"clock: expected a callable returning seconds, got {describe(clock)}")
    else:
        clock = _checked_clock(clock)
    if drafter is None or isinstance(drafter, str) or budget is None or (isinstance(budget, str) and budget == "auto"):
        drafter, policy = Session.of(verifier).resolve(drafter, budget)
    else:
        policy = as_budget_policy(budget)
    if isinstance(drafter, type):
        raise ConfigError(f"drafter: expected a drafter object, got the class {drafter.__name__}; pass an instance "
                          f"({drafter.__name__}(...)) or a name")
    shared = serves_many(drafter)
    needed = ("start",) if shared else ("start",) + _REQUEST_METHODS
    missing = [m for m in needed if not callable(getattr(drafter, m, None))]
    if missing:
        raise ConfigError(f"drafter: {describe(drafter)} lacks the Drafter method(s) {missing}; expected "
                          f"start(prompt) returning a request (propose(context, budget), update(tokens), "
                          f"finish()), or None with those methods on the drafter itself")
    claims = []
    try:
        claims.append(Claim(verifier, "verifier", VERIFIER_ADVICE))
        if not shared:
            claims.append(Claim(drafter, "drafter", DRAFTER_ADVICE))
        if not serves_many(policy):
            claims.append(Claim(policy, "budget", BUDGET_ADVICE))
    except BaseException:
        for claim in claims:
            claim.release()
        raise
    lifetime = _Lifetime(claims)
    generator = _decode(verifier, prompt, max_new_tokens, limits, drafter, policy, rule, stops, clock, was_text,
                        lifetime)
    decode = getattr(verifier, "decode", None)
    return SpeculationStream(generator, lifetime, decode if callable(decode) else None, prompt)


def _decode(verifier, prompt, max_new_tokens, limits, drafter, policy, rule, stops, clock, was_text, lifetime):
    """The loop; the stream that drives it finishes the drafter request and releases the claims."""
    stats = SpeculateStats()
    n_prompt = prompt.shape[0]
    # prompt + generated; grows as tokens arrive (max_new_tokens may be far more than is generated)
    context = np.empty(n_prompt + min(max_new_tokens, _FIRST_CONTEXT), np.int32)
    context[:n_prompt] = prompt
    n_context = n_prompt
    vocab_size = limits.vocab_size
    t_start = clock()
    request = lifetime.start(drafter, prompt)
    # draftcore's own drafters are trusted to return well-formed trees; anything else is checked.
    trusted = getattr(request, "returns_valid_trees", False) is True
    # A request that can leave its lookahead window out is told when the policy wants none.
    lookahead_optional = getattr(request, "lookahead_optional", False) is True
    observe = getattr(request, "observe", None)
    # A policy that learns from what its proposals would have done is told, a few tokens later.
    report_outcomes = getattr(policy, "observe_outcomes", None)
    outcomes = ProposalOutcomes(report_outcomes) if callable(report_outcomes) else None
    rule.start(prompt)
    tokens, logits = check_node_results(verifier.prefill(prompt, rule.prefill_logits), 1, rule.prefill_logits,
                                        vocab_size, "verifier.prefill")
    emitted = np.array([rule.first(tokens, logits)], np.int32)
    stats.time_prefill = clock() - t_start
    stats.steps = 1
    while True:
        emitted, stop_reason = stops.cut(emitted, context, n_context, n_prompt, max_new_tokens)
        if n_context + emitted.shape[0] > context.shape[0]:
            context = _grown(context, n_context, n_context + emitted.shape[0])
        context[n_context:n_context + emitted.shape[0]] = emitted
        n_context += emitted.shape[0]
        stats.new_tokens = n_context - n_prompt
        if stop_reason is not None:
            # The drafter sees the output whole (the trie counts its last tokens, its calibration
            # the last draft's hits), before the last yield: a caller may stop there.
            request.update(emitted)
            if outcomes is not None:
                outcomes.settle(context, n_context, final=True)
            yield emitted
            break
        yield emitted
        rule.update(emitted)
        t0 = clock()
        request.update(emitted)
        if outcomes is not None:
            outcomes.settle(context, n_context)
        tree, proposal = _draft(request, policy, context[:n_context], limits, verifier.n_past,
                                max_new_tokens - stats.new_tokens, trusted, lookahead_optional)
        if outcomes is not None:
            outcomes.add(proposal, tree.n_draft, n_context)
        t1 = clock()
        n_logits = rule.n_logits(tree)
        tokens, logits = check_node_results(verifier.verify(tree, n_logits), len(tree), n_logits, vocab_size,
                                            "verifier.verify")
        t2 = clock()
        path, next_token = rule.accept(tree, tokens, logits)
        verifier.commit(path)
        t3 = clock()
        if observe is not None:
            observe(tree, tokens, path)
        t4 = clock()
        # The whole step is the price of this tree size, not the verify alone: drafting, and a
        # commit that leaves the backend's preferred branch (llama.cpp re-decodes the path's
        # tail) grow with the tree, and a fixed per-step host cost weighs more on a fast GPU.
        policy.observe(tree, path, t4 - t0)
        n_accepted = path.shape[0] - 1
        stats.record_step(tree, n_accepted, (t1 - t0) + (t4 - t3), t2 - t1, t3 - t2)
        emitted = np.empty(n_accepted + 1, np.int32)
        emitted[:n_accepted] = tree.tokens[path[1:]]
        emitted[n_accepted] = next_token
    stats.time_total = clock() - t_start
    tokens = context[n_prompt:n_context].copy()
    text = verifier.decode(tokens) if was_text and callable(getattr(verifier, "decode", None)) else None
    return SpeculateResult(tokens=tokens, stop_reason=stop_reason, stats=stats, text=text, seed=rule.seed)


def _grown(context: np.ndarray, n_context: int, needed: int) -> np.ndarray:
    grown = np.empty(max(2 * context.shape[0], needed), np.int32)
    grown[:n_context] = context[:n_context]
    return grown


def _draft(request, policy, context, limits, n_past, tokens_wanted, trusted, lookahead_optional=False):
    """(the tree to verify this step, the drafter's whole proposal): the proposal's candidates cut to
    the policy's choice and to what one verify holds (nodes, cache cells, leaves); a lookahead window
    that does not fit is dropped whole, never cut. A request that can leave its window out
    (`lookahead_optional`) is asked for none when the policy wants none this step."""
    root = int(context[-1])
    cells = min(limits.max_context - n_past, limits.max_tree_nodes)   # nodes one verify may hold
    room = min(tokens_wanted - 1, cells - 1)                          # candidates worth drafting
    size = min(policy.request_size(), room)
    if size <= 0:
        tree = DraftTree.root_only(root)
        return tree, tree
    if lookahead_optional and not _wants_lookahead(policy):
        tree = request.propose(context, size, lookahead=False)
    else:
        tree = request.propose(context, size)
    if not trusted:
        _check_proposal(tree, root, size, limits.vocab_size)
    if tree.n_lookahead and 1 + tree.n_lookahead > cells:
        tree = tree.without_lookahead()
    keep = min(policy.choose(tree), room, cells - 1 - tree.n_lookahead)
    # Leaves are counted only for a window the policy keeps: where verify is not free (a CPU) the
    # window is dropped nearly every step, and counting cost a llama.cpp step ~1 % for nothing.
    if tree.n_lookahead and (not _keeps_lookahead(policy, tree, keep) or (
            limits.max_tree_leaves is not None and _leaf_counts(tree)[1] > limits.max_tree_leaves)):
        tree = tree.without_lookahead()
        keep = min(policy.choose(tree), room, cells - 1)
    # Each candidate or window node adds at most one leaf (a root-only tree is one leaf): count
    # leaves only when the tree could hold more than the verifier takes.
    if limits.max_tree_leaves is not None and max(keep + tree.n_lookahead, 1) > limits.max_tree_leaves:
        keep = min(keep, _most_candidates_within_leaves(tree, keep, limits.max_tree_leaves))
    return tree.with_candidates(keep), tree


def _wants_lookahead(policy) -> bool:
    decide = getattr(policy, "wants_lookahead", None)
    return True if decide is None else bool(decide())


def _keeps_lookahead(policy, tree: DraftTree, keep: int) -> bool:
    decide = getattr(policy, "keep_lookahead", None)
    return True if decide is None else bool(decide(tree, keep))


def _leaf_counts(tree: DraftTree) -> np.ndarray:
    """counts[m]: leaves of the root + first m - 1 candidates + the whole window, m = 1 .. n_candidates
    (index 0 unused). Adding candidate m makes it a leaf and its parent no longer one when m is the
    parent's first child."""
    m_all = tree.n_candidates
    parents = tree.parents[:m_all]
    first_child = np.full(m_all, m_all, np.int64)
    children = np.arange(m_all - 1, 0, -1)
    first_child[parents[children]] = children  # reverse order: the lowest index is written last
    added = np.ones(m_all, np.int64)
    added[1:] -= first_child[parents[1:]] == np.arange(1, m_all)
    counts = np.zeros(m_all + 1, np.int64)
    counts[1:] = np.cumsum(added)
    if tree.n_lookahead:
        window = tree.parents[m_all:]
        has_child = np.zeros(tree.n_lookahead, bool)
        inner = window[window >= m_all] - m_all
        has_child[inner] = True
        counts[1] -= 1                         # the root has the window below it: not a leaf
        counts[1:] += int((~has_child).sum())
    return counts


def _most_candidates_within_leaves(tree: DraftTree, keep: int, max_leaves: int) -> int:
    counts = _leaf_counts(tree)[1:keep + 2]   # leaves with 0 .. keep candidates
    fits = np.flatnonzero(counts <= max_leaves)
    return int(fits[-1]) if fits.size else 0


def _check_proposal(tree, root, request, vocab_size) -> None:
    """Full check of a tree from a drafter that is not draftcore's own."""
    try:
        check_tree(tree, vocab_size)
    except InputError as exc:
        raise BackendError(f"drafter.propose: returned a malformed tree: {exc}") from None
    if tree.tokens[0] != root:
        raise BackendError(f"drafter.propose: tree root {int(tree.tokens[0])} is not the last context token {root}")
    if tree.n_draft > request:
        raise BackendError(f"drafter.propose: returned {tree.n_draft} drafted candidates, more than the budget {request}")


class _Stops:
    """When generation ends: an EOS id, a completed stop sequence, or max_new_tokens."""

    def __init__(self, eos_token_id, stop_sequences, vocab_size: int):
        if eos_token_id is None:
            eos = []
        elif isinstance(eos_token_id, (int, np.integer)) and not isinstance(eos_token_id, bool):
            eos = [eos_token_id]
        else:
            try:
                eos = list(eos_token_id)
            except TypeError:
                raise InputError(f"eos_token_id: expected an int token id or a collection of them, "
                                 f"got {describe(eos_token_id)}") from None
        self.eos = token_array("eos_token_id", eos, vocab_size, allow_empty=True)
        if stop_sequences is None:
            stop_sequences = ()
        try:
            stop_sequences = list(stop_sequences)
        except TypeError:
            raise InputError(f"stop_sequences: expected a collection of token-id sequences, "
                             f"got {describe(stop_sequences)}") from None
        self.sequences = [token_array(f"stop_sequences[{i}]", s, vocab_size) for i, s in enumerate(stop_sequences)]

    def cut(self, emitted, context, n_context, n_prompt, max_new_tokens):
        """Cut `emitted` at the first EOS / completed stop sequence / token budget; say why it stopped."""
        n_generated = n_context - n_prompt
        for i in range(emitted.shape[0]):
            token = emitted[i]
            if self.eos.shape[0] and (self.eos == token).any():
                return emitted[:i + 1], "eos"
            for stop in self.sequences:
                n = stop.shape[0]
                end = n_context + i + 1  # candidate tail: context[..n_context] + emitted[..i]
                if end - n >= n_prompt and stop[-1] == token:
                    tail = np.concatenate([context[end - n:n_context], emitted[:i + 1]])[-n:]
                    if np.array_equal(tail, stop):
                        return emitted[:i + 1], "stop_sequence"
            if n_generated + i + 1 >= max_new_tokens:
                return emitted[:i + 1], "max_new_tokens"
        return emitted, None


def _checked_clock(clock):
    """A caller's clock, refused (ConfigError) when it returns anything but finite, non-decreasing
    seconds: the budget learns step costs from its differences, and a negative cost would steer it
    for the rest of the session."""
    last = -math.inf

    def checked() -> float:
        nonlocal last
        now = clock()
        if isinstance(now, bool) or not isinstance(now, (int, float, np.integer, np.floating)) \
                or not math.isfinite(now) or now < last:
            raise ConfigError(f"clock: expected a callable returning finite, non-decreasing seconds; it returned "
                              f"{now!r} after {last!r}")
        last = float(now)
        return last
    checked()   # one reading now, so that a clock of the wrong kind is refused before anything runs
    return checked
