"""Acceptance: which root-to-node path of a verified tree is kept, and the model's next token.

Only the tree's candidates are walked (nodes 0 .. n_walk - 1, the root first): lookahead nodes ride
in the verify to be observed, never accepted (draftcore.tree, "Node roles").

Greedy: walk from the root; at node u the model's token is argmax(out[u]); move to the child of u
holding that token, else stop. The emitted tokens are the path's drafted tokens plus argmax at the
last node, so every step emits at least one token (the model's own).

Sampling, keyed by position: the token at output position t is drawn from its processed
distribution p_t by inverse CDF with its own uniform u_t (`position_uniforms`), a pure function of
the request's key and t. At node u (depth d below a root that predicts position t0) the walk
draws the model's token x = inverse_cdf(p_u, u_{t0 + d}); it moves to u's child holding x, else it
stops and emits x. Why it is exact: every emitted token is a plain draw from its prefix's p with a
fresh uniform, whatever was drafted; a drafted child only saves the forward that would have
computed the same p. It also makes the output a function of the seed, the model and the options
alone: the same seed gives the same tokens with any drafter, any budget, or none (budget=0), up to
the logits' rounding, which moves a draw only when u_t falls within that rounding of a CDF boundary.
The chance that some child is accepted is the children's total mass, as with Fu et al.'s walk
(accept child c with p(c) / mass left, else remove c's mass; "Lookahead Decoding", 2024, Alg. 4):
for deterministic drafts the two accept equally often, but that walk's draws follow the tree.

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
def sample_step(tokens, parents, n_walk, u, p, uniform):
    """One node of the keyed sampling walk: (child, token). token: the draw from p (float32[vocab],
    non-negative weights, normalised here) by inverse CDF at `uniform`; child: the first of u's
    children among nodes u+1 .. n_walk-1 holding that token, or -1 (the walk ends and emits token).
    """
    sums = _block_sums(p)
    mass = 0.0
    for b in range(sums.shape[0]):
        mass += sums[b]
    target = uniform * mass
    token = _inverse_cdf(p, sums, target)
    for c in range(u + 1, n_walk):
        if parents[c] == u and tokens[c] == token:
            return c, token
    return -1, token


_BLOCK = 256   # tokens per partial sum: the sums vectorise, the scan for the draw reads one block


@nb.njit(cache=True, fastmath=True)
def _block_sums(p):
    """float64[blocks]: the mass of each _BLOCK tokens of p (fastmath, and a constant trip count
    per full block, so the sums vectorise: 4 us instead of 40 over a 49k vocabulary; the draw only
    needs the same sums on every call, which one compiled kernel gives)."""
    vocab = p.shape[0]
    n_full = vocab // _BLOCK
    sums = np.empty(n_full + (1 if vocab % _BLOCK else 0), np.float64)
    for b in range(n_full):
        total = 0.0
        first = b * _BLOCK
        for i in range(_BLOCK):
            total += np.float64(p[first + i])
        sums[b] = total
    if vocab % _BLOCK:
        total = 0.0
        for v in range(n_full * _BLOCK, vocab):
            total += np.float64(p[v])
        sums[n_full] = total
    return sums


@nb.njit(cache=True)
def _inverse_cdf(p, sums, target):
    """The first token whose cumulative mass exceeds `target`: the block where the running sum of
    `sums` passes it, then that block token by token. Rounding between a block's sum and its tokens
    one by one can leave the target unreached inside the block (or, at u within 1e-16 of 1, in the
    last one): the last token with mass before it is drawn then."""
    acc = 0.0
    last = -1
    for b in range(sums.shape[0]):
        if sums[b] <= 0.0:
            continue
        if acc + sums[b] > target:
            for v in range(b * _BLOCK, min(p.shape[0], (b + 1) * _BLOCK)):
                if p[v] > 0.0:
                    acc += p[v]
                    last = v
                    if acc > target:
                        return v
            return last
        acc += sums[b]
        for v in range(min(p.shape[0], (b + 1) * _BLOCK) - 1, b * _BLOCK - 1, -1):
            if p[v] > 0.0:
                last = v
                break
    return last if last >= 0 else np.argmax(p)   # no mass at all: the processors refuse such rows first


# SplitMix64 (Steele, Lea & Flood, 2014): its n-th output is a hash of (seed, n), so a uniform
# for any position is one call, in any order, with no state to carry between steps.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@nb.njit(cache=True)
def position_uniforms(key, first, n):
    """float64[n]: the uniforms in [0, 1) of output positions first .. first + n - 1 under `key`
    (uint64): SplitMix64's outputs number first + 1 .., each with 53 random bits."""
    out = np.empty(n, np.float64)
    for i in range(n):
        z = key + np.uint64(first + i + 1) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z = z ^ (z >> np.uint64(31))
        out[i] = (z >> np.uint64(11)) * (1.0 / 9007199254740992.0)
    return out


def warm_up() -> None:
    tokens, parents = np.zeros(2, np.int32), np.array([-1, 0], np.int32)
    greedy_accept(tokens, parents, tokens, 2)
    sample_step(tokens, parents, 2, 0, np.full(4, 0.25, np.float32), 0.5)
    position_uniforms(np.uint64(1), 0, 2)
