"""A framework-free toy model and verifier for tests.

The toy model's logits at a position are a pure function of the whole prefix — every (position,
token) pair before it — so a wrong mask, a wrong position id, a wrong commit or a wrong acceptance
changes the output. It is also predictable enough for drafts to be accepted: most of the time the
next token is a fixed function of the previous two tokens (text that repeats), and about one
position in five it depends on a hash of the entire prefix.
"""
from __future__ import annotations

import numpy as np

from draftcore.tree import DraftTree

_MULT = 1_000_003
_MASK = (1 << 61) - 1


def _mix(h: int, position: int, token: int) -> int:
    return (h * _MULT + (position + 1) * 7919 + token + 1) & _MASK


class ToyModel:
    """next-token logits = f(entire prefix); see the module docstring."""

    def __init__(self, vocab_size: int = 24, seed: int = 0, surprise_every: int = 5, sharpness: float = 4.0):
        rng = np.random.default_rng(seed)
        self.vocab_size = vocab_size
        self.table = rng.integers(0, vocab_size, size=(vocab_size, vocab_size))
        self.surprise_every = surprise_every
        self.sharpness = sharpness

    def logits_from_hash(self, h: int, prev1: int, prev2: int) -> np.ndarray:
        rng = np.random.default_rng(h)
        logits = rng.normal(0.0, 1.0, self.vocab_size).astype(np.float32)
        if h % self.surprise_every:
            logits[self.table[prev2, prev1]] += self.sharpness
        return logits

    def prefix_hash(self, tokens) -> int:
        h = 0
        for pos, tok in enumerate(tokens):
            h = _mix(h, pos, int(tok))
        return h

    def logits(self, tokens) -> np.ndarray:
        """float32[vocab]: logits for the token after `tokens`."""
        prev1 = int(tokens[-1]) if len(tokens) >= 1 else 0
        prev2 = int(tokens[-2]) if len(tokens) >= 2 else 0
        return self.logits_from_hash(self.prefix_hash(tokens), prev1, prev2)

    def greedy(self, prompt, n_new: int, eos: int | None = None) -> np.ndarray:
        """Plain greedy decoding, one token at a time, straight from the definition."""
        seq = [int(t) for t in prompt]
        out = []
        for _ in range(n_new):
            tok = int(np.argmax(self.logits(seq)))
            out.append(tok)
            seq.append(tok)
            if eos is not None and tok == eos:
                break
        return np.array(out, np.int32)


class ToyVerifier:
    """A Verifier over ToyModel that behaves like a real backend: it attends through the mask the
    tree derives and places nodes at the position ids the tree derives, and keeps a "KV cache"
    (the committed tokens with their running hash)."""

    def __init__(self, model: ToyModel, max_context: int = 4096):
        self.model = model
        self.vocab_size = model.vocab_size
        self.max_context = max_context
        self.cache: list[int] = []
        self.hashes: list[int] = []  # hashes[i] = hash of cache[:i+1]
        self.pending: DraftTree | None = None
        self.n_verify = 0
        self.n_nodes = 0  # nodes verified so far

    @property
    def n_past(self) -> int:
        return len(self.cache)

    def _append(self, token: int) -> None:
        h = self.hashes[-1] if self.hashes else 0
        self.hashes.append(_mix(h, len(self.cache), token))
        self.cache.append(token)

    def prefill(self, prompt, n_logits=0):
        self.cache, self.hashes, self.pending = [], [], None
        for tok in prompt:
            self._append(int(tok))
        logits = self.model.logits_from_hash(self.hashes[-1], self.cache[-1], self.cache[-2] if len(self.cache) > 1 else 0)
        return np.array([np.argmax(logits)], np.int32), logits[None, :][:n_logits]

    def verify(self, tree: DraftTree, n_logits=0):
        n = len(tree)
        assert self.n_past + n <= self.max_context
        assert 0 <= n_logits <= n
        mask = tree.ancestor_mask()
        positions = tree.position_ids(self.n_past)
        out = np.empty((n, self.vocab_size), np.float32)
        for i in range(n):
            visible = np.flatnonzero(mask[i])
            order = visible[np.argsort(positions[visible], kind="stable")]
            h = self.hashes[-1] if self.hashes else 0
            seq = list(self.cache[-2:])
            for j in order:  # a real model would see these (position, token) pairs
                h = _mix(h, int(positions[j]), int(tree.tokens[j]))
                seq.append(int(tree.tokens[j]))
            prev2 = seq[-2] if len(seq) >= 2 else 0
            out[i] = self.model.logits_from_hash(h, seq[-1], prev2)
        self.pending = tree
        self.n_verify += 1
        self.n_nodes += n
        return out.argmax(axis=1).astype(np.int32), out[:n_logits]

    def commit(self, path) -> None:
        tree = self.pending
        assert tree is not None, "commit without verify"
        path = np.asarray(path)
        assert path[0] == 0 and all(tree.parents[path[i]] == path[i - 1] for i in range(1, len(path)))
        for node in path:
            self._append(int(tree.tokens[node]))
        self.pending = None


def plain_greedy(verifier, prompt, n_new, eos=None):
    """Greedy decoding through a verifier's own interface, one root-only tree per step."""
    out = [int(verifier.prefill(np.asarray(prompt, np.int32))[0][0])]
    while len(out) < n_new and not (eos is not None and out[-1] == eos):
        tree = DraftTree.root_only(out[-1])
        out.append(int(verifier.verify(tree)[0][0]))
        verifier.commit(np.array([0], np.int32))
    return np.array(out, np.int32)
