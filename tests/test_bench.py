"""The benchmark harness and the CLI commands around it."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from draftcore.tools import cli
from draftcore.tools.bench import (FLOOR, Method, Prompt, Run, bare_call_method, draftcore_method, format_table,
                                   kernel_choices, run_benchmark, summarize, summary_table, with_control,
                                   write_outputs)
from draftcore.tools.datasets import WORKLOADS
from draftcore.tools.traces import read_traces

REPO_TRACES = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "data", "smollm2_greedy_traces.jsonl.gz")
WORKLOAD_TRACES = os.path.join(os.path.dirname(REPO_TRACES), "smollm2_workload_traces.jsonl.gz")


def _fake_method(name, seconds_per_token, corrupt_at=None):
    def run(prompt_ids, max_new_tokens):
        tokens = (np.arange(max_new_tokens) + int(prompt_ids[0])).astype(np.int32)
        if corrupt_at is not None:
            tokens[corrupt_at] += 1
        return Run(tokens, seconds_per_token * max_new_tokens, max_new_tokens // 2 or 1)
    return Method(name, run)


def test_run_benchmark_interleaves_checks_identity_and_summarizes(tmp_path):
    calls = []
    plain = _fake_method("plain", 0.02)
    fast = _fake_method("fast", 0.01)
    wrong = _fake_method("wrong", 0.01, corrupt_at=3)
    for m in (plain, fast, wrong):
        inner = m.run
        m.run = (lambda inner, name: lambda p, n: (calls.append(name), inner(p, n))[1])(inner, m.name)
    prompts = [Prompt("d", i, np.array([i + 1], np.int32)) for i in range(4)]
    records = run_benchmark([plain, fast, wrong], prompts, 8, warmup=1)
    assert calls[:3] == ["plain", "fast", "wrong"]  # interleaved prompt by prompt
    assert len(records) == 3 * 3  # the warm-up prompt is run but not recorded
    rows = {r["method"]: r for r in summarize(records, baseline="plain")}
    assert rows["fast"]["speedup"] == pytest.approx(2.0)
    assert rows["fast"]["identical"] == 3 and rows["wrong"]["identical"] == 0
    assert all(r["first_difference"] == 3 for r in records if r["method"] == "wrong")
    assert "| d | fast | 3 |" in format_table(list(rows.values()))
    paths = write_outputs(str(tmp_path / "b"), {"title": "t"}, records, list(rows.values()))
    assert json.load(open(paths[0]))["summary"]
    if len(paths) > 1:
        assert os.path.getsize(paths[1]) > 1000  # a real PNG


def test_summary_counts_prompts_below_the_floor_and_sums_all_tokens_over_all_time():
    """Over 10, 10 and 40 tokens plain takes 1, 1 and 4 s, the method 0.5, 1.25 (0.8x: below the
    floor) and 3 s: per-prompt ratios 2.0, 0.8 and 1.33, median 1.33; all tokens over all time
    60 / 4.75 against plain's 60 / 6."""
    def record(method, idx, seconds, tokens):
        return {"dataset": "d", "idx": idx, "method": method, "new_tokens": tokens, "seconds": seconds,
                "steps": tokens, "tokens_per_second": tokens / seconds, "drafting_share": 0.0, "identical": True}
    tokens = [10, 10, 40]
    records = [record("plain", i, s, n) for i, (s, n) in enumerate(zip([1.0, 1.0, 4.0], tokens))]
    records += [record("m", i, s, n) for i, (s, n) in enumerate(zip([0.5, 1.25, 3.0], tokens))]
    row = {r["method"]: r for r in summarize(records, baseline="plain")}["m"]
    assert row["speedup"] == pytest.approx(4 / 3) and row["speedup_min"] == pytest.approx(0.8)
    assert row["speedup_all"] == pytest.approx(6 / 4.75)
    assert row["below_floor"] == 1 and 0.8 < FLOOR
    cells = summary_table([row])["rows"][0]
    assert "1/3" in cells and f"{6 / 4.75:.2f}x" in cells
    old = {k: v for k, v in row.items() if k not in ("speedup_all", "below_floor")}   # a run summarized before
    assert summary_table([old])["rows"][0].count("–") == 2


def test_the_control_runs_the_reference_again_last_under_its_own_name():
    plain, fast = _fake_method("plain", 0.02), _fake_method("fast", 0.01)
    methods = with_control([plain, fast])
    assert [m.name for m in methods] == ["plain", "fast", "plain, again"] and methods[2].run is plain.run
    prompts = [Prompt("d", i, np.array([i + 1], np.int32)) for i in range(3)]
    rows = {r["method"]: r for r in summarize(run_benchmark(methods, prompts, 8, warmup=0), baseline="plain")}
    assert rows["plain, again"]["speedup"] == pytest.approx(1.0) and rows["plain, again"]["identical"] == 3


