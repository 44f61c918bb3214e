"""draftcore's vLLM proposer without vLLM: a stand-in config and rows handed over as vLLM hands them
(token_ids_cpu int32[max_num_seqs, max_model_len], num_tokens_no_spec, sampled_token_ids lists).
The proposer inside a real vLLM engine is tested by `make test-vllm` (tests/vllm/)."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from draftcore import ConfigError, TrieDrafter
from draftcore.adapters.vllm import DraftcoreProposer, options_from_environment
from draftcore.drafters.rows import RowDrafter
from row_engine import Engine, repeating_requests, vllm_arguments

VOCAB, K, MAX_LEN, MAX_SEQS = 40, 4, 128, 3


def stand_in_config(k=K, max_len=MAX_LEN, max_seqs=MAX_SEQS, vocab=VOCAB, device="cpu", drop=None, ranks=1):
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, method="custom_class"),
        model_config=SimpleNamespace(max_model_len=max_len, get_vocab_size=lambda: vocab),
        scheduler_config=SimpleNamespace(max_num_seqs=max_seqs),
        parallel_config=SimpleNamespace(tensor_parallel_size=ranks),
        device_config=SimpleNamespace(device_type=device))
    if drop:
        section, name = drop.split(".")
        delattr(getattr(config, section), name)
    return config


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in [n for n in __import__("os").environ if n.startswith("DRAFTCORE_") and n != "DRAFTCORE_CACHE"]:
        monkeypatch.delenv(name)


def vllm_call(proposer, engine):
    """One propose() with the arguments vLLM passes, from the engine's batch."""
    rows, n_tokens, active, _ = engine.batch()
    sampled = [[int(rows[r, n_tokens[r] - 1])] if active[r] else [] for r in range(len(n_tokens))]
    num_tokens_no_spec = np.zeros(MAX_SEQS, np.int32)   # vLLM's array has a slot per possible row
    num_tokens_no_spec[:len(n_tokens)] = n_tokens
    return proposer.propose(sampled, num_tokens_no_spec, rows, slot_mappings=None)


def test_drafts_as_vllm_wants_them_and_equal_the_row_drafter_s(monkeypatch):
    monkeypatch.setenv("DRAFTCORE_PAUSE", "off")   # the chains alone (the floor: test_vllm_floor.py)
    engine = Engine(repeating_requests(12, 5, VOCAB), max_rows=MAX_SEQS, max_len=MAX_LEN, seed=5)
    proposer = DraftcoreProposer(stand_in_config())
    proposer.load_model(object())   # vLLM's CPU runner calls it with the target model: a no-op
    reference = RowDrafter(max_rows=MAX_SEQS, max_len=MAX_LEN, max_draft=K, token_limit=VOCAB,
                           token_cost=proposer.options.token_cost)
    drafted = 0
    while not engine.done:
        rows, n_tokens, active, _ = engine.batch()
        drafts = vllm_call(proposer, engine)
        tokens, lengths = reference.propose(rows, n_tokens, active)
        assert drafts == [tokens[r, :lengths[r]].tolist() for r in range(len(n_tokens))]
        assert len(drafts) == len(n_tokens)
        for r, draft in enumerate(drafts):
            assert isinstance(draft, list) and all(type(t) is int and 0 <= t < VOCAB for t in draft)
            assert len(draft) <= K and (active[r] or draft == [])
            assert n_tokens[r] + len(draft) + 1 <= MAX_LEN
        drafted += sum(map(len, drafts))
        engine.step(drafts)
    assert drafted > 0 and engine.accepted > 0
    assert proposer.stats()["steps"] == engine.steps and proposer.stats()["propose_seconds"] > 0


def test_a_row_reused_by_a_new_request_gets_no_draft_from_the_old_request():
    proposer = DraftcoreProposer(stand_in_config())
    rows = np.zeros((MAX_SEQS, MAX_LEN), np.int32)
    old = [1, 2, 3, 30, 31, 32, 33, 4, 5, 6, 9, 30, 31]   # its prompt alone holds 30 31 -> 32 33
    rows[0, :len(old)] = old
    n = np.zeros(MAX_SEQS, np.int32)
    n[0] = len(old) - 2
    proposer.propose([[9]], n, rows)
    n[0] = len(old)
    assert proposer.propose([[31]], n, rows)[0][:2] == [32, 33]      # the old request drafts its prompt
    new = [8, 9, 8, 9, 30, 31]
    rows[0, :len(new)] = new
    n[0] = len(new)
    assert 32 not in proposer.propose([[31]], n, rows)[0]            # the new one in the same row does not


