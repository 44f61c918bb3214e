"""What `speculate` returns: the tokens, why it stopped, and the statistics users ask for."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SpeculateStats:
    """Counters of one request. Times are seconds of wall clock.

    steps counts model forwards, the prefill included (so tokens_per_step compares directly with
    plain decoding, where it is 1.0). accepted_hist[k] counts verify steps that accepted k drafted
    tokens (and so emitted k + 1).
    """

    steps: int = 0
    new_tokens: int = 0
    drafted_tokens: int = 0
    accepted_hist: list = field(default_factory=list)
    budget_hist: dict = field(default_factory=dict)
    time_prefill: float = 0.0
    time_drafting: float = 0.0
    time_verifying: float = 0.0
    time_accepting: float = 0.0
    time_total: float = 0.0
    draft_seconds: list = field(default_factory=list)  # drafter update + propose, per verify step
    notes: list = field(default_factory=list)

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens over drafted tokens."""
        accepted = sum(k * c for k, c in enumerate(self.accepted_hist))
        return accepted / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0

    def record_accept(self, n_accepted: int) -> None:
        while len(self.accepted_hist) <= n_accepted:
            self.accepted_hist.append(0)
        self.accepted_hist[n_accepted] += 1

    def record_budget(self, budget: int) -> None:
        self.budget_hist[budget] = self.budget_hist.get(budget, 0) + 1

    def summary(self) -> dict:
        return {
            "steps": self.steps, "new_tokens": self.new_tokens,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "accepted_hist": list(self.accepted_hist),
            "budget_hist": {int(k): v for k, v in sorted(self.budget_hist.items())},
            "time_prefill": self.time_prefill, "time_drafting": self.time_drafting,
            "time_verifying": self.time_verifying, "time_accepting": self.time_accepting,
            "time_total": self.time_total, "notes": list(self.notes),
        }


@dataclass
class SpeculateResult:
    """tokens: int32[k] generated ids (the prompt excluded); stop_reason: "eos", "stop_sequence",
    "max_new_tokens" or "max_context"; text: decoded output when the verifier can decode;
    seed: when sampling, the int seed that replays the run (`SamplingParams(seed=...)`), else None."""

    tokens: np.ndarray
    stop_reason: str
    stats: SpeculateStats
    text: str | None = None
    seed: int | None = None
