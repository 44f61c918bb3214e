"""The draft tree: the one shape every drafter produces and every verifier consumes.

A flat, topologically ordered forest under one root::

    context ... a b c | t          t = tokens[0]: the last accepted token, not yet in the KV cache
                        ├── x      node 1  parent 0  depth 1
                        │   ├── y  node 2  parent 1  depth 2
                        │   └── z  node 3  parent 1  depth 2
                        └── w      node 4  parent 0  depth 1

    tokens  = [t, x, y, z, w]
    parents = [-1, 0, 1, 1, 0]      parents[i] < i  (topological order)
    depths  = [0, 1, 2, 2, 1]       position id of node i = n_past + depths[i]

    mask (row i sees column j iff j is i or an ancestor of i; everyone sees the whole context):
          t x y z w
      t   1 . . . .
      x   1 1 . . .
      y   1 1 1 . .
      z   1 1 . 1 .
      w   1 . . . 1

    llama.cpp sequence ids: one per leaf (y → 1, z → 2, w → 3; 0 is the committed context); a node
    carries the ids of every leaf below it: t {1,2,3}, x {1,2}, y {1}, z {2}, w {3}. A token sees
    cache cells that share an id and have a smaller position: exactly its ancestors.

Token ids are int32 everywhere. A tree of one node (the root alone) is "no draft".
"""
from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .errors import InputError, describe


@nb.njit(cache=True)
def _first_bad_node(parents, depths):
    """Index of the first node breaking the tree invariants, or -1 if the tree is well formed."""
    n = parents.shape[0]
    if parents[0] != -1 or depths[0] != 0:
        return 0
    for i in range(1, n):
        p = parents[i]
        if p < 0 or p >= i or depths[i] != depths[p] + 1:
            return i
    return -1


