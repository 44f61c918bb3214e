"""Several draft trees as one: identical prefixes shared, best first (the composite drafter's and
the Jacobi pool's merge)."""
from __future__ import annotations

import numpy as np

from ..jit import kernels
from ..tree import DraftTree

_KERNELS = "draftcore.drafters.merge_kernels"
def merge_trees(root: int, tokens, parents, priority, sources, budget: int):
    """One tree from several (concatenated without their roots; `parents` index the concatenation,
    -1 under the root): shared prefixes merged, best priority first, cut to `budget` candidates.
    Returns (DraftTree, int32 source bits per node, int32 each input node's index in the tree, -1
    where the cut dropped it)."""
    K = kernels(_KERNELS)
    n = tokens.shape[0]
    size = n + 1
    out = np.empty((4, size), np.int32)
    out_sources = np.empty(size, np.int32)
    index_of = np.empty(n, np.int32)
    m = K.merge(tokens, parents, priority, sources, n, budget, out[0], out[1], out[2], out[3].view(np.float32),
                out_sources, np.empty(size, np.int32), np.empty(size, np.int32), index_of,
                np.empty(size, np.float32))
    out[0, 0] = root
    rows = out[:, :m].copy()
    return DraftTree(rows[0], rows[1], rows[2], rows[3].view(np.float32)), out_sources[:m].copy(), index_of
