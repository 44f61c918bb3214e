"""One call's settings, validated before anything changes: what the decode loop reads besides the
verifier, the drafter and the budget policy.

    call = Call.of(verifier, prompt, max_new_tokens=128, eos_token_id=2, sampling=None, ...)
    call.prompt, call.max_new_tokens, call.limits, call.stops, call.rule, call.clock, call.was_text

Every argument is checked here and refused with a DraftcoreError naming it: a refused call leaves
the verifier, the drafter and the session as they were.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .checks import VerifierLimits
from .errors import ConfigError, InputError, describe
from .sampling import GreedyRule, ProcessedRule, as_sampling_params, make_rule
from .validate import positive_int, token_array


@dataclass(frozen=True)
class Call:
    """A call's validated settings (see `draftcore.speculate` for each argument's meaning)."""

    prompt: np.ndarray          # int32[T], T < limits.max_context
    max_new_tokens: int         # prompt + max_new_tokens <= limits.max_context
    limits: VerifierLimits      # what one verify may hold
    stops: "Stops"
    rule: GreedyRule | ProcessedRule   # how each token is picked (draftcore.sampling)
    clock: Callable[[], float]  # seconds, non-decreasing
    was_text: bool              # the prompt was text: the result carries text too

    @staticmethod
    def of(verifier, prompt, *, max_new_tokens, eos_token_id, stop_sequences, sampling, clock) -> "Call":
        was_text = isinstance(prompt, str)
        if was_text:
            if not callable(getattr(verifier, "encode", None)):
                raise InputError(f"prompt: got text, but {type(verifier).__name__} has no encode(); "
                                 f"pass int32 token ids")
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
        stops = Stops(eos_token_id, stop_sequences, limits.vocab_size)
        rule = make_rule(as_sampling_params(sampling), limits.vocab_size)
        return Call(prompt, max_new_tokens, limits, stops, rule, _clock(clock), was_text)


class Stops:
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
        # a set of ints: one lookup per emitted token, where a numpy comparison cost a few µs
        self.eos = frozenset(token_array("eos_token_id", eos, vocab_size, allow_empty=True).tolist())
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
        for i, token in enumerate(emitted.tolist()):
            if token in self.eos:
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


def _clock(clock):
    """time.perf_counter, or a caller's clock refused (ConfigError) when it returns anything but
    finite, non-decreasing seconds: the budget learns step costs from its differences, and a negative
    cost would steer it for the rest of the session."""
    if clock is None:
        return time.perf_counter
    if not callable(clock):
        raise ConfigError(f"clock: expected a callable returning seconds, got {describe(clock)}")
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
