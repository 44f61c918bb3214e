"""LlamaCppVerifier(reuse_prefix=True): a prefill keeps the cells of the prefix the new prompt shares
with the committed tokens (tree commits, chain commits, advance) and decodes only the rest.

On the exact float32 fixture of test_llamacpp_verifier.py: the kept count is exactly the shared
prefix; the cache then holds exactly the new prompt (seq 0, no other cells); logits and greedy output
equal a fresh prefill's within that file's tolerances; a decode that fails leaves no sequence to
verify; a borrowed Llama's context is never reused.
"""
import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import draftcore  # noqa: E402
from draftcore.adapters.llamacpp import LlamaCppVerifier  # noqa: E402
from draftcore.errors import BackendError, ConfigError, InputError  # noqa: E402
from draftcore.tree import DraftTree  # noqa: E402

from test_llamacpp_verifier import (ATOL, EXACT, assert_committed_only, assert_same_greedy,  # noqa: E402,F401
                                    plain_greedy, stock_llama, tiny)


@pytest.fixture(scope="module")
def pair(tiny):
    """(a verifier that reuses prefixes, one that never does), over the same GGUF."""
    return (LlamaCppVerifier.from_gguf(tiny[0], n_ctx=512, n_seq_max=9, **EXACT),
            LlamaCppVerifier.from_gguf(tiny[0], n_ctx=512, n_seq_max=9, reuse_prefix=False, **EXACT))


def _fresh_last(fresh, prompt):
    return fresh.prefill(np.asarray(prompt, np.int32), 1)[1][0]


def test_prefill_keeps_exactly_the_committed_prefix(pair):
    v, fresh = pair
    rng = np.random.default_rng(0)
    first = rng.integers(3, 512, 30).astype(np.int32)
    tree = DraftTree.build(rng.integers(3, 512, 6), [-1, 0, 1, 0, 3, 4])
    path = np.array([0, 3, 4, 5], np.int32)      # not the batch's first branch: its tail is decoded again
    chain = DraftTree.chain(7, np.array([8, 9, 10]))

    def build():
        """prompt, a tree commit (gathered path), a chain commit, one advance, and a pending tree."""
        v.prefill(first)
        v.verify(tree)
        v.commit(path)
        v.verify(chain)
        v.commit(np.array([0, 1], np.int32))
        v.advance(11)
        v.verify(DraftTree.build([12, 13, 14], [-1, 0, 0]))   # pending: not committed
        return np.r_[first, tree.tokens[path], 7, 8, 11].astype(np.int32)

    committed = build()
    assert v.n_past == len(committed)
    cases = [(np.r_[committed, 20, 21], len(committed)),
             (committed[:20], 19),
             (np.r_[committed[:33], (committed[33] + 1) % 512, committed[34:]], 33),
             (np.r_[(committed[0] + 1) % 512, committed[1:]], 0)]
    for prompt, shared in cases:
        build()
        tokens, logits = v.prefill(prompt.astype(np.int32), 1)
        assert v.prefix_reused == shared, (len(prompt), shared)
        assert v.n_past == len(prompt)
        assert_committed_only(v, len(prompt))
        np.testing.assert_allclose(logits[0], _fresh_last(fresh, prompt), atol=ATOL, rtol=0)
        assert tokens[0] == logits[0].argmax()


def test_multi_turn_speculate_equals_fresh_plain_greedy(pair):
    v, fresh = pair
    rng = np.random.default_rng(1)
    block = rng.integers(3, 512, 10)
    conversation = np.r_[1, block, block, block[:4]].astype(np.int32)
    shared = 0
    for turn in range(3):
        result = draftcore.speculate(v, conversation, max_new_tokens=24, budget=6)
        assert v.prefix_reused >= shared
        want, gaps = plain_greedy(fresh, conversation, 24)
        assert_same_greedy(result.tokens.tolist(), want, gaps, f"turn {turn}")
        shared = len(conversation)
        conversation = np.r_[conversation, result.tokens, block[turn:turn + 5]].astype(np.int32)
    assert shared > 80


