"""Trace replay: TraceVerifier on the verifier protocol, the simulated clock, and replay()."""
from __future__ import annotations

import numpy as np
import pytest

import draftcore
from draftcore import CostAwareBudget, DraftTree, FixedBudget, InputError, TrieDrafter
from draftcore.checks import MISSING
from draftcore.tools.cost_model import CostModel, SimulatedClock
from draftcore.tools.oracle_budget import ASSISTS, AssistedBudget, OracleBudget
from draftcore.tools.replay import TraceVerifier, replay, vocab_size_of
from draftcore.tools.traces import Trace, read_traces, write_traces
from naive import naive_greedy_accept


def _tree(tokens, parents):
    tokens = np.asarray(tokens, np.int32)
    parents = np.asarray(parents, np.int32)
    depths = np.zeros_like(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return DraftTree(tokens, parents, depths)


def _traces(n=8, seed=0):
    """Outputs that repeat a shared phrase, so a trie learns across requests and drafts long matches."""
    rng = np.random.default_rng(seed)
    phrase = rng.integers(3, 60, 30).astype(np.int32)
    traces = []
    for i in range(n):
        out = np.concatenate([phrase[i % 4:], rng.integers(3, 60, 5), phrase[:12], [2]]).astype(np.int32)
        traces.append(Trace("a" if i % 2 else "b", i, rng.integers(3, 60, 7).astype(np.int32), out))
    return traces


def test_trace_verifier_answers_on_the_trace_and_minus_one_off_it():
    trace = Trace("t", 0, np.array([9, 8], np.int32), np.array([5, 6, 7, 8], np.int32))
    verifier = TraceVerifier.for_traces([trace])
    assert verifier.vocab_size == 10
    verifier.load(trace)
    first, logits = verifier.prefill(trace.prompt_ids)
    assert first.tolist() == [5] and first.dtype == np.int32 and logits.shape == (0, 10)
    # root 5; on the trace: 6 (child of root), 7 (child of 6); off it: 3 (child of root), 4 (child of 3)
    tree = _tree([5, 6, 3, 7, 4], [-1, 0, 0, 1, 2])
    tokens, logits = verifier.verify(tree)
    assert tokens.tolist() == [6, 7, MISSING, 8, MISSING]  # never a made-up 0
    assert tokens.dtype == np.int32 and logits.shape == (0, 10)
    verifier.commit(np.array([0, 1], np.int32))
    assert verifier.n_past == 2 + 2
    # the recorded output ends after 8: the model's token after it is unknown too
    tokens, _ = verifier.verify(_tree([7, 8, 1], [-1, 0, 1]))
    assert tokens.tolist() == [8, MISSING, MISSING]


def test_trace_verifier_refuses_logits_and_trees_off_its_trace():
    trace = Trace("t", 0, np.array([9], np.int32), np.array([5, 6, 7], np.int32))
    verifier = TraceVerifier.for_traces([trace])
    with pytest.raises(InputError, match="no trace loaded"):
        verifier.prefill(trace.prompt_ids)
    verifier.load(trace)
    with pytest.raises(InputError, match="n_logits"):
        verifier.prefill(trace.prompt_ids, n_logits=1)
    with pytest.raises(InputError, match="before prefill"):
        verifier.verify(_tree([5], [-1]))
    verifier.prefill(trace.prompt_ids)
    with pytest.raises(InputError, match="n_logits"):
        verifier.verify(_tree([5, 6], [-1, 0]), n_logits=1)
    with pytest.raises(InputError, match="left its trace"):
        verifier.verify(_tree([4], [-1]))
    with pytest.raises(InputError, match="vocabulary"):
        verifier.load(Trace("t", 1, np.array([1], np.int32), np.array([99], np.int32)))


def test_replay_reproduces_each_trace_and_reports_per_dataset():
    traces = _traces()
    report = replay(traces, eos_token_id=2)
    assert list(report) == ["b", "a"]  # the order datasets first appear
    for name, summary in report.items():
        assert summary.requests == 4
        assert summary.new_tokens == sum(t.output_ids.shape[0] for t in traces if t.dataset == name)
        assert summary.tokens_per_step > 1.5 and summary.speedup > 1.0
        assert sum(summary.accepted_hist) == sum(summary.budget_hist.values()) == len(summary.draft_seconds)
        assert summary.steps == summary.requests + sum(summary.accepted_hist)  # one prefill each
    assert isinstance(report.drafter, TrieDrafter) and isinstance(report.budget, CostAwareBudget)


def test_replay_with_the_cost_model_is_deterministic():
    traces = _traces()
    first, second = replay(traces, eos_token_id=2), replay(traces, eos_token_id=2)
    for name in first:
        assert first[name].tokens_per_step == second[name].tokens_per_step
        assert first[name].budget_hist == second[name].budget_hist
        assert first[name].accepted_hist == second[name].accepted_hist
        assert first[name].speedup == second[name].speedup
    assert len(set().union(*(s.budget_hist for s in first.values()))) > 1  # the auto budget did choose


def test_replay_is_the_bare_call_with_its_session_kept_across_traces():
    traces = _traces()
    clock = SimulatedClock(CostModel.named("hf-cpu"))
    verifier = TraceVerifier.for_traces(traces, clock=clock)
    budgets: dict = {}
    for trace in traces:
        verifier.load(trace)
        result = draftcore.speculate(verifier, trace.prompt_ids, max_new_tokens=trace.output_ids.shape[0],
                                     eos_token_id=2, clock=clock)
        for k, c in result.stats.budget_hist.items():
            budgets[k] = budgets.get(k, 0) + c
    report = replay(traces, eos_token_id=2)
    merged: dict = {}
    for summary in report.values():
        for k, c in summary.budget_hist.items():
            merged[k] = merged.get(k, 0) + c
    assert merged == budgets
    assert sum(s.simulated_seconds for s in report.values()) == pytest.approx(clock())


def test_replay_with_a_fresh_trie_per_request_drafts_less():
    traces = _traces()
    carried = replay(traces, budget=16, eos_token_id=2)
    reset = replay(traces, budget=16, eos_token_id=2, reset_per_request=True)
    assert sum(s.steps for s in reset.values()) > sum(s.steps for s in carried.values())
    assert isinstance(carried.budget, FixedBudget) and carried.budget.n == 16
    with pytest.raises(draftcore.ConfigError, match="reset_per_request"):
        replay(traces, TrieDrafter(), reset_per_request=True)
    made = []
    replay(traces, lambda: made.append(TrieDrafter(branch_length=12)) or made[-1], reset_per_request=True)
    assert len(made) == len(traces)


def test_replay_without_a_cost_model_reports_no_speedup():
    report = replay(_traces(4), budget=8, cost=None, eos_token_id=2)
    assert all(s.speedup is None and s.tokens_per_step > 1.0 for s in report.values())


def test_accepted_by_prefix_is_the_greedy_walk_of_each_prefix_and_changes_nothing():
    trace = Trace("t", 0, np.array([9, 8], np.int32), np.array([5, 6, 7, 8, 4], np.int32))
    verifier = TraceVerifier.for_traces([trace])
    verifier.load(trace)
    verifier.prefill(trace.prompt_ids)
    # root 5; 6 -> 7 on the trace, 3 -> 4 off it, then 8 under 7 on it
    tree = _tree([5, 6, 3, 7, 4, 8], [-1, 0, 0, 1, 2, 3])
    assert verifier.accepted_by_prefix(tree).tolist() == [0, 1, 1, 2, 2, 3]
    assert verifier.n_past == 2   # nothing verified or committed
    verifier.verify(tree)
    verifier.commit(np.array([0, 1], np.int32))
    # after the commit the root is 7: 8 follows it on the trace, the second 8 is a sibling off it
    assert verifier.accepted_by_prefix(_tree([7, 8, 8, 4], [-1, 0, 0, 1])).tolist() == [0, 1, 1, 2]
    with pytest.raises(InputError, match="left its trace"):
        verifier.accepted_by_prefix(_tree([6], [-1]))


class _RecordingOracle(OracleBudget):
    """The oracle, keeping each chosen step's tree and the path the loop really accepted."""

    def __init__(self, verifier, cost):
        super().__init__(verifier, cost)
        self.steps, self._tree, self._base = [], None, 0

    def choose(self, tree):
        self._tree, self._base = tree, self.verifier.n_past - self.verifier._loaded("test").prompt_ids.shape[0]
        return super().choose(tree)

    def observe(self, tree, path, seconds):
        if self._tree is not None:
            self.steps.append((self._tree, self._base, self.chosen[-1], self.accepted[-1], path.shape[0] - 1))
        self._tree = None


@pytest.mark.parametrize("table", ["llamacpp-cpu", "hf-cpu"])
def test_the_oracle_verifies_the_best_prefix_and_accepts_what_it_knew(table):
    traces = _traces()
    cost = CostModel.named(table)
    clock = SimulatedClock(cost)
    verifier = TraceVerifier.for_traces(traces, clock=clock)
    oracle, drafter = _RecordingOracle(verifier, cost), TrieDrafter()
    for trace in traces:
        verifier.load(trace)
        draftcore.speculate(verifier, trace.prompt_ids, max_new_tokens=trace.output_ids.shape[0], eos_token_id=2,
                            drafter=drafter, budget=oracle, clock=clock)
        out = trace.output_ids
        for tree, base, chosen, expected, accepted in oracle.steps:
            assert accepted == expected   # the loop accepted what the oracle said it would
            # every prefix by a naive walk against the recorded output: none gives more tokens per second
            values = []
            for k in range(tree.n_draft + 1):
                at = base + tree.depths[:k + 1].astype(np.int64)
                model = np.where(at + 1 < out.shape[0], out[np.minimum(at + 1, out.shape[0] - 1)], -1)
                path, _ = naive_greedy_accept(tree.tokens[:k + 1], tree.parents[:k + 1], model)
                values.append(len(path) / cost.seconds(k + 1))
            assert values[chosen] == max(values)
        oracle.steps.clear()
    assert len(oracle.chosen) > 20 and max(oracle.chosen) > 1
    # the ceiling over the same drafter's proposals: above the auto budget and every fixed size
    ceiling = replay(traces, budget="oracle", cost=table, eos_token_id=2)
    for other in ["auto", 2, 8, 64]:
        report = replay(traces, budget=other, cost=table, eos_token_id=2)
        for name in report:
            assert ceiling[name].speedup >= report[name].speedup
    assert isinstance(ceiling.budget, OracleBudget)
    with pytest.raises(draftcore.ConfigError, match="oracle"):
        replay(traces, budget="oracle", cost=None)


def test_cost_model_interpolates_extrapolates_and_parses_tables():
    hf = CostModel.named("hf-cpu-unpacked")
    assert hf.seconds(1) == pytest.approx(0.046)
    assert hf.seconds(5) == pytest.approx((0.0551 + 0.0725) / 2)
    assert hf.seconds(48) == pytest.approx(0.1327 + 16 * (0.1327 - 0.099) / 16)  # past the table: its last slope
    table = CostModel.named("1:10,3:30")
    assert table.seconds(2) == pytest.approx(0.02)
    for bad in ("fast", "1:x", "0:5", "2:-1"):
        with pytest.raises(draftcore.ConfigError, match="cost"):
            CostModel.named(bad)


def test_traces_round_trip_through_gzip_reproducibly(tmp_path):
    traces = _traces(3)
    for name in ("t.jsonl", "t.jsonl.gz", "u.jsonl.gz"):
        write_traces(tmp_path / name, traces)
        back = read_traces(tmp_path / name)
        assert [(t.dataset, t.idx) for t in back] == [(t.dataset, t.idx) for t in traces]
        assert all(np.array_equal(a.output_ids, b.output_ids) for a, b in zip(back, traces))
    assert (tmp_path / "t.jsonl.gz").read_bytes() == (tmp_path / "u.jsonl.gz").read_bytes()
    assert (tmp_path / "t.jsonl.gz").read_bytes()[:2] == b"\x1f\x8b"
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(InputError, match="cannot read"):
        read_traces(tmp_path / "bad.jsonl.gz")


def test_vocab_size_of_covers_every_token():
    traces = _traces(3)
    assert vocab_size_of(traces) == 1 + max(int(max(t.prompt_ids.max(), t.output_ids.max())) for t in traces)


class _RecordingAssist(AssistedBudget):
    def __init__(self, verifier, assist):
        super().__init__(verifier, assist)
        self.choices = []   # (the auto budget's k, the assisted choice, accepted tokens by prefix)

    def assisted_choice(self, tree, k):
        changed = super().assisted_choice(tree, k)
        n = min(tree.n_draft, self.max_nodes) + 1
        self.choices.append((k, changed, self.verifier.accepted_by_prefix(tree)[:n]))
        return changed


@pytest.mark.parametrize("assist", ASSISTS)
def test_an_assisted_budget_changes_only_the_choices_its_knowledge_names(assist):
    """oracle-skip drops exactly the trees of which nothing would be accepted; oracle-extend grows
    exactly the choices accepted whole short of what the proposal would accept, to a menu size that
    accepts it all; the replay still reproduces every recorded output."""
    traces = _traces()
    clock = SimulatedClock(CostModel.named("hf-cpu"))
    verifier = TraceVerifier.for_traces(traces, clock=clock)
    budget, drafter = _RecordingAssist(verifier, assist), TrieDrafter()
    for trace in traces:
        verifier.load(trace)
        result = draftcore.speculate(verifier, trace.prompt_ids, max_new_tokens=trace.output_ids.shape[0],
                                     eos_token_id=2, drafter=drafter, budget=budget, clock=clock)
        assert np.array_equal(result.tokens, trace.output_ids[:result.tokens.shape[0]])
    changed = [(k, c, accepted) for k, c, accepted in budget.choices if c != k]
    assert changed and budget.assisted == len(changed)
    for k, c, accepted in budget.choices:
        if assist == "oracle-skip":
            assert (c != k) == (k > 0 and accepted[-1] == 0) and (c == k or c == 0)
        else:
            grows = 0 < k < accepted.shape[0] - 1 and accepted[k] == k and accepted[-1] > k
            assert (c != k) == grows
            if grows:
                assert accepted[c] == accepted[-1] and (c + 1 in budget.sizes or c == accepted.shape[0] - 1)


def test_an_unknown_assist_is_refused():
    verifier = TraceVerifier.for_traces(_traces())
    with pytest.raises(draftcore.ConfigError, match="assist: expected one of"):
        AssistedBudget(verifier, "oracle-everything")
