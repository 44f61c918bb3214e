"""The two small interfaces everything else plugs into.

A backend implements `Verifier`; a drafting strategy implements `Drafter`. Both are structural
(`typing.Protocol`): no base class to inherit, nothing of draftcore's to import in a backend.

Errors, the same in every backend: `ConfigError` for construction options, `InputError` for a
call's arguments or call order (a bad `want`, a path that is not in the last tree, verify before
prefill), `BackendError` when the framework or model misbehaves. A verifier may also offer
`encode(text) -> int32[]` and `decode(ids) -> str`, so `speculate` accepts text prompts.
"""
from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import numpy as np

from .tree import DraftTree

Want = Literal["argmax", "logits"]


@runtime_checkable
class Verifier(Protocol):
    """One model deployment that can run a tree-masked forward and roll its KV cache back.

    Attributes:
        vocab_size: number of logits per position.
        n_past: tokens whose KV is in the cache (the committed context).
        max_context: the most tokens the cache can hold (prompt + generated + one draft tree).
        max_tree_nodes (optional): the most nodes one verify takes (e.g. llama.cpp: n_seq_max leaves,
            n_batch tokens); `speculate` never asks the drafter for more. Absent: no limit but
            max_context.
    """

    vocab_size: int
    n_past: int
    max_context: int

    def prefill(self, prompt: np.ndarray, want: Want = "argmax"):
        """Start a new sequence from `prompt` (int32[T]), dropping any previous one.

        Returns the model's result for the last prompt position: an int token id for
        want="argmax", float32[vocab_size] for want="logits". Afterwards n_past == T.
        """

    def verify(self, tree: DraftTree, want: Want = "argmax") -> np.ndarray:
        """One forward over every node of `tree` (positions n_past + depths, tree-masked).

        Returns int32[n] (argmax per node, computed where the logits live) for want="argmax",
        float32[n, vocab_size] for want="logits". The KV of every node is held until `commit`;
        a second verify without a commit replaces the first tree (its KV is dropped).
        """

    def commit(self, path: np.ndarray) -> None:
        """Keep the KV of `path` (int32[k], tree node indices, root first, each the parent of the
        next) appended to the context; drop every other node of the last verified tree.
        Afterwards n_past grows by k."""


@runtime_checkable
class Drafter(Protocol):
    """A source of draft trees.

    A drafter that lives across requests (the trie) is created by the caller and passed to every
    `speculate` call; it keeps learning from each request.
    """

    def start(self, prompt: np.ndarray) -> None:
        """A new request begins with `prompt` (int32[T])."""

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        """Return a tree of at most `budget` drafted nodes (plus the root) continuing `context`.

        `context` is int32[m]: prompt + accepted tokens, ending with the root token
        (context[-1] == tree.tokens[0]). A root-only tree means "no draft".
        """

    def update(self, tokens: np.ndarray) -> None:
        """`tokens` (int32[k]) were just accepted and appended to the context."""

    def finish(self) -> None:
        """The request ended (forget per-request state, keep what should persist)."""
