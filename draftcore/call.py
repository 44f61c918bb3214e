"""One call, built once: its options, validated before anything changes, with the drafter, the
budget policy and what each part can do, resolved once. The decode loop reads nothing else.

    options = Options.of({"max_new_tokens": 64, ...})   # the keyword arguments of every public call
    call = Call.of(verifier, prompt, options, resolve)   # resolve(drafter, budget) -> (drafter, policy)
    call.prompt, call.max_new_tokens, call.limits, call.stops, call.rule, call.clock, call.was_text
    call.verifier, call.drafter, call.policy, call.capabilities

`Options` is the one definition of those arguments and their defaults: `speculate`,
`speculate_stream` and the Session's calls take them as **options and show them as their signature
(`takes_options`). Every argument is checked here and refused with a DraftcoreError naming it: a
refused call leaves the verifier, the drafter and the session as they were.
"""
from __future__ import annotations

import difflib
import inspect
import math
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

import numpy as np

from .capabilities import Capabilities, PolicyCapabilities, VerifierCapabilities, check_drafter
from .checks import VerifierLimits
from .errors import ConfigError, InputError, describe
from .sampling import GreedyRule, ProcessedRule, SamplingParams, as_sampling_params, make_rule
from .validate import positive_int, token_array


@dataclass(frozen=True)
class Options:
    """The keyword arguments of `speculate`, `speculate_stream`, `Session.speculate` and
    `Session.stream`, with their defaults (see `draftcore.speculate` for each one's meaning)."""

    max_new_tokens: int = 128
    drafter: Any = None
    budget: Any = None
    eos_token_id: int | Sequence[int] | None = None
    stop_sequences: Sequence[Sequence[int]] | None = ()
    sampling: SamplingParams | dict | None = None
    clock: Callable[[], float] | None = None

    @staticmethod
    def of(given: dict) -> "Options":
        """`given` (a call's **options) as Options, or InputError naming an argument no call takes."""
        names = [f.name for f in fields(Options)]
        for name, value in given.items():
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise InputError(f"{name}: got {name}={describe(value)}, but speculate takes no argument {name!r}"
                                 f"{hint}; expected one of {', '.join(names)}")
        return Options(**given)


def takes_options(function):
    """`function(..., **options)` shown with `Options`' arguments as keyword-only parameters, so
    help(), editors and inspect.signature list them where they are defined once."""
    signature = inspect.signature(function)
    parameters = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    parameters += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
                   for f in fields(Options)]
    function.__signature__ = signature.replace(parameters=parameters)
    return function


@dataclass(frozen=True)
class Call:
    """A call's validated settings and resolved parts."""

    prompt: np.ndarray          # int32[T], T < limits.max_context
    max_new_tokens: int         # prompt + max_new_tokens <= limits.max_context
    limits: VerifierLimits      # what one verify may hold
    stops: "Stops"
    rule: GreedyRule | ProcessedRule   # how each token is picked (draftcore.sampling)
    clock: Callable[[], float]  # seconds, non-decreasing
    was_text: bool              # the prompt was text: the result carries text too
    verifier: Any
    drafter: Any                # a Drafter, checked (draftcore.capabilities.check_drafter)
    policy: Any                 # a BudgetPolicy
    capabilities: Capabilities  # what the verifier, the drafter and the policy can do

    @staticmethod
    def of(verifier, prompt, options: Options, resolve) -> "Call":
        """The call's settings, checked; then `resolve(options.drafter, options.budget) -> (drafter,
        policy)` (the session's, which may build a named drafter: only once the settings passed)."""
        verifier_caps = VerifierCapabilities.of(verifier)
        was_text = isinstance(prompt, str)
        if was_text:
            if verifier_caps.encode is None:
                raise InputError(f"prompt: got text, but {type(verifier).__name__} has no encode(); "
                                 f"pass int32 token ids")
            prompt = verifier_caps.encode(prompt)
        limits = VerifierLimits.of(verifier_caps)
        prompt = token_array("prompt", prompt, vocab_size=limits.vocab_size)
        if prompt.shape[0] >= limits.max_context:
            raise InputError(f"prompt: {prompt.shape[0]} tokens; expected fewer than the verifier's max_context "
                             f"{limits.max_context} (the prompt and at least one new token must fit)")
        max_new_tokens = positive_int("max_new_tokens", options.max_new_tokens)
        if prompt.shape[0] + max_new_tokens > limits.max_context:
            raise InputError(
                f"max_new_tokens: prompt ({prompt.shape[0]} tokens) + max_new_tokens ({max_new_tokens}) = "
                f"{prompt.shape[0] + max_new_tokens} exceeds the verifier's max_context {limits.max_context}; "
                f"expected at most {limits.max_context - prompt.shape[0]}")
        stops = Stops(options.eos_token_id, options.stop_sequences, limits.vocab_size)
        rule = make_rule(as_sampling_params(options.sampling), limits.vocab_size)
        clock = _clock(options.clock)
        drafter, policy = resolve(options.drafter, options.budget)
        capabilities = Capabilities(verifier_caps, check_drafter(drafter), PolicyCapabilities.of(policy))
        return Call(prompt, max_new_tokens, limits, stops, rule, clock, was_text, verifier, drafter, policy,
                    capabilities)


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
