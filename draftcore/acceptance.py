"""Acceptance: which root-to-node path of a verified tree is kept, and the model's next token.

Only the tree's candidates are walked (nodes 0 .. n_walk - 1, the root first): lookahead nodes ride
in the verify to be observed, never accepted (draftcore.tree, "Node roles").

Greedy: walk from the root; at node u the model's token is argmax(out[u]); move to the child of u
holding that token, else stop. The emitted tokens are the path's drafted tokens plus argmax at the
last node, so every step emits at least one token (the model's own).

Sampling (exact for deterministic drafts; Fu et al., "Break the Sequential Dependency of LLM Inference
Using Lookahead Decoding", 2024, Alg. 4): at node u, with p the
processed distribution of u's own prefix, try u's children c in tree order: accept c with
probability p(c) / (mass left); on rejection remove p(c) from the mass. If no child is accepted the
next token is drawn from what is left of p (a reached leaf draws from its whole p). Why it is exact:
the token emitted after u's prefix is c_1 with probability p(c_1), c_2 with (1 - p(c_1)) ·
p(c_2) / (1 - p(c_1)) = p(c_2), ..., and any other token t with (1 - Σ p(c)) · p(t) / (1 - Σ p(c))
= p(t): exactly p, whatever the drafter proposed (duplicate children get probability 0 once their
token's mass is gone). Below an accepted child the same argument runs on the child's own p.

Kernels of `draftcore.jit`: loaded on first use, never at `import draftcore`.
"""
import numba as nb
import numpy as np


@nb.njit(cache=True)
def greedy_accept(tokens, parents, model_tokens, n_walk):
    """Return (path int32[k] of node indices, root first; next_token int) for one verified tree.

    tokens, parents: the tree (int32[n]); model_tokens: int32[n], the model's argmax at each node;
    n_walk: nodes 0 .. n_walk - 1 may be walked (the candidates). Children of u have indices > u
    (topological order), so one forward scan per level suffices. A node whose token is -1 (not
    evaluated by the backend) ends the walk with next_token -1, which the caller refuses.
    """
    path = np.empty(n_walk, np.int32)
    path[0] = 0
    n_path = 1
    u = 0
    while True:
        want = model_tokens[u]
        child = -1
        for v in range(u + 1, n_walk):
            if parents[v] == u and tokens[v] == want:
                child = v
                break
        if child < 0:
            break
        path[n_path] = child
        n_path += 1
        u = child
    return path[:n_path], model_tokens[u]


@nb.njit(cache=True)
def sample_step(tokens, parents, n_walk, u, p, uniforms, i_draw, left):
    """One node of the exact sampling walk: at node u with distribution p (float32[vocab],
    non-negative weights), try u's children among nodes u+1 .. n_walk-1 in tree order. Returns
    (child, token, i_draw): the accepted child and token -1, or child -1 and the token drawn from
    what is left of p; uniforms[i_draw:] are the unused draws (one per child tried, then one for the
    final draw), so a seeded generator reproduces a run. left: float64[vocab] scratch. The sampling
    rule calls it node by node from the root, so only the nodes the walk reaches get processed logits.
    """
    vocab = p.shape[0]
    mass = 0.0
    for v in range(vocab):
        left[v] = p[v]
        mass += left[v]
    for c in range(u + 1, n_walk):
        if parents[c] != u:
            continue
        pc = left[tokens[c]]
        r = uniforms[i_draw]
        i_draw += 1
        if r * mass < pc:  # accept with probability pc / mass
            return c, -1, i_draw
        left[tokens[c]] = 0.0
        mass -= pc
    # No child accepted: draw from what is left (inverse CDF over the vocabulary).
    target = uniforms[i_draw] * mass
    i_draw += 1
    acc = 0.0
    last = -1
    for v in range(vocab):
        if left[v] > 0.0:
            acc += left[v]
            last = v
            if acc > target:
                return -1, v, i_draw
    if last < 0:
        # Every token with mass was drafted and rejected: probability 0 in exact arithmetic, reached
        # only through rounding in `mass`. Fall back to u's most likely token.
        last = np.argmax(p)
    return -1, last, i_draw


def warm_up() -> None:
    tokens, parents = np.zeros(2, np.int32), np.array([-1, 0], np.int32)
    greedy_accept(tokens, parents, tokens, 2)
    sample_step(tokens, parents, 2, 0, np.full(4, 0.25, np.float32), np.zeros(3), 0, np.zeros(4))
