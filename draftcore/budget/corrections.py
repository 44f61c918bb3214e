"""What an expectation is worth: recent accepted over expected tokens, as a factor in [floor, 1].

The auto budget keeps two (docs/budget.md, "Corrections"):
    bias    on the prefixes it picks or would pick, from every proposal's outcome: the calibration
            counts cells, and the candidates of one tree are not independent
    gamble  on the trees it verifies: those are the trees whose estimates looked best against no
            draft, and such estimates err high more than the average proposal's (the winner's curse)
"""
from __future__ import annotations


class Correction:
    """(accepted + prior) / (expected + prior) over faded sums, in [floor, 1]: the floor keeps a tree
    worth 1 / floor of its estimate verified, so its outcome teaches the correction again."""

    def __init__(self, memory: float, prior: float, floor: float):
        self.keep = 1.0 - 1.0 / memory
        self.prior, self.floor = prior, floor
        self.expected = 0.0
        self.accepted = 0.0

    def learn(self, expected: float, accepted: float) -> None:
        self.expected = self.keep * self.expected + expected
        self.accepted = self.keep * self.accepted + accepted

    def value(self) -> float:
        rate = (self.accepted + self.prior) / (self.expected + self.prior)
        return min(1.0, max(self.floor, rate))
