"""The tree attention mask, in the one form every HF attention implementation reads the same way.

A 4-D mask is handed to the attention kernels untouched (transformers' mask builder returns a 4-D
tensor as it is). `sdpa` reads a bool mask or an additive float mask; `eager` ADDS the mask to the
scores, so a bool mask there silently turns "masked" into +0 / +1 and gives wrong logits. An additive
float mask (0 where allowed, dtype-min where not) is correct for both, so it is the only form built::

    columns:  0 .. n_past-1 (committed context) | n_past .. n_past+n-1 (tree nodes)
    row i:    0 0 0 ... 0                        | 0 where node j is i or an ancestor of i, else min
"""
from __future__ import annotations

import numpy as np
import torch


def tree_forward_inputs(tree, n_past: int, dtype: torch.dtype, device: torch.device) -> dict:
    """input_ids, position_ids and the additive attention_mask of one tree forward after n_past
    cached positions (the model-forward keyword arguments every tree forward passes)."""
    return dict(input_ids=torch.from_numpy(tree.tokens).to(device, torch.long)[None],
                position_ids=torch.from_numpy(tree.position_ids(n_past)).to(device)[None],
                attention_mask=tree_attention_mask(tree.ancestor_mask(), n_past, dtype, device))


def tree_attention_mask(ancestors: np.ndarray, n_past: int, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
    """Additive mask float[1, 1, n, n_past + n] of `dtype` on `device` for one tree forward.

    ancestors: bool[n, n], DraftTree.ancestor_mask() (row i sees column j iff j is i or its ancestor).
    The min value is torch.finfo(dtype).min rather than -inf: a row with every column at -inf would
    softmax to NaN, and min stays finite when a kernel adds it to a score.
    """
    n = ancestors.shape[0]
    mask = torch.zeros((1, 1, n, n_past + n), dtype=dtype, device=device)
    hidden = torch.from_numpy(~ancestors).to(device)
    mask[0, 0, :, n_past:].masked_fill_(hidden, torch.finfo(dtype).min)
    return mask