def test_rounds_report_each_runs_median_round_and_start_every_dataset_afresh():
    """rounds=3: every (method, prompt) is the record of its median-speed round (not the first, the
    fastest or the slowest), each round resets every method at each dataset, and an output differing
    in any round is not identical."""
    from draftcore.errors import ConfigError
    plain_seconds = iter([3.0, 1.0, 2.0] * 10)   # per call, in call order: round r, prompt i
    fast_seconds = iter([0.5, 0.2, 0.9] * 10)
    resets = []
    flaky_round = {"n": 0}

    def timed(name, seconds, flaky=False):
        def run(prompt_ids, max_new_tokens):
            tokens = (np.arange(max_new_tokens) + int(prompt_ids[0])).astype(np.int32)
            if flaky and flaky_round["n"] == 3:  # fast's third reset: round 1, dataset d
                tokens[2] += 1                    # differs from plain there only, not its median round
            return Run(tokens, next(seconds), 4)
        return Method(name, run, reset=lambda: (resets.append(name),
                                                 flaky_round.update(n=flaky_round["n"] + (name == "fast"))))
    plain, fast = timed("plain", plain_seconds), timed("fast", fast_seconds, flaky=True)
    prompts = [Prompt("d", 0, np.array([1], np.int32)), Prompt("e", 0, np.array([2], np.int32))]
    records = run_benchmark([plain, fast], prompts, 8, warmup=0, rounds=3)
    assert resets == ["plain", "fast"] * 6        # 2 datasets x 3 rounds
    assert len(records) == 4
    by = {(r["dataset"], r["method"]): r for r in records}
    # plain's seconds by round: d -> 3, 2, 1 (calls 0, 2, 4); e -> 1, 3, 2 (calls 1, 3, 5)
    assert by[("d", "plain")]["seconds"] == 2.0 and by[("e", "plain")]["seconds"] == 2.0
    assert by[("d", "plain")]["tokens_per_second_by_round"] == [8 / 3, 8 / 2, 8 / 1]
    assert by[("d", "fast")]["seconds"] == 0.5    # 0.5, 0.9, 0.2 by round: the median
    assert by[("d", "fast")]["identical"] is False and by[("d", "fast")]["first_difference"] == 2
    assert by[("d", "fast")]["identical_by_round"] == [True, False, True]
    assert by[("d", "plain")]["identical"] is True
    assert run_benchmark([plain], prompts, 8, warmup=0, rounds=1)[0].get("tokens_per_second_by_round") is None
    with pytest.raises(ConfigError, match="rounds: expected an int >= 1, got 0"):
        run_benchmark([plain], prompts, 8, rounds=0)


def test_rounds_rotate_the_order_methods_run_in_and_keep_the_first_as_reference():
    """Round r runs each prompt's methods rotated by r (no method always runs right after another),
    records them in the given order, and checks outputs against the first method's run, whichever
    position it ran in: a method that differs from it is not identical in any round."""
    calls = []
    methods = [_fake_method("plain", 0.02), _fake_method("fast", 0.01), _fake_method("wrong", 0.01, corrupt_at=1)]
    for m in methods:
        inner = m.run
        m.run = (lambda inner, name: lambda p, n: (calls.append(name), inner(p, n))[1])(inner, m.name)
    records = run_benchmark(methods, [Prompt("d", 0, np.array([1], np.int32))], 4, warmup=0, rounds=3)
    assert calls == ["plain", "fast", "wrong", "fast", "wrong", "plain", "wrong", "plain", "fast"]
    assert [r["method"] for r in records] == ["plain", "fast", "wrong"]
    by = {r["method"]: r for r in records}
    assert by["fast"]["identical_by_round"] == [True, True, True]
    assert by["wrong"]["identical_by_round"] == [False, False, False]
    assert by["plain"]["identical"] is True


