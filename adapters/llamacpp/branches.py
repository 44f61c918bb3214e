"""Tree walks for a context that can only hold one branch at a time (chain-only mode).

Drafters emit nodes best-first, so a node's first child (lowest index) is its best continuation and
the chain root -> first child -> its first child ... is the tree's best branch. Every other branch
starts at a "branch head": a node that is not its parent's first child.

    node:     0 ── 1 ── 2 ── 3         branch heads in depth-first order: 0, 4, 5
               │    └── 4               best_chain(0) = [0, 1, 2, 3]
               └── 5 ── 6               best_chain(4) = [4],  best_chain(5) = [5, 6]

Visiting the heads depth-first, each branch's chain is decoded after rolling the cache back to the
head's parent, which is always on the previous branch: every node is decoded exactly once. A verify
that reads only some branches (those greedy acceptance walks into, those holding lookahead nodes or
the first n_logits nodes) decodes each as a root path: the part of root_path(head) + chain that
the cache (itself a root path) does not already hold.
Pure numpy; node indices are int, arrays int32.
"""
from __future__ import annotations

import numpy as np


def first_children(parents: np.ndarray) -> np.ndarray:
    """int32[n]: the lowest-index child of each node, -1 for a leaf."""
    n = parents.shape[0]
    first = np.full(n, -1, np.int32)
    # Assigning in reverse index order leaves the lowest child index as the last write.
    children = np.arange(n - 1, 0, -1)
    first[parents[children]] = children
    return first


def best_chain(first: np.ndarray, head: int) -> list[int]:
    """Node indices from `head` down through first children to a leaf."""
    chain = [head]
    while first[chain[-1]] >= 0:
        chain.append(int(first[chain[-1]]))
    return chain


def branch_heads(parents: np.ndarray) -> list[int]:
    """The root and every non-first child, in depth-first (children in index order) preorder."""
    n = parents.shape[0]
    children: list[list[int]] = [[] for _ in range(n)]
    for v in range(1, n):
        children[parents[v]].append(v)
    heads, stack = [], [0]
    while stack:
        u = stack.pop()
        if u == 0 or children[parents[u]][0] != u:
            heads.append(u)
        stack.extend(reversed(children[u]))
    return heads


def matching_child(tokens: np.ndarray, parents: np.ndarray, node: int, token: int, n_walk: int) -> int:
    """The lowest-index child of `node` among nodes 0 .. n_walk - 1 (the candidates) holding
    `token`, -1 if none: greedy acceptance's rule (draftcore.acceptance.greedy_accept)."""
    hits = np.flatnonzero((parents[:n_walk] == node) & (tokens[:n_walk] == token))
    return int(hits[0]) if hits.shape[0] else -1


def root_path(parents: np.ndarray, node: int) -> list[int]:
    """Node indices from the root down to `node`."""
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    return path[::-1]


def common_prefix(a: list[int], b) -> int:
    """Length of the longest common prefix of two node sequences."""
    k = 0
    for x, y in zip(a, b):
        if x != y:
            break
        k += 1
    return k


def preorder(parents: np.ndarray) -> np.ndarray:
    """int32[n]: the nodes in depth-first preorder, children in index order, so the best branch
    (root -> first child -> ...) comes first and every root path's nodes appear in path order.

        node:     0 ── 1 ── 2 ── 3         preorder: 0 1 2 3 4 5 6
                   │    └── 4
                   └── 5 ── 6
    """
    n = parents.shape[0]
    children: list[list[int]] = [[] for _ in range(n)]
    for v in range(1, n):
        children[parents[v]].append(v)
    order, stack = [], [0]
    while stack:
        u = stack.pop()
        order.append(u)
        stack.extend(reversed(children[u]))
    return np.array(order, np.int32)
