"""Construction-time proof that a model honours the tree mask (and that commit gathers correctly).

A model whose forward drops or rebuilds the 4-D attention mask still runs, still returns logits of
the right shape, and is wrong: every node would also see its cousins. One small branching tree
catches that::

    prompt p0..p5 | r ── a1 ── a2        tokens  [r, a1, a2, b1, b2]
                    └─── b1 ── b2        parents [-1, 0,  1,  0,  3]

b1 and b2 come after a1 and a2 in the batch, so a model that falls back to a causal mask lets them
see branch a. The tree logits are compared with plain causal forwards over p + [r, a1, a2] and
p + [r, b1, b2]; then commit([0, 3, 4]) (a gather, not a slice) and one more verify of x is
compared with a plain forward over p + [r, b1, b2, x].

Tolerance follows DESIGN.md "Numerics": a k-token forward never matches k one-token forwards bit
for bit. The error is measured relative to the largest reference logit, and the bound per dtype is
~10x what a correct forward shows, while a model that ignores the mask is off by O(1) relative.
"""
from __future__ import annotations

import numpy as np
import torch

from draftcore.errors import BackendError, ConfigError
from draftcore.tree import DraftTree

# Bound on max |tree - plain| / max(1, max |plain|) for a correct forward. Measured on this tree
# (prompt of 6, seeds 0-5, SmolLM2-135M and tiny random Llamas, sdpa and eager): correct forwards
# reach 5e-6 in fp32, 4e-3 in fp16, 3e-2 in bf16; a model that ignores the mask is off by >= 0.09
# (0.23 on SmolLM2).
RELATIVE_TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}
_N_CHECK_TOKENS = 13  # prompt 6 + tree 5 + 1 after the commit, plus margin


def check_tree_attention(verifier) -> None:
    """Raise BackendError naming the model class if tree-masked logits disagree with plain ones.

    Leaves `verifier` empty (n_past 0, no cache) whether it passes or raises.
    """
    name = type(verifier.model).__name__
    if verifier.max_context < _N_CHECK_TOKENS:
        raise ConfigError(f"max_context: the self-check needs {_N_CHECK_TOKENS} positions, got "
                          f"{verifier.max_context}; pass self_check=False for such a small context")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, verifier.vocab_size, 6).astype(np.int32)
    r, a1, a2, b1, b2, x = rng.integers(0, verifier.vocab_size, 6).astype(np.int32)
    tree = DraftTree.build([r, a1, a2, b1, b2], [-1, 0, 1, 0, 3])
    try:
        verifier.prefill(prompt, "logits")
        got_tree = verifier.verify(tree, "logits")                       # [5, vocab]
        verifier.commit(np.array([0, 3, 4], np.int32))
        got_after = verifier.verify(DraftTree.root_only(int(x)), "logits")  # [1, vocab]
        want_a = verifier.plain_logits(np.r_[prompt, r, a1, a2])[-3:]
        want_b = verifier.plain_logits(np.r_[prompt, r, b1, b2, x])[-4:]
    except BackendError:
        raise
    except Exception as exc:  # a kernel that rejects the 4-D mask, a cache it cannot use, ...
        raise BackendError(f"{name}: the tree-mask self-check forward failed with "
                           f"{type(exc).__name__}: {exc}") from exc
    finally:
        verifier.reset()

    checks = [
        ("tree branch a (nodes 0, 1, 2)", got_tree[:3], want_a),
        ("tree branch b (nodes 3, 4)", got_tree[3:], want_b[1:3]),
        ("verify after commit([0, 3, 4])", got_after, want_b[3:]),
    ]
    tol = tolerance(verifier.dtype)
    for what, got, want in checks:
        err = relative_error(got, want)
        if not err <= tol:  # also catches NaN
            raise BackendError(
                f"{name}: tree-masked logits disagree with plain causal forwards at {what}: "
                f"relative error {err:.3g} > {tol:g} ({verifier.dtype}). The model ignores or rebuilds "
                f"the 4-D attention mask (attn_implementation="
                f"{getattr(verifier.model.config, '_attn_implementation', None)!r}); load it with "
                f"attn_implementation='sdpa' or 'eager', or pass self_check=False at your own risk.")


def tolerance(dtype: torch.dtype) -> float:
    """RELATIVE_TOLERANCE for `dtype` (float32's for any other dtype)."""
    return RELATIVE_TOLERANCE.get(dtype, RELATIVE_TOLERANCE[torch.float32])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max(1, max |want|): float32 arrays of equal shape."""
    return float(np.abs(got - want).max() / max(1.0, float(np.abs(want).max())))
