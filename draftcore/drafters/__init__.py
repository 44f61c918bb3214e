"""Drafters: sources of draft trees (see draftcore.protocols.Drafter)."""
from .trie import TrieDrafter

__all__ = ["TrieDrafter"]
