"""The vLLM proposer's costs learnt from step times (adapters/vllm/step_costs.py): synthetic steps of
a known cost model, and the proposer driven as vLLM drives it on a fake clock."""
from __future__ import annotations

import numpy as np
import pytest

from draftcore import ConfigError
from draftcore.adapters.vllm import DraftcoreProposer
from draftcore.adapters.vllm.step_costs import StepCosts, StepTimer
from row_engine import Engine, repeating_requests
from test_vllm_proposer import MAX_SEQS, VOCAB, clean_environment, stand_in_config, vllm_call  # noqa: F401

A, B, C = 0.020, 0.004, 0.0005   # seconds: a step of n rows and d drafted tokens costs A + B n + C d


def truth(rows: int, drafted: int) -> float:
    return A + B * rows + C * drafted


def test_the_defaults_hold_until_a_step_is_learnt():
    costs = StepCosts(0.04, 0.16, max_draft=8)
    assert costs.ratios() == (0.04, 0.16)


def test_varied_steps_give_the_machine_s_ratios_within_a_few_percent():
    rng = np.random.default_rng(0)
    costs = StepCosts(0.04, 0.16, max_draft=8)
    for _ in range(3000):
        rows, drafted = int(rng.integers(1, 9)), int(rng.integers(0, 9))
        drafted = min(drafted * rows, 64)
        assert costs.observe(truth(rows, drafted) * rng.uniform(0.95, 1.05), rows, drafted)
    token_cost, row_cost = costs.ratios()
    assert token_cost == pytest.approx(C / (A + B), rel=0.05)   # 0.0208, where the default says 0.04
    assert row_cost == pytest.approx(B / A, rel=0.05)


def test_one_row_teaches_token_cost_and_leaves_row_cost_at_the_prior():
    rng = np.random.default_rng(1)
    costs = StepCosts(0.04, 0.16, max_draft=8)
    for _ in range(2000):
        drafted = int(rng.integers(0, 9))
        costs.observe(truth(1, drafted) * rng.uniform(0.95, 1.05), 1, drafted)
    token_cost, row_cost = costs.ratios()
    assert token_cost == pytest.approx(C / (A + B), rel=0.05)
    assert row_cost == pytest.approx(0.16, rel=0.25)   # the data say nothing of it: near the prior


def test_a_step_three_times_its_cost_is_not_learnt_from():
    rng = np.random.default_rng(2)
    costs = StepCosts(0.04, 0.16, max_draft=8)
    for i in range(2000):
        drafted = int(rng.integers(0, 9))
        seconds = truth(1, drafted) * (20.0 if i % 50 == 49 else 1.0)   # a host pause every 50 steps
        costs.observe(seconds, 1, drafted)
    assert costs.steps_refused == 40
    assert costs.ratios()[0] == pytest.approx(C / (A + B), rel=0.05)


def test_a_gpu_like_step_makes_drafted_tokens_nearly_free():
    costs = StepCosts(0.04, 0.16, max_draft=8)
    for i in range(500):
        costs.observe(0.010 + 0.000005 * (i % 9), 1, i % 9)
    assert costs.ratios()[0] < 0.002


@pytest.mark.parametrize("name, value", [("token_cost", -1.0), ("row_cost", float("nan")), ("max_draft", 0)])
def test_bad_settings_are_refused_by_name(name, value):
    options = {"token_cost": 0.04, "row_cost": 0.16, "max_draft": 8}
    options[name] = value
    with pytest.raises(ConfigError, match=f"^{name}: "):
        StepCosts(options.pop("token_cost"), options.pop("row_cost"), **options)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_timer_learns_only_steps_that_ran_the_last_call_s_rows():
    clock = FakeClock()
    timer = StepTimer(StepCosts(0.04, 0.16, max_draft=4), clock)
    active = np.ones(2, np.bool_)
    timer.call_starts(np.array([10, 12]), active)                 # first call: nothing to learn
    timer.call_ends(np.array([10, 12]), active, drafted=3)
    clock.now += 0.05
    timer.call_starts(np.array([12, 13]), active)                 # grew by 3: within 2 .. 2 + 3
    assert timer.costs.steps_learnt == 1
    timer.call_ends(np.array([12, 13]), active, drafted=0)
    clock.now += 0.05
    timer.call_starts(np.array([13, 300]), active)                # a new request in row 1: its prefill ran
    timer.call_ends(np.array([13, 300]), active, drafted=2)
    clock.now += 0.05
    timer.call_starts(np.array([14, 301, 50]), np.ones(3, np.bool_))   # a row joined
    timer.call_ends(np.array([14, 301, 50]), np.array([True, True, False]), drafted=1)
    clock.now += 0.05
    timer.call_starts(np.array([15, 302, 51]), np.ones(3, np.bool_))   # the last call had a prefilling row
    assert timer.costs.steps_learnt == 1


def drive(proposer, clock, step_seconds):
    """Run an engine's requests through the proposer, the fake clock moving by a step's cost."""
    engine = Engine(repeating_requests(12, 5, VOCAB), max_rows=MAX_SEQS, max_len=128, seed=5)
    while not engine.done:
        drafts = vllm_call(proposer, engine)
        engine.step(drafts)
        clock.now += step_seconds(len(drafts), sum(map(len, drafts)))
    return engine


def test_the_proposer_learns_its_costs_where_one_rank_drafts():
    clock = FakeClock()
    config = stand_in_config()
    config.parallel_config.world_size = 1
    proposer = DraftcoreProposer(config)
    proposer.timer.clock = clock
    engine = drive(proposer, clock, lambda rows, drafted: 0.010 + 0.000001 * drafted)   # drafts nearly free
    stats = proposer.stats()
    assert stats["costs_measured"] and stats["steps_timed"] > 20
    assert stats["token_cost"] < 0.01 < proposer.options.token_cost
    assert engine.accepted > 0


@pytest.mark.parametrize("setting", ["two ranks", "costs set", "measuring off", "world size unknown"])
def test_the_proposer_keeps_fixed_costs_where_asked_or_where_ranks_must_agree(monkeypatch, setting):
    clock = FakeClock()
    config = stand_in_config()
    config.parallel_config.world_size = 2 if setting == "two ranks" else 1
    if setting == "world size unknown":
        del config.parallel_config.world_size
    if setting == "costs set":
        monkeypatch.setenv("DRAFTCORE_TOKEN_COST", "0.05")
    if setting == "measuring off":
        monkeypatch.setenv("DRAFTCORE_MEASURE_COSTS", "0")
    proposer = DraftcoreProposer(config)
    assert proposer.timer is None
    drive(proposer, clock, lambda rows, drafted: 0.010 + 0.000001 * drafted)
    stats = proposer.stats()
    assert not stats["costs_measured"]
    assert stats["token_cost"] == (0.05 if setting == "costs set" else 0.04)


def test_a_bad_measure_costs_value_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("DRAFTCORE_MEASURE_COSTS", "yes")
    with pytest.raises(ConfigError, match="^DRAFTCORE_MEASURE_COSTS: 'yes'; expected 1"):
        DraftcoreProposer(stand_in_config())
