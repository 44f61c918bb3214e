"""Drafters: sources of draft trees (see draftcore.protocols.Drafter), and the menu of their names.

    name        drafter
    trie        TrieDrafter: n-grams of the prompt and of every past output (shared pool)
    ngram       NGramDrafter: multi-level n-gram tables of the request's own text
    jacobi      JacobiDrafter: lookahead decoding's window and n-gram pool
    composite   CompositeDrafter: trie + n-gram + Jacobi pool in one tree, window attached

`register_drafter(name, factory)` adds a name beside the menu's: the tooling registers the variants
it keeps for measurement that way (draftcore.tools.variants), so the runtime's menu stays the four
drafters users pick from. For engines that batch requests and verify chains (vLLM's proposer hook)
there is `RowDrafter` (rows.py): one chain per row of a batch from a shared TrieDrafter.
"""
from __future__ import annotations

from typing import Callable

from .composite import CompositeDrafter
from .jacobi import JacobiDrafter
from .ngram import NGramDrafter
from .rows import RowDrafter
from .trie import TrieDrafter

__all__ = ["TrieDrafter", "NGramDrafter", "JacobiDrafter", "CompositeDrafter", "RowDrafter", "DRAFTER_NAMES",
           "make_drafter", "register_drafter", "drafter_names"]

_MENU = {
    "trie": lambda vocab: TrieDrafter(token_limit=vocab),
    "ngram": lambda vocab: NGramDrafter(),
    "jacobi": lambda vocab: JacobiDrafter(),
    "composite": lambda vocab: CompositeDrafter(token_limit=vocab),
}
DRAFTER_NAMES = tuple(_MENU)

# Names registered at run time; never a menu name, so "trie" means the same drafter in every process.
_registered: dict[str, Callable] = {}


def register_drafter(name: str, factory: Callable) -> None:
    """Make `make_drafter(name, vocab_size)` (and so a drafter name given to speculate, Session or the
    tooling) build `factory(vocab_size)`. Registering a name again replaces its factory."""
    from ..errors import ConfigError
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name: expected a non-empty string, got {name!r}")
    if name in _MENU:
        raise ConfigError(f"name: {name!r} is one of the menu's drafters {list(DRAFTER_NAMES)}; "
                          f"register another name")
    if not callable(factory):
        raise ConfigError(f"factory: expected a callable (vocab_size) -> Drafter, got {factory!r}")
    _registered[name] = factory


def drafter_names() -> tuple[str, ...]:
    """Every name make_drafter builds: the menu's, then the registered ones in registration order."""
    return DRAFTER_NAMES + tuple(_registered)


def make_drafter(name: str, vocab_size: int):
    """A new drafter by name (drafter_names()), its token index sized to `vocab_size`."""
    from ..errors import ConfigError
    from ..validate import positive_int
    factory = (_MENU.get(name) or _registered.get(name)) if isinstance(name, str) else None
    if factory is None:
        raise ConfigError(f"drafter: expected a Drafter or one of {list(drafter_names())}, got {name!r}")
    return factory(positive_int("vocab_size", vocab_size))
