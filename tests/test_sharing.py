"""Shared objects: one drafter serving concurrent requests stays exact, a busy verifier says so,
abandoned streams end only their own request, context buffers grow, saves are atomic (tests/test_trie.py).

Threads run with sys.setswitchinterval made tiny, so the interpreter switches threads every few
bytecodes and interleavings that would corrupt a shared drafter actually happen.
"""
from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest

import draftcore
from draftcore import BusyError, ConfigError, CostAwareBudget, InputError, TrieDrafter
from fixtures.toy import ToyModel, ToyVerifier, plain_greedy

VOCAB = 24


@pytest.fixture
def tiny_switch_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def prompts(n, seed=0, vocab=VOCAB):
    """Prompts that repeat themselves, so the trie has something to draft."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        block = rng.integers(0, vocab, int(rng.integers(3, 8)))
        out.append(np.tile(block, 4)[:int(rng.integers(8, 28))].astype(np.int32))
    return out


def assert_threads_match_plain(model, shared, work_prompts, n_threads, max_new_tokens):
    """`n_threads` threads, each with its own ToyVerifier, decode `work_prompts` (round robin) with
    the one `shared` drafter; every output must equal plain greedy decoding."""
    want = [plain_greedy(ToyVerifier(model), p, max_new_tokens) for p in work_prompts]
    got = [None] * len(work_prompts)

    def work(i):
        verifier = ToyVerifier(model)  # one verifier per thread: one request at a time each
        for j in range(i, len(work_prompts), n_threads):
            got[j] = draftcore.speculate(verifier, work_prompts[j], max_new_tokens=max_new_tokens, drafter=shared,
                                         budget=8).tokens

    run_threads(n_threads, work)
    for j in range(len(work_prompts)):
        np.testing.assert_array_equal(got[j], want[j], err_msg=f"prompt {j}")


def run_threads(n_threads, work):
    """work(i) in n_threads threads; re-raises the first error."""
    errors = []

    def body(i):
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# -- one drafter, many requests ------------------------------------------------------------------------
@pytest.mark.parametrize("repeat", range(3))
def test_threads_share_one_trie_exactly_toy(tiny_switch_interval, repeat):
    model = ToyModel(vocab_size=VOCAB, seed=repeat)
    shared = TrieDrafter(token_limit=VOCAB, capacity=4096, branch_length=8)
    work_prompts = prompts(24, seed=repeat)
    assert_threads_match_plain(model, shared, work_prompts, n_threads=6, max_new_tokens=40)
    assert shared.requests_in_progress == 0
    shared.check_integrity()


def test_threads_share_one_trie_exactly_tiny_llama(tiny_switch_interval):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from draftcore.adapters.torch_hf import HFVerifier
    from test_hf_verifier import assert_same_greedy, generate_greedy
    from fixtures.tiny_llama import tiny_llama

    model = tiny_llama(seed=0)
    vocab = model.config.vocab_size
    shared = TrieDrafter(token_limit=vocab, capacity=8192)
    work_prompts = prompts(8, seed=5, vocab=vocab)
    want = [generate_greedy(model, p, 24) for p in work_prompts]
    got = [None] * len(work_prompts)
    n_threads = 4

    def work(i):
        verifier = HFVerifier(model)
        for j in range(i, len(work_prompts), n_threads):
            got[j] = draftcore.speculate(verifier, work_prompts[j], max_new_tokens=24, drafter=shared,
                                         budget=8).tokens

    run_threads(n_threads, work)
    reference = HFVerifier(model)
    for j in range(len(work_prompts)):
        assert_same_greedy(reference, work_prompts[j], got[j], want[j], tie_tol=1e-4)
    assert shared.requests_in_progress == 0
    shared.check_integrity()


def test_a_tree_owns_its_arrays():
    """Another request's propose must not change a tree being verified."""
    d = TrieDrafter(token_limit=VOCAB, capacity=1024)
    d.warm_up([[1, 2, 3, 4, 1, 2, 5, 6]])
    a = d.start(np.array([1, 2, 3], np.int32))
    b = d.start(np.array([5, 6, 7], np.int32))
    tree = a.propose(np.array([1, 2], np.int32), 6)
    kept = (tree.tokens.copy(), tree.parents.copy(), tree.depths.copy(), tree.scores.copy())
    b.propose(np.array([5, 6], np.int32), 6)
    a.propose(np.array([7, 1], np.int32), 6)
    for got, was in zip((tree.tokens, tree.parents, tree.depths, tree.scores), kept):
        np.testing.assert_array_equal(got, was)
    a.finish(), b.finish()


