"""RowDrafter: chains for a batch of rows in one call, requests found again by their tokens.

The reference is NaiveRowDrafter (tests/naive.py), which drives one TrieRequest per request with the
identities the test engine knows (tests/row_engine.py: rows reused, condensed, swapped, inactive).
Equal chains at every step mean the row drafter found every request's state, and only its own.
"""
from __future__ import annotations

import numpy as np
import pytest

from draftcore import ConfigError, InputError, TrieDrafter
from draftcore.drafters.rows import RowDrafter
from draftcore.drafters.trie_research import TrieResearch
from naive import NaiveRowDrafter
from row_engine import Engine, repeating_requests

VOCAB = 40
OPTIONS = dict(max_draft=6, token_cost=0.05, tree_nodes=16, memory=50.0)


def make_pair(max_rows, max_len, capacity=1 << 12, by_row=False, **options):
    options = {**OPTIONS, **options}
    fast = RowDrafter(max_rows=max_rows, max_len=max_len, token_limit=VOCAB, capacity=capacity, **options)
    # rows draft with the trie's plain scores (RowDrafter), so the per-request twin's trie does too
    slow = NaiveRowDrafter(TrieDrafter(capacity=capacity, token_limit=VOCAB, max_requests=max_rows,
                                       research=TrieResearch(calibrate=False)),
                           max_rows=max_rows, max_len=max_len, by_row=by_row, **options)
    return fast, slow


def first_difference(engine, fast, slow):
    """Run the engine to the end, both drafters proposing; the first step where they differ (or None).
    The engine follows the row drafter's chains."""
    while not engine.done:
        rows, n_tokens, active, ids = engine.batch()
        tokens, lengths = fast.propose(rows, n_tokens, active)
        got = [tokens[r, :lengths[r]].tolist() for r in range(len(ids))]
        want = slow.propose(rows, n_tokens, active, ids)
        if got != want:
            return engine.steps, got, want
        engine.step(got)
    return None


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_rows", [1, 3, 8])
def test_chains_equal_the_per_request_twin_while_rows_are_reused_swapped_and_condensed(seed, max_rows):
    engine = Engine(repeating_requests(14, seed, VOCAB), max_rows=max_rows, max_len=128, seed=seed)
    fast, slow = make_pair(max_rows, 128)
    assert first_difference(engine, fast, slow) is None
    assert engine.accepted > 50          # the chains were worth verifying: drafting happened
    fast.propose(engine.rows, np.zeros(0, np.int64))   # an empty batch: every request has left
    assert fast.requests_tracked == 0
    fast.drafter.check_integrity()


def test_small_trie_under_pruning_still_equals_the_twin():
    engine = Engine(repeating_requests(20, 7, VOCAB, output=(40, 80)), max_rows=4, max_len=160, seed=7)
    fast, slow = make_pair(4, 160, capacity=200)
    assert first_difference(engine, fast, slow) is None
    fast.drafter.check_integrity()


def test_the_same_comparison_catches_a_drafter_that_keeps_a_row_s_state_for_its_next_request():
    """The planted bug: state by row, not by content. Requests come and go through few rows, so some
    row is handed to a new request; the comparison must see the difference."""
    caught = 0
    for seed in range(4):
        engine = Engine(repeating_requests(10, seed, VOCAB), max_rows=2, max_len=128, seed=seed, swap=0.0)
        fast, slow = make_pair(2, 128, by_row=True)
        caught += first_difference(engine, fast, slow) is not None
    assert caught == 4


def test_a_row_handed_to_a_new_request_drafts_nothing_from_the_old_request_s_prompt():
    rows = np.zeros((2, 64), np.int32)
    old = np.array([1, 2, 3, 30, 31, 32, 33, 4, 5, 6, 9], np.int32)   # 30 31 32 33: only in its prompt
    new = np.array([8, 9, 8, 9, 30, 31], np.int32)
    drafter = RowDrafter(max_rows=2, max_len=64, max_draft=4, token_limit=VOCAB, token_cost=0.0)
    rows[0, :old.shape[0]] = old
    drafter.propose(rows, [old.shape[0]])
    # Control: a row continuing the old request, ending in 30 31, drafts the old prompt's 32 33.
    rows[0, :old.shape[0] + 2] = np.concatenate([old, [30, 31]])
    tokens, lengths = drafter.propose(rows, [old.shape[0] + 2])
    assert tokens[0, :2].tolist() == [32, 33]
    # The row goes to a new request: the old one ends (its prompt counts go), nothing of it is drafted.
    rows[0, :new.shape[0]] = new
    tokens, lengths = drafter.propose(rows, [new.shape[0]])
    assert 32 not in tokens[0, :lengths[0]].tolist()
    assert drafter.requests_tracked == 1


