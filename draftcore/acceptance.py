"""Greedy acceptance: the longest root-to-node path the model agrees with, plus the model's token.

Walk from the root; at node u the model's token is argmax(out[u]); move to the child of u holding
that token, else stop. The emitted tokens are the path's drafted tokens plus argmax at the last node,
so every step emits at least one token (the model's own).
"""
import numba as nb
import numpy as np


@nb.njit(cache=True)
def greedy_accept(tokens, parents, model_tokens):
    """Return (path int32[k] of node indices, root first; next_token int) for one verified tree.

    tokens, parents: the tree (int32[n]); model_tokens: int32[n], the model's argmax at each node.
    Children of u have indices > u (topological order), so one forward scan per level suffices.
    """
    n = tokens.shape[0]
    path = np.empty(n, np.int32)
    path[0] = 0
    n_path = 1
    u = 0
    while True:
        want = model_tokens[u]
        child = -1
        for v in range(u + 1, n):
            if parents[v] == u and tokens[v] == want:
                child = v
                break
        if child < 0:
            break
        path[n_path] = child
        n_path += 1
        u = child
    return path[:n_path], model_tokens[u]
