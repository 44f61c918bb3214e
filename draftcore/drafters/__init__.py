"""Drafters: sources of draft trees (see draftcore.protocols.Drafter), and their names.

    name                 drafter
    trie                 TrieDrafter: n-grams of the prompt and of every past output (shared pool)
    trie-uncalibrated    the same ranking its candidates by raw relative weights, longest match
                         first (calibrate=False): what `trie` was before its calibration
    trie-blind           the same not learning the model's tokens at rejected candidates
                         (learn_from_model=False): what `trie` was before it learnt them
    ngram                NGramDrafter: multi-level n-gram tables of the request's own text
    ngram-paper          NGramDrafter.paper(): ANPD as published (N=5, K=7, one chain)
    jacobi               JacobiDrafter: lookahead decoding's window and n-gram pool
    jacobi-paper         JacobiDrafter.paper(): W=15, N=5, G=15 as published for 7B models on A100
    composite            CompositeDrafter: trie + n-gram + Jacobi pool in one tree, window attached
    composite-nowindow   the same without the Jacobi window's lookahead nodes

and, for engines that batch requests and verify chains (vLLM's proposer hook), `RowDrafter`: one
chain per row of a batch from a shared TrieDrafter, one numba call per step (rows.py).
"""
from __future__ import annotations

from .composite import CompositeDrafter
from .jacobi import JacobiDrafter
from .ngram import NGramDrafter
from .rows import RowDrafter
from .trie import TrieDrafter

__all__ = ["TrieDrafter", "NGramDrafter", "JacobiDrafter", "CompositeDrafter", "RowDrafter", "DRAFTER_NAMES",
           "make_drafter"]

_FACTORIES = {
    "trie": lambda vocab: TrieDrafter(token_limit=vocab),
    "trie-uncalibrated": lambda vocab: TrieDrafter(token_limit=vocab, calibrate=False),
    "trie-blind": lambda vocab: TrieDrafter(token_limit=vocab, learn_from_model=False),
    "ngram": lambda vocab: NGramDrafter(),
    "ngram-paper": lambda vocab: NGramDrafter.paper(),
    "jacobi": lambda vocab: JacobiDrafter(),
    "jacobi-paper": lambda vocab: JacobiDrafter.paper(),
    "composite": lambda vocab: CompositeDrafter(token_limit=vocab),
    "composite-nowindow": lambda vocab: CompositeDrafter(token_limit=vocab, window=False),
}
DRAFTER_NAMES = tuple(_FACTORIES)


def make_drafter(name: str, vocab_size: int):
    """A new drafter by name (DRAFTER_NAMES), its token index sized to `vocab_size`."""
    from ..errors import ConfigError
    from ..validate import positive_int
    factory = _FACTORIES.get(name) if isinstance(name, str) else None
    if factory is None:
        raise ConfigError(f"drafter: expected a Drafter or one of {list(DRAFTER_NAMES)}, got {name!r}")
    return factory(positive_int("vocab_size", vocab_size))
