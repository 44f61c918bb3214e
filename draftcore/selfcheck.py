"""Construction-time proof that a verifier honours the tree mask and commits the right KV.

A backend whose forward drops or rebuilds the attention mask still runs, still returns results of
the right shape, and is wrong: every node would also see its cousins. One small branching tree,
run through the Verifier protocol alone (so every adapter runs the same check), catches that::

    prompt p0..p5 | r ── a1 ── a2        tokens  [r, a1, a2, b1, b2]
                    └─── b1 ── b2        parents [-1, 0,  1,  0,  3]

b1 and b2 come after a1 and a2 in the batch, so a backend that falls back to a causal mask lets
them see branch a. The tree's logits are compared with the same verifier's plain decoding, one
token per forward, over p + [r, a1, a2] and p + [r, b1, b2]; then commit([0, 3, 4]) (a gather,
not a slice) and one more verify of x is compared with plain decoding of p + [r, b1, b2, x]. The
argmax each verify returns must also be the argmax of the logits it returns (rows in node order).

The error is measured relative to the largest reference logit. A k-token forward never matches k
one-token forwards bit for bit (the docs' numerics policy), so each adapter passes its tolerance:
about 10x what a correct forward shows in its dtype, while a backend that ignores the mask is off by
O(1) relative (>= 0.09 on the models measured).
"""
from __future__ import annotations

import numpy as np

from .errors import BackendError, DraftcoreError
from .tree import DraftTree

N_POSITIONS = 13  # prompt 6 + tree 5 + 1 after the commit, plus margin


def check_tree_attention(verifier, tolerance: float, *, name: str | None = None, hint: str = "",
                         draws: int = 2) -> float:
    """Raise BackendError naming `name` (default: the verifier's class) if tree-masked logits
    disagree with plain decoding by more than `tolerance` (relative); return the largest error.

    Runs the check on `draws` random token sets: how much a node that sees its cousins is off
    depends on the tokens (SmolLM2 with the mask dropped: 0.08 to 0.4 relative by draw), so the
    worst of two is a much clearer signal than one, for a few more forwards. Uses only prefill /
    verify / commit: the verifier is left holding the check's last sequence (the next prefill
    replaces it). `hint`: what to tell the user when the check fails.
    """
    return max(_check_one_draw(verifier, tolerance, name or type(verifier).__name__, hint, seed)
               for seed in range(draws))


def _check_one_draw(verifier, tolerance: float, name: str, hint: str, seed: int) -> float:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, verifier.vocab_size, 6).astype(np.int32)
    r, a1, a2, b1, b2, x = (int(t) for t in rng.integers(0, verifier.vocab_size, 6))
    tree = DraftTree.build([r, a1, a2, b1, b2], [-1, 0, 1, 0, 3])
    try:
        verifier.prefill(prompt, 0)
        tree_tokens, tree_logits = verifier.verify(tree, len(tree))
        verifier.commit(np.array([0, 3, 4], np.int32))
        after_tokens, after_logits = verifier.verify(DraftTree.root_only(x), 1)
        plain_a = plain_decoding_logits(verifier, prompt, [r, a1, a2])
        plain_b = plain_decoding_logits(verifier, prompt, [r, b1, b2, x])
    except DraftcoreError:
        raise
    except Exception as exc:  # a kernel that rejects the mask, a cache it cannot use, ...
        raise BackendError(f"{name}: the tree-mask self-check forward failed with "
                           f"{type(exc).__name__}: {exc}") from exc

    for what, tokens, logits in (("tree", tree_tokens, tree_logits), ("verify after commit", after_tokens, after_logits)):
        if not np.array_equal(np.asarray(tokens), np.asarray(logits).argmax(axis=1)):
            raise BackendError(f"{name}: verify's tokens are not the argmax of its logits rows ({what}: tokens "
                               f"{np.asarray(tokens).tolist()}, argmax {np.asarray(logits).argmax(axis=1).tolist()}); "
                               f"both must be per node, in node order")
    checks = [
        ("tree branch a (nodes 0, 1, 2)", tree_logits[:3], plain_a),
        ("tree branch b (nodes 3, 4)", tree_logits[3:], plain_b[1:3]),
        ("verify after commit([0, 3, 4])", after_logits, plain_b[3:]),
    ]
    worst = 0.0
    for what, got, want in checks:
        err = relative_error(got, want)
        if not err <= tolerance:  # also catches NaN
            raise BackendError(
                f"{name}: tree-masked logits disagree with plain decoding at {what}: relative error "
                f"{err:.3g} > {tolerance:g}. The backend ignores or rebuilds the tree attention mask, or "
                f"commits the wrong KV.{(' ' + hint) if hint else ''}")
        worst = max(worst, err)
    return worst


def plain_decoding_logits(verifier, prompt: np.ndarray, tokens) -> np.ndarray:
    """float32[len(tokens), vocab]: the logits after prompt + tokens[:i + 1] for each i, decoded one
    token per forward (root-only verifies), as plain decoding runs the backend."""
    verifier.prefill(prompt, 0)
    rows = []
    for token in tokens:
        rows.append(verifier.verify(DraftTree.root_only(int(token)), 1)[1][0])
        verifier.commit(np.zeros(1, np.int32))
    return np.stack(rows)


def chain_against_one_token(verifier, context_tokens: int, length: int = 4, seed: int = 0) -> float:
    """The largest |logit| difference between a chain of `length` random tokens verified in one
    forward and the same tokens decoded one per forward, after `context_tokens` random cached tokens:
    what a verify at that context length changes against plain decoding (llama.cpp's split attention
    past 256 tokens, adapters/llamacpp/numerics.py). Leaves the verifier holding the context and the
    chain's tokens, committed."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, verifier.vocab_size, context_tokens).astype(np.int32)
    chain = rng.integers(3, verifier.vocab_size, length).astype(np.int32)
    verifier.prefill(prompt, 0)
    batch = verifier.verify(DraftTree.chain(int(chain[0]), chain[1:]), length)[1]
    return float(np.abs(batch - plain_decoding_logits(verifier, prompt, chain)).max())


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max(1, max |want|) over float arrays of equal shape."""
    return float(np.abs(got - want).max() / max(1.0, float(np.abs(want).max())))
