"""A verify runs the fastest of the forwards that compute it, measured on this machine at this
context length.

Without drafts, a step is one token: draftcore then must cost no more than the user's own decoding.
Two forwards compute it:

    "generate"   the model's own forward as `generate()` calls it: input_ids [1, 1], positions,
                 a 2-D all-ones attention_mask, logits_to_keep=1. No 4-D mask is built, so `sdpa`
                 runs its grouped-head kernel without copying K/V for every query head.
    "split"      the verifier's split head (head.py), without a mask either (one query sees every
                 cached position): the decoder, then `W @ hidden.T`, with the Linear kernels chosen
                 at construction.

On CUDA in fp16/bf16, where SDPA may run cuDNN's attention (attention_backends.py), each of a one-node
and a tree verify also has a twin that runs without it ("... without cuDNN").

On CPU, a tree verify has as many forwards as the split head has ways of running its Linear layers
(head.py: torch's own, `W @ x.T`, oneDNN on packed copies), and the model's own forward besides:

    "model"               the model's forward with the tree mask, as transformers runs it
    "split, torch"        the split head, the decoder's Linear layers as torch runs them
    "split, weight-major" ... as `W @ x.T` (weight_major.py)
    "split, packed"       ... through oneDNN on the packed weights (packed_linear.py)

Which is faster depends on the machine (the split's kernels pay on one CPU and not on another; cuDNN's
plans cost little where shapes repeat and much where they do not), on the context (attention grows
with it, the Linear layers do not) and on the tree's size (each Linear kernel wins over some range of
rows). So none is assumed: per bucket, the first calls alternate between the forwards, `TRIALS` each,
and the bucket then keeps the one with the lower median. One-token steps and CUDA's twins are
bucketed by context (powers of two of n_past, everything under 256 in one). The CPU tree forwards are
bucketed by tree size (2, 3-4, 5-8, ... nodes): they differ only in their Linear kernels, whose cost
does not grow with the context, so a choice holds at every context. Each bucket's choice is kept for
the verifier's lifetime, across requests. The forwards give the same logits within the verifier's
construction check (head.py, selfcheck.py); the "generate" one is the very forward plain decoding
runs.

Timing each size at run time, rather than only at construction, is what keeps one noisy construction
from costing every later tree: on a 2-core EPYC whose construction-time race once timed `W @ x.T`
slower than torch's Linear at one token (98 vs 91 ms), it ran every tree through torch's Linear, and
8- and 16-node verifies cost 202 and 247 ms, where `W @ x.T` or the packed weights took ~150 and ~186.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable

import numpy as np

TRIALS = 3            # timed calls of each forward per context bucket before one is kept
SMALLEST_BUCKET = 8   # contexts under 2**8 tokens share one bucket


def context_bucket(n_past: int) -> int:
    """The bucket of a context of n_past tokens: its bit length, at least SMALLEST_BUCKET."""
    return max(int(n_past).bit_length(), SMALLEST_BUCKET)


def bucket_range(bucket: int) -> str:
    """The contexts a bucket holds, as text (for reports)."""
    low = 0 if bucket == SMALLEST_BUCKET else 2 ** (bucket - 1)
    return f"{low}-{2 ** bucket - 1}"


def size_bucket(nodes: int) -> int:
    """The bucket of a tree of `nodes` nodes: 0 for 1, 1 for 2, 2 for 3-4, 3 for 5-8, ..."""
    return int(nodes - 1).bit_length()


def size_range(bucket: int) -> str:
    """The tree sizes a size bucket holds, as text (for reports)."""
    high = 2 ** bucket
    low = high // 2 + 1 if bucket > 1 else high
    return f"{high} nodes" if low == high else f"{low}-{high} nodes"


class FastestForward:
    """Runs a forward through whichever of `forwards` measured fastest at its context.

    forwards: name -> callable(inputs, n_past) returning the forward's result; the first name is the
        one a bucket starts with. With one forward there is nothing to choose and nothing is timed.
    clock: seconds, monotonic (tests pass a fake one).
    wait: called with a timed forward's result before the clock is read again, where the result
        may still be computing (a GPU's queue: torch.cuda.synchronize); None where it is done.
    per: "context" (each context bucket races and keeps its own) or "size" (each tree size bucket).
    """

    def __init__(self, forwards: dict[str, Callable[[object, int], object]], clock: Callable[[], float] = time.perf_counter,
                 wait: Callable[[object], None] | None = None, per: str = "context"):
        if per not in ("context", "size"):
            raise ValueError(f"per: expected 'context' or 'size', got {per!r}")
        self.forwards = forwards
        self.clock = clock
        self.wait = wait
        self.per = per
        self._seconds: dict[int, dict[str, list[float]]] = {}   # bucket -> forward -> trial seconds
        self.chosen: dict[int, str] = {}                         # bucket -> the forward it keeps
        self._pinned: str | None = None                          # the forward every call runs, untimed

    def __call__(self, inputs, n_past: int, nodes: int = 1):
        """The forward's result for `inputs` at a context of n_past tokens (a tree of `nodes` nodes)."""
        if self._pinned is not None:
            return self.forwards[self._pinned](inputs, n_past)
        bucket = context_bucket(n_past) if self.per == "context" else size_bucket(nodes)
        name = self.chosen.get(bucket)
        if name is not None or len(self.forwards) == 1:
            return self.forwards[name or next(iter(self.forwards))](inputs, n_past)
        trials = self._seconds.setdefault(bucket, {key: [] for key in self.forwards})
        name = min(trials, key=lambda key: len(trials[key]))   # alternate: the one with fewest trials
        start = self.clock()
        result = self.forwards[name](inputs, n_past)
        if self.wait is not None:
            self.wait(result)
        trials[name].append(self.clock() - start)
        if all(len(seconds) >= TRIALS for seconds in trials.values()):
            self.chosen[bucket] = min(trials, key=lambda key: float(np.median(trials[key])))
        return result

    @contextmanager
    def first_only(self):
        """Within the block every call runs the first forward, untimed; what was measured and
        chosen stays as it was for after it (a diagnosis: the cost without the race's choices)."""
        pinned, self._pinned = self._pinned, next(iter(self.forwards))
        try:
            yield
        finally:
            self._pinned = pinned

    def forget(self) -> None:
        """Drop every measurement and choice (after construction's self-check, whose few cold calls
        should not decide)."""
        self._seconds.clear()
        self.chosen.clear()

    def choices(self) -> dict[str, str]:
        """{context range or tree sizes: the forward kept there} for the buckets decided so far."""
        describe = bucket_range if self.per == "context" else size_range
        return {describe(bucket): name for bucket, name in sorted(self.chosen.items())}