def test_each_round_restarts_the_bare_calls_session():
    """The bare call keeps its session's trie across prompts and datasets (what a user gets), but a
    new round must not draft from the previous round's outputs: each round restarts it."""
    from fixtures.toy import ToyModel, ToyVerifier

    from draftcore.session import Session
    verifier = ToyVerifier(ToyModel(vocab_size=24, seed=0))
    bare = bare_call_method("bare", verifier)
    prompts = [Prompt("d", i, np.array([1, 2, 3, 1, 2, 3, 1, i + 2], np.int32)) for i in range(2)]
    learnt = []
    for _ in range(2):
        assert run_benchmark([bare], prompts, 24, warmup=0)[0]["identical"]
        learnt.append((Session.of(verifier).drafter, Session.of(verifier).drafter.n_nodes))
    (first, first_nodes), (second, second_nodes) = learnt
    assert second is not first and second_nodes == first_nodes > 0   # the same work, from nothing
    bare.run(np.array([9, 8, 7, 6], np.int32), 24)                     # no restart: it keeps learning
    assert Session.of(verifier).drafter is second and second.n_nodes > second_nodes


def test_sampled_methods_are_compared_with_nothing():
    plain = _fake_method("plain", 0.02)
    sampled = _fake_method("sampled", 0.01)
    sampled.sampled = True
    prompts = [Prompt("d", i, np.array([i + 1], np.int32)) for i in range(3)]
    records = run_benchmark([plain, sampled], prompts, 8, warmup=0)
    assert all(r["identical"] is None for r in records if r["method"] == "sampled")
    assert all(r["identical"] for r in records if r["method"] == "plain")
    rows = {r["method"]: r for r in summarize(records, baseline="plain")}
    assert rows["sampled"]["identical"] is None and rows["plain"]["identical"] == 3
    table = format_table(list(rows.values()))
    assert "| (sampled) |" in table and "| 3/3 |" in table
    # a sampled reference: nothing is compared with it
    records = run_benchmark([sampled, plain], prompts, 8, warmup=0)
    assert all(r["identical"] is None for r in records)


def test_draftcore_method_keeps_the_trie_per_dataset_and_counts_backend_forwards():
    from fixtures.toy import ToyModel, ToyVerifier, plain_greedy

    verifier = ToyVerifier(ToyModel(vocab_size=24, seed=0))
    method = draftcore_method("dc", verifier, lambda: 4, count_forwards=lambda: verifier.n_verify)
    assert not method.sampled
    prompt = np.array([1, 2, 3, 1, 2, 3, 1, 2], np.int32)
    want = plain_greedy(verifier, prompt, 24)
    before = verifier.n_verify
    first = method.run(prompt, 24)
    np.testing.assert_array_equal(first.tokens, want)
    assert first.steps == verifier.n_verify - before and first.steps < 24
    second = method.run(prompt, 24)  # same dataset: the trie has seen this output and drafts all of it
    assert second.steps < first.steps
    method.reset()                   # a new dataset starts with an empty trie
    assert method.run(prompt, 24).steps == first.steps
    sampled = draftcore_method("dcs", verifier, lambda: 4, sampling=dict(temperature=1.0))
    assert sampled.sampled and len(sampled.run(prompt, 8).tokens) == 8


def test_bare_call_method_learns_in_the_verifiers_session_across_datasets():
    import draftcore
    from fixtures.toy import ToyModel, ToyVerifier, plain_greedy

    verifier = ToyVerifier(ToyModel(vocab_size=24, seed=0))
    method = bare_call_method("bare", verifier)
    session = draftcore.Session.of(verifier)
    # A fixed budget: the auto budget times the toy's verifies, and on a loaded machine it may
    # rightly stop drafting, which is not what this test is about.
    session.budget = draftcore.budget.as_budget_policy(4)
    prompt = np.array([1, 2, 3, 1, 2, 3, 1, 2], np.int32)
    first = method.run(prompt, 24)
    np.testing.assert_array_equal(first.tokens, plain_greedy(ToyVerifier(ToyModel(vocab_size=24, seed=0)), prompt, 24))
    method.reset()  # a new dataset: the bare call keeps its session all the same
    assert draftcore.Session.of(verifier) is session
    assert method.run(prompt, 24).steps < first.steps


def test_replay_cli_on_the_repos_recorded_traces(capsys):
    assert cli.main(["replay", "--traces", REPO_TRACES, "--eos", "2"]) == 0  # the library's defaults
    out = capsys.readouterr().out
    assert "humaneval" in out and "mtbench" in out


def test_cli_reports_bad_input_as_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"dataset": "x"}\n')
    assert cli.main(["replay", "--traces", str(bad)]) == 2
    assert "not a trace object" in capsys.readouterr().err


