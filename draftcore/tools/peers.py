"""Peers' drafting rules as draftcore drafters, so a replay can compare them with ours on the same
traces and the same loop.

`PromptLookupDrafter` is transformers' prompt lookup (`generate(prompt_lookup_num_tokens=10)`,
`PromptLookupCandidateGenerator`): match the last `max_ngram` tokens (then fewer, down to 1)
against the earlier context, take the earliest match that has tokens after it, and propose up to
`num_tokens` of them as one chain. Re-implemented from its documented behaviour (numpy, no torch).
"""
from __future__ import annotations

import numpy as np

from ..tree import DraftTree
from ..validate import positive_int, token_array


class PromptLookupDrafter:
    concurrent_requests = True  # no state at all

    def __init__(self, num_tokens: int = 10, max_ngram: int = 2):
        self.num_tokens = positive_int("num_tokens", num_tokens)
        self.max_ngram = positive_int("max_ngram", max_ngram)

    def __repr__(self) -> str:
        return f"PromptLookupDrafter(num_tokens={self.num_tokens}, max_ngram={self.max_ngram})"

    def start(self, prompt) -> "PromptLookupDrafter":
        return _PromptLookupRequest(self)


class _PromptLookupRequest:
    def __init__(self, drafter: PromptLookupDrafter):
        self._drafter = drafter

    def propose(self, context, budget: int) -> DraftTree:
        context = token_array("context", context)
        budget = positive_int("budget", budget, minimum=0)
        n = context.shape[0]
        root = int(context[-1])
        want = min(budget, self._drafter.num_tokens)
        for size in range(min(self._drafter.max_ngram, n - 1), 0, -1):
            tail = context[n - size:]
            windows = np.lib.stride_tricks.sliding_window_view(context[:n - 1], size)
            for start in np.flatnonzero((windows == tail).all(axis=1)):
                begin = start + size
                end = min(begin + want, n)
                if begin < end:
                    return DraftTree.chain(root, context[begin:end])
        return DraftTree.root_only(root)

    def update(self, tokens) -> None:
        pass

    def finish(self) -> None:
        pass
