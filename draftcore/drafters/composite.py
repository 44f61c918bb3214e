"""One draft tree from several drafters: trie branches, n-gram chains and Jacobi pool candidates
merged under one root (identical prefixes shared), the Jacobi window attached as lookahead nodes.

The node budget is split by each source's recent acceptance, measured where it matters: a node's
priority is the rate at which its own source's nodes *of the same score* were accepted lately
(per source, per score bin, fading with a memory of `memory` judged proposals; the drafter's,
shared by its requests under a lock; a fresh drafter takes each score at its word). Sources score
on different scales — the n-gram tables' count ratios say 1.0
for a key seen once, the trie's scores are estimates of acceptance — so raw scores cannot be
compared, and one rate per source (how this drafter first did it) let a source's confident but
wrong nodes crowd out another's sure ones. A source whose scores already estimate acceptance
(`scores_estimate_acceptance`: the trie) keeps them: calibrated here from verified nodes alone (the
budget's most optimistic picks), one rate per bin, they reached the budget on a coarser, drifting
scale, and the budget's own calibration (every proposed candidate, from outcomes) did worse on it.
A node proposed by several sources gets the best of their priorities, and a child never outranks
its parent, so the merged tree is best first and the budget policy may cut it anywhere; its
scores are acceptance estimates, which is what the policy expects of a drafter's scores. Rates per
bin beat one rate per source on the recorded SmolLM2 traces; with today's trie (which improved
since) replay puts the composite behind the trie, while on the real model it leads, because its
n-gram tables learn the model's tokens at rejected candidates, which replay cannot see
(docs/drafters.md, "Composite"; docs/design.md, "Replay"; benchmarks/model_outputs_value.py).

The rates are learnt from every proposed node as the step's emitted tokens settle it
(`learn_from="outcomes"`, the default), not only from the nodes the budget verified
(`learn_from="verified"`): where a verify is dear (llama.cpp on a CPU) the budget verifies a
handful of nodes in a hundred steps, and those its most optimistic picks (docs/drafters.md).
A proposal is judged on its first step's tokens alone, though a deep node under a prefix that came
true is then left out and its rates read low: waiting until every node settles measured worse
(docs/design.md, "The merge").

The model's token at every verified candidate (`observe`) feeds the n-gram tables, whoever
proposed the node, and the window's outputs feed the Jacobi pool. The window is attached whenever
the loop asks for one (`lookahead_optional`: the cost-aware budget asks every step while it keeps
the window, and once it drops it, where verify is not free (a CPU), only every 16th step; a dropped
window still rides now and then, ever more rarely, to be measured again).

    CompositeDrafter()                                   trie + n-gram + Jacobi (window on)
    CompositeDrafter(jacobi=None)                        trie + n-gram
    CompositeDrafter(window=False)                       trie + n-gram: without its window the
                                                         Jacobi pool would never fill, so no Jacobi source
    CompositeDrafter(learn_from="verified")              the rates from verified nodes only
"""
from __future__ import annotations

import threading
from collections import namedtuple

import numpy as np

from ..capabilities import DrafterCapabilities, RequestCapabilities, serves_many
from ..checks import check_observation
from ..errors import ConfigError
from ..jit import kernels
from ..tree import DraftTree, score_bins_of
from ..validate import flag, positive_float, token_array, tree_size
from .jacobi import JacobiDrafter
from .ngram import NGramDrafter
from .trie import TrieDrafter

_DEFAULT = object()
_KERNELS = "draftcore.drafters.composite_kernels"
_BINS = 20           # score bins of the calibration
_PRIOR_WEIGHT = 2.0  # nodes' worth of the prior that a score is its node's acceptance rate
_LEARN_FROM = ("outcomes", "verified")   # every proposed node, as the emitted tokens settle it; or the verified ones
# Each source's acceptance by score bin, [source, bin], faded towards the prior, and the lock that
# guards it: a drafter's, handed to each of its requests.
_SharedRates = namedtuple("_SharedRates", "offered accepted prior_offered prior_accepted lock")


