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

Trees of up to `SplitHead.weight_major_rows` nodes also run the decoder's Linear layers as
`W @ x.T` (weight_major.py), where that measured faster at construction.

Only the model's public modules are called; nothing is patched. Whether decoder + head equals the
model's forward is not assumed: `checked_split_head` runs both on a small tree-masked batch, as
`verify` calls them, and returns None (use the model's forward) for any model where they differ
(logit scaling or soft-capping, a head that is not a plain Linear, a forward that drops or rewrites
the mask — which the tree self-check then refuses — or does anything else besides decoder + head).
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch

from draftcore.selfcheck import relative_error
from draftcore.tree import DraftTree

from .masks import tree_forward_inputs
from .timing import interleaved_medians
from .weight_major import WeightMajorLinear, faster_rows, weight_major_product


class SplitHead:
    """Calls the decoder, then projects its last hidden states with `weight @ hidden.T` (+ bias).

    pad_single_row: compute a one-row projection as two identical rows (a GEMM, not a GEMV).
    weight_major_rows: forwards of up to this many tokens run the decoder inside
        `WeightMajorLinear` (weight_major.py: its Linear layers as `W @ x.T` too); 0 never.
    """

    def __init__(self, decoder, head: torch.nn.Linear, pad_single_row: bool = False, weight_major_rows: int = 0):
        self._decoder = decoder
        self._head = head
        self.pad_single_row = pad_single_row
        self.weight_major_rows = weight_major_rows

    def __call__(self, **forward_kwargs) -> torch.Tensor:
        """[n, vocab] logits of the first (only) sequence; the kwargs are the model forward's."""
        weight_major = forward_kwargs["input_ids"].shape[-1] <= self.weight_major_rows
        with WeightMajorLinear() if weight_major else nullcontext():
            hidden = self._decoder(**forward_kwargs).last_hidden_state[0]     # [n, hidden]
        # a strided [n, vocab] view: fine for argmax and for .numpy()
        return weight_major_product(hidden, self._head.weight, self._head.bias, self.pad_single_row)


def checked_split_head(model, device: torch.device, dtype: torch.dtype, vocab_size: int, tolerance: float,
                       weight_major_rows: int | None = None):
    """A SplitHead when it applies (CPU, a decoder and a plain Linear head) and reproduces the
    model's own logits on a small tree within `tolerance` (relative to the largest logit); None
    otherwise, and the verifier then calls the model's forward as it is.

    weight_major_rows: the SplitHead's (None: measured, `weight_major.faster_rows`); 0 as well when
    the decoder inside `WeightMajorLinear` does not reproduce the model's logits."""
    if device.type != "cpu":
        return None  # GPU GEMMs read the weight in place already: nothing to gain
    decoder = decoder_of(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or type(head) is not torch.nn.Linear:
        return None
    tree = DraftTree.build(np.random.default_rng(0).integers(0, vocab_size, 5), [-1, 0, 1, 0, 3])
    forward = dict(tree_forward_inputs(tree, 0, dtype, device), use_cache=False)
    try:
        with torch.inference_mode():
            want = model(**forward).logits[0].float().cpu().numpy()
    except Exception:  # left to the verifier's own calls, which report it
        return None

    def reproduces(split: SplitHead) -> bool:
        try:
            with torch.inference_mode():
                got = split(**forward).float().cpu().numpy()
        except Exception:  # a decoder that needs more than the model forward's arguments
            return False
        return got.shape == want.shape and relative_error(got, want) <= tolerance

    if not reproduces(SplitHead(decoder, head)):
        return None
    if weight_major_rows != 0 and not reproduces(SplitHead(decoder, head, weight_major_rows=len(tree))):
        weight_major_rows = 0
    if weight_major_rows is None:
        weight_major_rows = faster_rows(decoder, vocab_size, device)
    return SplitHead(decoder, head, two_rows_beat_one(head.weight), weight_major_rows)


def decoder_of(model):
    """`model.get_decoder()` when the model has one distinct from itself, else None."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    return None if decoder is model else decoder


def two_rows_beat_one(weight: torch.Tensor, reps: int = 3) -> bool:
    """Whether `weight @ x.T` of two rows takes less time than of one on this machine
    (`timing.interleaved_medians`)."""
    one = torch.ones(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    two = one.repeat(2, 1)
    seconds = interleaved_medians({1: lambda: torch.matmul(weight, one.T), 2: lambda: torch.matmul(weight, two.T)},
                                  reps)
    return seconds[2] < seconds[1]
