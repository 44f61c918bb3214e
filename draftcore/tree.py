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

Node roles. The first `n_candidates` nodes (the root and the drafted candidates) are what acceptance
may walk; the last `n_lookahead` nodes are lookahead nodes (a Jacobi window) that ride in the same
forward only so that the drafter can observe the model's token at each of them. A lookahead node's
parent is the root or another lookahead node, so dropping candidates never orphans the window::

    index:   0 | 1 .. n_candidates-1 | n_candidates .. n-1
    role:    root | candidates (best first) | lookahead nodes

Token ids are int32 everywhere. A tree of one node (the root alone) is "no draft".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InputError, describe
from .jit import kernels
from .validate import positive_int


@dataclass(eq=False, slots=True)
class DraftTree:
    """Draft tree arrays (see the module docstring). Build with `DraftTree.build` to validate."""

    tokens: np.ndarray   # int32[n], tokens[0] is the root
    parents: np.ndarray  # int32[n], parents[0] == -1, parents[i] < i
    depths: np.ndarray   # int32[n], depths[0] == 0
    # float32[n] or None: the drafter's estimate that the path root..i is accepted (scores[0] == 1).
    # Drafters that fill it emit candidates best-first, so every prefix of them is the best k-node draft.
    scores: np.ndarray | None = None
    n_lookahead: int = 0  # the last n_lookahead nodes are lookahead nodes (never accepted)

    @staticmethod
    def build(tokens, parents, depths=None, *, scores=None, n_lookahead: int = 0) -> "DraftTree":
        """Validate and build a tree; `depths` is derived from `parents` when omitted."""
        tokens = _int32_vector("tokens", tokens)
        parents = _int32_vector("parents", parents)
        if tokens.shape[0] == 0:
            raise InputError("tokens: expected at least the root token, got an empty array")
        if parents.shape != tokens.shape:
            raise InputError(f"parents: expected shape {tokens.shape} like tokens, got {parents.shape}")
        if depths is None:
            depths = kernels("draftcore.tree_kernels").depths_from_parents(parents)
        depths = _int32_vector("depths", depths)
        if scores is not None:
            scores = _score_vector(scores, tokens.shape[0])
        tree = DraftTree(tokens, parents, depths, scores, n_lookahead)
        tree.check()
        return tree

    def check(self, vocab_size: int | None = None) -> None:
        """Raise InputError unless the tree is well formed (`check_tree`). For trees from outside
        draftcore (a custom drafter); draftcore's own are valid by construction."""
        check_tree(self, vocab_size)

    @staticmethod
    def root_only(root: int) -> "DraftTree":
        """The tree with no draft: just the last accepted token."""
        return DraftTree(np.array([root], np.int32), np.array([-1], np.int32), np.zeros(1, np.int32))

    @staticmethod
    def chain(root: int, draft) -> "DraftTree":
        """A single branch: root, draft[0], draft[1], ..."""
        draft = _int32_vector("draft", draft)
        root = _int32_vector("root", [root])[0]
        n = draft.shape[0] + 1
        tokens = np.empty(n, np.int32)
        tokens[0] = root
        tokens[1:] = draft
        return DraftTree(tokens, np.arange(-1, n - 1, dtype=np.int32), np.arange(n, dtype=np.int32))

    # -- sizes and roles ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_candidates(self) -> int:
        """Nodes acceptance may walk: the root and the drafted candidates (the first nodes)."""
        return len(self) - self.n_lookahead

    @property
    def n_draft(self) -> int:
        """Drafted candidate tokens (every node but the root and the lookahead nodes)."""
        return self.n_candidates - 1

    def with_candidates(self, n_draft: int) -> "DraftTree":
        """The root, the first `n_draft` candidates and every lookahead node (renumbered): still a
        tree, since parents come first and no lookahead node hangs below a candidate."""
        if isinstance(n_draft, bool) or not isinstance(n_draft, (int, np.integer)):
            raise InputError(f"n_draft: expected an int (candidates to keep), got {describe(n_draft)}")
        m = 1 + max(0, min(n_draft, self.n_draft))
        n_cand = self.n_candidates
        if m == n_cand:
            return self
        if self.n_lookahead == 0:
            keep = slice(0, m)
            parents = self.parents[:m]
        else:
            keep = np.r_[0:m, n_cand:len(self)]
            window = self.parents[n_cand:]
            parents = np.concatenate([self.parents[:m], np.where(window > 0, window - (n_cand - m), window)])
        return DraftTree(self.tokens[keep], parents, self.depths[keep],
                         None if self.scores is None else self.scores[keep], self.n_lookahead)

    def without_lookahead(self) -> "DraftTree":
        """The root and the candidates only."""
        if self.n_lookahead == 0:
            return self
        m = self.n_candidates
        return DraftTree(self.tokens[:m], self.parents[:m], self.depths[:m],
                         None if self.scores is None else self.scores[:m], 0)

    def leaf_counts(self) -> np.ndarray:
        """int64[n_candidates + 1]: counts[m] is the number of leaves of the root, the first m - 1
        candidates and the whole window, m = 1 .. n_candidates (index 0 unused). Adding candidate m
        makes it a leaf, and its parent no longer one when m is the parent's first child."""
        m_all = self.n_candidates
        parents = self.parents[:m_all]
        first_child = np.full(m_all, m_all, np.int64)
        children = np.arange(m_all - 1, 0, -1)
        first_child[parents[children]] = children  # reverse order: the lowest index is written last
        added = np.ones(m_all, np.int64)
        added[1:] -= first_child[parents[1:]] == np.arange(1, m_all)
        counts = np.zeros(m_all + 1, np.int64)
        counts[1:] = np.cumsum(added)
        if self.n_lookahead:
            window = self.parents[m_all:]
            has_child = np.zeros(self.n_lookahead, bool)
            inner = window[window >= m_all] - m_all
            has_child[inner] = True
            counts[1] -= 1                         # the root has the window below it: not a leaf
            counts[1:] += int((~has_child).sum())
        return counts

    def fitted(self, n_draft: int, max_leaves: int | None) -> "DraftTree":
        """`with_candidates(n_draft)`, cut further to the most candidates whose tree (the window
        included) has at most `max_leaves` leaves (None: no limit; llama.cpp gives each leaf a
        sequence id)."""
        # Each candidate or window node adds at most one leaf (a root-only tree is one leaf): count
        # leaves only when the tree could hold more than the verifier takes.
        if max_leaves is not None and max(n_draft + self.n_lookahead, 1) > max_leaves:
            fits = np.flatnonzero(self.leaf_counts()[1:n_draft + 2] <= max_leaves)   # 0 .. n_draft candidates
            n_draft = min(n_draft, int(fits[-1]) if fits.size else 0)
        return self.with_candidates(n_draft)

    # -- derived views --------------------------------------------------------------------------------
    def is_chain(self) -> bool:
        """True when every node's parent is the node before it (a single branch)."""
        return bool(np.array_equal(self.parents, np.arange(-1, len(self) - 1, dtype=np.int32)))

    def position_ids(self, n_past: int) -> np.ndarray:
        """int64[n]: the position of each node when `n_past` tokens are already in the KV cache."""
        return self.depths.astype(np.int64) + n_past

    def ancestor_mask(self) -> np.ndarray:
        """bool[n, n]: mask[i, j] is True iff node j is node i or one of its ancestors."""
        return kernels("draftcore.tree_kernels").ancestor_mask(self.parents)

    def leaves(self) -> np.ndarray:
        """int32[n_leaves]: indices of nodes with no child, in tree order."""
        has_child = np.zeros(len(self), bool)
        has_child[self.parents[1:]] = True
        return np.flatnonzero(~has_child).astype(np.int32)

    def score_bins(self, n_bins: int, first: int = 0, stop: int | None = None) -> np.ndarray:
        """int64 bin (0 .. n_bins - 1) of nodes first..stop-1's scores, where calibrations count
        acceptance; a tree without scores is taken to halve its confidence at each depth."""
        positive_int("n_bins", n_bins)
        scores = (self.scores[first:stop] if self.scores is not None
                  else 0.5 ** self.depths[first:stop].astype(np.float64))
        return score_bins_of(scores, n_bins)

    def path_tokens(self, node: int) -> np.ndarray:
        """int32[depth + 1]: the tokens from the root down to `node`, root first."""
        if isinstance(node, bool) or not isinstance(node, (int, np.integer)) or not 0 <= node < len(self):
            raise InputError(f"node: expected a node index in [0, {len(self)}), got {describe(node)}")
        path = []
        while node >= 0:
            path.append(self.tokens[node])
            node = self.parents[node]
        return np.array(path[::-1], np.int32)

    def __repr__(self) -> str:
        roles = f", n_lookahead={self.n_lookahead}" if self.n_lookahead else ""
        return f"DraftTree(n={len(self)}, tokens={self.tokens.tolist()}, parents={self.parents.tolist()}{roles})"


