"""One llama_batch, allocated once, filled through numpy views of its C arrays, and the
sequence ids that let one batch hold a whole draft tree.

A tree batch (the tree pictured in draftcore/tree.py):

    i  token  pos          n_seq_id  seq_id     logits
    0  t      n_past + 0   3         1 2 3      1        root: above every leaf
    1  x      n_past + 1   2         1 2        1
    2  y      n_past + 2   1         1          1        leaf 0 -> seq 1
    3  z      n_past + 2   1         2          1        leaf 1 -> seq 2
    4  w      n_past + 1   1         3          1        leaf 2 -> seq 3

llama.cpp lets token i attend to cache cells that share one of its sequence ids and have a position
<= its own: its ancestors (above the same leaves, shallower) and itself. Siblings share no id;
descendants share ids but sit deeper. The committed context is copied to every leaf sequence first.
"""
from __future__ import annotations

import weakref

import numpy as np

from draftcore.tree import DraftTree


def leaf_membership(tree: DraftTree) -> np.ndarray:
    """bool[n, n_leaves]: [i, k] is True iff leaf k is node i or lies below it.

    llama.cpp gives leaf k the sequence id k + 1 (0 is the committed context); node i is tagged
    with the ids of its row. Leaves are numbered in tree order (`tree.leaves()`).
    """
    return tree.ancestor_mask()[tree.leaves()].T.copy()


class Batch:
    """A llama_batch of `capacity` tokens, each able to carry `max_ids` sequence ids."""

    def __init__(self, lib, capacity: int, max_ids: int):
        self.capacity = capacity
        self.raw = lib.llama_batch_init(capacity, 0, max_ids)
        # llama_batch_free takes the struct by value; the finalizer holds the struct, not self.
        weakref.finalize(self, lib.llama_batch_free, self.raw)
        view = np.ctypeslib.as_array
        self.token = view(self.raw.token, shape=(capacity,))
        self.pos = view(self.raw.pos, shape=(capacity,))
        self.n_seq_id = view(self.raw.n_seq_id, shape=(capacity,))
        self.logits = view(self.raw.logits, shape=(capacity,))
        # seq_id is an array of per-token pointers (one malloc each), so one view per token.
        self.seq_id = [view(self.raw.seq_id[i], shape=(max_ids,)) for i in range(capacity)]

    def set_chain(self, tokens: np.ndarray, pos0: int, outputs: str) -> None:
        """Tokens at positions pos0, pos0 + 1, ... in sequence 0.

        outputs: "all" (a row of logits per token), "last" or "none".
        """
        n = tokens.shape[0]
        self.raw.n_tokens = n
        self.token[:n] = tokens
        self.pos[:n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.n_seq_id[:n] = 1
        for i in range(n):
            self.seq_id[i][0] = 0
        self.logits[:n] = 1 if outputs == "all" else 0
        if outputs == "last":
            self.logits[n - 1] = 1

    def set_one(self, token: int, pos: int) -> None:
        """set_chain of one token with its logits, without the numpy calls a chain's slices take."""
        self.raw.n_tokens = 1
        self.token[0], self.pos[0], self.n_seq_id[0], self.logits[0] = token, pos, 1, 1
        self.seq_id[0][0] = 0

    def set_tree(self, tokens: np.ndarray, depths: np.ndarray, membership: np.ndarray, n_past: int) -> None:
        """Every tree node at n_past + depth, tagged with seq ids 1 + (leaves below it); all output."""
        n = tokens.shape[0]
        self.raw.n_tokens = n
        self.token[:n] = tokens
        self.pos[:n] = depths + n_past
        counts = membership.sum(axis=1)
        self.n_seq_id[:n] = counts
        # Leaf indices of each row first (a stable sort puts True before False), shifted to seq ids.
        ids = np.argsort(~membership, axis=1, kind="stable").astype(np.int32) + 1
        for i in range(n):
            self.seq_id[i][:counts[i]] = ids[i, :counts[i]]
        self.logits[:n] = 1
