"""Numba kernels behind `DraftTree` (loaded through `draftcore.jit.kernels`, never at import)."""
import numba as nb
import numpy as np


@nb.njit(cache=True)
def depths_from_parents(parents):
    """int32[n] depths of a parents array; -1 where a parent is not an earlier node (which the
    tree check then refuses)."""
    n = parents.shape[0]
    depths = np.zeros(n, np.int32)
    for i in range(1, n):
        p = parents[i]
        depths[i] = depths[p] + 1 if 0 <= p < i else -1
    return depths


@nb.njit(cache=True)
def ancestor_mask(parents):
    """bool[n, n]: [i, j] is True iff node j is node i or one of its ancestors."""
    n = parents.shape[0]
    mask = np.zeros((n, n), np.bool_)
    for i in range(n):
        mask[i, i] = True
        p = parents[i]
        if p >= 0:
            mask[i, :i] = mask[p, :i]  # topological order: the parent's row is complete
    return mask


# What tree_error reports (draftcore.checks turns it into a message).
TREE_OK, BAD_TOKEN, BAD_NODE, BAD_WINDOW = 0, 1, 2, 3


@nb.njit(cache=True)
def tree_error(tokens, parents, depths, n_lookahead, upper):
    """(code, node) of the first broken invariant of a tree's arrays (equal lengths n >= 1 checked
    by the caller), or (TREE_OK, -1): BAD_TOKEN a token outside [0, upper); BAD_NODE parents[0] !=
    -1, depths[0] != 0, a parent not an earlier node, or a depth not its parent's + 1; BAD_WINDOW a
    lookahead node (one of the last n_lookahead) whose parent is a candidate other than the root."""
    n = tokens.shape[0]
    for i in range(n):
        if tokens[i] < 0 or tokens[i] >= upper:
            return BAD_TOKEN, i
    if parents[0] != -1 or depths[0] != 0:
        return BAD_NODE, 0
    first_lookahead = n - n_lookahead
    for i in range(1, n):
        p = parents[i]
        if p < 0 or p >= i or depths[i] != depths[p] + 1:
            return BAD_NODE, i
        if i >= first_lookahead and 0 < p < first_lookahead:
            return BAD_WINDOW, i
    return TREE_OK, -1


@nb.njit(cache=True)
def path_error(path, parents):
    """Index in `path` of the first entry that is not a node of the tree (outside [0, n)), not the
    root (entry 0) or not a child of the entry before it; -1 when `path` is a root-first chain."""
    n = parents.shape[0]
    for i in range(path.shape[0]):
        node = path[i]
        if node < 0 or node >= n:
            return i
        if i == 0:
            if node != 0:
                return 0
        elif parents[node] != path[i - 1]:
            return i
    return -1


@nb.njit(cache=True)
def tokens_in_range(tokens, limit):
    """True if every token id is in [0, limit): one pass (validate.token_array's fast path; two numpy
    reductions cost more than the whole check on the short arrays the decode loop passes)."""
    for i in range(tokens.shape[0]):
        t = tokens[i]
        if t < 0 or t >= limit:
            return False
    return True


@nb.njit(cache=True)
def would_accept(tokens, parents, depths, n, continuation):
    """int8[n]: for the first n nodes of a tree whose root is followed by `continuation` (the tokens
    really emitted after it), 1 where the node's path root..i is a prefix of root + continuation
    (acceptance would have walked it), 0 where it is not, -1 where the continuation is too short to
    tell. Parents come before children, so one pass settles every node."""
    out = np.empty(n, np.int8)
    known = continuation.shape[0]
    out[0] = 1
    for i in range(1, n):
        parent = out[parents[i]]
        if parent != 1:
            out[i] = parent          # below a rejected node: rejected; below an unknown one: unknown
        elif depths[i] > known:
            out[i] = -1
        else:
            out[i] = 1 if tokens[i] == continuation[depths[i] - 1] else 0
    return out


def warm_up() -> None:
    parents = np.array([-1, 0, 1, 0], np.int32)
    depths = depths_from_parents(parents)
    ancestor_mask(parents)
    tree_error(parents + 1, parents, depths, 1, 10)
    path_error(np.array([0, 1], np.int32), parents)
    path_error(np.array([0, 1], np.int64), parents)
    tokens_in_range(parents, 10)
    would_accept(parents + 1, parents, depths, 4, np.array([1], np.int32))