class CompositeDrafter:
    """Merges the drafts of `trie`, `ngram` and `jacobi` (each a drafter or None)."""

    def __init__(self, *, trie=_DEFAULT, ngram=_DEFAULT, jacobi=_DEFAULT, window: bool = True,
                 memory: float = 500.0, token_limit: int = 1 << 18, learn_from: str = "outcomes"):
        self.trie = TrieDrafter(token_limit=token_limit) if trie is _DEFAULT else trie
        self.ngram = NGramDrafter() if ngram is _DEFAULT else ngram
        self.window = flag("window", window)
        self.jacobi = None if not self.window else JacobiDrafter() if jacobi is _DEFAULT else jacobi
        self.sources = [s for s in (self.trie, self.ngram, self.jacobi) if s is not None]
        if not self.sources:
            raise ConfigError("trie, ngram, jacobi: expected at least one drafter, got None for all three")
        for s in self.sources:
            if DrafterCapabilities.of(s).start is None:
                raise ConfigError(f"drafter: expected a Drafter with start(prompt), got {type(s).__name__}")
        self.memory = positive_float("memory", memory, minimum=1.0, inclusive=True)
        if learn_from not in _LEARN_FROM:
            raise ConfigError(f"learn_from: expected one of {_LEARN_FROM}, got {learn_from!r}")
        self.learn_from = learn_from
        # Each source's acceptance by score bin, [source, bin], faded, prior included: shared by the
        # drafter's requests (a request of 128 tokens on a CPU verifies too few nodes to learn it,
        # and from the prior the n-gram tables' 1.0 for a key seen once outranked the trie's
        # calibrated nodes in every new request), updated under the lock.
        centres = (np.arange(_BINS) + 0.5) / _BINS
        prior_offered = np.full((len(self.sources), _BINS), _PRIOR_WEIGHT)
        prior_accepted = np.tile(_PRIOR_WEIGHT * centres, (len(self.sources), 1))
        self._rates = _SharedRates(offered=prior_offered.copy(), accepted=prior_accepted.copy(),
                                   prior_offered=prior_offered, prior_accepted=prior_accepted, lock=threading.Lock())

    @property
    def concurrent_requests(self) -> bool:
        return all(serves_many(s) for s in self.sources)

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
        return CompositeRequest(self, requests, self._rates)


