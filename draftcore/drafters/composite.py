"""One draft tree from several drafters: trie branches, n-gram chains and Jacobi pool candidates
merged under one root (identical prefixes shared), the Jacobi window attached as lookahead nodes.

The node budget is split by recent acceptance: a node's priority is its own drafter's score times
that drafter's recent acceptance rate (accepted / verified nodes it proposed, fading with a memory
of `memory` steps) relative to the best source's rate, so a source that has stopped paying off yields its nodes to the others within a
few steps; a node proposed by several sources gets the best of their priorities. The merged tree is
best first (a child never outranks its parent), so the budget policy may cut it anywhere.

The model's token at every verified candidate (`observe`) feeds the n-gram tables, whoever
proposed the node, and the window's outputs feed the Jacobi pool.

    CompositeDrafter()                                   trie + n-gram + Jacobi (window on)
    CompositeDrafter(jacobi=None)                        trie + n-gram
    CompositeDrafter(window=False)                       trie + n-gram: without its window the
                                                         Jacobi pool would never fill, so no Jacobi source
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..tree import DraftTree
from ..validate import positive_float, token_array
from .jacobi import JacobiDrafter
from .merge import merge_trees
from .ngram import NGramDrafter
from .trie import TrieDrafter

_DEFAULT = object()
_PRIOR_OFFERED, _PRIOR_ACCEPTED = 4.0, 2.0  # a new source starts at 50% acceptance


class CompositeDrafter:
    """Merges the drafts of `trie`, `ngram` and `jacobi` (each a drafter or None)."""

    def __init__(self, *, trie=_DEFAULT, ngram=_DEFAULT, jacobi=_DEFAULT, window: bool = True,
                 memory: float = 50.0, token_limit: int = 1 << 18):
        self.trie = TrieDrafter(token_limit=token_limit) if trie is _DEFAULT else trie
        self.ngram = NGramDrafter() if ngram is _DEFAULT else ngram
        self.window = bool(window)
        self.jacobi = None if not self.window else JacobiDrafter() if jacobi is _DEFAULT else jacobi
        self.sources = [s for s in (self.trie, self.ngram, self.jacobi) if s is not None]
        if not self.sources:
            raise ConfigError("trie, ngram, jacobi: expected at least one drafter, got None for all three")
        for s in self.sources:
            if not callable(getattr(s, "start", None)):
                raise ConfigError(f"drafter: expected a Drafter with start(prompt), got {type(s).__name__}")
        self.memory = positive_float("memory", memory, minimum=1.0, inclusive=True)

    @property
    def concurrent_requests(self) -> bool:
        return all(getattr(s, "concurrent_requests", False) is True for s in self.sources)

    def __repr__(self) -> str:
        parts = ", ".join(repr(s) for s in self.sources)
        return f"CompositeDrafter({parts}, window={self.window})"

    def start(self, prompt) -> "CompositeRequest":
        prompt = token_array("prompt", prompt)
        requests = []
        try:
            for s in self.sources:
                requests.append(s.start(prompt))
        except BaseException:
            for r in requests:
                r.finish()
            raise
        return CompositeRequest(self, requests)


class CompositeRequest:
    """One request on every source drafter, and the sources' recent acceptance."""

    returns_valid_trees = True

    def __init__(self, drafter: CompositeDrafter, requests: list):
        self._drafter = drafter
        self._requests = requests
        self._jacobi = next((r for s, r in zip(drafter.sources, requests) if s is drafter.jacobi), None)
        self._observers = [r.observe for r in requests if callable(getattr(r, "observe", None))]
        n = len(requests)
        self.offered = np.full(n, _PRIOR_OFFERED)
        self.accepted = np.full(n, _PRIOR_ACCEPTED)
        self._keep = 1.0 - 1.0 / drafter.memory
        self._sources = np.zeros(1, np.int32)  # source bits of the last proposal's nodes

    def __repr__(self) -> str:
        rates = ", ".join(f"{type(s).__name__}: {a / o:.2f}" for s, a, o in
                          zip(self._drafter.sources, self.accepted, self.offered))
        return f"CompositeRequest(acceptance {rates})"

    def propose(self, context, budget: int) -> DraftTree:
        context = token_array("context", context)
        root = int(context[-1])
        rates = self.accepted / self.offered
        # Relative to the best source: the order is the same as with raw rates, and the best source's
        # nodes keep their own scores, which the budget policy calibrates (raw rates, a few percent
        # per node on bushy trees, would push every score into the lowest bin and starve the budget).
        weights = rates / rates.max()
        tokens, parents, priority, sources = [], [], [], []
        offset = 0
        for i, request in enumerate(self._requests):
            if request is self._jacobi:
                tree = request.candidates(root, budget)
            else:
                tree = request.propose(context, budget).without_lookahead()
            n = len(tree) - 1
            if n == 0:
                continue
            tokens.append(tree.tokens[1:])
            # parents index the concatenation; -1: under the common root
            parents.append(np.where(tree.parents[1:] > 0, tree.parents[1:] - 1 + offset, -1).astype(np.int32))
            score = tree.scores[1:] if tree.scores is not None else 0.5 ** tree.depths[1:]
            priority.append((score * weights[i]).astype(np.float32))
            sources.append(np.full(n, i, np.int32))
            offset += n
        if offset:
            merged, self._sources = merge_trees(root, np.concatenate(tokens), np.concatenate(parents),
                                                np.concatenate(priority), np.concatenate(sources), budget)
        else:
            merged, self._sources = DraftTree.root_only(root), np.zeros(1, np.int32)
        if self._jacobi is not None and self._drafter.window:
            merged = self._jacobi.with_window(merged)
        return merged

    def update(self, tokens) -> None:
        for request in self._requests:
            request.update(tokens)

    def observe(self, tree: DraftTree, node_tokens: np.ndarray, path: np.ndarray) -> None:
        m = tree.n_candidates
        if m > 1 and m <= self._sources.shape[0]:
            bits = self._sources[1:m]
            on_path = np.zeros(m - 1, bool)
            on_path[path[1:] - 1] = True
            self.offered = _PRIOR_OFFERED + self._keep * (self.offered - _PRIOR_OFFERED)
            self.accepted = _PRIOR_ACCEPTED + self._keep * (self.accepted - _PRIOR_ACCEPTED)
            for i in range(len(self._requests)):
                mine = (bits >> i) & 1 == 1
                self.offered[i] += mine.sum()
                self.accepted[i] += (mine & on_path).sum()
        for observe in self._observers:
            observe(tree, node_tokens, path)

    def finish(self) -> None:
        for request in self._requests:
            request.finish()
