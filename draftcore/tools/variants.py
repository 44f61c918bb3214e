"""Drafter variants kept for measurement, each by name beside the runtime's menu (draftcore.drafters).

    name                 drafter
    trie-uncalibrated    TrieDrafter ranking its candidates by raw relative weights, longest match
                         first (TrieResearch(calibrate=False)): what `trie` was before its calibration
    trie-blind           TrieDrafter not learning the model's tokens at rejected candidates
                         (TrieResearch(learn_from_model=False)): what `trie` was before it learnt them
    ngram-paper          NGramDrafter.paper(): ANPD as published (N=5, K=7, one chain)
    jacobi-paper         JacobiDrafter.paper(): W=15, N=5, G=15 as published for 7B models on A100
    composite-nowindow   CompositeDrafter without the Jacobi window's lookahead nodes

Importing this module registers them (draftcore.drafters.register_drafter), so `draftcore bench
--methods trie-blind,...`, `draftcore replay --drafter trie-uncalibrated` and the benchmark scripts
run them by name; users' code sees the menu only, unless it imports this module too. The trie's
switches are a TrieResearch (draftcore.drafters.trie_research), off TrieDrafter's constructor;
`research_trie(**options)` takes them beside the constructor's options.
"""
from __future__ import annotations

from ..drafters import CompositeDrafter, JacobiDrafter, NGramDrafter, TrieDrafter, register_drafter
from ..drafters.trie_research import SWITCHES, TrieResearch

VARIANTS = {
    "trie-uncalibrated": lambda vocab: TrieDrafter(token_limit=vocab, research=TrieResearch(calibrate=False)),
    "trie-blind": lambda vocab: TrieDrafter(token_limit=vocab, research=TrieResearch(learn_from_model=False)),
    "ngram-paper": lambda vocab: NGramDrafter.paper(),
    "jacobi-paper": lambda vocab: JacobiDrafter.paper(),
    "composite-nowindow": lambda vocab: CompositeDrafter(token_limit=vocab, window=False),
}
VARIANT_NAMES = tuple(VARIANTS)


def research_trie(**options) -> TrieDrafter:
    """A TrieDrafter from its constructor's options and TrieResearch's switches, given side by side
    (`draftcore replay --no-fill`, tests that sweep both)."""
    switches = {name: options.pop(name) for name in SWITCHES if name in options}
    return TrieDrafter(research=TrieResearch(**switches), **options)


for _name, _factory in VARIANTS.items():
    register_drafter(_name, _factory)