def test_reordered_rows_get_the_same_chains_reordered():
    """Requests over disjoint token ranges (and no stage 0, the shared most-frequent tokens) cannot
    influence each other's drafts: whatever rows they sit in, each gets the chains it gets alone."""
    rng = np.random.default_rng(3)
    width, n_req = 96, 4
    texts = [np.tile(10 * r + rng.integers(0, 10, int(rng.integers(2, 6))), 40)[:80].astype(np.int32)
             for r in range(n_req)]
    drafters = [RowDrafter(max_rows=n_req, max_len=width, token_limit=VOCAB, **OPTIONS,
                           drafter=TrieDrafter(capacity=1 << 12, token_limit=VOCAB, max_requests=n_req,
                                               research=TrieResearch(use_top=False)))
                for _ in range(2)]
    lengths = np.array([12, 15, 9, 20], np.int64)
    for step in range(25):
        chains = []
        for d, drafter in enumerate(drafters):
            perm = np.arange(n_req) if d == 0 else rng.permutation(n_req)   # the second sees rows shuffled
            rows = np.zeros((n_req, width), np.int32)
            for i, r in enumerate(perm):
                rows[i, :lengths[r]] = texts[r][:lengths[r]]
            tokens, got = drafter.propose(rows, lengths[perm])
            by_request = [None] * n_req
            for i, r in enumerate(perm):
                by_request[r] = tokens[i, :got[i]].tolist()
            chains.append(by_request)
        assert chains[0] == chains[1], step
        lengths += 1 + step % 3
    assert all(d.requests_tracked == n_req for d in drafters)
    assert sum(len(c) for c in chains[0]) > 0


def test_same_calls_give_the_same_chains():
    """Tensor-parallel ranks each run the proposer on the same rows: they must agree."""
    runs = []
    for _ in range(2):
        engine = Engine(repeating_requests(10, 11, VOCAB), max_rows=3, max_len=128, seed=11)
        drafter = RowDrafter(max_rows=3, max_len=128, token_limit=VOCAB, **OPTIONS)
        chains = []
        while not engine.done:
            rows, n_tokens, active, _ = engine.batch()
            tokens, lengths = drafter.propose(rows, n_tokens, active)
            step = [tokens[r, :lengths[r]].tolist() for r in range(len(n_tokens))]
            chains.append(step)
            engine.step(step)
        runs.append(chains)
    assert runs[0] == runs[1]


def test_empty_and_inactive_rows_get_nothing_and_chains_respect_k_max_len_and_the_vocabulary():
    rows = np.zeros((3, 20), np.int32)
    text = np.tile(np.array([3, 4, 5], np.int32), 6)
    rows[0, :18] = text
    rows[1, :12] = text[:12]
    rows[2, :10] = text[:10]
    drafter = RowDrafter(max_rows=3, max_len=20, max_draft=5, token_limit=VOCAB, token_cost=0.0)
    for _ in range(3):
        tokens, lengths = drafter.propose(rows, [18, 12, 0], np.array([True, False, True]))
        assert lengths.tolist()[1:] == [0, 0]
        assert lengths[0] <= 1   # 18 tokens of 20: one drafted token plus the model's next fills the row
    tokens, lengths = drafter.propose(rows, [12, 12, 10])
    assert all(0 < m <= 5 for m in lengths)
    assert int(tokens[lengths > 0].max()) < VOCAB
    tokens, lengths = drafter.propose(rows, [12, 12, 10], limits=[2, 0, 5])
    assert lengths[0] <= 2 and lengths[1] == 0


def test_a_row_with_token_ids_outside_the_vocabulary_gets_no_draft_and_harms_nothing():
    rows = np.zeros((2, 32), np.int32)
    rows[0, :12] = np.tile([1, 2, 3], 4)
    rows[1, :12] = np.tile([1, 2, 3], 4)
    rows[1, 5] = VOCAB + 7
    drafter = RowDrafter(max_rows=2, max_len=32, max_draft=4, token_limit=VOCAB, token_cost=0.0)
    tokens, lengths = drafter.propose(rows, [12, 12])
    assert lengths[1] == 0 and lengths[0] > 0
    rows[0, 12] = -3
    tokens, lengths = drafter.propose(rows, [13, 12])
    assert lengths.tolist() == [0, 0] and drafter.requests_tracked == 0
    drafter.drafter.check_integrity()


