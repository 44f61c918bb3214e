"""One step's verify and commit as the decode loop calls them, chosen once per call from what the
verifier can do, so the loop has one path for every step:

    step = StepVerifier.of(verifier, capabilities.verifier, vocab_size)
    tokens, logits = step.verify(tree, n_logits)     # checked (check_node_results)
    path, next = rule.accept(tree, tokens, logits)
    step.commit(path)

A verifier with `advance(token)` (verify of a root-only tree + commit([0]) fused, cheaper on
llama.cpp's one-token path) takes every root-only step that reads no logits through it; its commit
of that step is then already done. That is the verifier's business, so it lives here, not as a
second branch of the loop.
"""
from __future__ import annotations

import numpy as np

from .checks import check_node_results, check_token
from .errors import BackendError


class StepVerifier:
    """verify and commit through the tree protocol, with the loop's check of what a backend returns."""

    @staticmethod
    def of(verifier, capabilities, vocab_size: int) -> "StepVerifier":
        """The step functions for `verifier`: through `advance` where `capabilities` (its
        VerifierCapabilities) has one."""
        if capabilities.advance is not None:
            return AdvancingVerifier(verifier, vocab_size, capabilities.advance)
        return StepVerifier(verifier, vocab_size)

    def __init__(self, verifier, vocab_size: int):
        self.verifier, self.vocab_size = verifier, vocab_size

    def prefill(self, prompt: np.ndarray, n_logits: int):
        return check_node_results(self.verifier.prefill(prompt, n_logits), 1, n_logits, self.vocab_size,
                                  "verifier.prefill")

    def verify(self, tree, n_logits: int):
        return check_node_results(self.verifier.verify(tree, n_logits), len(tree), n_logits, self.vocab_size,
                                  "verifier.verify")

    def commit(self, path: np.ndarray) -> None:
        self.verifier.commit(path)


class AdvancingVerifier(StepVerifier):
    """A root-only step that reads no logits goes through `advance`, which commits it too."""

    def __init__(self, verifier, vocab_size: int, advance):
        super().__init__(verifier, vocab_size)
        self._advance = advance
        self._advanced = False   # the last verify was an advance: its commit is done
        self._no_logits = np.empty((0, vocab_size), np.float32)

    def verify(self, tree, n_logits: int):
        if n_logits == 0 and len(tree) == 1:
            self._advanced = True
            token = check_token("verifier.advance() returned", self._advance(int(tree.tokens[0])), self.vocab_size,
                                BackendError)
            return np.array([token], np.int32), self._no_logits
        self._advanced = False
        return super().verify(tree, n_logits)

    def commit(self, path: np.ndarray) -> None:
        if self._advanced:   # path is [0]: advance kept the root already
            self._advanced = False
            return
        self.verifier.commit(path)