def test_a_request_drafts_from_its_own_prompt_not_anothers():
    """Two requests whose prompts continue [1, 2] differently: each drafts its own continuation."""
    d = TrieDrafter(token_limit=VOCAB, capacity=1024)
    a = d.start(np.array([1, 2, 3, 9, 1, 2], np.int32))
    b = d.start(np.array([1, 2, 4, 9, 1, 2], np.int32))
    assert a.propose(np.array([1, 2], np.int32), 1).tokens.tolist() == [2, 3]
    assert b.propose(np.array([1, 2], np.int32), 1).tokens.tolist() == [2, 4]
    a.finish()  # a's end removes its own prompt branches only
    assert b.propose(np.array([1, 2], np.int32), 1).tokens.tolist() == [2, 4]
    b.finish()
    d.check_integrity()
    assert d.n_nodes == 0


def test_max_requests_is_a_clear_limit():
    d = TrieDrafter(token_limit=VOCAB, capacity=1024, max_requests=5)
    requests = [d.start(np.array([1, 2, i], np.int32)) for i in range(5)]
    with pytest.raises(BusyError, match="drafter: all max_requests=5 request slots"):
        d.start(np.array([1, 2], np.int32))
    requests[0].finish()
    d.start(np.array([1, 2], np.int32)).finish()
    for r in requests[1:]:
        r.finish()
    assert d.requests_in_progress == 0
    d.check_integrity()


def test_a_request_dropped_without_finish_is_ended_by_the_next_call():
    d = TrieDrafter(token_limit=VOCAB, capacity=1024)
    kept = d.start(np.array([1, 2, 3], np.int32))
    dropped = d.start(np.array([4, 5, 6], np.int32))
    dropped.update(np.array([7, 8], np.int32))
    assert d.requests_in_progress == 2
    del dropped
    gc.collect()
    kept.propose(np.array([1, 2, 3], np.int32), 4)  # the next call on the drafter ends it
    assert d.requests_in_progress == 1
    d.check_integrity()
    kept.finish()
    assert d.requests_in_progress == 0 and d.n_nodes == 3  # (7,), (7, 8), (8,): the dropped request's output
    d.check_integrity()


# -- one verifier, one request at a time ------------------------------------------------------------------
def test_interleaved_streams_on_one_verifier_are_refused():
    model = ToyModel(vocab_size=VOCAB, seed=1)
    verifier = ToyVerifier(model)
    drafter = TrieDrafter(token_limit=VOCAB)
    prompt = prompts(1)[0]
    first = draftcore.speculate_stream(verifier, prompt, max_new_tokens=30, drafter=drafter, budget=0)
    next(first)
    with pytest.raises(BusyError, match="verifier: ToyVerifier object .* is serving another request") as info:
        draftcore.speculate_stream(verifier, prompt, max_new_tokens=30, drafter=drafter, budget=0)
    assert "its own verifier" in str(info.value)
    rest = np.concatenate([chunk for chunk in first])  # the first stream is unaffected
    assert first.result is not None and rest.size > 0
    np.testing.assert_array_equal(first.result.tokens, plain_greedy(ToyVerifier(model), prompt, 30))
    # afterwards both serve a normal request exactly
    again = draftcore.speculate(verifier, prompt, max_new_tokens=30, drafter=drafter, budget=8)
    np.testing.assert_array_equal(again.tokens, plain_greedy(ToyVerifier(model), prompt, 30))
    assert drafter.requests_in_progress == 0


