"""The vLLM proposer's floor (adapters/vllm/floor.py): where the engine's steps say drafting does
not pay, the proposer proposes nothing; where it pays, it keeps drafting. The engine is the
stand-in of row_engine.py, its step times a simulated cost: a step of r rows and d drafted tokens
takes 1 + ROW_COST * r + token_cost * d."""
from __future__ import annotations

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
    engine = Engine(repeating_requests(60, 4, VOCAB, output=(40, 90)), max_rows=MAX_SEQS, max_len=MAX_LEN, seed=4,
                    swap=0.0, inactive=0.0)
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
    return clock.now, proposer, float(np.mean(empty[-len(empty) // 3:]))


def test_drafting_that_costs_more_than_it_gains_is_paused(monkeypatch):
    """A drafted token costing 1.5 plain steps: drafting loses wherever a chain is not accepted whole."""
    plain, _, _ = serve(1.5, "off", monkeypatch, draft=False)
    always, _, _ = serve(1.5, "off", monkeypatch)
    floored, proposer, paused_late = serve(1.5, "auto", monkeypatch)
    stats = proposer.stats()["floor"]
    assert always > 1.3 * plain                  # the cost rule alone drafts where it loses
    assert stats["drafting_pays"] is False and paused_late > 0.7   # drafting tried 16 steps in 80
    # pausing sets in after two trials (steps 64 and ~200, PauseTrials), and drafting is tried again
    # now and then: what a floor costs at the start of a server's life, not a share of its run
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


def test_drafting_is_taken_up_again_when_it_comes_to_pay(monkeypatch):
    """Traffic changes under a server: drafted tokens dear for the first 300 steps, then cheap. The
    other arm is tried every 64 steps however long the winner has won, so drafting resumes."""
    _, proposer, paused_late = serve(lambda step: 1.5 if step < 300 else 0.02, "auto", monkeypatch)
    stats = proposer.stats()["floor"]
    assert proposer.steps > 500 and stats["paused_steps"] > 100      # it had paused
    assert stats["drafting_pays"] is True and paused_late < 0.1


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
