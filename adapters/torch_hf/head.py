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

Where oneDNN can take them (packed_linear.py: float32, a torch build with oneDNN, the copies fit in
memory, the logits match and it measures faster at construction), the decoder's and the head's
Linear layers run instead through oneDNN on weights packed once: 2x faster again for 8-16 rows.
Trees of up to `SplitHead.weight_major_rows` nodes run the decoder's Linear layers as `W @ x.T`
(weight_major.py) instead, packed weights or not, where that measured faster at construction: which
of the three wins at which size changes with the machine's state (`_packed_plan`).

Only the model's public modules are called; nothing is patched. Whether decoder + head equals the
model's forward is not assumed: `checked_split_head` runs both on a small tree-masked batch, as
`verify` calls them, and returns None (use the model's forward) for any model where they differ
(logit scaling or soft-capping, a head that is not a plain Linear, a forward that drops or rewrites
the mask — which the tree self-check then refuses — or does anything else besides decoder + head).
"""
from __future__ import annotations

from contextlib import nullcontext
from functools import partial

import numpy as np
import torch

from draftcore.errors import ConfigError
from draftcore.selfcheck import relative_error
from draftcore.tree import DraftTree

from .masks import tree_forward_inputs
from . import packed_linear
from .timing import interleaved_medians
from .weight_major import WeightMajorLinear, faster_rows, leading_wins, weight_major_product


class SplitHead:
    """Calls the decoder, then projects its last hidden states with `weight @ hidden.T` (+ bias).

    pad_single_row: compute a one-row projection as two identical rows (a GEMM, not a GEMV).
    weight_major_rows: forwards of up to this many tokens run the decoder inside
        `WeightMajorLinear` (weight_major.py: its Linear layers as `W @ x.T` too); 0 never.
    packed: a `packed_linear.PackedLinears` of the decoder and head: every larger forward runs
        their Linear layers through oneDNN on the packed weights.
    """

    def __init__(self, decoder, head: torch.nn.Linear, pad_single_row: bool = False, weight_major_rows: int = 0,
                 packed: "packed_linear.PackedLinears | None" = None):
        self._decoder = decoder
        self._head = head
        self.pad_single_row = pad_single_row
        self.weight_major_rows = weight_major_rows
        self.packed = packed

    def __call__(self, **forward_kwargs) -> torch.Tensor:
        """[n, vocab] logits of the first (only) sequence; the kwargs are the model forward's."""
        rows = forward_kwargs["input_ids"].shape[-1]
        if self.packed is not None and rows > self.weight_major_rows:
            with self.packed.mode():
                hidden = self._decoder(**forward_kwargs).last_hidden_state[0]
            logits = self.packed.linear(hidden, self._head.weight, self._head.bias)
            if logits is not None:
                return logits
        else:
            with WeightMajorLinear() if rows <= self.weight_major_rows else nullcontext():
                hidden = self._decoder(**forward_kwargs).last_hidden_state[0]     # [n, hidden]
        # a strided [n, vocab] view: fine for argmax and for .numpy()
        return weight_major_product(hidden, self._head.weight, self._head.bias, self.pad_single_row)


def checked_split_head(model, device: torch.device, dtype: torch.dtype, vocab_size: int, tolerance: float,
                       weight_major_rows: int | None = None, packed: bool | None = None):
    """A SplitHead when it applies (CPU, a decoder and a plain Linear head) and reproduces the
    model's own logits on a small tree within `tolerance` (relative to the largest logit); None
    otherwise, and the verifier then calls the model's forward as it is.

    weight_major_rows: the SplitHead's (None: measured, by `_packed_plan` where the weights are
    packed, else by `weight_major.faster_rows`); 0 as well when the decoder inside
    `WeightMajorLinear` does not reproduce the model's logits.
    packed: run the Linear layers of forwards larger than weight_major_rows through oneDNN on
    packed weights (packed_linear.py): True (ConfigError where it cannot), False (never), None
    (where oneDNN has the weights' dtype, their copies fit in memory, the logits match and it
    measures faster than going without: `_packed_plan`)."""
    def unsplit(why: str):
        if packed:
            raise ConfigError(f"packed_linear: True, but {why}; pass packed_linear=None or False")
        return None

    if device.type != "cpu":
        return unsplit(f"the model is on {device.type}")  # GPU GEMMs read the weight in place already
    decoder = decoder_of(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or type(head) is not torch.nn.Linear:
        return unsplit("the model has no decoder and plain Linear head to call one after the other")
    tree = DraftTree.build(np.random.default_rng(0).integers(0, vocab_size, 5), [-1, 0, 1, 0, 3])
    forward = dict(tree_forward_inputs(tree, 0, dtype, device), use_cache=False)
    try:
        with torch.inference_mode():
            want = model(**forward).logits[0].float().cpu().numpy()
    except Exception:  # left to the verifier's own calls, which report it
        return unsplit("the model's forward failed on a tree")

    def reproduces(split: SplitHead) -> bool:
        try:
            with torch.inference_mode():
                got = split(**forward).float().cpu().numpy()
        except Exception:  # a decoder that needs more than the model forward's arguments
            return False
        return got.shape == want.shape and relative_error(got, want) <= tolerance

    if not reproduces(SplitHead(decoder, head)):
        return unsplit("the model's forward is more than its decoder and head")
    pad_single_row = two_rows_beat_one(head.weight)
    if weight_major_rows != 0 and not reproduces(SplitHead(decoder, head, weight_major_rows=len(tree))):
        weight_major_rows = 0
    linears = _checked_packed(decoder, head, packed, reproduces, unsplit)
    if linears is not None:
        rows = _packed_plan(decoder, head, linears, vocab_size, device, weight_major_rows, forced=bool(packed))
        if rows is not None:
            packed_linear.share(decoder, head, linears)
            return SplitHead(decoder, head, pad_single_row, rows, linears)
    if weight_major_rows is None:
        weight_major_rows = faster_rows(decoder, vocab_size, device)
    return SplitHead(decoder, head, pad_single_row, weight_major_rows)


def _checked_packed(decoder, head, packed, reproduces, refuse):
    """Packed copies of the Linear weights that reproduce the model's logits (module docstring of
    packed_linear.py), or None; `refuse(why)` is called where packing was asked for (True) and
    cannot be done."""
    if packed is False:
        return None
    why = None
    nbytes = packed_linear.linear_bytes(decoder, head)
    if not packed_linear.available():
        why = "this torch build has no oneDNN Linear operators"
    elif not nbytes:
        why = "the model has no float32 CPU Linear layers"
    elif packed is None and not packed_linear.fits_in_memory(nbytes):
        return None   # a second copy of the weights would crowd the machine
    if why is None:
        linears = packed_linear.shared(decoder, head)
        if linears is not None:
            return linears   # checked and chosen for an earlier verifier of this model
        linears = packed_linear.PackedLinears.of(decoder, head)
        if not reproduces(SplitHead(decoder, head, packed=linears)):
            why = "the model's logits through oneDNN differ from its own forward"
    return refuse(why) if why is not None else linears


def _packed_plan(decoder, head, linears, vocab_size, device, weight_major_rows, forced: bool,
                 sizes=(1, 2, 4, 8, 16), margin: float = 0.9) -> int | None:
    """How the packed weights should be used, from the decoder and head timed at `sizes` three ways
    (torch's Linear, `W @ x.T` where allowed, the packed weights): the number of rows up to which a
    forward still runs unpacked, as `W @ x.T` (larger ones run packed), or None where packing
    should not be used.

    Each way wins at some sizes: on this project's 2-core EPYC the packed weights once took a
    one-token forward from 27 to 21 ms, and in a later, slower state of the same machine tied with
    `W @ x.T` at one token (~50 ms) while still cutting 8 tokens from ~70 to ~53 ms. So the split
    is measured: weight_major_rows (None: the split with the least total time over `sizes`;
    otherwise as given). Unless `forced`, packing is used only where that plan's total time is at
    most `margin` of the best plan without it (`W @ x.T` up to the sizes where it beats torch's
    Linear by `margin`, as weight_major.faster_rows picks): the copies cost memory, and the margin
    keeps a tie from buying them by chance.

    The sizes reach 16 tokens, a tree the auto budget verifies on code, because packing's gain grows
    with the size. Raced only up to 8 on SmolLM2 here, packing's total sat at the margin (0.905 of
    the plan without it), and fresh constructions took it 2 times in 6; yet in steady state the
    packed plan verified 16 nodes in 59 ms against 84 ms unpacked, and tied at 1 and 2."""
    if forced and weight_major_rows is not None:
        return weight_major_rows   # nothing left to choose (a pool's sibling verifiers take the first's)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, vocab_size, max(sizes))).to(device)[None]
    modes = ["torch", "packed"] + (["weight-major"] if weight_major_rows != 0 else [])
    splits = {"torch": SplitHead(decoder, head), "packed": SplitHead(decoder, head, packed=linears),
              "weight-major": SplitHead(decoder, head, weight_major_rows=max(sizes))}

    def forward(n, mode):
        splits[mode](input_ids=ids[:, :n], use_cache=False)

    seconds = interleaved_medians({(n, mode): partial(forward, n, mode) for n in sizes for mode in modes})

    def total(unpacked_rows: int, large: str) -> float:
        return sum(seconds[n, "weight-major" if n <= unpacked_rows else large] for n in sizes)

    candidates = [0, *sizes] if weight_major_rows is None else [weight_major_rows]
    rows = min(candidates, key=lambda k: total(k, "packed"))
    if forced:
        return rows
    unpacked_rows = weight_major_rows
    if unpacked_rows is None:   # as faster_rows picks
        unpacked_rows = leading_wins(seconds, sizes, "weight-major", "torch", margin)
    return rows if total(rows, "packed") <= margin * total(unpacked_rows, "torch") else None


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
