"""What `speculate` returns: the tokens, why it stopped, and the statistics users ask for."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def add_histogram(total: list, counts) -> list:
    """Add the histogram `counts` (counts[k]: occurrences of k) into `total`, growing it; returns it."""
    if len(total) < len(counts):
        total.extend([0] * (len(counts) - len(total)))
    for k, c in enumerate(counts):
        total[k] += c
    return total


@dataclass
class SpeculateStats:
    """Counters of one request. Times are seconds of the loop's clock.

    steps counts model forwards, the prefill included (so tokens_per_step compares directly with
    plain decoding, where it is 1.0). accepted_hist[k] counts verify steps that accepted k drafted
    tokens (and so emitted k + 1). drafted_tokens counts candidate nodes verified (the root
    excluded) and budget_hist the candidates per step; lookahead_nodes counts lookahead nodes
    verified (a Jacobi window), which acceptance never walks.
    """

    steps: int = 0
    new_tokens: int = 0
    drafted_tokens: int = 0
    lookahead_nodes: int = 0
    accepted_hist: list = field(default_factory=list)
    budget_hist: dict = field(default_factory=dict)
    time_prefill: float = 0.0
    time_drafting: float = 0.0   # drafter update + propose + observe, and the budget's choice
    time_verifying: float = 0.0
    time_accepting: float = 0.0  # acceptance and commit
    time_total: float = 0.0
    draft_seconds: list = field(default_factory=list)  # time_drafting per verify step

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens over drafted (candidate) tokens."""
        accepted = sum(k * c for k, c in enumerate(self.accepted_hist))
        return accepted / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0

    def record_step(self, tree, n_accepted: int, drafting: float, verifying: float, accepting: float) -> None:
        """One verify step: `tree` as verified, `n_accepted` drafted tokens accepted."""
        self.steps += 1
        self.drafted_tokens += tree.n_draft
        self.lookahead_nodes += tree.n_lookahead
        hist = self.accepted_hist
        if len(hist) <= n_accepted:
            hist.extend([0] * (n_accepted + 1 - len(hist)))
        hist[n_accepted] += 1
        self.budget_hist[tree.n_draft] = self.budget_hist.get(tree.n_draft, 0) + 1
        self.time_drafting += drafting
        self.time_verifying += verifying
        self.time_accepting += accepting
        self.draft_seconds.append(drafting)

    def summary(self) -> dict:
        return {
            "steps": self.steps, "new_tokens": self.new_tokens,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "drafted_tokens": self.drafted_tokens, "lookahead_nodes": self.lookahead_nodes,
            "accepted_hist": list(self.accepted_hist),
            "budget_hist": {int(k): v for k, v in sorted(self.budget_hist.items())},
            "time_prefill": self.time_prefill, "time_drafting": self.time_drafting,
            "time_verifying": self.time_verifying, "time_accepting": self.time_accepting,
            "time_total": self.time_total,
        }


@dataclass
class SpeculateResult:
    """tokens: int32[k] generated ids (the prompt excluded); stop_reason: "eos", "stop_sequence" or
    "max_new_tokens"; text: decoded output when the prompt was text and the verifier can decode;
    seed: when sampling, the int seed that replays the run (`SamplingParams(seed=...)`), else None."""

    tokens: np.ndarray
    stop_reason: str
    stats: SpeculateStats
    text: str | None = None
    seed: int | None = None
