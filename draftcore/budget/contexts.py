"""Step costs by context length (docs/budget.md, "Costs by context length"): one cost table per
power-of-two bucket of cached tokens, a new bucket leaning on the nearest one that measured more
than its root.

    contexts = ContextCosts(largest=65, smoothing=0.2, optimism=0.05)
    contexts.at(n_past)              # before a step: the bucket of its context
    contexts.current                 # that bucket's CostTable
    contexts.unit()                  # what a root-only step costs at this context: the unit the
                                     # pause arms compare in, so both stay comparable as it grows
"""
from __future__ import annotations

from .constants import SMALLEST_BUCKET
from .costs import CostTable


def bucket_of(n_past: int) -> int:
    """The bucket of a context of `n_past` cached tokens: its bit length, at least SMALLEST_BUCKET."""
    return max(int(n_past).bit_length(), SMALLEST_BUCKET)


def bucket_name(bucket: int) -> str:
    """"0-255", "256-511", ...: the context lengths a bucket holds."""
    low = 0 if bucket == SMALLEST_BUCKET else 1 << (bucket - 1)
    return f"{low}-{(1 << bucket) - 1}"


class ContextCosts:
    """The cost table of the context bucket each step runs in, each bucket's own, with a prior from
    the nearest bucket that measured more than its root."""

    def __init__(self, largest: int, smoothing: float, optimism: float):
        self._shape = (largest, smoothing, optimism)
        self.tables: dict[int, CostTable] = {}
        self.bucket = SMALLEST_BUCKET
        self.current = self._table(SMALLEST_BUCKET)

    def at(self, n_past: int) -> None:
        """The next steps run with `n_past` cached tokens."""
        bucket = bucket_of(n_past)
        if bucket != self.bucket:
            self.bucket = bucket
            self.current = self._table(bucket)
            self.current.prior = self._nearest_measured(bucket)
            self.current.forget_estimates()

    def unit(self) -> float:
        """Seconds of a root-only step at the current context (taught by drafting steps only)."""
        return self.current.root_estimate(0)

    def by_bucket(self) -> dict[str, list[float]]:
        """Measured seconds per menu size (NaN: never), without windows, per bucket (for reports)."""
        return {bucket_name(b): [float(x) for x in t.table(0)] for b, t in sorted(self.tables.items())}

    def _table(self, bucket: int) -> CostTable:
        table = self.tables.get(bucket)
        if table is None:
            table = self.tables[bucket] = CostTable(*self._shape)
        return table

    def _nearest_measured(self, bucket: int) -> CostTable | None:
        """The nearest other bucket's table (ties: the shorter) that measured more than its root."""
        best = None
        for other, table in self.tables.items():
            if other != bucket and table.n_measured(0) >= 2:
                key = (abs(other - bucket), other)
                if best is None or key < best[0]:
                    best = (key, table)
        return None if best is None else best[1]
