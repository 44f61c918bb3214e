"""What persists between the requests one verifier serves: its drafter and its draft budget.

Speculative decoding gets faster as it runs: the trie learns the text a deployment generates, and
the cost-aware budget learns what a verify of each size costs on this machine and how often drafts
of each confidence are accepted. Both must outlive a request, so they live in a `Session`::

    session = draftcore.Session(verifier)                # a TrieDrafter sized to the vocabulary + auto budget
    result = session.speculate(prompt_ids, max_new_tokens=128)
    session.drafter, session.budget                      # what it has learnt, visible
    session.reset()                                      # forget it

The bare call `draftcore.speculate(verifier, prompt)` uses the verifier's own session,
`Session.of(verifier)`: created on first use, kept for as long as the verifier lives, and the same
object every time, so it can be inspected or replaced. Passing `drafter=` or `budget=` to
`speculate` overrides that part for one call.
"""
from __future__ import annotations

import threading
import warnings
import weakref

from .budget import CostAwareBudget, as_budget_policy
from .call import Call, Options, takes_options
from .capabilities import VerifierCapabilities, check_drafter
from .loop import SpeculationStream, open_stream
from .validate import positive_int


class Session:
    """A verifier with the drafter and budget policy that its requests share.

    verifier: any Verifier.
    drafter: a Drafter or a name from `draftcore.DRAFTER_NAMES`; default a `TrieDrafter` whose
        token index covers the verifier's vocabulary.
    budget: "auto" or None (default: a `CostAwareBudget`, as `speculate` reads them), an int (a fixed
        number of drafted candidates per step) or a budget policy object.
    """

    _sessions: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # verifier -> its Session.of
    _sessions_lock = threading.Lock()

    def __init__(self, verifier, *, drafter=None, budget="auto"):
        self._verifier = verifier
        self._custom_drafter = drafter is not None
        self._budget_spec = budget
        budget = _own_budget(budget)
        if isinstance(drafter, str):
            drafter = make_drafter(drafter, VerifierCapabilities.of(verifier).vocab_size)
        elif drafter is not None:
            check_drafter(drafter)
        if drafter is None:   # the default drafter's token index is sized by it: refuse a bad one now
            positive_int("verifier.vocab_size", VerifierCapabilities.of(verifier).vocab_size)
        self._drafter = drafter   # None: the default, built on first use (a call naming its drafter builds none)
        self._named: dict = {}  # name -> drafter, for speculate(verifier, prompt, drafter="name")
        self.budget = budget

    @classmethod
    def of(cls, verifier) -> "Session":
        """The session `draftcore.speculate(verifier, ...)` uses when no drafter or budget is passed:
        one per verifier, created on first use and dropped with the verifier. A verifier that cannot
        be weakly referenced gets a fresh session per call (and a warning): keep a Session yourself."""
        with cls._sessions_lock:
            try:
                session = cls._sessions.get(verifier)
            except TypeError:
                session = None
                warnings.warn(f"{type(verifier).__name__} cannot be weakly referenced, so draftcore cannot keep "
                              f"its drafter and budget between calls; create a draftcore.Session(verifier) "
                              f"and call session.speculate(...) instead", RuntimeWarning, stacklevel=3)
                return cls(verifier)
            if session is None:
                session = cls._sessions[verifier] = cls(verifier)
                # The registry's value must not keep its key alive: this session holds its verifier weakly.
                session._verifier = weakref.ref(verifier)
            return session

    @staticmethod
    def open_bare(verifier, prompt, options: dict) -> SpeculationStream:
        """A bare call `draftcore.speculate_stream(verifier, prompt, **options)`: the drafter and the
        budget the call names itself, and for None, a name or "auto" the verifier's own session's
        (`Session.of(verifier)`, created only when needed)."""
        def resolve(drafter, budget):
            if drafter is None or isinstance(drafter, str) or _is_auto(budget):
                return Session.of(verifier).resolve(drafter, budget)
            return drafter, as_budget_policy(budget)
        return open_stream(Call.of(verifier, prompt, Options.of(options), resolve))

    @property
    def drafter(self):
        """The session's drafter: the one it was given, else DEFAULT_DRAFTER sized to the verifier's
        vocabulary, built on first use."""
        if self._drafter is None:
            with self._sessions_lock:
                if self._drafter is None:
                    self._drafter = default_drafter(self.verifier)
        return self._drafter

    @drafter.setter
    def drafter(self, drafter) -> None:
        self._drafter = drafter

    @property
    def verifier(self):
        """The verifier this session serves."""
        verifier = self._verifier() if isinstance(self._verifier, weakref.ref) else self._verifier
        if verifier is None:
            raise ReferenceError("Session: its verifier was garbage-collected")
        return verifier

    def named_drafter(self, name: str):
        """The session's drafter called `name` (DRAFTER_NAMES), created on first use and kept, so
        `speculate(verifier, prompt, drafter="ngram")` keeps learning across calls as the default does."""
        with self._sessions_lock:
            drafter = self._named.get(name)
            if drafter is None:
                drafter = self._named[name] = make_drafter(name, VerifierCapabilities.of(self.verifier).vocab_size)
            return drafter

    @takes_options
    def speculate(self, prompt, **options):
        """`draftcore.speculate(self.verifier, prompt, drafter=self.drafter, budget=self.budget, ...)`:
        a drafter or budget the call names overrides the session's; None, a name or "auto" is the
        session's own."""
        with self.stream(prompt, **options) as stream:
            for _ in stream:
                pass
        return stream.result

    @takes_options
    def stream(self, prompt, **options) -> SpeculationStream:
        """`draftcore.speculate_stream` with this session's drafter and budget."""
        return open_stream(Call.of(self.verifier, prompt, Options.of(options), self.resolve))

    def resolve(self, drafter, budget):
        """(drafter, budget policy) for a call: None means this session's drafter, a name its drafter
        of that name (DRAFTER_NAMES), None or "auto" its budget; anything else is the call's own.
        The budget is checked first, so a refused call leaves no new named drafter behind."""
        budget = as_budget_policy(self.budget if _is_auto(budget) else budget)
        if drafter is None:
            drafter = self.drafter
        elif isinstance(drafter, str):
            drafter = self.named_drafter(drafter)
        return drafter, budget

    def reset(self) -> None:
        """Forget what was learnt: a fresh default drafter (unless one was given) and budget."""
        if not self._custom_drafter:
            self._drafter = None   # a fresh default, built on next use
        self._named.clear()
        self.budget = _own_budget(self._budget_spec)

    def __repr__(self) -> str:
        return f"Session({type(self.verifier).__name__}, drafter={self.drafter!r}, budget={self.budget!r})"


DEFAULT_DRAFTER = "trie"  # what measured best end to end (README.md, "Drafters": "The trie stays the default")


def default_drafter(verifier):
    """The drafter a session starts with: DEFAULT_DRAFTER, its token index covering the vocabulary."""
    return make_drafter(DEFAULT_DRAFTER, positive_int("verifier.vocab_size", VerifierCapabilities.of(verifier).vocab_size))


def _is_auto(budget) -> bool:
    """None or "auto": the session's own budget (the one place the string is parsed)."""
    return budget is None or (isinstance(budget, str) and budget == "auto")


def _own_budget(spec):
    """A session's budget policy from its `budget=`: "auto" is a fresh CostAwareBudget."""
    return CostAwareBudget() if _is_auto(spec) else as_budget_policy(spec)


def make_drafter(name, vocab_size):
    from .drafters import make_drafter as make  # the drafters load numba's kernels: import on use
    return make(name, vocab_size)
