"""The HF side of the construction-time tree-mask check: a tolerance per dtype and the advice to give.

The check itself is the core's backend-neutral `draftcore.selfcheck.check_tree_attention`: one
small branching tree verified through the Verifier protocol and compared with the same verifier's
one-token-per-forward plain decoding. A model whose forward drops or rebuilds the 4-D attention
mask still runs and returns logits of the right shape, and is wrong (every node also sees its
cousins); that check catches it, and this module says how to fix it.

A k-token forward never matches k one-token forwards bit for bit: the reductions run in another
order and round at every step (docs/design.md, section "Numerics"). So the bound, relative to
the largest reference logit, sits between what a correct forward shows in each dtype and what a
model that ignores the mask shows (RELATIVE_TOLERANCE below: ~250x and ~6x above the first in fp32
and fp16, 1.7x in bf16, where the two are closest).
"""
from __future__ import annotations

import torch

from draftcore.errors import ConfigError
from draftcore.selfcheck import N_POSITIONS
from draftcore.selfcheck import check_tree_attention as check_through_protocol

# Bound on max |tree - plain| / max(1, max |plain|) for a correct forward, plain being one token per
# forward. Measured on CPU, sdpa and eager, on the check's tree with its own tokens and with 7 other
# random token draws (SmolLM2-135M), and on tiny random Llamas (seeds 0-5):
#                      fp32      fp16      bf16
#   correct forward    <4e-6     <3.3e-3   <3.5e-2   (the check's own tokens: 2e-6, 2.6e-3, 1.0e-2)
#   mask dropped       >0.084    >0.084    >0.077    (tiny Llamas: >0.54; SmolLM2, other draws: >0.2)
# bf16 leaves the least room on both sides; a bound above ~0.07 would let a mask-dropping SmolLM2 pass.
RELATIVE_TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}


def check_tree_attention(verifier) -> float:
    """Raise BackendError naming the model class if `verifier` (an HFVerifier) gives tree-masked
    logits that disagree with plain decoding; return the largest relative error otherwise.

    Leaves `verifier` empty (n_past 0, no cache) whether it passes or raises.
    """
    if verifier.max_context < N_POSITIONS:
        raise ConfigError(f"max_context: the tree-mask self-check needs {N_POSITIONS} positions, got "
                          f"{verifier.max_context}; pass self_check=False for such a small context")
    attn = getattr(verifier.model.config, "_attn_implementation", None)
    hint = (f"With attn_implementation={attn!r} ({verifier.dtype}) the model's forward drops or rewrites the "
            f"4-D attention mask draftcore passes; load it with attn_implementation='sdpa' or 'eager', "
            f"or pass self_check=False at your own risk.")
    try:
        return check_through_protocol(verifier, tolerance(verifier.dtype, verifier.device),
                                      name=type(verifier.model).__name__, hint=hint)
    finally:
        verifier.reset()


def tolerance(dtype: torch.dtype, device=None) -> float:
    """RELATIVE_TOLERANCE for `dtype` (float32's for any other dtype). float32 on CUDA with TF32
    matmuls allowed (`torch.set_float32_matmul_precision("high")`, common in serving code) rounds
    with fp16's 10-bit mantissa, so it gets fp16's bound: still 4x under a mask-dropping forward."""
    if dtype == torch.float32 and device is not None and torch.device(device).type == "cuda" \
            and torch.get_float32_matmul_precision() != "highest":
        return RELATIVE_TOLERANCE[torch.float16]
    return RELATIVE_TOLERANCE.get(dtype, RELATIVE_TOLERANCE[torch.float32])