@dataclass(eq=False, slots=True)
class DraftTree:
    """Draft tree arrays (see the module docstring). Build with `DraftTree.build` to validate."""

    tokens: np.ndarray   # int32[n], tokens[0] is the root
    parents: np.ndarray  # int32[n], parents[0] == -1, parents[i] < i
    depths: np.ndarray   # int32[n], depths[0] == 0
    # float32[n] or None: the drafter's estimate that the path root..i is accepted (scores[0] == 1).
    # Drafters that fill it emit nodes best-first, so every prefix tree[:k] is the best k-node tree.
    scores: np.ndarray | None = None

    @staticmethod
    def build(tokens, parents, depths=None) -> "DraftTree":
        """Validate and build a tree; `depths` is derived from `parents` when omitted."""
        tokens = _int32_vector("tokens", tokens)
        parents = _int32_vector("parents", parents)
        if tokens.shape[0] == 0:
            raise InputError("tokens: expected at least the root token, got an empty array")
        if parents.shape != tokens.shape:
            raise InputError(f"parents: expected shape {tokens.shape} like tokens, got {parents.shape}")
        if depths is None:
            depths = _depths_from_parents(parents)
        depths = _int32_vector("depths", depths)
        if depths.shape != tokens.shape:
            raise InputError(f"depths: expected shape {tokens.shape} like tokens, got {depths.shape}")
        tree = DraftTree(tokens, parents, depths)
        tree.check()
        return tree

    def check(self, vocab_size: int | None = None) -> None:
        """Raise InputError unless the arrays are well formed: 1-D int32 of one length n >= 1,
        the tree invariants hold, tokens lie in [0, vocab_size), scores is None or float[n].
        For trees from outside draftcore (a custom drafter); draftcore's own are valid by build."""
        for name in ("tokens", "parents", "depths"):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.dtype != np.int32 or arr.ndim != 1 or arr.shape[0] == 0:
                raise InputError(f"tree.{name}: expected a non-empty 1-D int32 array, got {describe(arr)}")
        if not self.tokens.shape == self.parents.shape == self.depths.shape:
            raise InputError(f"tree: arrays differ in length: tokens {self.tokens.shape}, parents "
                             f"{self.parents.shape}, depths {self.depths.shape}")
        if self.scores is not None and (not isinstance(self.scores, np.ndarray) or self.scores.shape != self.tokens.shape
                                        or not np.issubdtype(self.scores.dtype, np.floating)):
            raise InputError(f"tree.scores: expected None or float32[{len(self.tokens)}], got {describe(self.scores)}")
        upper = vocab_size if vocab_size is not None else np.iinfo(np.int32).max
        if self.tokens.min() < 0 or self.tokens.max() >= upper:
            raise InputError(f"tree.tokens: token id outside the vocabulary [0, {upper}): {self.tokens.tolist()}")
        bad = _first_bad_node(self.parents, self.depths)
        if bad >= 0:
            raise InputError(
                f"tree.parents/depths: node {bad} breaks the tree invariants (parents[0] == -1, "
                f"0 <= parents[i] < i, depths[i] == depths[parents[i]] + 1): "
                f"parent={int(self.parents[bad])}, depth={int(self.depths[bad])}")

    @staticmethod
    def root_only(root: int) -> "DraftTree":
        """The tree with no draft: just the last accepted token."""
        return DraftTree(np.array([root], np.int32), np.array([-1], np.int32), np.zeros(1, np.int32))

    @staticmethod
    def chain(root: int, draft) -> "DraftTree":
        """A single branch: root, draft[0], draft[1], ..."""
        draft = np.asarray(draft, np.int32)
        n = draft.shape[0] + 1
        tokens = np.empty(n, np.int32)
        tokens[0] = root
        tokens[1:] = draft
        return DraftTree(tokens, np.arange(-1, n - 1, dtype=np.int32), np.arange(n, dtype=np.int32))

    def truncated(self, n_nodes: int) -> "DraftTree":
        """The first `n_nodes` nodes (root included): still a tree, since parents come first."""
        if n_nodes >= len(self):
            return self
        n_nodes = max(1, n_nodes)
        scores = None if self.scores is None else self.scores[:n_nodes]
        return DraftTree(self.tokens[:n_nodes], self.parents[:n_nodes], self.depths[:n_nodes], scores)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_draft(self) -> int:
        """Number of drafted tokens (every node but the root)."""
        return len(self) - 1

    def is_chain(self) -> bool:
        """True when every node's parent is the node before it (a single branch)."""
        return bool(np.array_equal(self.parents, np.arange(-1, len(self) - 1, dtype=np.int32)))

    def position_ids(self, n_past: int) -> np.ndarray:
        """int64[n]: the position of each node when `n_past` tokens are already in the KV cache."""
        return self.depths.astype(np.int64) + n_past

    def ancestor_mask(self) -> np.ndarray:
        """bool[n, n]: mask[i, j] is True iff node j is node i or one of its ancestors."""
        return _ancestor_mask(self.parents)

    def leaves(self) -> np.ndarray:
        """int32[n_leaves]: indices of nodes with no child, in tree order."""
        has_child = np.zeros(len(self), bool)
        has_child[self.parents[1:]] = True
        return np.flatnonzero(~has_child).astype(np.int32)

    def leaf_membership(self) -> np.ndarray:
        """bool[n, n_leaves]: [i, k] is True iff leaf k is node i or lies below it.

        llama.cpp gives leaf k the sequence id k + 1 (0 is the committed context); node i is tagged
        with the ids of its row.
        """
        return self.ancestor_mask()[self.leaves()].T.copy()

    def path_tokens(self, node: int) -> np.ndarray:
        """int32[depth + 1]: the tokens from the root down to `node`, root first."""
        path = []
        while node >= 0:
            path.append(self.tokens[node])
            node = self.parents[node]
        return np.array(path[::-1], np.int32)

    def __repr__(self) -> str:
        return f"DraftTree(n={len(self)}, tokens={self.tokens.tolist()}, parents={self.parents.tolist()})"


def _int32_vector(name, value) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise InputError(f"{name}: expected a 1-D int32 array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{name}: expected dtype=int32, got {describe(arr)}")
    return np.ascontiguousarray(arr, dtype=np.int32)


@nb.njit(cache=True)
def _depths_from_parents(parents):
    n = parents.shape[0]
    depths = np.zeros(n, np.int32)
    for i in range(1, n):
        p = parents[i]
        depths[i] = depths[p] + 1 if 0 <= p < i else -1  # -1 is caught by the invariant check
    return depths


@nb.njit(cache=True)
def _ancestor_mask(parents):
    n = parents.shape[0]
    mask = np.zeros((n, n), np.bool_)
    for i in range(n):
        mask[i, i] = True
        p = parents[i]
        if p >= 0:
            mask[i, :i] = mask[p, :i]  # topological order: the parent's row is complete
    return mask
