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
memory, the logits match), the decoder's and the head's Linear layers can run instead through oneDNN
on weights packed once; and the decoder's Linear layers can run as `W @ x.T` (weight_major.py). Which
of the three ways wins changes with the tree size, the machine and its state, so construction times
each at 1, 2, 4, 8 and 16 tokens and keeps, per size, the fastest (`SplitHead.ways`; `_linear_plan`).
On this project's second 2-core EPYC, for example (construction's medians, ms):

    tokens              1      2      4      8     16
    torch's Linear     79    102    131    138    175
    W @ x.T           107     95     98    126    174
    packed             95     98    106    120    156

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

from draftcore.errors import ConfigError, describe
from draftcore.selfcheck import relative_error
from draftcore.tree import DraftTree

from .masks import tree_forward_inputs
from . import packed_linear
from .timing import interleaved_medians
from .weight_major import WeightMajorLinear, weight_major_product

# How a split head's forward runs its Linear layers; the first, the framework's own, wins ties.
WAYS = ("torch", "weight-major", "packed")


class SplitHead:
    """Calls the decoder, then projects its last hidden states with `weight @ hidden.T` (+ bias).

    pad_single_row: compute a one-row projection as two identical rows (a GEMM, not a GEMV).
    ways: {tokens: way} (`WAYS`): a forward of n tokens runs the decoder's Linear layers the way of
        the smallest key >= n (of the largest key beyond it): torch's own, inside
        `WeightMajorLinear` (weight_major.py: as `W @ x.T`), or through oneDNN on `packed`. Default:
        torch's own at every size.
    packed: a `packed_linear.PackedLinears` of the decoder and head, for the "packed" ways.
    timings: construction's medians behind `ways`, {tokens: {way: ms}} (for reports).
    """

    def __init__(self, decoder, head: torch.nn.Linear, pad_single_row: bool = False,
                 ways: dict[int, str] | None = None, packed: "packed_linear.PackedLinears | None" = None,
                 timings: dict | None = None):
        self._decoder = decoder
        self._head = head
        self.pad_single_row = pad_single_row
        self.ways = dict(sorted((ways or {1: "torch"}).items()))
        self.packed = packed
        self.timings = timings or {}

    def way(self, rows: int) -> str:
        """How a forward of `rows` tokens runs its Linear layers."""
        for size, way in self.ways.items():
            if rows <= size:
                return way
        return way

    def __call__(self, **forward_kwargs) -> torch.Tensor:
        """[n, vocab] logits of the first (only) sequence; the kwargs are the model forward's."""
        way = self.way(forward_kwargs["input_ids"].shape[-1])
        if way == "packed" and self.packed is not None:
            with self.packed.mode():
                hidden = self._decoder(**forward_kwargs).last_hidden_state[0]
            logits = self.packed.linear(hidden, self._head.weight, self._head.bias)
            if logits is not None:
                return logits
        else:
            with WeightMajorLinear() if way == "weight-major" else nullcontext():
                hidden = self._decoder(**forward_kwargs).last_hidden_state[0]     # [n, hidden]
        # a strided [n, vocab] view: fine for argmax and for .numpy()
        return weight_major_product(hidden, self._head.weight, self._head.bias, self.pad_single_row)


def checked_linear_ways(value) -> dict[int, str] | None:
    """`HFVerifier(linear_ways=...)` as a {tokens: way} dict, or ConfigError naming what is wrong."""
    if value is None:
        return None
    expected = f"a non-empty dict of tokens (int >= 1) to one of {', '.join(WAYS)}"
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"linear_ways: expected {expected}, got {describe(value)}")
    ways = {}
    for size, way in value.items():
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1 or way not in WAYS:
            raise ConfigError(f"linear_ways: expected {expected}, got the entry {size!r}: {way!r}")
        ways[int(size)] = way
    return ways


