"""The verifiers `speculative_generate` keeps for each model between `generate()` calls.

A verifier holds one sequence's KV cache, so concurrent `generate()` calls on one model (threads of
a server) each need their own: a model's pool builds one per concurrent call, up to `capacity`,
and reuses them afterwards. They share one drafter (a TrieDrafter serves concurrent requests, each
with its own state), so what one call generates helps the next, whichever verifier serves it.

The pool keeps its model alive (a verifier holds the model it verifies), so the registry is
bounded: it keeps the pools of the MAX_MODELS models used last, and `release(model)` drops one now.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager

from draftcore import BusyError, Session
from draftcore.validate import positive_int

from .verifier import HFVerifier

MAX_MODELS = 4               # pools kept at once (each keeps its model alive)
DEFAULT_CAPACITY = 4         # verifiers per model: concurrent generate() calls served at once

_pools: "OrderedDict[int, VerifierPool]" = OrderedDict()   # id(model) -> pool; a pool holds its model
_registry_lock = threading.Lock()


class VerifierPool:
    """Up to `capacity` HFVerifiers over one model, handed out one per call, and their shared drafter."""

    def __init__(self, model, capacity: int = DEFAULT_CAPACITY):
        self.model = model
        self.capacity = positive_int("capacity", capacity)
        self._lock = threading.Lock()
        self._idle: list[HFVerifier] = []
        self._built = 0
        self._first: HFVerifier | None = None
        self.drafter = None   # the first verifier's session drafter, shared by all of them

    @contextmanager
    def verifier(self, prompt=None):
        """An idle verifier of this model for the duration of a `with` block (built if none is
        idle and the pool is not full); BusyError when `capacity` calls already hold one each.
        prompt: the request's token ids; of the idle verifiers, the one whose cache holds the
        longest prefix of it is handed out (its prefill then runs only the rest: HFVerifier's
        reuse_prefix), so interleaved conversations each find their own earlier turns."""
        verifier = self._acquire(prompt)
        try:
            yield verifier
        finally:
            with self._lock:
                self._idle.append(verifier)

    def _acquire(self, prompt) -> HFVerifier:
        with self._lock:
            if self._idle:
                # the last returned on a tie (none holds any of the prompt: the most recently used)
                best = (len(self._idle) - 1 if prompt is None else
                        max(reversed(range(len(self._idle))), key=lambda i: self._idle[i].cached_prefix(prompt)))
                return self._idle.pop(best)
            if self._built >= self.capacity:
                raise BusyError(
                    f"model: {self._built} generate() calls on this {type(self.model).__name__} are running, the "
                    f"most speculative_generate serves at once (one KV cache each); wait for one to finish, or "
                    f"raise the limit with draftcore.adapters.torch_hf.verifier_pool.pool_of(model, capacity=...)")
            self._built += 1
            first = self._first
        try:
            # The model was checked (tree attention, split head) and timed by the first verifier:
            # the next ones reuse its findings instead of repeating a ~2 s check per verifier
            # (and its packed weights: packed_linear.shared).
            verifier = (HFVerifier(self.model) if first is None else
                        HFVerifier(self.model, self_check=False, linear_ways=first.linear_ways,
                                   packed_linear=first.packed_linear))
        except BaseException:
            with self._lock:
                self._built -= 1
            raise
        with self._lock:
            if self._first is None:
                self._first = verifier
                self.drafter = Session.of(verifier).drafter
        return verifier

    def __repr__(self) -> str:
        return f"VerifierPool({type(self.model).__name__}, built={self._built}, capacity={self.capacity})"


def pool_of(model, capacity: int | None = None) -> VerifierPool:
    """The pool of `model`, created on first use (and made the most recently used); `capacity`
    changes how many concurrent calls it serves."""
    with _registry_lock:
        pool = _pools.get(id(model))
        if pool is None or pool.model is not model:
            pool = _pools[id(model)] = VerifierPool(model)
            while len(_pools) > MAX_MODELS:
                _pools.popitem(last=False)
        _pools.move_to_end(id(model))
        if capacity is not None:
            pool.capacity = positive_int("capacity", capacity)
        return pool


def release(model) -> bool:
    """Drop `model`'s pool (its verifiers, KV caches and drafter) so the model can be freed; True if
    there was one. A call running on it finishes normally."""
    with _registry_lock:
        pool = _pools.get(id(model))
        if pool is not None and pool.model is model:
            del _pools[id(model)]
            return True
        return False