def test_record_then_replay_on_smollm2(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from draftcore.adapters.torch_hf.smollm2 import packaged_gguf
    try:
        packaged_gguf()
    except Exception as exc:
        pytest.skip(f"optional backend data missing: {exc}")
    out = tmp_path / "t.jsonl.gz"
    assert cli.main(["record", "--backend", "hf", "--dataset", "humaneval", "--n", "2", "--max-new-tokens", "12",
                     "--out", str(out)]) == 0
    traces = read_traces(out)
    assert len(traces) == 2 and all(t.output_ids.shape[0] == 12 for t in traces)
    assert cli.main(["replay", "--traces", str(out)]) == 0


def test_fixed_budget_method_names_parse_any_drafter_and_refuse_what_the_verifier_cannot_take():
    """"DRAFTER-fixedN" names a drafter with FixedBudget(N); anything else is not such a name."""
    from draftcore.errors import ConfigError
    from draftcore.tools.bench import fixed_budget_method

    assert fixed_budget_method("trie-fixed16") == ("trie", 16)
    assert fixed_budget_method("composite-nowindow-fixed5") == ("composite-nowindow", 5)
    assert fixed_budget_method("trie-fixed0", max_draft=0) == ("trie", 0)
    for name in ("trie", "nodraft", "draft-fixed5", "trie-fixed", "trie-fixed-1", "trie-fixed5x", "bare"):
        assert fixed_budget_method(name) is None, name
    with pytest.raises(ConfigError, match=r"'trie-fixed9'.*at most 8"):
        fixed_budget_method("trie-fixed9", max_draft=8)


def test_kernel_choices_are_reported_once_per_verifier():
    class Reporting:
        def __init__(self, choices):
            self.kernel_choices = choices

    shared, other = Reporting({"one_token": {"0-255": "split"}}), Reporting({"split_head": False})
    methods = [Method("plain", lambda p, n: None), Method("nodraft", lambda p, n: None, verifier=shared),
               Method("bare", lambda p, n: None, verifier=shared), Method("other", lambda p, n: None, verifier=other),
               Method("silent", lambda p, n: None, verifier=object())]
    assert kernel_choices(methods) == {"nodraft + bare": {"one_token": {"0-255": "split"}},
                                       "other": {"split_head": False}}


def _benchmark_script(name):
    """A script of benchmarks/ imported as a module (not run)."""
    import importlib.util
    import sys
    folder = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
    sys.path.insert(0, folder)   # the scripts import their _common
    try:
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


@pytest.mark.parametrize("path, datasets", [(REPO_TRACES, ("humaneval", "mtbench")), (WORKLOAD_TRACES, WORKLOADS)])
def test_recorded_traces_hold_the_prompts_the_datasets_build_today(path, datasets):
    """benchmarks/data's traces are replayed as those datasets (replay, budget_sim.py,
    drafting_bounds.py): their prompts must be the ones the datasets module builds now, token for
    token, or a changed dataset (as the agent set became a session) leaves the replays measuring
    the old one."""
    pytest.importorskip("transformers")
    from draftcore.tools.backends.prompts import load_prompts, load_tokenizer
    tokenizer = load_tokenizer()
    traces = read_traces(path)
    assert sorted({t.dataset for t in traces}) == sorted(datasets)
    for dataset in datasets:
        recorded = [t.prompt_ids for t in traces if t.dataset == dataset]
        for trace_ids, prompt in zip(recorded, load_prompts(tokenizer, dataset, len(recorded)), strict=True):
            np.testing.assert_array_equal(np.asarray(trace_ids), prompt.ids, err_msg=f"{dataset} {prompt.idx}")


def test_floor_prompts_have_the_asked_context_length_and_no_shared_text():
    """benchmarks/floor.py's prompts: about `context` tokens each (the chat template included), cut
    from different parts of the documentation."""
    pytest.importorskip("transformers")
    from draftcore.tools.backends.prompts import load_tokenizer
    floor = _benchmark_script("floor")
    tokenizer = load_tokenizer()
    document = floor.document_ids(tokenizer)
    for context in (100, 1000, 3000):
        prompts = floor.context_prompts(tokenizer, document, context, 3)
        assert [p.dataset for p in prompts] == [f"{context} tokens"] * 3
        for p in prompts:
            assert abs(len(p.ids) - context) <= 0.05 * context + 5
        assert len({tuple(p.ids[-40:]) for p in prompts}) == 3


@pytest.mark.parametrize("token_cost", [0.035, 0.14])
def test_chain_replay_s_oracle_bounds_every_chain_proposer_it_replays(token_cost):
    """benchmarks/chain_replay.py's headroom row: the oracle accepts at least as many tokens a step as
    RowDrafter and vLLM's n-gram rule replayed the same way (same traces, same counting: prefill's
    token is not a step's), and drafts only what it gets accepted. An oracle that counted one more
    step a request (prefill's token as a step's, which replay does not count) falls below RowDrafter
    here: a bound off in that way fails."""
    chain = _benchmark_script("chain_replay")
    traces = read_traces(REPO_TRACES)
    k = 8
    for dataset in ("humaneval", "mtbench"):
        group = [t for t in traces if t.dataset == dataset][:20]
        tokens, steps, drafted = chain.oracle(group, k)
        assert drafted == tokens - steps
        for propose in (chain.row_proposer(k, token_cost), lambda c: None if c is None else chain.vllm_ngram(c, k)):
            t, s, _ = chain.replay(group, propose, k)
            assert t == tokens and 1.0 < t / s <= tokens / steps + 1e-12, (dataset, t / s, tokens / steps)


def test_vllm_rounds_split_every_prompt_once_and_merge_back_in_order():
    """benchmarks/vllm_proposer.py --rounds: each part starts with the warm-up prompt, the measured
    prompts are split without loss or overlap, and merging the parts' results gives the prompts'
    tokens back in order, times and counters summed, and each round's speedup against its own plain."""
    bench = _benchmark_script("vllm_proposer")
    ids = [[0], [1], [2], [3], [4], [5], [6], [7]]
    parts = bench.in_rounds(ids, 3)
    assert all(part[0] == [0] for part in parts)
    assert [p for part in parts for p in part[1:]] == ids[1:]
    with pytest.raises(SystemExit, match="--rounds"):
        bench.in_rounds(ids, 8)

    def result(tokens, seconds, paused):
        return {"mtbench": {"tokens": tokens, "seconds": [None] * len(tokens), "total_seconds": seconds,
                            "spec": {"drafts": 2, "draft_tokens": 5, "accepted_tokens": 3},
                            "proposer": {"steps": 10, "seconds": 0.5, "paused_steps": paused}}}
    plain = bench.merged([result([[1, 2]], 2.0, None), result([[3], [4, 5, 6]], 4.0, None)])
    fast = bench.merged([result([[1, 2]], 1.0, 4), result([[3], [4, 5, 6]], 4.0, 1)])
    assert fast["mtbench"]["tokens"] == [[1, 2], [3], [4, 5, 6]]
    assert fast["mtbench"]["total_seconds"] == 5.0
    assert fast["mtbench"]["spec"] == {"drafts": 4, "draft_tokens": 10, "accepted_tokens": 6}
    assert fast["mtbench"]["proposer"] == {"steps": 20, "seconds": 1.0, "paused_steps": 5}
    assert plain["mtbench"]["proposer"]["paused_steps"] is None
    assert bench.by_round(fast["mtbench"], plain["mtbench"]) == "2.00x / 1.00x"


def test_end_to_end_bound_adds_the_prefill_to_the_copy_oracle_s_decode_at_each_request_s_costs():
    """benchmarks/end_to_end_bound.py's bound: plain seconds over (the measured prefill + the copy
    oracle's fastest decode at that request's own chain costs). The second request's output was the
    first's: at flat costs it decodes in 2 steps ("9" alone, then the copied "2 3 4" and the model's
    7); the frequent-token family can only be faster. A bound that left out the prefill, or priced a
    request at another's costs, fails here."""
    from draftcore.tools.traces import Trace
    bound = _benchmark_script("end_to_end_bound")
    traces = [Trace("d", 0, np.array([1, 2, 3, 4], np.int32), np.array([9, 2, 3, 4, 7], np.int32)),
              Trace("d", 1, np.array([5, 6], np.int32), np.array([9, 2, 3, 4, 7], np.int32))]
    requests = [{"plain_s": 1.0, "prefill_s": 0.2, "chain_ms": {1: 100.0, 8: 100.0}},
                {"plain_s": 1.0, "prefill_s": 0.3, "chain_ms": {1: 50.0, 8: 50.0}}]
    bound.add_bounds(requests, traces, frequent=64)
    assert requests[0]["bound_copy_s"] == pytest.approx(0.2 + 3 * 0.1)   # "9", "2", "3 4" + 7: 3 steps
    assert requests[1]["bound_copy_s"] == pytest.approx(0.3 + 2 * 0.05)
    assert requests[1]["bound_copy"] == pytest.approx(1.0 / 0.4)
    for r in requests:
        assert r["bound_copy_or_frequent"] >= r["bound_copy"]
