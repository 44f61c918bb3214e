"""Trace replay: run a drafter plus greedy acceptance against known outputs, with no model.

`TraceVerifier` answers as the model did when the trace was recorded: at a node whose path from
the root continues the known output, the model's token is the next known token. Replaying goes
through the real `speculate` loop, so tokens per step and drafting time are the loop's own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..speculate import speculate
from .traces import Trace
from ..tree import DraftTree


class TraceVerifier:
    """A Verifier whose "model" is one recorded (prompt, output) trace."""

    def __init__(self, trace: Trace, vocab_size: int | None = None):
        self.trace = trace
        self.vocab_size = vocab_size or int(max(trace.prompt_ids.max(), trace.output_ids.max())) + 1
        self.max_context = trace.prompt_ids.shape[0] + trace.output_ids.shape[0] + 1
        self._n_out_cached = 0  # output tokens whose "KV" is committed
        self._tree: DraftTree | None = None

    @property
    def n_past(self) -> int:
        return self.trace.prompt_ids.shape[0] + self._n_out_cached

    def prefill(self, prompt, want="argmax"):
        if want != "argmax":
            raise InputError(f"want: TraceVerifier only knows argmax tokens, got {want!r}")
        if not np.array_equal(prompt, self.trace.prompt_ids):
            raise InputError("prompt: TraceVerifier was given a prompt other than its trace's")
        self._n_out_cached = 0
        return int(self.trace.output_ids[0])

    def verify(self, tree: DraftTree, want="argmax") -> np.ndarray:
        if want != "argmax":
            raise InputError(f"want: TraceVerifier only knows argmax tokens, got {want!r}")
        out = self.trace.output_ids
        base = self._n_out_cached  # the root is output token `base`
        n = len(tree)
        on_trace = np.zeros(n, bool)
        result = np.zeros(n, np.int32)
        on_trace[0] = True
        for i in range(n):
            if i:
                at = base + tree.depths[i]
                on_trace[i] = on_trace[tree.parents[i]] and at < out.shape[0] and tree.tokens[i] == out[at]
            nxt = base + tree.depths[i] + 1
            if on_trace[i] and nxt < out.shape[0]:
                result[i] = out[nxt]
        self._tree = tree
        return result

    def commit(self, path) -> None:
        self._n_out_cached += len(path)
        self._tree = None


@dataclass
class ReplaySummary:
    """Totals over a set of traces (one dataset)."""

    requests: int = 0
    new_tokens: int = 0
    steps: int = 0
    accepted_hist: list = field(default_factory=list)
    draft_seconds: list = field(default_factory=list)
    per_request_tps: list = field(default_factory=list)

    @property
    def tokens_per_step(self) -> float:
        """Output tokens over forward steps (the prefill counted), summed over requests."""
        return self.new_tokens / self.steps if self.steps else 0.0

    def draft_us(self, q: float) -> float:
        return float(np.quantile(self.draft_seconds, q) * 1e6) if self.draft_seconds else 0.0


def replay(traces, drafter, *, budget: int = 64, eos_token_id=None) -> dict[str, ReplaySummary]:
    """Replay `traces` in order through `drafter` (kept across them); summaries per dataset."""
    summaries: dict[str, ReplaySummary] = {}
    for trace in traces:
        verifier = TraceVerifier(trace)
        result = speculate(verifier, trace.prompt_ids, max_new_tokens=trace.output_ids.shape[0],
                           drafter=drafter, budget=budget, eos_token_id=eos_token_id)
        if not np.array_equal(result.tokens, trace.output_ids[:result.tokens.shape[0]]):
            raise AssertionError(f"replay of {trace.dataset}/{trace.idx} diverged from its trace")
        s = summaries.setdefault(trace.dataset, ReplaySummary())
        st = result.stats
        s.requests += 1
        s.new_tokens += st.new_tokens
        s.steps += st.steps
        s.per_request_tps.append(st.tokens_per_step)
        s.draft_seconds.extend(st.draft_seconds)
        for k, c in enumerate(st.accepted_hist):
            while len(s.accepted_hist) <= k:
                s.accepted_hist.append(0)
            s.accepted_hist[k] += c
    return summaries