def test_a_verifier_used_from_two_threads_is_refused_not_corrupted(tiny_switch_interval):
    model = ToyModel(vocab_size=VOCAB, seed=2)
    verifier = ToyVerifier(model)
    prompt = prompts(1, seed=2)[0]
    want = plain_greedy(ToyVerifier(model), prompt, 60)
    outcomes = []
    barrier = threading.Barrier(2)

    def work(i):
        barrier.wait()
        try:
            outcomes.append(draftcore.speculate(verifier, prompt, max_new_tokens=60, budget=4).tokens)
        except BusyError as exc:
            outcomes.append(exc)

    for _ in range(5):
        outcomes.clear()
        run_threads(2, work)
        for outcome in outcomes:  # each either exact or refused; never a wrong output
            if not isinstance(outcome, BusyError):
                np.testing.assert_array_equal(outcome, want)
        assert any(not isinstance(o, BusyError) for o in outcomes)


def test_a_single_request_drafter_shared_concurrently_is_refused():
    class OneAtATime:  # serves its request itself: start returns None
        def start(self, prompt):
            self.context = list(prompt)

        def propose(self, context, budget):
            return draftcore.DraftTree.root_only(int(context[-1]))

        def update(self, tokens):
            pass

        def finish(self):
            pass

    model = ToyModel(vocab_size=VOCAB, seed=3)
    drafter = OneAtATime()
    prompt = prompts(1)[0]
    with draftcore.speculate_stream(ToyVerifier(model), prompt, max_new_tokens=8, drafter=drafter) as first:
        next(first)
        with pytest.raises(BusyError, match="drafter: OneAtATime object"):
            draftcore.speculate_stream(ToyVerifier(model), prompt, max_new_tokens=8, drafter=drafter)
    out = draftcore.speculate(ToyVerifier(model), prompt, max_new_tokens=8, drafter=drafter)  # released
    np.testing.assert_array_equal(out.tokens, plain_greedy(ToyVerifier(model), prompt, 8))


def test_a_budget_policy_with_state_is_claimed():
    model = ToyModel(vocab_size=VOCAB, seed=3)
    budget = CostAwareBudget()
    prompt = prompts(1)[0]
    first = draftcore.speculate_stream(ToyVerifier(model), prompt, max_new_tokens=8, budget=budget)
    next(first)
    with pytest.raises(BusyError, match="budget: CostAwareBudget object"):
        draftcore.speculate_stream(ToyVerifier(model), prompt, max_new_tokens=8, budget=budget)
    first.close()
    draftcore.speculate(ToyVerifier(model), prompt, max_new_tokens=8, budget=budget)


# -- stream lifetime ---------------------------------------------------------------------------------------
def test_an_abandoned_stream_ends_only_its_own_request():
    """A client disconnects: its stream is kept a while, then collected. Requests running on the
    same drafter meanwhile, and afterwards, are exact; the verifier is free once it is collected."""
    model = ToyModel(vocab_size=VOCAB, seed=4)
    drafter = TrieDrafter(token_limit=VOCAB)
    v1, v2 = ToyVerifier(model), ToyVerifier(model)
    p1, p2, p3 = prompts(3, seed=4)
    abandoned = draftcore.speculate_stream(v1, p1, max_new_tokens=50, drafter=drafter, budget=8)
    next(abandoned), next(abandoned)
    b = draftcore.speculate(v2, p2, max_new_tokens=50, drafter=drafter, budget=8)
    np.testing.assert_array_equal(b.tokens, plain_greedy(ToyVerifier(model), p2, 50))
    during = draftcore.speculate_stream(v2, p3, max_new_tokens=50, drafter=drafter, budget=8)
    head = [next(during) for _ in range(3)]
    del abandoned  # collected while `during` runs: its clean-up must not touch `during`'s request
    gc.collect()
    tail = list(during)
    np.testing.assert_array_equal(np.concatenate(head + tail), plain_greedy(ToyVerifier(model), p3, 50))
    # the same verifier serves a new request: its claim went with the stream
    again = draftcore.speculate(v1, p1, max_new_tokens=50, drafter=drafter, budget=8)
    np.testing.assert_array_equal(again.tokens, plain_greedy(ToyVerifier(model), p1, 50))
    assert drafter.requests_in_progress == 0
    drafter.check_integrity()


