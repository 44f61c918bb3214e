"""The speculative decoding loop, greedy or sampled, and the stream that runs it.

    prompt ──prefill──▶ first token t
    repeat:
      tree, proposal = drafting.draft(context, ...)       root = t (accepted, not yet in the KV cache)
      tokens, logits = verifier.verify(tree, n_logits)    one forward over every node, tree-masked
      path, next     = rule.accept(tree, tokens, logits)  longest agreed root-to-candidate path + one model token
      verifier.commit(path)                               the path's KV is kept, every other node's dropped
                                                          (a root-only greedy step: verifier.advance(t), both in one)
      drafting.observe(tree, tokens, path)                the model's token at EVERY node (if the request asks)
      policy.observe(tree, path, seconds)                 what the step cost, what was accepted
      emit path[1:] tokens + next; t = next
    until eos / stop sequence / max_new_tokens

One loop for every acceptance rule (`draftcore.sampling`): greedy asks the verifier for no logits (it
returns every node's argmax, computed where the logits live); sampling, and greedy with penalties,
asks for the candidates' logits, processes each row for its own prefix and accepts exactly.
`open_stream(call)` is the one way in: `draftcore.speculate` and `Session.speculate` both build the
`Call` (draftcore.call: the settings, the resolved drafter and budget policy, what each part can
do) and hand it over; the loop asks that call and calls nothing back.
"""
from __future__ import annotations

import weakref
from typing import Iterator

import numpy as np

from .call import Call
from .capabilities import RequestCapabilities
from .claims import BUDGET_ADVICE, DRAFTER_ADVICE, VERIFIER_ADVICE, Claim
from .drafting import StepDrafting
from .errors import ConfigError, describe
from .outcomes import ProposalOutcomes
from .result import SpeculateResult, SpeculateStats
from .text import IncrementalText
from .verifying import StepVerifier

_FIRST_CONTEXT = 1024  # context buffer tokens after the prompt; it doubles as tokens arrive
_TEXT_CONTEXT = 4      # prompt tokens decoded before the first generated one (its leading space)


def open_stream(call: Call) -> "SpeculationStream":
    """Claim what serves one request at a time (a drafter or budget policy that does not declare
    concurrent_requests, and always the verifier): a refused claim releases the others. Returns the
    stream to iterate; decoding starts at its first item."""
    capabilities = call.capabilities
    claims = []
    try:
        claims.append(Claim(call.verifier, "verifier", VERIFIER_ADVICE))
        if not capabilities.drafter.serves_many:
            claims.append(Claim(call.drafter, "drafter", DRAFTER_ADVICE))
        if not capabilities.policy.serves_many:
            claims.append(Claim(call.policy, "budget", BUDGET_ADVICE))
    except BaseException:
        for claim in claims:
            claim.release()
        raise
    lifetime = _Lifetime(claims)
    return SpeculationStream(_decode(call, lifetime), lifetime, capabilities.verifier.decode, call.prompt)


def _decode(call: Call, lifetime):
    """The loop; the stream that drives it finishes the drafter request and releases the claims."""
    stats, timer, context = SpeculateStats(), StepTimer(call.clock), _Context(call.prompt, call.max_new_tokens)
    rule, stops, limits, policy = call.rule, call.stops, call.limits, call.policy
    request, request_caps = lifetime.start(call.drafter, call.capabilities.drafter, call.prompt)
    drafting = StepDrafting(request, policy, limits, request_caps, call.capabilities.policy)
    outcomes = ProposalOutcomes.of(call.capabilities.policy.observe_outcomes)
    rule.start(call.prompt)
    step = StepVerifier.of(call.verifier, call.capabilities.verifier, limits.vocab_size)
    tokens, logits = step.prefill(call.prompt, rule.prefill_logits)
    emitted = np.array([rule.first(tokens, logits)], np.int32)
    stats.time_prefill, stats.steps = timer.since_start(), 1
    while True:
        emitted, stop_reason = stops.cut(emitted, context.tokens, context.n, context.n_prompt, call.max_new_tokens)
        context.append(emitted)
        stats.new_tokens = context.n_new
        if stop_reason is not None:
            # The drafter sees the output whole (the trie counts its last tokens, its calibration
            # the last draft's hits), before the last yield: a caller may stop there.
            drafting.update(emitted)
            outcomes.settle(context.tokens, context.n, final=True)
            yield emitted
            break
        yield emitted
        rule.update(emitted)
        timer.start()
        drafting.update(emitted)
        outcomes.settle(context.tokens, context.n)
        tree, proposal = drafting.draft(context.view(), call.verifier.n_past, call.max_new_tokens - context.n_new)
        outcomes.add(proposal, tree.n_draft, context.n)
        timer.lap("drafting")
        tokens, logits = step.verify(tree, rule.n_logits(tree))   # the verifier's advance, where it fits
        timer.lap("verifying")
        path, next_token = rule.accept(tree, tokens, logits)
        step.commit(path)
        timer.lap("accepting")
        drafting.observe(tree, tokens, path)
        timer.lap("drafting")
        # The whole step is the price of this tree size, not the verify alone: drafting, and a
        # commit that leaves the backend's preferred branch (llama.cpp re-decodes the path's
        # tail) grow with the tree, and a fixed per-step host cost weighs more on a fast GPU.
        policy.observe(tree, path, timer.step_seconds())
        stats.record_step(tree, path.shape[0] - 1, timer.laps["drafting"], timer.laps["verifying"],
                          timer.laps["accepting"])
        emitted = np.empty(path.shape[0], np.int32)   # the accepted candidates, then the model's next token
        emitted[:-1] = tree.tokens[path[1:]]
        emitted[-1] = next_token
    stats.time_total = timer.since_start()
    tokens = context.tokens[context.n_prompt:context.n].copy()
    decode = call.capabilities.verifier.decode
    text = decode(tokens) if call.was_text and decode is not None else None
    return SpeculateResult(tokens=tokens, stop_reason=stop_reason, stats=stats, text=text, seed=rule.seed)


