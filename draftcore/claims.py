"""One request at a time, said out loud: a claim on an object that serves one request at a time (a
verifier, whose KV cache holds one sequence; a drafter or budget policy that keeps one request's
state), held for the request's lifetime. A second claim while one is held raises `BusyError`
instead of letting two requests corrupt each other.

An object that declares `concurrent_requests = True` (a TrieDrafter: every request gets its own
state; a FixedBudget: it has none) is never claimed (draftcore.capabilities reads the flag).
"""
from __future__ import annotations

from .errors import BusyError

# id(object) -> the token of the claim holding it. dict.setdefault is one atomic step under the GIL,
# so claiming needs no lock (a free-threaded CPython build would need one here), and releasing is
# done by the holder only. A claim keeps its object alive, so the id cannot be reused while it is held.
_held: dict = {}


class Claim:
    """Holds `obj` for one request until `release()`; raises BusyError if another claim holds it."""

    def __init__(self, obj, argument: str, advice: str):
        token = object()
        if _held.setdefault(id(obj), token) is not token:
            raise BusyError(f"{argument}: {type(obj).__name__} object at {id(obj):#x} is serving another request "
                            f"(a speculate_stream not yet exhausted, closed or garbage-collected) and serves one "
                            f"request at a time; {advice}")
        self._obj, self._token = obj, token

    def release(self) -> None:
        """End the claim; idempotent."""
        if self._token is not None and _held.get(id(self._obj)) is self._token:
            del _held[id(self._obj)]
        self._obj = self._token = None


VERIFIER_ADVICE = ("give each concurrent request its own verifier (a pool of verifiers can share one TrieDrafter), "
                   "or finish or close() the other stream first")
DRAFTER_ADVICE = ("give each concurrent request its own drafter, or share a TrieDrafter (concurrent_requests = "
                  "True), or finish or close() the other stream first")
BUDGET_ADVICE = ("give each concurrent request its own budget policy (each verifier's Session has one), "
                 "or finish or close() the other stream first")
