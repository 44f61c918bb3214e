"""The drafting bounds (draftcore.tools.bounds): hand-computed cases, and no real drafter of a
family beating its family's bound on the recorded SmolLM2 traces."""
import os

import numpy as np
import pytest

from draftcore import ConfigError, InputError, TrieDrafter
from draftcore.drafters.trie_research import TrieResearch
from draftcore.tools.bounds import (_fastest_decode, chain_bound, copy_bound, copy_decode_seconds,
                                    copy_or_frequent_bound, copy_speedup_bound)
from draftcore.tools.cost_model import CostModel
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
    for make in (lambda: TrieDrafter(token_limit=49152, research=TrieResearch(use_top=False)), PromptLookupDrafter):
        measured = replay(traces, make, budget=budget, cost=None, eos_token_id=2)
        for dataset, summary in measured.items():
            assert 1.0 < summary.tokens_per_step <= bound[dataset] + 1e-9, (dataset, summary.tokens_per_step)


def test_copy_speedup_bound_is_tokens_per_step_where_every_verify_costs_the_same():
    """With a flat cost the fastest decode is the one with the fewest steps: copy_bound's."""
    flat = CostModel({1: 10.0, 300: 10.0})
    t = trace([1, 2, 3, 4], [9, 2, 3, 4, 7])
    assert copy_speedup_bound([t], flat) == {"d": pytest.approx(5 / 3)}
    traces = read_traces(REPO_TRACES)
    for frequent, bound in ((0, copy_bound(traces)), (64, copy_or_frequent_bound(traces, k=64))):
        speedup = copy_speedup_bound(traces, flat, frequent=frequent)
        assert speedup == pytest.approx(bound), frequent


def test_copy_speedup_bound_drafts_only_where_it_pays():
    t = trace([1, 2, 3, 4], [9, 2, 3, 4, 7])   # one step can copy 2 tokens (module docstring's case)
    # 3 nodes cost 5 one-token steps: copying 2 tokens there is slower than decoding them one by one
    assert copy_speedup_bound([t], CostModel({1: 1.0, 2: 3.0, 3: 5.0})) == {"d": pytest.approx(1.0)}
    # 3 nodes cost 2: the copy saves a step's worth (5 one-token steps against 1 + 1 + 2 + 1)
    assert copy_speedup_bound([t], CostModel({1: 1.0, 3: 2.0})) == {"d": pytest.approx(5 / 4)}
    # where 2 nodes cost less than 1 (a GEMM against a GEMV), a step carries a node it does not need
    assert copy_speedup_bound([t], CostModel({1: 2.0, 2: 1.0, 3: 1.0})) == {"d": pytest.approx(10 / 3)}


def test_copy_decode_seconds_prices_each_trace_at_its_own_costs():
    """Per trace: (one-token steps, fastest decode), each at its own cost table, later traces seeing
    the earlier ones."""
    first = trace([1, 2, 3, 4], [9, 2, 3, 4, 7])   # copies 2 tokens in one step (5 tokens, 3 steps)
    second = trace([5, 6], [9, 2, 3, 4, 7], idx=1)  # the same output: copies it from the first trace
    cheap, dear = CostModel({1: 1.0, 5: 1.0}), CostModel({1: 2.0, 2: 3.0, 3: 5.0, 5: 10.0})   # ms
    (plain_1, best_1), (plain_2, best_2) = (tuple(1e3 * t for t in pair) for pair in
                                            copy_decode_seconds([first, second], [cheap, dear]))
    assert (plain_1, best_1) == (pytest.approx(5.0), pytest.approx(3.0))
    # "9" follows nothing seen ("6 9" is new): one token alone (2 ms); then "2 3 4" could be copied
    # from the first trace, but at dear costs two steps of 2 nodes (3 ms each) beat one of 4
    # (7.5 ms): 2 + 3 + 3 = 8 ms, against 10 ms one token at a time
    assert plain_2 == pytest.approx(10.0) and best_2 == pytest.approx(8.0)
    # at the first trace's flat costs the copy runs whole: "9" alone, then "2 3 4" and the model's 7
    assert copy_decode_seconds([first, second], [cheap, cheap])[1][1] == pytest.approx(2e-3)
    # the same two traces at one table agree with copy_speedup_bound's per-dataset total
    both = copy_decode_seconds([first, second], [cheap, cheap])
    assert sum(p for p, _ in both) / sum(b for _, b in both) == pytest.approx(
        copy_speedup_bound([first, second], cheap)["d"])
    with pytest.raises(InputError, match="costs: expected one per trace"):
        copy_decode_seconds([first, second], [cheap])


def _slowest_search(longest, seconds):
    """Every way to cut the output into steps, tried (the dynamic program's twin)."""
    def best(position):
        if position == len(longest):
            return 0.0
        return min(min(seconds[d:]) + best(position + d + 1) for d in range(longest[position] + 1))
    return best(0)


@pytest.mark.parametrize("seed", range(20))
def test_fastest_decode_equals_trying_every_cut(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    longest = [int(rng.integers(0, n - p)) for p in range(n)]   # at most the tokens left after the root
    seconds = rng.uniform(0.5, 3.0, size=n + 1)
    fastest = np.minimum.accumulate(seconds[::-1])[::-1]
    assert _fastest_decode(longest, fastest) == pytest.approx(_slowest_search(longest, seconds))


@pytest.mark.parametrize("cost", ["hf-cpu", "llamacpp-cpu", "hf-cpu-avx2"])
def test_no_retrieval_drafter_beats_the_copy_speedup_bound_on_recorded_traces(cost):
    """The trie without its frequent-token stage, replayed with the auto budget on a cost table, is
    never faster than the copy family's best on the same table. A bound priced wrongly (a step's
    cost off by one node, the plain time on another size) fails here."""
    traces = read_traces(REPO_TRACES)
    bound = copy_speedup_bound(traces, cost, max_draft=256)
    measured = replay(traces, lambda: TrieDrafter(token_limit=49152, research=TrieResearch(use_top=False)),
                      cost=cost, eos_token_id=2)
    for dataset, summary in measured.items():
        assert 1.0 < summary.speedup <= bound[dataset] + 1e-9, (dataset, summary.speedup, bound[dataset])


def test_copy_speedup_bound_refuses_bad_arguments_by_name():
    t = trace([1], [2])
    with pytest.raises(ConfigError, match="cost: expected one of"):
        copy_speedup_bound([t], "no-such-table")
    with pytest.raises(ConfigError, match="^frequent: expected an int >= 0, got -1"):
        copy_speedup_bound([t], "hf-cpu", frequent=-1)
    with pytest.raises(ConfigError, match="max_draft"):
        copy_speedup_bound([t], "hf-cpu", max_draft=-1)
    with pytest.raises(InputError, match="traces"):
        copy_speedup_bound([], "hf-cpu")