def score_bins_of(scores: np.ndarray, n_bins: int) -> np.ndarray:
    """int64 bin (0 .. n_bins - 1) of each score: the rule `DraftTree.score_bins` applies, for
    scores gathered from several trees (the composite drafter)."""
    # minimum(maximum()) rather than np.clip: the same ints, without clip's ~10 µs of Python per call
    return np.minimum(np.maximum((scores * n_bins).astype(np.int64), 0), n_bins - 1)


def _score_vector(value, n: int) -> np.ndarray:
    """float32[n] of finite scores (they are binned and ranked: a NaN would land in no bin), or InputError."""
    arr = np.asarray(value)
    if arr.shape != (n,) or arr.dtype.kind not in "iuf" or not np.isfinite(arr).all():
        raise InputError(f"scores: expected {n} finite floats (one per node), got {describe(value)}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _int32_vector(name, value) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise InputError(f"{name}: expected a 1-D int32 array, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise InputError(f"{name}: expected dtype=int32, got {describe(arr)}")
    if arr.size and arr.dtype.itemsize >= 4 and arr.dtype != np.int32:   # a cast would wrap these silently
        low, high = int(arr.min()), int(arr.max())
        limits = np.iinfo(np.int32)
        if low < limits.min or high > limits.max:
            raise InputError(f"{name}: expected int32 values, got {low if low < limits.min else high}")
    return np.ascontiguousarray(arr, dtype=np.int32)


def check_tree(tree, vocab_size: int | None = None) -> DraftTree:
    """Return `tree` if it is a well-formed DraftTree, else raise InputError: 1-D int32 arrays of
    one length n >= 1; parents[0] == -1, depths[0] == 0, 0 <= parents[i] < i, depths[i] ==
    depths[parents[i]] + 1; tokens in [0, vocab_size); scores None or float[n]; 0 <= n_lookahead < n
    and every lookahead node's parent the root or a lookahead node."""
    if not isinstance(tree, DraftTree):
        raise InputError(f"tree: expected a draftcore.DraftTree, got {describe(tree)}")
    for name in ("tokens", "parents", "depths"):
        arr = getattr(tree, name)
        if not isinstance(arr, np.ndarray) or arr.dtype != np.int32 or arr.ndim != 1 or arr.shape[0] == 0:
            raise InputError(f"tree.{name}: expected a non-empty 1-D int32 array, got {describe(arr)}")
    n = tree.tokens.shape[0]
    if not tree.parents.shape == tree.depths.shape == (n,):
        raise InputError(f"tree: arrays differ in length: tokens {tree.tokens.shape}, parents "
                         f"{tree.parents.shape}, depths {tree.depths.shape}")
    if tree.scores is not None and (not isinstance(tree.scores, np.ndarray) or tree.scores.shape != (n,)
                                    or tree.scores.dtype.kind != "f"):
        raise InputError(f"tree.scores: expected None or float32[{n}], got {describe(tree.scores)}")
    n_lookahead = tree.n_lookahead
    if isinstance(n_lookahead, bool) or not isinstance(n_lookahead, (int, np.integer)) or not 0 <= n_lookahead < n:
        raise InputError(f"tree.n_lookahead: expected an int in [0, {n - 1}] (the root is never a lookahead "
                         f"node), got {describe(n_lookahead)}")
    upper = vocab_size if vocab_size is not None else np.iinfo(np.int32).max
    K = kernels("draftcore.tree_kernels")
    code, i = K.tree_error(tree.tokens, tree.parents, tree.depths, n_lookahead, upper)
    if code == K.BAD_TOKEN:
        raise InputError(f"tree.tokens: token id {int(tree.tokens[i])} (node {i}) is outside the vocabulary [0, {upper})")
    if code == K.BAD_NODE:
        raise InputError(
            f"tree: malformed at node {i} (expected parents[0] == -1, 0 <= parents[i] < i, depths[0] == 0, "
            f"depths[i] == depths[parents[i]] + 1): parent={int(tree.parents[i])}, depth={int(tree.depths[i])}")
    if code == K.BAD_WINDOW:
        raise InputError(f"tree: lookahead node {i} hangs below candidate {int(tree.parents[i])}; a lookahead "
                         f"node's parent must be the root or another lookahead node (index >= {n - n_lookahead})")
    return tree