class StepTimer:
    """A step's time on the loop's clock, by phase: start(), then lap(phase) at the end of each
    phase (a phase may recur: its laps add up); step_seconds() is all of the step so far."""

    def __init__(self, clock):
        self.clock = clock
        self.begun = self.started = self.last = clock()
        self.laps = {"drafting": 0.0, "verifying": 0.0, "accepting": 0.0}

    def start(self) -> None:
        self.started = self.last = self.clock()
        for phase in self.laps:
            self.laps[phase] = 0.0

    def lap(self, phase: str) -> None:
        now = self.clock()
        self.laps[phase] += now - self.last
        self.last = now

    def step_seconds(self) -> float:
        return self.last - self.started

    def since_start(self) -> float:
        """Seconds since the timer was made (the call's start), read now."""
        return self.clock() - self.begun


class _Context:
    """prompt + generated, in a buffer that grows as tokens arrive (max_new_tokens may be far more
    than is generated)."""

    def __init__(self, prompt: np.ndarray, max_new_tokens: int):
        self.n_prompt = self.n = prompt.shape[0]
        self.tokens = np.empty(self.n_prompt + min(max_new_tokens, _FIRST_CONTEXT), np.int32)
        self.tokens[:self.n] = prompt

    @property
    def n_new(self) -> int:
        return self.n - self.n_prompt

    def append(self, emitted: np.ndarray) -> None:
        if self.n + emitted.shape[0] > self.tokens.shape[0]:
            self.tokens = _grown(self.tokens, self.n, self.n + emitted.shape[0])
        self.tokens[self.n:self.n + emitted.shape[0]] = emitted
        self.n += emitted.shape[0]

    def view(self) -> np.ndarray:
        return self.tokens[:self.n]


def _grown(context: np.ndarray, n_context: int, needed: int) -> np.ndarray:
    grown = np.empty(max(2 * context.shape[0], needed), np.int32)
    grown[:n_context] = context[:n_context]
    return grown


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
        `.result` is set at the end as usual.

        A verifier without `decode` is refused here, at the call, with a ConfigError, and the
        refusal closes the stream: a stream nobody can read must not hold its verifier (and drafter)
        until the garbage collector finds it."""
        if self._decode is None:
            self.close()
            raise ConfigError("text: the verifier has no decode(); build it with a tokenizer, or iterate over "
                              "token ids (this stream is closed)")
        return self._text()

    def _text(self) -> Iterator[str]:
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
        self.request = self.finish = None
        self.request_is_drafter = False

    def start(self, drafter, capabilities, prompt):
        """(request, its RequestCapabilities) from `capabilities.start(prompt)` (the drafter's start):
        the request's own handle, or the drafter itself when it returns None."""
        request = capabilities.start(prompt)
        if request is None:
            request, self.request_is_drafter = drafter, True
        self.request = request
        self.finish = (request_caps := RequestCapabilities.of(request)).finish
        if request_caps.missing:
            if self.request_is_drafter:
                raise ConfigError(f"drafter: {describe(drafter)}.start(prompt) returned None, but the drafter lacks "
                                  f"{request_caps.missing}; expected start(prompt) to return a request with "
                                  f"propose(context, budget), update(tokens) and finish(), or None from a drafter "
                                  f"that has those methods itself")
            raise ConfigError(f"drafter: {describe(drafter)}.start(prompt) returned {describe(request)}, which lacks "
                              f"{request_caps.missing}; expected None or a request with propose(context, budget), "
                              f"update(tokens) and finish()")
        return request, request_caps

    def end(self) -> None:
        """The request ended (normally, by an error, or closed): finish it, then release the claims."""
        request, self.request = self.request, None
        try:
            if request is not None and self.finish is not None:
                self.finish()
        finally:
            self._release()

    def abandon(self) -> None:
        """The stream was collected unfinished. A request of its own is dropped (a TrieRequest's
        finalizer has the drafter end it); a drafter serving the request itself is finished here."""
        request, self.request = self.request, None
        try:
            if request is not None and self.request_is_drafter and self.finish is not None:
                self.finish()
        finally:
            self._release()

    def _release(self) -> None:
        for claim in self.claims:
            claim.release()


