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
from .errors import ConfigError, describe
from .loop import open_stream
from .validate import positive_int


class Session:
    """A verifier with the drafter and budget policy that its requests share.

    verifier: any Verifier.
    drafter: a Drafter or a name from `draftcore.DRAFTER_NAMES`; default a `TrieDrafter` whose
        token index covers the verifier's vocabulary.
    budget: "auto" (default: a `CostAwareBudget`), an int (a fixed number of drafted candidates per
        step) or a budget policy object.
    """

    _sessions: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # verifier -> its Session.of
    _sessions_lock = threading.Lock()

    def __init__(self, verifier, *, drafter=None, budget="auto"):
        self._verifier = verifier
        self._custom_drafter = drafter is not None
        self._budget_spec = budget
        auto_budget = isinstance(budget, str) and budget == "auto"
        budget = CostAwareBudget() if auto_budget else as_budget_policy(budget)
        if isinstance(drafter, str):
            drafter = make_drafter(drafter, getattr(verifier, "vocab_size", None))
        elif drafter is not None and not (callable(getattr(drafter, "start", None)) or all(
                callable(getattr(drafter, m, None)) for m in ("propose", "update", "finish"))):
            raise ConfigError(f"drafter: expected None, a name or a Drafter (start(prompt) returning a request, or "
                              f"propose/update/finish itself), got {describe(drafter)}")
        if drafter is None:   # the default drafter's token index is sized by it: refuse a bad one now
            positive_int("verifier.vocab_size", getattr(verifier, "vocab_size", None))
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
    def resolve_for(verifier, drafter, budget):
        """(drafter, budget policy) for a bare call `draftcore.speculate(verifier, ..., drafter=,
        budget=)`: what the call names itself, and for None, a name or "auto" the verifier's own
        session's (`Session.of(verifier).resolve`)."""
        if drafter is None or isinstance(drafter, str) or budget is None or (isinstance(budget, str)
                                                                            and budget == "auto"):
            return Session.of(verifier).resolve(drafter, budget)
        return drafter, as_budget_policy(budget)

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
                drafter = self._named[name] = make_drafter(name, getattr(self.verifier, "vocab_size", None))
            return drafter

    def speculate(self, prompt, **options):
        """`draftcore.speculate(self.verifier, prompt, drafter=self.drafter, budget=self.budget, ...)`:
        a drafter or budget the call names overrides the session's; None, a name or "auto" is the
        session's own."""
        with self.stream(prompt, **options) as stream:
            for _ in stream:
                pass
        return stream.result

    def stream(self, prompt, drafter=None, budget=None, **options):
        """`draftcore.speculate_stream` with this session's drafter and budget."""
        return open_stream(self.verifier, prompt, drafter=drafter, budget=budget, resolve=self.resolve,
                           **{"max_new_tokens": 128, "eos_token_id": None, "stop_sequences": (), "sampling": None,
                              "clock": None, **options})

    def resolve(self, drafter, budget):
        """(drafter, budget policy) for a call: None means this session's drafter, a name its drafter
        of that name (DRAFTER_NAMES), None or "auto" its budget; anything else is the call's own.
        The budget is checked first, so a refused call leaves no new named drafter behind."""
        if budget is None or (isinstance(budget, str) and budget == "auto"):
            budget = self.budget
        budget = as_budget_policy(budget)
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
        self.budget = CostAwareBudget() if self._budget_spec == "auto" else as_budget_policy(self._budget_spec)

    def __repr__(self) -> str:
        return f"Session({type(self.verifier).__name__}, drafter={self.drafter!r}, budget={self.budget!r})"


DEFAULT_DRAFTER = "trie"  # what measured best end to end (README.md, "Drafters": "The trie stays the default")


def default_drafter(verifier):
    """The drafter a session starts with: DEFAULT_DRAFTER, its token index covering the vocabulary."""
    return make_drafter(DEFAULT_DRAFTER, positive_int("verifier.vocab_size", getattr(verifier, "vocab_size", None)))


def make_drafter(name, vocab_size):
    from .drafters import make_drafter as make  # the drafters load numba's kernels: import on use
    return make(name, vocab_size)