class CompositeRequest:
    """One request on every source drafter; each source's recent acceptance by score bin is the
    drafter's, shared by its requests (`offered`, `accepted`)."""

    returns_valid_trees = True
    lookahead_optional = True   # propose(..., lookahead=False) builds no window

    def __init__(self, drafter: CompositeDrafter, requests: list, rates: _SharedRates):
        self._drafter = drafter
        self._requests = requests
        self._jacobi = next((r for s, r in zip(drafter.sources, requests) if s is drafter.jacobi), None)
        # the package's own sources take the arguments as this request checked them; others check their own
        caps = [RequestCapabilities.of(r) for r in requests]
        self._observers = [c.observe_checked or c.observe for c in caps if c.observe is not None]
        # sources asked for no window when proposing (the composite drops theirs anyway)
        self._windowless = [c.lookahead_optional for c in caps]
        # sources whose scores estimate acceptance (the trie): taken at their word, not re-calibrated
        self._at_word = np.array([c.scores_estimate_acceptance for c in caps])
        self._prior_offered, self._prior_accepted = rates.prior_offered, rates.prior_accepted
        self.offered, self.accepted = rates.offered, rates.accepted   # the drafter's, shared
        self._lock = rates.lock
        self._keep = 1.0 - 1.0 / drafter.memory
        self._sources = np.zeros(1, np.int32)  # source bits of the last proposal's nodes
        self._proposed = None                  # (source, score bin, index in the tree) of its input nodes
        self._proposed_tree = None             # the last proposal's merged candidates, until update settles them
        self._from_outcomes = drafter.learn_from == "outcomes"
        self._K = kernels(_KERNELS)

    @property
    def acceptance(self) -> np.ndarray:
        """Each source's recent acceptance rate over the nodes its calibration counted: every proposed
        node its first step settled (learn_from "outcomes"), or the verified ones (NaN: none)."""
        offered = (self.offered - self._prior_offered).sum(axis=1)
        accepted = (self.accepted - self._prior_accepted).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(offered > 1e-9, accepted / offered, np.nan)

    def __repr__(self) -> str:
        rates = ", ".join(f"{type(s).__name__}: {r:.2f}" for s, r in zip(self._drafter.sources, self.acceptance))
        return f"CompositeRequest(acceptance {rates})"

    def propose(self, context, budget: int, lookahead: bool = True) -> DraftTree:
        """The sources' candidates merged, and the Jacobi window when `lookahead` (the loop asks
        for none where the budget keeps dropping it: building it is a good share of the
        composite's drafting, docs/drafters.md)."""
        context = token_array("context", context)
        budget = tree_size("budget", budget)   # refused before any source's state moves
        root = int(context[-1])
        trees = {}   # source index -> its tree, for the sources that drafted something
        for i, request in enumerate(self._requests):
            if request is self._jacobi:
                tree = request.candidates(root, budget)
            elif self._windowless[i]:
                tree = request.propose(context, budget, lookahead=False)
            else:
                tree = request.propose(context, budget)
            if tree.n_lookahead:
                tree = tree.without_lookahead()
            if len(tree) > 1:
                trees[i] = tree
        self._proposed = self._proposed_tree = None
        if trees:
            merged, self._sources, self._proposed = self._merged(root, trees, budget)
            self._proposed_tree = merged
        else:
            merged, self._sources = DraftTree.root_only(root), np.zeros(1, np.int32)
        if lookahead and self._jacobi is not None and self._drafter.window:
            merged = self._jacobi.with_window(merged)
        return merged

    def _merged(self, root: int, trees: dict, budget: int):
        """The sources' candidates as one tree (composite_kernels.merge_sources), the source bits of
        its nodes, and (source, score bin, index in the tree) of every input node."""
        drafted = list(trees.values())
        tokens = np.concatenate([t.tokens[1:] for t in drafted])
        parents = np.concatenate([t.parents[1:] for t in drafted])
        # a tree without scores is taken to halve its confidence at each depth (DraftTree.score_bins)
        scores = np.concatenate([t.scores[1:] if t.scores is not None else
                                 0.5 ** t.depths[1:] for t in drafted]).astype(np.float32, copy=False)
        score_bin = score_bins_of(scores, _BINS)
        lengths = np.array([len(t) - 1 for t in drafted], np.int64)
        n = tokens.shape[0]
        size = n + 1
        out = np.empty((4, size), np.int32)
        out_sources = np.empty(size, np.int32)
        source, index = np.empty(n, np.int32), np.empty(n, np.int32)
        with self._lock:
            rates = self.accepted / self.offered
        m = self._K.merge_sources(tokens, parents, scores, score_bin, lengths, np.array(list(trees), np.int32),
                                  self._at_word, rates, budget, source, index,
                                  out[0], out[1], out[2], out[3].view(np.float32), out_sources,
                                  np.empty(size, np.int32), np.empty(size, np.int32), np.empty(size, np.float32),
                                  np.empty(n, np.float32))
        out[0, 0] = root
        rows = out[:, :m].copy()
        tree = DraftTree(rows[0], rows[1], rows[2], rows[3].view(np.float32))
        return tree, out_sources[:m].copy(), (source, score_bin, index)

    def update(self, tokens) -> None:
        """The sources' updates; the first after a proposal settles its candidates (learn_from
        "outcomes": the tokens are the step's accepted ones and the model's next)."""
        tokens = token_array("tokens", tokens, allow_empty=True)
        for request in self._requests:
            request.update(tokens)
        tree, self._proposed_tree = self._proposed_tree, None
        if self._from_outcomes and tree is not None and tokens.shape[0]:
            source, score_bin, index = self._proposed
            with self._lock:
                self._K.count_outcomes(self.offered, self.accepted, self._prior_offered, self._prior_accepted,
                                       self._keep, source, score_bin, index, tree.parents, tree.depths, tree.tokens,
                                       tokens)

    def observe(self, tree: DraftTree, node_tokens: np.ndarray, path: np.ndarray) -> None:
        # checked once, before a kernel indexes with them and before any source has learnt from them
        self.observe_checked(tree, *check_observation(tree, node_tokens, path))

    def observe_checked(self, tree: DraftTree, node_tokens: np.ndarray, path: np.ndarray) -> None:
        """`observe` with the arguments `check_observation` returned (the decode loop's own)."""
        m = tree.n_candidates   # the policy may have verified only the best m - 1 candidates
        if not self._from_outcomes and self._proposed is not None and 1 < m <= self._sources.shape[0]:
            source, score_bin, index = self._proposed
            with self._lock:
                self._K.count_verified(self.offered, self.accepted, self._prior_offered, self._prior_accepted,
                                       self._keep, source, score_bin, index, m, path)
        if not self._from_outcomes:
            self._proposed = None
        for observe in self._observers:
            observe(tree, node_tokens, path)

    def finish(self) -> None:
        for request in self._requests:
            request.finish()