def checked_split_head(model, device: torch.device, dtype: torch.dtype, vocab_size: int, tolerance: float,
                       ways: dict[int, str] | None = None, packed: bool | None = None):
    """A SplitHead when it applies (CPU, a decoder and a plain Linear head) and reproduces the
    model's own logits on a small tree within `tolerance` (relative to the largest logit); None
    otherwise, and the verifier then calls the model's forward as it is.

    ways: the SplitHead's {tokens: way} (`checked_linear_ways`), each way checked against the
    model's logits (ConfigError where one does not reproduce them); None: measured per size among
    the ways that reproduce them (`_linear_plan`).
    packed: the packed weights (packed_linear.py): True (made, ConfigError where they cannot be,
    and they stand in for torch's Linear), False (never), None (where oneDNN has the weights'
    dtype, their copies fit in memory, the logits match and they measure fastest at some size)."""
    asked = ", ".join(filter(None, [f"linear_ways={ways}" if ways else "", "packed_linear=True" if packed else ""]))

    def unsplit(why: str):
        if asked:
            raise ConfigError(f"{asked}, but {why}; pass linear_ways=None and packed_linear=None")
        return None

    if ways is not None and packed is not None and packed != ("packed" in ways.values()):
        raise ConfigError(f"linear_ways={ways} runs {'some' if packed is False else 'no'} sizes packed, "
                          f"but packed_linear={packed}")
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
    usable = ["torch"]
    if ways is None or "weight-major" in ways.values():
        if reproduces(SplitHead(decoder, head, ways={1: "weight-major"})):
            usable.append("weight-major")
        elif ways is not None:   # asked for by name, so refused rather than left out
            raise ConfigError(f"{asked}, but the model's logits with its Linear layers as W @ x.T differ "
                              "from its own forward; pass linear_ways=None and packed_linear=None")
    linears = None
    if ways is None or "packed" in ways.values() or packed:
        linears = _checked_packed(decoder, head, True if ways else packed, reproduces, unsplit)
    timings = {}
    if ways is None:
        if linears is not None:
            usable = [way for way in usable if way != "torch" or not packed] + ["packed"]
        ways, timings = _linear_plan(decoder, head, linears, vocab_size, device, usable)
        if packed and "packed" not in ways.values():
            ways[max(ways)] = "packed"   # asked for: the largest trees run packed at least
    if "packed" not in ways.values():
        linears = None                   # copies that are not used are not kept
    elif linears is not None:
        packed_linear.share(decoder, head, linears)
    return SplitHead(decoder, head, pad_single_row, ways, linears, timings)


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
        if not reproduces(SplitHead(decoder, head, ways={1: "packed"}, packed=linears)):
            why = "the model's logits through oneDNN differ from its own forward"
    return refuse(why) if why is not None else linears


def _linear_plan(decoder, head, linears, vocab_size, device, usable, sizes=(1, 2, 4, 8, 16)):
    """({tokens: way}, {tokens: {way: ms}}): the decoder and head timed at each of `sizes` each
    `usable` way (`timing.interleaved_medians`), and the fastest kept per size.

    The sizes reach 16 tokens, a tree the auto budget verifies on code. Per size, not "from 1 token
    up": on the second 2-core EPYC, `W @ x.T` lost at one token (107 against torch's 79 ms) and won
    at 2-8, while packing won only at 8-16 and by ~10 %; a split from 1 token up kept neither there
    (design.md, the HF backend). The packed copies cost the weights' memory again, which
    `packed_linear.fits_in_memory` bounds before they are made."""
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, vocab_size, max(sizes))).to(device)[None]
    splits = {way: SplitHead(decoder, head, ways={1: way}, packed=linears) for way in usable}

    def forward(n, way):
        splits[way](input_ids=ids[:, :n], use_cache=False)

    seconds = interleaved_medians({(n, way): partial(forward, n, way) for n in sizes for way in usable})
    ways = {n: min(usable, key=lambda way: (seconds[n, way], WAYS.index(way))) for n in sizes}
    timings = {n: {way: round(1e3 * seconds[n, way], 2) for way in usable} for n in sizes}
    return ways, timings


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
