"""The output head of a tree forward on CPU: `weight @ hidden.T` instead of `F.linear(hidden, weight)`.

A causal LM's forward is its decoder (`model.get_decoder()`) followed by the output projection
(`model.get_output_embeddings()`, `logits = hidden @ W.T`). On CPU, torch runs that projection of a
few rows through MKL's GEMM, which copies (packs) all of W for every call, and one row through
MKL's GEMV. For SmolLM2's 49,152 x 576 head (fp32, this project's 2-core AMD EPYC; median ms):

    rows                     1     2     3     4     6     8    16    32    64
    F.linear(hidden, W)   11.5  24.5  37.4  17.4  23.2  16.6  19.2  26.2  41.9
    W @ hidden.T          11.2   4.2   5.0   4.9   8.2  10.6  15.5  21.4  37.2

so `W @ hidden.T` (the same products, W read in place) is used for trees, and a one-row verify
computes two identical rows where the machine's 2-row GEMM beats its GEMV (timed once, at
construction: 3.5-5.8 ms vs 10.4 here; on other CPUs GEMV may win). A tree of 4-8 nodes costs ~12%
less to verify, a one-node step ~10% less.

Only the model's public modules are called; nothing is patched. Whether decoder + head equals the
model's forward is not assumed: `checked_split_head` runs both on a small tree-masked batch, as
`verify` calls them, and returns None (use the model's forward) for any model where they differ
(logit scaling or soft-capping, a head that is not a plain Linear, a forward that drops or rewrites
the mask — which the tree self-check then refuses — or does anything else besides decoder + head).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from draftcore.tree import DraftTree

from .masks import tree_forward_inputs
from .selfcheck import relative_error


class SplitHead:
    """Calls the decoder, then projects its last hidden states with `weight @ hidden.T` (+ bias).

    pad_single_row: compute a one-row projection as two identical rows (a GEMM, not a GEMV).
    """

    def __init__(self, decoder, head: torch.nn.Linear, pad_single_row: bool = False):
        self._decoder = decoder
        self._head = head
        self.pad_single_row = pad_single_row

    def __call__(self, **forward_kwargs) -> torch.Tensor:
        """[n, vocab] logits of the first (only) sequence; the kwargs are the model forward's."""
        hidden = self._decoder(**forward_kwargs).last_hidden_state[0]     # [n, hidden]
        n = hidden.shape[0]
        if n == 1 and self.pad_single_row:
            hidden = hidden.repeat(2, 1)  # a real copy: an expand()ed row is slower than either
        # [vocab, n] then transposed: a strided view is fine for argmax and for .numpy()
        logits = torch.matmul(self._head.weight, hidden.T).T[:n]
        if self._head.bias is not None:
            logits = logits + self._head.bias
        return logits


def checked_split_head(model, device: torch.device, dtype: torch.dtype, vocab_size: int, tolerance: float):
    """A SplitHead when it applies (CPU, a decoder and a plain Linear head) and reproduces the
    model's own logits on a small tree within `tolerance` (relative to the largest logit); None
    otherwise, and the verifier then calls the model's forward as it is."""
    if device.type != "cpu":
        return None  # GPU GEMMs read the weight in place already: nothing to gain
    decoder = decoder_of(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or type(head) is not torch.nn.Linear:
        return None
    split = SplitHead(decoder, head)
    tree = DraftTree.build(np.random.default_rng(0).integers(0, vocab_size, 5), [-1, 0, 1, 0, 3])
    forward = dict(tree_forward_inputs(tree, 0, dtype, device), use_cache=False)
    try:
        with torch.inference_mode():
            want = model(**forward).logits[0].float().cpu().numpy()
            got = split(**forward).float().cpu().numpy()
    except Exception:  # a decoder that needs more than the model forward's arguments
        return None
    if got.shape != want.shape or not relative_error(got, want) <= tolerance:
        return None
    split.pad_single_row = two_rows_beat_one(head.weight)
    return split


def decoder_of(model):
    """`model.get_decoder()` when the model has one distinct from itself, else None."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    return None if decoder is model else decoder


def two_rows_beat_one(weight: torch.Tensor, reps: int = 3) -> bool:
    """Whether `weight @ x.T` of two rows takes less time than of one on this machine (medians of
    `reps` interleaved runs after one warm-up of each)."""
    one = torch.ones(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    two = one.repeat(2, 1)
    seconds = {1: [], 2: []}
    with torch.inference_mode():
        for rep in range(reps + 1):
            for rows, x in ((1, one), (2, two)):
                start = time.perf_counter()
                torch.matmul(weight, x.T)
                if rep:
                    seconds[rows].append(time.perf_counter() - start)
    return float(np.median(seconds[2])) < float(np.median(seconds[1]))