def test_a_draft_that_is_never_accepted_stops_being_proposed_where_a_token_costs_something():
    """The cost rule: with a token cost, chains the rows never accept are cut to nothing."""
    rows = np.zeros((1, 600), np.int32)
    text = np.tile(np.array([3, 4, 5, 6], np.int32), 150)
    drafter = RowDrafter(max_rows=1, max_len=600, max_draft=4, token_limit=VOCAB, token_cost=0.3, memory=None)
    n = 12
    rows[0, :n] = text[:n]
    proposed = []
    for _ in range(150):
        tokens, lengths = drafter.propose(rows, [n])
        proposed.append(int(lengths[0]))
        rows[0, n] = (int(text[n]) + 1) % VOCAB   # the "model" always disagrees with the text
        n += 1
    assert sum(proposed[:10]) > 0 and sum(proposed[-50:]) == 0


def test_bad_input_is_refused_naming_the_argument_and_changes_nothing():
    drafter = RowDrafter(max_rows=2, max_len=16, max_draft=3, token_limit=VOCAB)
    rows = np.zeros((2, 16), np.int32)
    rows[0, :6] = [1, 2, 1, 2, 1, 2]
    drafter.propose(rows, [6, 0])
    cases = [((rows.astype(np.int64), [6]), "rows"), ((rows[0], [6]), "rows"), ((rows, [[6]]), "n_tokens"),
             ((rows, [6.0]), "n_tokens"), ((rows, [17]), "n_tokens"), ((rows, [-1]), "n_tokens"),
             ((rows, [6, 0, 0]), "n_tokens"), ((rows, [6], [1]), "active"), ((rows, [6], None, [1.5]), "limits")]
    for args, name in cases:
        with pytest.raises(InputError, match=f"^{name}:"):
            drafter.propose(*args)
    assert drafter.requests_tracked == 1 and drafter.steps == 1


@pytest.mark.parametrize("match_cost, lengths", [(0.07, [1, 3]), (0.14, [2, 6]), (float("inf"), [6, 6])])
def test_a_chain_is_as_long_as_its_match_allows(match_cost, lengths):
    """The match-length rule: at a drafted token's cost c = 0.07, a chain is at most max(1, match_cost
    / c) times the longest context suffix seen before with a continuation. Both rows continue the
    same counted text (1 .. 9, seen once: every score is 1); the first ends in "9 1" (only "1" was
    seen, followed by 2: a match of 1), the second in "1 2 3" (a match of 3)."""
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    got = []
    for ending in ([9, 1], [1, 2, 3]):
        drafter = RowDrafter(max_rows=1, max_len=64, max_draft=6, token_limit=VOCAB, token_cost=0.07,
                             match_cost=match_cost)
        row = np.array(text + ending, np.int32)
        tokens, n = drafter.propose(row[None, :], [row.shape[0]])
        assert tokens[0, :n[0]].tolist() == text[ending[-1]:ending[-1] + n[0]]   # the text's continuation
        got.append(int(n[0]))
    assert got == lengths


def test_construction_options_are_checked():
    with pytest.raises(ConfigError, match="^tree_nodes:"):
        RowDrafter(max_rows=1, max_len=8, max_draft=4, token_limit=VOCAB, tree_nodes=2)
    with pytest.raises(ConfigError, match="^token_cost:"):
        RowDrafter(max_rows=1, max_len=8, max_draft=4, token_limit=VOCAB, token_cost=-1)
    with pytest.raises(ConfigError, match="^drafter:"):
        RowDrafter(max_rows=1, max_len=8, max_draft=4, token_limit=VOCAB, drafter="trie")
    for bad in (-0.1, float("nan"), "0.07", None):
        with pytest.raises(ConfigError, match="^match_cost:"):
            RowDrafter(max_rows=1, max_len=8, max_draft=4, token_limit=VOCAB, match_cost=bad)
    with pytest.raises(ConfigError, match="^drafter:.*max_requests"):
        RowDrafter(max_rows=8, max_len=8, max_draft=4, token_limit=VOCAB,
                   drafter=TrieDrafter(capacity=256, token_limit=VOCAB, max_requests=4))
    with pytest.raises(ConfigError, match="^drafter:.*token_limit"):
        RowDrafter(max_rows=1, max_len=8, max_draft=4, token_limit=VOCAB,
                   drafter=TrieDrafter(capacity=256, token_limit=VOCAB - 1))