def test_a_stream_as_a_context_manager_releases_on_exit():
    model = ToyModel(vocab_size=VOCAB, seed=5)
    verifier = ToyVerifier(model)
    drafter = TrieDrafter(token_limit=VOCAB)
    prompt = prompts(1, seed=5)[0]
    with draftcore.speculate_stream(verifier, prompt, max_new_tokens=50, drafter=drafter) as stream:
        next(stream)
        assert drafter.requests_in_progress == 1
    assert drafter.requests_in_progress == 0  # closed on exit, unfinished
    assert list(stream) == []                 # a closed stream yields nothing more
    out = draftcore.speculate(verifier, prompt, max_new_tokens=50, drafter=drafter)
    np.testing.assert_array_equal(out.tokens, plain_greedy(ToyVerifier(model), prompt, 50))
    with pytest.raises(RuntimeError, match="client went away"):  # an error inside the block releases too
        with draftcore.speculate_stream(verifier, prompt, max_new_tokens=50, drafter=drafter) as stream:
            next(stream)
            raise RuntimeError("client went away")
    assert drafter.requests_in_progress == 0
    draftcore.speculate(verifier, prompt, max_new_tokens=5, drafter=drafter)


def test_a_stream_never_started_releases_when_closed_or_collected():
    model = ToyModel(vocab_size=VOCAB, seed=6)
    verifier = ToyVerifier(model)
    prompt = prompts(1, seed=6)[0]
    stream = draftcore.speculate_stream(verifier, prompt, max_new_tokens=5)
    stream.close()
    stream = draftcore.speculate_stream(verifier, prompt, max_new_tokens=5)
    del stream
    gc.collect()
    draftcore.speculate(verifier, prompt, max_new_tokens=5)


def test_an_error_inside_the_loop_releases_the_verifier():
    model = ToyModel(vocab_size=VOCAB, seed=7)
    verifier = ToyVerifier(model)
    drafter = TrieDrafter(token_limit=VOCAB)

    class Broken:
        concurrent_requests = True

        def start(self, prompt):
            return object()  # not a request

    with pytest.raises(ConfigError, match="drafter: .*start\\(prompt\\) returned"):
        draftcore.speculate(verifier, prompts(1)[0], max_new_tokens=5, drafter=Broken())
    out = draftcore.speculate(verifier, prompts(1)[0], max_new_tokens=5, drafter=drafter)
    assert out.tokens.shape == (5,)


# -- context buffer, limits -------------------------------------------------------------------------------
def test_context_buffer_grows_as_tokens_arrive():
    """max_new_tokens far beyond memory on a verifier whose context is as large: nothing is
    allocated up front; 1,500 tokens (past the first buffer) come out exact."""
    model = ToyModel(vocab_size=VOCAB, seed=8)
    verifier = ToyVerifier(model, max_context=1 << 50)
    prompt = prompts(1, seed=8)[0]
    got = []
    with draftcore.speculate_stream(verifier, prompt, max_new_tokens=1 << 45, budget=8) as stream:
        for chunk in stream:
            got.append(chunk)
            if sum(map(len, got)) >= 1500:
                break
    got = np.concatenate(got)
    want = plain_greedy(ToyVerifier(model, max_context=1 << 50), prompt, len(got))
    np.testing.assert_array_equal(got, want)


def test_a_prompt_longer_than_the_context_is_named_as_the_prompt():
    verifier = ToyVerifier(ToyModel(vocab_size=VOCAB), max_context=16)
    with pytest.raises(InputError, match=r"^prompt: 16 tokens; expected fewer than the verifier's max_context 16"):
        draftcore.speculate(verifier, np.arange(16, dtype=np.int32) % VOCAB, max_new_tokens=1)
    with pytest.raises(InputError, match=r"^max_new_tokens: .* expected at most 6"):
        draftcore.speculate(verifier, np.arange(10, dtype=np.int32), max_new_tokens=7)
    draftcore.speculate(verifier, np.arange(10, dtype=np.int32), max_new_tokens=6)  # refused calls held nothing
