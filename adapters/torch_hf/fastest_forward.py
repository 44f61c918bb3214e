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

Which is faster depends on the machine (the split's kernels pay on one CPU and not on another; cuDNN's
plans cost little where shapes repeat and much where they do not) and on the context (attention grows
with it, the Linear layers do not). So none is assumed: per context bucket (powers of two of n_past,
everything under 256 in one), the first calls alternate between the forwards, `TRIALS` each, and the
bucket then keeps the one with the lower median. The forwards give the same logits within the
verifier's construction check (head.py, selfcheck.py); the "generate" one is the very forward plain
decoding runs.

A choice made from a few trials can be wrong for good: trials taken while the machine was busy, or
in the first cold calls of a bucket. So the choice is kept for the verifier's lifetime, but not
blindly: every `RECHECK_EVERY` calls of a bucket, two calls in a row are timed, the kept forward's
and one other's (in turn where there are several), each forward keeps its last `WINDOW` times, and
the bucket keeps whichever then has the lower median. The two times of a re-check are taken at
nearly the same context, so the medians compare like with like while the context grows inside a
bucket. Where the kept forward is the faster, a re-check costs one slower call (on a GPU, also two
waits for the queue to drain), so the calls between re-checks grow with how much slower the others
measured: their extra time stays within `RECHECK_SHARE` of the bucket's (a twin 3x slower, as
cuDNN's attention measured on an H200, is re-checked every 200 calls, not every 64).
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from typing import Callable

import numpy as np

TRIALS = 3            # timed calls of each forward per context bucket before one is kept
RECHECK_EVERY = 64    # calls of a bucket between two re-checks of its choice, once made
WINDOW = 7            # a forward's last timed calls, per bucket, whose median decides
RECHECK_SHARE = 0.01  # at most this share of a bucket's time goes to re-checks' slower calls
SMALLEST_BUCKET = 8   # contexts under 2**8 tokens share one bucket


def context_bucket(n_past: int) -> int:
    """The bucket of a context of n_past tokens: its bit length, at least SMALLEST_BUCKET."""
    return max(int(n_past).bit_length(), SMALLEST_BUCKET)


def bucket_range(bucket: int) -> str:
    """The contexts a bucket holds, as text (for reports)."""
    low = 0 if bucket == SMALLEST_BUCKET else 2 ** (bucket - 1)
    return f"{low}-{2 ** bucket - 1}"


class FastestForward:
    """Runs a forward through whichever of `forwards` measured fastest at its context.

    forwards: name -> callable(inputs, n_past) returning the forward's result; the first name is the
        one a bucket starts with. With one forward there is nothing to choose and nothing is timed.
    clock: seconds, monotonic (tests pass a fake one).
    wait: called with a timed forward's result before the clock is read again, where the result
        may still be computing (a GPU's queue: torch.cuda.synchronize); None where it is done.
    """

    def __init__(self, forwards: dict[str, Callable[[object, int], object]], clock: Callable[[], float] = time.perf_counter,
                 wait: Callable[[object], None] | None = None):
        self.forwards = forwards
        self.clock = clock
        self.wait = wait
        self._seconds: dict[int, dict[str, deque]] = {}   # bucket -> forward -> its last WINDOW times
        self.chosen: dict[int, str] = {}                   # bucket -> the forward it keeps
        self._since: dict[int, int] = {}                   # bucket -> calls since its last re-check
        self._every: dict[int, int] = {}                   # bucket -> calls between its re-checks
        self._challenges: dict[int, int] = {}              # bucket -> re-checks made (whose turn is next)
        self.switches = 0                                  # times a re-check changed a bucket's choice
        self._pinned: str | None = None                    # the forward every call runs, untimed

    def __call__(self, inputs, n_past: int):
        if self._pinned is not None:
            return self.forwards[self._pinned](inputs, n_past)
        if len(self.forwards) == 1:
            return next(iter(self.forwards.values()))(inputs, n_past)
        bucket = context_bucket(n_past)
        times = self._seconds.setdefault(bucket, {key: deque(maxlen=WINDOW) for key in self.forwards})
        kept = self.chosen.get(bucket)
        if kept is None:   # still alternating: the forward with the fewest trials goes next
            return self._timed(min(times, key=lambda key: len(times[key])), inputs, n_past, bucket)
        since = self._since.get(bucket, 0) + 1
        self._since[bucket] = since
        every = self._every.get(bucket, RECHECK_EVERY)
        if since < every:
            return self.forwards[kept](inputs, n_past)
        if since == every:          # a re-check: the kept forward's time, then a challenger's
            return self._timed(kept, inputs, n_past, bucket)
        self._since[bucket] = 0
        others = [key for key in self.forwards if key != kept]
        challenger = others[self._challenges.get(bucket, 0) % len(others)]
        self._challenges[bucket] = self._challenges.get(bucket, 0) + 1
        result = self._timed(challenger, inputs, n_past, bucket)
        self._every[bucket] = self._recheck_interval(bucket)
        return result

    def _recheck_interval(self, bucket: int) -> int:
        """Calls between re-checks of `bucket`: RECHECK_EVERY, or more where the slowest other
        forward's extra time per call would take more than RECHECK_SHARE of the bucket's."""
        times = self._seconds[bucket]
        kept = float(np.median(times[self.chosen[bucket]]))
        slowest = max(float(np.median(seconds)) for seconds in times.values() if seconds)
        if kept <= 0:
            return RECHECK_EVERY
        return max(RECHECK_EVERY, int(np.ceil((slowest / kept - 1.0) / RECHECK_SHARE)))

    def _timed(self, name: str, inputs, n_past: int, bucket: int):
        """Run forward `name`, record its time in `bucket`, and decide the bucket again where every
        forward has TRIALS times."""
        start = self.clock()
        result = self.forwards[name](inputs, n_past)
        if self.wait is not None:
            self.wait(result)
        times = self._seconds[bucket]
        times[name].append(self.clock() - start)
        if all(len(seconds) >= TRIALS for seconds in times.values()):
            median = {key: float(np.median(seconds)) for key, seconds in times.items()}
            faster = min(median, key=median.get)
            kept = self.chosen.get(bucket)
            if kept is None:
                self.chosen[bucket] = faster
            elif median[faster] < median[kept]:   # a tie keeps what was kept
                self.chosen[bucket] = faster
                self.switches += 1
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
        self._since.clear()
        self._every.clear()
        self._challenges.clear()
        self.switches = 0

    def choices(self) -> dict[str, str]:
        """{context range: the forward kept there} for the buckets decided so far."""
        return {bucket_range(bucket): name for bucket, name in sorted(self.chosen.items())}