def test_a_failed_decode_leaves_no_sequence_and_the_next_prefill_is_right(pair, monkeypatch):
    v, fresh = pair
    prompt = np.arange(3, 40, dtype=np.int32)
    v.prefill(prompt)

    def fail():
        raise BackendError("planted failure")

    monkeypatch.setattr(v, "_decode", fail)
    with pytest.raises(BackendError, match="planted failure"):
        v.prefill(np.r_[prompt, 50, 51].astype(np.int32))
    monkeypatch.undo()
    with pytest.raises(InputError):
        v.verify(DraftTree.root_only(3))      # no sequence to verify after a failed prefill
    longer = np.r_[prompt, 50, 51, 52].astype(np.int32)
    logits = v.prefill(longer, 1)[1][0]
    assert v.prefix_reused == len(prompt)     # what the failed prefill had kept is still right
    assert_committed_only(v, len(longer))
    np.testing.assert_allclose(logits, _fresh_last(fresh, longer), atol=ATOL, rtol=0)


def test_borrowed_llama_is_never_reused_and_the_option_is_checked(tiny, stock_llama):
    borrowed = LlamaCppVerifier.from_llama(stock_llama)
    prompt = np.arange(3, 30, dtype=np.int32)
    borrowed.prefill(prompt)
    borrowed.prefill(np.r_[prompt, 4].astype(np.int32))
    assert borrowed.prefix_reused == 0
    for bad in ("yes", None, 1):
        with pytest.raises(ConfigError, match="reuse_prefix: expected True or False"):
            LlamaCppVerifier.from_gguf(tiny[0], n_ctx=64, self_check=False, reuse_prefix=bad, **EXACT)
        with pytest.raises(ConfigError, match="reuse_prefix: expected True or False"):
            LlamaCppVerifier.from_llama(stock_llama, self_check=False, reuse_prefix=bad)


def test_self_check_must_be_a_bool(tiny, stock_llama, monkeypatch):
    """bool("no") is True: a coerced self_check="no" would run the check the user turned off."""
    monkeypatch.setattr(LlamaCppVerifier, "_checked", lambda *_: pytest.fail("the self-check ran"))
    for bad in ("no", None, 1):
        with pytest.raises(ConfigError, match=f"self_check: expected True or False, got {bad!r}"):
            LlamaCppVerifier.from_gguf(tiny[0], n_ctx=64, self_check=bad, **EXACT)
        with pytest.raises(ConfigError, match=f"self_check: expected True or False, got {bad!r}"):
            LlamaCppVerifier.from_llama(stock_llama, self_check=bad)


def test_reset_forgets_the_sequence_and_refuses_once_closed(tiny):
    v = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=64, n_seq_max=3, self_check=False, **EXACT)
    prompt = np.arange(3, 20, dtype=np.int32)
    v.prefill(prompt)
    v.reset()
    assert v.n_past == 0 and v.prefix_reused == 0
    with pytest.raises(InputError):
        v.verify(DraftTree.root_only(3))
    v.prefill(np.r_[prompt, 4].astype(np.int32))
    assert v.prefix_reused == 0                # nothing was left to reuse
    v.close()
    with pytest.raises(InputError, match="reset: this verifier was closed"):
        v.reset()


def test_a_reused_prefill_longer_than_n_batch_is_decoded_in_chunks(tiny):
    """The rest of a prompt after its kept prefix goes in n_batch-token decodes like a whole one."""
    v = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=512, n_batch=16, n_seq_max=3, **EXACT)
    fresh = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=512, n_batch=16, n_seq_max=3, reuse_prefix=False, **EXACT)
    rng = np.random.default_rng(5)
    first = rng.integers(3, 512, 40).astype(np.int32)
    longer = np.r_[first, rng.integers(3, 512, 60)].astype(np.int32)    # 60 more: four decodes of <= 16
    v.prefill(first)
    before = v.n_decodes
    logits = v.prefill(longer, 1)[1][0]
    assert v.prefix_reused == 40 and v.n_decodes - before == 4
    assert_committed_only(v, len(longer))
    np.testing.assert_allclose(logits, _fresh_last(fresh, longer), atol=ATOL, rtol=0)
