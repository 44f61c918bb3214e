"""What a call's verifier, drafter, drafter requests and budget policy can do beyond the required
protocol, read once into frozen objects: the only place draftcore reads a protocol member by name.

    caps = Capabilities.of(verifier, drafter, policy)        # at the start of a call
    caps.verifier.advance, caps.verifier.decode, caps.drafter.serves_many, caps.policy.keep_lookahead
    request_caps = RequestCapabilities.of(request)           # when a request starts

The loop, the session and the drafters then ask these objects: a member is a callable or None, a flag
a bool, so a step calls plain methods and never probes an object (protocols.py lists every member).
Reading changes nothing and refuses nothing: the checks that refuse a bad value (`VerifierLimits`,
`check_drafter`, the request check in the loop) read what is here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import ConfigError, describe

# Every optional member of the protocols, as protocols.py lists them (a test keeps the two equal).
OPTIONAL_MEMBERS = ("max_tree_nodes", "max_tree_leaves", "encode", "decode", "advance",
                    "observe", "observe_checked", "returns_valid_trees", "lookahead_optional",
                    "scores_estimate_acceptance", "concurrent_requests",
                    "at_context", "keep_lookahead", "wants_lookahead", "observe_outcomes")
REQUEST_METHODS = ("propose", "update", "finish")


def _method(obj, name: str) -> Callable | None:
    member = getattr(obj, name, None)
    return member if callable(member) else None


def _flag(obj, name: str) -> bool:
    return getattr(obj, name, False) is True   # only True itself: a truthy stand-in is no declaration


def serves_many(obj) -> bool:
    """True if `obj` declares that concurrent requests may share it (`concurrent_requests = True`)."""
    return _flag(obj, "concurrent_requests")


@dataclass(frozen=True)
class VerifierCapabilities:
    """A verifier's attributes as found (validated by `draftcore.checks.VerifierLimits`) and its
    optional methods, None where it has none."""

    vocab_size: object
    max_context: object
    max_tree_nodes: object
    max_tree_leaves: object
    encode: Callable | None
    decode: Callable | None
    advance: Callable | None

    @staticmethod
    def of(verifier) -> "VerifierCapabilities":
        return VerifierCapabilities(getattr(verifier, "vocab_size", None), getattr(verifier, "max_context", None),
                                    getattr(verifier, "max_tree_nodes", None),
                                    getattr(verifier, "max_tree_leaves", None), _method(verifier, "encode"),
                                    _method(verifier, "decode"), _method(verifier, "advance"))


@dataclass(frozen=True)
class DrafterCapabilities:
    """start (None where missing), whether requests may share the drafter, and whether it can serve
    a request itself (propose, update, finish on the drafter: its `start` may return None)."""

    start: Callable | None
    serves_many: bool
    serves_itself: bool

    @staticmethod
    def of(drafter) -> "DrafterCapabilities":
        return DrafterCapabilities(_method(drafter, "start"), serves_many(drafter),
                                   all(_method(drafter, m) is not None for m in REQUEST_METHODS))


@dataclass(frozen=True)
class RequestCapabilities:
    """One DraftRequest's methods (None where missing) and declarations."""

    propose: Callable | None
    update: Callable | None
    finish: Callable | None
    observe: Callable | None
    observe_checked: Callable | None
    returns_valid_trees: bool
    lookahead_optional: bool
    scores_estimate_acceptance: bool

    @staticmethod
    def of(request) -> "RequestCapabilities":
        return RequestCapabilities(*(_method(request, m) for m in (*REQUEST_METHODS, "observe", "observe_checked")),
                                   *(_flag(request, f) for f in ("returns_valid_trees", "lookahead_optional",
                                                                 "scores_estimate_acceptance")))

    @property
    def missing(self) -> list[str]:
        """The required request methods it lacks."""
        return [m for m in REQUEST_METHODS if getattr(self, m) is None]


@dataclass(frozen=True)
class PolicyCapabilities:
    """A budget policy's optional methods (None where missing) and whether requests may share it."""

    at_context: Callable | None
    wants_lookahead: Callable | None
    keep_lookahead: Callable | None
    observe_outcomes: Callable | None
    serves_many: bool

    @staticmethod
    def of(policy) -> "PolicyCapabilities":
        return PolicyCapabilities(*(_method(policy, m) for m in ("at_context", "wants_lookahead", "keep_lookahead",
                                                                 "observe_outcomes")), serves_many(policy))


@dataclass(frozen=True)
class Capabilities:
    """What one call's parts can do, read at its start."""

    verifier: VerifierCapabilities
    drafter: DrafterCapabilities
    policy: PolicyCapabilities

    @staticmethod
    def of(verifier, drafter, policy) -> "Capabilities":
        return Capabilities(VerifierCapabilities.of(verifier), DrafterCapabilities.of(drafter),
                            PolicyCapabilities.of(policy))


def check_drafter(drafter) -> DrafterCapabilities:
    """`drafter`'s capabilities, or ConfigError when it is no Drafter: it needs `start(prompt)`;
    what start returns (a request, or None for a drafter that serves the request itself) is
    checked when the request starts."""
    if isinstance(drafter, type):
        raise ConfigError(f"drafter: expected a drafter object, got the class {drafter.__name__}; pass an instance "
                          f"({drafter.__name__}(...)) or a name")
    capabilities = DrafterCapabilities.of(drafter)
    if capabilities.start is None:
        raise ConfigError(f"drafter: {describe(drafter)} has no start(prompt); expected a Drafter: start(prompt) "
                          f"returning a request with propose(context, budget), update(tokens) and finish(), "
                          f"or returning None when the drafter has those methods itself")
    return capabilities
