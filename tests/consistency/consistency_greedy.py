"""Plain greedy decoding through any verifier, and the comparison that allows for near-ties."""
import warnings

import numpy as np

from draftcore.tree import DraftTree

NEAR_TIE = 1e-3   # a top-2 logit gap below this may flip between two correct fp32 forwards (docs/design.md)


def plain_greedy(verifier, prompt, n_new):
    """The verifier's own plain greedy decoding: prefill, then one root-only verify per token.
    Returns (tokens, the top-2 logit gap that chose each token)."""
    logits = verifier.prefill(np.asarray(prompt, np.int32), 1)[1][0]
    tokens, gaps = [], []
    for _ in range(n_new):
        top2 = np.sort(logits)[-2:]
        tokens.append(int(logits.argmax()))
        gaps.append(float(top2[1] - top2[0]))
        logits = verifier.verify(DraftTree.root_only(tokens[-1]), 1)[1][0]
        verifier.commit(np.array([0], np.int32))
    return tokens, gaps


def assert_same_greedy(got, want, gaps, what, tie=NEAR_TIE):
    """Equal token for token, except that a first mismatch at a near-tie (reported as a warning)
    ends the comparison."""
    got, want = [int(t) for t in got], [int(t) for t in want]
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            assert gaps[i] < tie, f"{what}: token {i} differs ({a} vs {b}), top-2 gap {gaps[i]:.3g}"
            warnings.warn(f"{what}: near-tie at token {i} (gap {gaps[i]:.2g}); compared {i} tokens")
            return
    assert len(got) == len(want), f"{what}: {len(got)} tokens vs {len(want)}"
