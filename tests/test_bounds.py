"""The drafting bounds (draftcore.tools.bounds): hand-computed cases, and no real drafter of a
family beating its family's bound on the recorded SmolLM2 traces."""
import os

import numpy as np
import pytest

from draftcore import ConfigError, InputError, TrieDrafter
from draftcore.tools.bounds import chain_bound, copy_bound, copy_or_frequent_bound
from draftcore.tools.peers import PromptLookupDrafter
from draftcore.tools.replay import replay
from draftcore.tools.traces import Trace, read_traces

REPO_TRACES = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "data", "smollm2_greedy_traces.jsonl.gz")


def trace(prompt, output, dataset="d", idx=0):
    return Trace(dataset, idx, np.array(prompt, np.int32), np.array(output, np.int32))


def test_copy_bound_drafts_what_followed_the_root_and_stops_at_the_output_end():
    # root 4: "4 9" never seen, 1 token; root 9: "9 2" never seen, 1 token; root 2: "2 3 4" seen,
    # 2 drafted (the last token is always the model's own) -> 5 tokens in 3 steps
    assert copy_bound([trace([1, 2, 3, 4], [9, 2, 3, 4, 7])]) == {"d": pytest.approx(5 / 3)}
    # a longer context must match too: "3 4 9" and "4 9 2" never seen; "9 2 3" not either; "2 3 4" is
    assert copy_bound([trace([1, 2, 3, 4], [9, 2, 3, 4, 7])], context=2) == {"d": pytest.approx(5 / 4)}


def test_chain_bound_composes_ngrams_that_were_never_seen_in_one_piece():
    prompt, output = [5, 6, 9, 6, 7], [5, 6, 7, 0]
    # root 7: "7 5" unseen, 1 token; then "5 6" and "6 7" each seen: 2 drafted + 1 -> 2 steps
    assert chain_bound([trace(prompt, output)], n=2) == {"d": pytest.approx(4 / 2)}
    # a copy needs "5 6 7" in one piece: root 7 -> 1, root 5 -> "5 6" (1 drafted), root 7 -> last token
    assert copy_bound([trace(prompt, output)]) == {"d": pytest.approx(4 / 3)}


def test_bounds_see_earlier_traces_per_dataset_and_respect_max_draft():
    first = trace([1, 2], [3, 4, 5, 6, 7, 8], "a", 0)
    again = trace([9, 2], [3, 4, 5, 6, 7, 8], "b", 0)   # copies the first trace's output after root 2
    assert copy_bound([first, again])["b"] == pytest.approx(6 / 1)
    assert copy_bound([first, again], max_draft=2)["b"] == pytest.approx(6 / 2)
    assert copy_bound([again])["b"] == pytest.approx(1.0)   # alone it has nothing to copy
    assert chain_bound([first, again])["b"] == pytest.approx(6 / 1)
    assert copy_bound([first, again], max_draft=0)["b"] == pytest.approx(1.0)


def test_copy_or_frequent_bound_adds_one_frequent_token_where_nothing_is_copied():
    t = trace([7, 7, 7, 1], [7, 5, 7, 5])
    # root 1: "1 7" never seen, but 7 is the most frequent token: 1 drafted, 2 tokens; root 5: "5 7"
    # never seen, 7 again: 2 tokens. Copies alone find nothing at any step: 4 steps.
    assert copy_or_frequent_bound([t], k=1) == {"d": pytest.approx(4 / 2)}
    assert copy_bound([t]) == {"d": pytest.approx(4 / 4)}
    assert copy_or_frequent_bound([t], k=1)["d"] >= copy_bound([t])["d"]


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(InputError, match="traces"):
        copy_bound([])
    with pytest.raises(ConfigError, match="context"):
        copy_bound([trace([1], [2])], context=0)
    with pytest.raises(ConfigError, match="n: expected an int >= 2"):
        chain_bound([trace([1], [2])], n=1)
    with pytest.raises(ConfigError, match="max_draft"):
        copy_bound([trace([1], [2])], max_draft=-1)
    with pytest.raises(ConfigError, match="^k: "):
        copy_or_frequent_bound([trace([1], [2])], k=0)
    with pytest.raises(InputError, match=r"d/0 output_ids holds ids in \[-1, 2\], expected ids in \[0, "):
        chain_bound([trace([1], [2, -1])])


@pytest.mark.parametrize("budget", [16, 64])
def test_no_retrieval_drafter_beats_the_copy_bound_on_recorded_traces(budget):
    """The trie without its frequent-token stage and transformers' prompt lookup draft only what
    followed the root somewhere in the seen text: their replayed tokens per step must stay at or under
    copy_bound. A bound too low (an off-by-one, a missed earlier trace) fails here."""
    traces = read_traces(REPO_TRACES)
    bound = copy_bound(traces, max_draft=budget)
    for make in (lambda: TrieDrafter(token_limit=49152, use_top=False), PromptLookupDrafter):
        measured = replay(traces, make, budget=budget, cost=None, eos_token_id=2)
        for dataset, summary in measured.items():
            assert 1.0 < summary.tokens_per_step <= bound[dataset] + 1e-9, (dataset, summary.tokens_per_step)