def test_empty_batches_empty_rows_and_rows_at_max_model_len():
    proposer = DraftcoreProposer(stand_in_config(max_len=16))
    rows = np.zeros((MAX_SEQS, 16), np.int32)
    rows[:, :15] = np.tile([3, 4, 5], 5)
    assert proposer.propose([], np.zeros(MAX_SEQS, np.int32), rows) == []
    n = np.array([14, 15, 9], np.int32)
    for _ in range(3):
        drafts = proposer.propose([[5], [3], []], n, rows)
        assert len(drafts[0]) <= 1 and drafts[1] == [] and drafts[2] == []


def long_requests(n, seed, max_len):
    """(prompt, continuation) pairs of text that repeats itself (8 % noise): 1,500 to 1,900 prompt
    tokens, continued to max_len tokens in all."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        text = np.tile(rng.integers(0, VOCAB, int(rng.integers(2, 7))), max_len)[:max_len]
        noise = rng.random(max_len) < 0.08
        text[noise] = rng.integers(0, VOCAB, int(noise.sum()))
        n_prompt = int(rng.integers(1500, 1900))
        out.append((text[:n_prompt].astype(np.int32), text[n_prompt:].astype(np.int32)))
    return out


@pytest.mark.parametrize("capacity", [None, "64"], ids=["default trie", "smallest trie"])
def test_requests_that_run_to_a_long_max_model_len(monkeypatch, capacity):
    """Rows of vLLM's token_ids_cpu[max_num_seqs, 2048] (vllm_engine.build_llm's max_model_len) filled by
    1,500-1,900-token prompts and generated to their last position: every draft leaves room for the
    model's own token, drafts are accepted to the end, and with the smallest trie the options allow
    (64 nodes: one prompt's branches overflow it at once) too."""
    if capacity:
        monkeypatch.setenv("DRAFTCORE_TRIE_CAPACITY", capacity)
    max_len = 2048
    engine = Engine(long_requests(5, 11, max_len), max_rows=MAX_SEQS, max_len=max_len, seed=3)
    proposer = DraftcoreProposer(stand_in_config(max_len=max_len))
    late = 0   # tokens drafted for rows within 2 * K of the end
    while not engine.done:
        _, n_tokens, _, _ = engine.batch()
        drafts = vllm_call(proposer, engine)
        for n, draft in zip(n_tokens.tolist(), drafts):
            assert n + len(draft) + 1 <= max_len
            late += len(draft) if n > max_len - 2 * K else 0
        engine.step(drafts)
    assert engine.accepted > 0 and late > 0
    assert engine.made == {q: max_len - len(prompt) for q, (prompt, _) in engine.requests.items()}   # all to the end


def test_the_same_calls_give_the_same_drafts_on_every_rank():
    """Tensor-parallel ranks each draft (and with async scheduling verify their own drafts): with more
    than one rank the proposer times nothing, so ranks whose steps take different times (here: on
    one, a drafted token costs 3 steps; on the other, nothing) still draft alike."""
    runs = []
    for token_cost in (3.0, 0.0):
        engine = Engine(repeating_requests(40, 9, VOCAB, output=(40, 90)), max_rows=MAX_SEQS, max_len=MAX_LEN, seed=9,
                        inactive=0.0)
        clock = SimpleNamespace(now=0.0)
        proposer = DraftcoreProposer(stand_in_config(ranks=2), clock=lambda: clock.now)
        assert proposer.floor is None
        out, seen = [], {}
        while not engine.done:
            drafts = proposer.propose(*vllm_arguments(engine, seen, MAX_SEQS))
            out.append(drafts)
            clock.now += 1.0 + token_cost * sum(map(len, drafts))
            engine.step(drafts)
        runs.append(out)
    assert runs[0] == runs[1]


def test_options_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTCORE_TOKEN_COST", "0.2")
    monkeypatch.setenv("DRAFTCORE_TREE_NODES", "24")
    monkeypatch.setenv("DRAFTCORE_TRIE_CAPACITY", "4096")
    monkeypatch.setenv("DRAFTCORE_MATCH_COST", "inf")
    proposer = DraftcoreProposer(stand_in_config())
    assert (proposer.rows.token_cost, proposer.rows.tree_nodes, proposer.rows.drafter.capacity) == (0.2, 24, 4096)
    assert proposer.rows.match_cost == float("inf") and options_from_environment({}).match_cost == 0.07
    assert options_from_environment({}, device="cuda").token_cost < options_from_environment({}, device="cpu").token_cost


def test_a_saved_trie_warms_the_proposer(monkeypatch, tmp_path):
    trie = TrieDrafter(capacity=1 << 12, token_limit=VOCAB)
    trie.warm_up([np.array([7, 8, 9, 10, 11, 12], np.int32)] * 3)
    path = tmp_path / "trie.npz"
    trie.save(path)
    monkeypatch.setenv("DRAFTCORE_TRIE_FILE", str(path))
    proposer = DraftcoreProposer(stand_in_config())
    rows = np.zeros((MAX_SEQS, MAX_LEN), np.int32)
    rows[0, :4] = [1, 2, 7, 8]
    n = np.zeros(MAX_SEQS, np.int32)
    n[0] = 4
    assert proposer.propose([[8]], n, rows)[0][:2] == [9, 10]   # learnt before this server started


@pytest.mark.parametrize("name, value, message", [
    ("DRAFTCORE_TOKEN_COST", "-1", "DRAFTCORE_TOKEN_COST: '-1'; expected a finite number >= 0"),
    ("DRAFTCORE_TOKEN_COST", "cheap", "DRAFTCORE_TOKEN_COST: 'cheap'"),
    ("DRAFTCORE_TREE_NODES", "0", "DRAFTCORE_TREE_NODES: '0'; expected an integer >= 1"),
    ("DRAFTCORE_MATCH_COST", "-0.1", "DRAFTCORE_MATCH_COST: '-0.1'; expected a number >= 0, or inf"),
    ("DRAFTCORE_MATCH_COST", "nan", "DRAFTCORE_MATCH_COST: 'nan'"),
    ("DRAFTCORE_TRIE_CAPACITY", "1e6", "DRAFTCORE_TRIE_CAPACITY: '1e6'"),
    ("DRAFTCORE_DRAFTER", "jacobi", "DRAFTCORE_DRAFTER: 'jacobi'; expected one of \\['trie'\\]"),
    ("DRAFTCORE_TRIE_FILE", "/no/such/trie.npz", "DRAFTCORE_TRIE_FILE: '/no/such/trie.npz' is not a file"),
    ("DRAFTCORE_TOKENCOST", "0.1", "DRAFTCORE_TOKENCOST: not an option"),
    ("DRAFTCORE_PAUSE", "on", "DRAFTCORE_PAUSE: 'on'; expected one of \\['auto', 'off'\\]"),
    # sizes past what one verify or this machine's memory holds (they raised a MemoryError at startup)
    ("DRAFTCORE_TREE_NODES", str(10**12), "DRAFTCORE_TREE_NODES: 1000000000000 asks for trees of .* expected at most"),
    ("DRAFTCORE_TRIE_CAPACITY", str(2**40), "DRAFTCORE_TRIE_CAPACITY=1099511627776: the trie's node pool would take "
                                            ".* more than this machine's physical memory"),
])
def test_bad_options_are_refused_at_construction(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        DraftcoreProposer(stand_in_config())


def test_a_config_without_the_tested_interface_is_refused_naming_what_is_missing_and_the_versions():
    for missing in ("scheduler_config.max_num_seqs", "speculative_config.num_speculative_tokens",
                    "model_config.max_model_len", "parallel_config.tensor_parallel_size"):
        with pytest.raises(ConfigError, match=rf"vllm_config\.{missing}: missing .* tested with vLLM 0\.32\.0"):
            DraftcoreProposer(stand_in_config(drop=missing))


def test_importing_the_adapter_imports_neither_vllm_nor_numba():
    code = "import sys, draftcore.adapters.vllm; print('vllm' in sys.modules, 'numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
