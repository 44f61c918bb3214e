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


def warm_up() -> None:
    parents = np.array([-1, 0, 1, 0], np.int32)
    depths_from_parents(parents)
    ancestor_mask(parents)
