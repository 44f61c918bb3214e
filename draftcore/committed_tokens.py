"""The token ids a verifier's KV cache holds, so that a prefill can keep what a new prompt shares.

A verifier records its prompt at prefill and each commit's path tokens at the positions they take;
`shared_prefix` then says how many leading tokens of the next prompt already have their KV cached
(a chat's earlier turns, an agent's system prompt and tool schema). The record grows like a KV
cache, by half its length, and never past the verifier's max_context, so its memory is bounded.
"""
from __future__ import annotations

import numpy as np

from .validate import positive_int


class CommittedTokens:
    """Token ids by cache position; positions at or past the verifier's n_past are stale.

    capacity: the most positions ever recorded (the verifier's max_context)."""

    def __init__(self, capacity: int):
        self.capacity = positive_int("capacity", capacity)
        self._ids = np.empty(0, np.int32)

    def record(self, tokens: np.ndarray, at: int) -> None:
        """`tokens` (int32[k]) now sit at positions at .. at + k - 1; what was recorded past `at`
        is overwritten, what lies before it is kept."""
        end = at + tokens.shape[0]
        if end > self.capacity:
            raise ValueError(f"positions up to {end} exceed the capacity {self.capacity}")  # a verifier bug
        if end > self._ids.shape[0]:
            grown = np.empty(min(self.capacity, max(end, self._ids.shape[0] * 3 // 2, 256)), np.int32)
            grown[:at] = self._ids[:at]
            self._ids = grown
        self._ids[at:end] = tokens

    def record_one(self, token: int, at: int) -> None:
        """`record` of one token, without building an array (a decode step's host time)."""
        if at >= self._ids.shape[0]:
            self.record(np.array([token], np.int32), at)
        else:
            self._ids[at] = token

    def shared_prefix(self, prompt: np.ndarray, n_cached: int) -> int:
        """How many leading tokens of `prompt` equal the first `n_cached` recorded ones, at most
        len(prompt) - 1: the last prompt position's logits always need a forward."""
        n = min(n_cached, prompt.shape[0] - 1, self._ids.shape[0])
        if n <= 0:
            return 0
        same = self._ids[:n] == prompt[:n]
        return n if same.all() else int(np.argmin(same))   # argmin of a bool array: the first False