@pytest.mark.parametrize("options, message", [
    (dict(max_len=2**40), r"^max_rows=4, max_len=1099511627776, max_draft=4: the rows' tables would take [0-9,]+ "
                          r"bytes, more than this machine's physical memory"),
    (dict(max_draft=10**12), r"^max_draft: 1000000000000 asks for trees of [0-9,]+ nodes; expected at most"),
    (dict(tree_nodes=10**12), r"^tree_nodes: 1000000000000 asks for trees of [0-9,]+ nodes; expected at most"),
])
def test_sizes_beyond_memory_or_one_verify_are_refused_before_the_tries_slots_are_taken(options, message):
    """max_draft=10**12 was reported as "max_len: ... does not fit in memory" (its chain table's
    MemoryError, caught), tree_nodes=10**12 raised a MemoryError that kept max_rows slots of the
    shared trie taken for good, and max_len=2**40 was refused only after the slots were taken. Each is
    refused now before anything is allocated, naming its arguments and the limit; the trie's slots stay free."""
    trie = TrieDrafter(capacity=256, token_limit=VOCAB, max_requests=8)
    with pytest.raises(ConfigError, match=message):
        RowDrafter(**{**dict(max_rows=4, max_len=64, max_draft=4, token_limit=VOCAB, drafter=trie), **options})
    assert not trie.pool.state.live.any() and trie.pool.state.live.shape[0] == 4   # no slot taken, none added
    RowDrafter(max_rows=8, max_len=64, max_draft=4, token_limit=VOCAB, drafter=trie)


def test_trie_slots_beyond_memory_are_refused_before_the_trie_is_built():
    """Each row owns a slot of the trie, 8 bytes a trie node: max_rows=2**20 over 2**22 nodes raised
    a MemoryError after building the trie; refused first, naming both."""
    with pytest.raises(ConfigError, match=r"^max_rows=1048576, capacity=4194304: the rows' trie slots would take "
                                          r"[0-9,]+ bytes, more than this machine's physical memory"):
        RowDrafter(max_rows=2**20, max_len=8, max_draft=4, token_limit=VOCAB, capacity=2**22)


def test_a_shared_trie_keeps_serving_its_own_requests_beside_the_rows():
    trie = TrieDrafter(capacity=1 << 12, token_limit=VOCAB, max_requests=6)
    drafter = RowDrafter(max_rows=4, max_len=64, max_draft=4, token_limit=VOCAB, drafter=trie)
    request = trie.start(np.array([5, 6, 7, 5, 6], np.int32))   # one of the two slots left
    rows = np.zeros((4, 64), np.int32)
    rows[:, :8] = np.tile([1, 2, 3, 4], 2)
    drafter.propose(rows, [8, 8, 8, 8])
    assert request.propose(np.array([5, 6, 7, 5, 6], np.int32), 4).tokens[1] == 7
    request.finish()
    drafter.close()
    assert trie.requests_in_progress == 0
    trie.check_integrity()


def test_a_second_thread_drafting_on_the_same_row_drafter_is_refused(monkeypatch):
    """One RowDrafter tracks one engine's batch: a concurrent call would end the first call's
    requests and overwrite its chains, so it gets BusyError, and the first call is unharmed."""
    import threading

    from draftcore import BusyError
    drafter = RowDrafter(max_rows=2, max_len=32, max_draft=4, token_limit=VOCAB, token_cost=0.0)
    rows = np.zeros((2, 32), np.int32)
    rows[0, :12] = np.tile([1, 2, 3], 4)
    inside, release = threading.Event(), threading.Event()
    kernel = drafter._K.step_rows

    def paused(*args):   # the kernel, held until the other thread has tried
        inside.set()
        release.wait(10)
        return kernel(*args)

    monkeypatch.setattr(drafter._K, "step_rows", paused)
    got = {}
    first = threading.Thread(target=lambda: got.setdefault("first", drafter.propose(rows, [12])))
    first.start()
    assert inside.wait(10)
    with pytest.raises(BusyError, match="^rows: this RowDrafter is drafting another batch"):
        drafter.propose(rows, [12])
    release.set()
    first.join()
    assert got["first"][1][0] > 0 and drafter.steps == 1
