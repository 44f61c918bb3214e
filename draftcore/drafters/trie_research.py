"""The trie's research switches: what exists only to measure a variant of TrieDrafter (the paper's
ablations, and each improvement of ours switched off), kept off its public constructor.

    switch             default   off (a variant measured)
    calibrate          True      candidates ranked by raw relative weights, longest match first
                                 (trie-uncalibrated); it applies with fill and the hierarchical or
                                 parallel layout only, and `drafter.calibrate` says whether it does
    learn_from_model   True      the model's tokens at rejected candidates not learnt (trie-blind)
    fill               True      one retrieval stage, as the paper (shorter suffixes do not fill the
                                 budget)
    use_top            True      no last stage drafting the most frequent tokens
    min_stage_nodes    8         paper mode: a stage offering fewer nodes falls to a shorter suffix
    insert_prompt, insert_output, eliminate_prompt   True   the paper's ablations (Table 3)

`TrieDrafter(research=TrieResearch(...))` takes them; `draftcore.tools.variants` names the
measured ones, and its `research_trie(**options)` builds a TrieDrafter from constructor options and
switches given side by side (the CLI's trie flags, tests that sweep both).
"""
from __future__ import annotations

import dataclasses

from ..validate import flag, positive_int


@dataclasses.dataclass(frozen=True)
class TrieResearch:
    """The trie's research switches (the module's docstring); checked at construction."""

    calibrate: bool = True
    learn_from_model: bool = True
    fill: bool = True
    use_top: bool = True
    min_stage_nodes: int = 8
    insert_prompt: bool = True
    insert_output: bool = True
    eliminate_prompt: bool = True

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            # bool("no") is True: every switch is checked, none coerced
            checked = positive_int(field.name, value) if field.type == "int" else flag(field.name, value)
            object.__setattr__(self, field.name, checked)

    @classmethod
    def paper(cls) -> "TrieResearch":
        """The paper's retrieval: one stage, no stage 0, no calibration, nothing learnt from the model."""
        return cls(fill=False, use_top=False, calibrate=False, learn_from_model=False)


SWITCHES = tuple(field.name for field in dataclasses.fields(TrieResearch))
