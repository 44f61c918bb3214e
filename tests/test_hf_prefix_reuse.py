"""HFVerifier(reuse_prefix=True): a prefill keeps the cached KV of the prefix the new prompt shares
with the committed tokens, and runs only the rest.

What must hold: the kept count is exactly the shared prefix (committed tokens only, in the order
commit gathered them; never the whole prompt: its last position's logits need a forward); the
logits after such a prefill, and every tree verified after it, equal a fresh prefill's within float
noise; greedy output across requests equals transformers' own greedy output; a failed forward leaves
an empty verifier; reuse_prefix=False reuses nothing.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import draftcore  # noqa: E402
from draftcore import ConfigError, DraftTree  # noqa: E402
from draftcore.adapters.torch_hf import HFVerifier  # noqa: E402
from draftcore.adapters.torch_hf.prefix_reuse import (  # noqa: E402
    FORWARD_ROWS, attention_pairs_per_row, plan_cost, reuse_plan)
from fixtures.tiny_llama import tiny_llama  # noqa: E402

from test_hf_verifier import FP32_ATOL, assert_same_greedy, generate_greedy, smollm2  # noqa: E402,F401

ATTENTIONS = ["sdpa", "eager", "draftcore_sdpa"]


@pytest.fixture(scope="module")
def models():
    return {attn: tiny_llama(seed=3, attn_implementation=attn) for attn in ATTENTIONS}


def _fresh_logits(model, tokens) -> np.ndarray:
    """The last position's logits after a prefill of `tokens` into an empty cache."""
    return HFVerifier(model, self_check=False, reuse_prefix=False).prefill(np.asarray(tokens, np.int32), 1)[1][0]


@pytest.mark.parametrize("attn", ATTENTIONS)
def test_prefill_keeps_exactly_the_shared_committed_prefix(models, attn):
    model = models[attn]
    verifier = HFVerifier(model)
    rng = np.random.default_rng(0)
    first = rng.integers(0, verifier.vocab_size, 40).astype(np.int32)
    verifier.prefill(first)
    assert verifier.prefix_reused == 0            # nothing cached before
    # commit a gathered path (not the first nodes): the committed tokens follow the path's order
    tree = DraftTree.build(rng.integers(0, verifier.vocab_size, 6), [-1, 0, 1, 0, 3, 4])
    verifier.verify(tree)
    path = np.array([0, 3, 4, 5], np.int32)
    verifier.commit(path)
    committed = np.r_[first, tree.tokens[path]].astype(np.int32)
    # a pending tree is not committed: its tokens must not count as shared
    verifier.verify(DraftTree.build(rng.integers(0, verifier.vocab_size, 3), [-1, 0, 1]))

    cases = [
        (np.r_[committed, 7, 8, 9], len(committed)),          # the whole sequence, then new tokens
        (committed[:25], 24),                                  # a prefix of it: the last token runs
        (np.r_[committed[:30], (committed[30] + 1) % verifier.vocab_size, committed[31:]], 30),
        # shared, less than the rest of the prompt, still cheaper than a fresh prefill (reuse_plan)
        (np.r_[committed[:17], (committed[17] + 1) % verifier.vocab_size, committed[18:]], 17),
        # 2 kept would save less Linear work than attending under a mask costs: a fresh prefill
        (np.r_[committed[:2], (committed[2] + 1) % verifier.vocab_size, committed[3:]], 0),
        (np.r_[(committed[0] + 1) % verifier.vocab_size, committed[1:]], 0),   # differs at once
    ]
    for prompt, shared in cases:
        prompt = prompt.astype(np.int32)
        # rebuild the committed sequence each time, so every case starts from the same cache
        verifier.prefill(first)
        verifier.verify(tree)
        verifier.commit(path)
        tokens, logits = verifier.prefill(prompt, 1)
        assert verifier.prefix_reused == shared, (len(prompt), shared)
        assert verifier.n_past == len(prompt)
        np.testing.assert_allclose(logits[0], _fresh_logits(model, prompt), atol=FP32_ATOL, rtol=0)
        assert tokens[0] == logits[0].argmax()


@pytest.mark.parametrize("attn", ATTENTIONS)
def test_trees_after_a_reused_prefill_see_the_new_prompt(models, attn):
    """After a reused prefill, a tree's logits are those of a fresh prefill's tree: the old
    sequence's positions past the shared prefix are gone from the cache."""
    model = models[attn]
    verifier = HFVerifier(model)
    fresh = HFVerifier(model, self_check=False, reuse_prefix=False)
    rng = np.random.default_rng(1)
    old = rng.integers(0, verifier.vocab_size, 60).astype(np.int32)
    new = np.r_[old[:30], rng.integers(0, verifier.vocab_size, 5)].astype(np.int32)   # shorter than old
    verifier.prefill(old)
    verifier.prefill(new)
    assert verifier.prefix_reused == 30
    fresh.prefill(new)
    tree = DraftTree.build(rng.integers(0, verifier.vocab_size, 7), [-1, 0, 1, 0, 3, 4, 0])
    np.testing.assert_allclose(verifier.verify(tree, 7)[1], fresh.verify(tree, 7)[1], atol=FP32_ATOL, rtol=0)
    verifier.commit(np.array([0, 3, 4], np.int32))
    fresh.commit(np.array([0, 3, 4], np.int32))
    np.testing.assert_allclose(verifier.verify(DraftTree.root_only(9), 1)[1],
                               fresh.verify(DraftTree.root_only(9), 1)[1], atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("attn", ATTENTIONS)
def test_multi_turn_speculate_reuses_the_conversation_and_equals_generate(models, attn):
    """Turn after turn, each prompt is the conversation so far (earlier prompts and outputs) plus a
    new message: each prefill after the first keeps at least the earlier turns, and every turn's
    output equals model.generate's on the whole conversation."""
    model = models[attn]
    verifier = HFVerifier(model)
    rng = np.random.default_rng(2)
    block = rng.integers(2, verifier.vocab_size, 12)
    conversation = np.r_[block, block, block[:5]].astype(np.int32)
    for turn in range(4):
        result = draftcore.speculate(verifier, conversation, max_new_tokens=40, eos_token_id=1)
        if turn:
            assert verifier.prefix_reused >= shared
        want = generate_greedy(model, conversation, 40, eos_token_id=1)
        assert_same_greedy(verifier, conversation, result.tokens, want, tie_tol=1e-4)
        shared = len(conversation)
        message = np.r_[block[turn:turn + 6], rng.integers(2, verifier.vocab_size, 4)]
        conversation = np.r_[conversation, result.tokens, message].astype(np.int32)
    assert len(conversation) > 200


def test_reuse_prefix_false_reuses_nothing(models):
    verifier = HFVerifier(models["sdpa"], reuse_prefix=False)
    prompt = np.arange(2, 50, dtype=np.int32)
    verifier.prefill(prompt)
    verifier.prefill(np.r_[prompt, 3].astype(np.int32))
    assert verifier.prefix_reused == 0 and verifier.n_past == len(prompt) + 1


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_reuse_prefix_must_be_a_bool(models, bad):
    with pytest.raises(ConfigError, match=f"reuse_prefix: expected True or False, got .*{bad!r}"):
        HFVerifier(models["sdpa"], self_check=False, reuse_prefix=bad)


def test_a_failed_reused_prefill_leaves_an_empty_verifier(models):
    """A forward that fails after the cache was cut back to the shared prefix must not leave that
    cut cache behind as a sequence: the verifier is empty, and the next prefill starts afresh."""
    model = models["sdpa"]
    verifier = HFVerifier(model)
    prompt = np.arange(2, 60, dtype=np.int32)
    verifier.prefill(prompt)

    def fail(module, args):
        raise RuntimeError("planted failure")

    handle = model.model.register_forward_pre_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="planted failure"):
            verifier.prefill(np.r_[prompt, 5].astype(np.int32))
    finally:
        handle.remove()
    assert verifier.n_past == 0 and verifier.prefix_reused == 0
    with pytest.raises(draftcore.InputError, match="before prefill"):
        verifier.verify(DraftTree.root_only(3))
    logits = verifier.prefill(np.r_[prompt, 5].astype(np.int32), 1)[1][0]
    assert verifier.prefix_reused == 0
    np.testing.assert_allclose(logits, _fresh_logits(model, np.r_[prompt, 5]), atol=FP32_ATOL, rtol=0)


def test_a_commit_that_fails_leaves_nothing_to_reuse(models, monkeypatch):
    """A gather that stops between layers leaves the cache out of step: the verifier is emptied,
    and the next prefill runs the whole prompt."""
    from draftcore.adapters.torch_hf import kv_cache

    model = models["sdpa"]
    verifier = HFVerifier(model)
    prompt = np.arange(2, 40, dtype=np.int32)
    verifier.prefill(prompt)
    verifier.verify(DraftTree.build([3, 4, 5, 6], [-1, 0, 0, 2]))

    def fail(*args, **kwargs):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(kv_cache, "keep_path", fail)
    with pytest.raises(RuntimeError, match="planted failure"):
        verifier.commit(np.array([0, 2, 3], np.int32))
    monkeypatch.undo()
    assert verifier.n_past == 0
    assert verifier.cached_prefix(np.r_[prompt, 9]) == 0
    verifier.prefill(np.r_[prompt, 9].astype(np.int32))
    assert verifier.prefix_reused == 0


def test_cached_prefix_says_what_a_prefill_would_keep_and_checks_its_prompt(models):
    verifier = HFVerifier(models["sdpa"])
    prompt = np.arange(2, 40, dtype=np.int32)
    assert verifier.cached_prefix(prompt) == 0
    verifier.prefill(prompt)
    assert verifier.cached_prefix(np.r_[prompt[:20], 1]) == 20 and verifier.cached_prefix(prompt) == len(prompt) - 1
    assert verifier.n_past == len(prompt)     # nothing changed
    with pytest.raises(draftcore.InputError, match="prompt"):
        verifier.cached_prefix(np.array([1, 999], np.int32))


def test_long_sequences_grow_the_token_record_and_stay_within_max_context(models):
    """Past the record's first capacity (256 tokens) and up to max_context (512 here)."""
    model = models["draftcore_sdpa"]
    verifier = HFVerifier(model)
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, verifier.vocab_size, 300).astype(np.int32)
    verifier.prefill(prompt)
    for _ in range(20):    # 20 chains of 8 committed: 460 tokens
        chain = DraftTree.build(rng.integers(0, verifier.vocab_size, 8), np.arange(-1, 7))
        verifier.verify(chain)
        verifier.commit(np.arange(8, dtype=np.int32))
        prompt = np.r_[prompt, chain.tokens].astype(np.int32)
    longer = np.r_[prompt, rng.integers(0, verifier.vocab_size, 52)].astype(np.int32)
    assert len(longer) == verifier.max_context == 512
    logits = verifier.prefill(longer, 1)[1][0]
    assert verifier.prefix_reused == 460
    np.testing.assert_allclose(logits, _fresh_logits(model, longer), atol=FP32_ATOL, rtol=0)


def test_smollm2_requests_sharing_a_long_system_prompt_equal_generate(smollm2):
    """SmolLM2 (the real tokenizer and chat template): requests behind one system prompt of more
    than 512 tokens. Every request after the first keeps at least the system prompt, and each
    output equals model.generate's greedy output on its whole prompt."""
    from pydoc_data.topics import topics

    model, tokenizer, verifier = smollm2   # a verifier of this module's own, fresh: nothing cached
    system = "Answer questions about this reference text.\n\n" + topics["for"] + topics["while"]
    eos = tokenizer.eos_token_id
    shared = None
    for i, question in enumerate(("What does the else clause of a for loop do?", "When does a while loop stop?",
                                  "Quote the grammar rule of the for statement.")):
        prompt = np.asarray(tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": question}],
            add_generation_prompt=True, return_dict=False), np.int32)
        if shared is None:
            shared = len(tokenizer.apply_chat_template([{"role": "system", "content": system}],
                                                       return_dict=False)) - 1
            assert shared > 512
        result = draftcore.speculate(verifier, prompt, max_new_tokens=24, eos_token_id=eos)
        assert verifier.prefix_reused >= shared if i else verifier.prefix_reused == 0
        want = generate_greedy(model, prompt, 24, eos_token_id=eos)
        assert_same_greedy(verifier, prompt, result.tokens, want, tie_tol=1e-2)


def test_bench_methods_reuse_only_their_own_requests_prefix(models):
    """In `draftcore bench`, each draftcore method has its own verifier (the first one's Linear
    kernels): a method never reuses another's prefill of the same prompt, reuses its own previous
    request's shared prefix, and starts each dataset (reset) and round (restart) with none."""
    from draftcore.tools.backends.hf import make_methods

    methods = make_methods(models["sdpa"], None, names=("plain", "nodraft", "trie", "bare"), eos_token_id=1)
    verifiers = [m.verifier for m in methods[1:]]
    assert methods[0].verifier is None and len({id(v) for v in verifiers}) == 3
    assert all(v.linear_ways == verifiers[0].linear_ways for v in verifiers)
    rng = np.random.default_rng(5)
    shared = rng.integers(2, 256, 50)
    first, second = (np.r_[shared, rng.integers(2, 256, 8)].astype(np.int32) for _ in range(2))
    for method in methods[1:]:
        assert method.run(first, 8).prefix_reused == 0       # the same prompt as the method before
        assert method.run(second, 8).prefix_reused >= 50
    for method, forget in ((methods[1], methods[1].reset), (methods[3], methods[3].restart)):
        forget()
        assert method.run(second, 8).prefix_reused == 0


def _pairs(keep: int, length: int, chunk: int) -> int:
    """(query, key) pairs the attention computes: a fresh causal prefill's lower triangle, or every
    pair of each chunk of the rest against all positions up to its end (under a mask)."""
    if keep == 0:
        return length * (length + 1) // 2
    return sum((end - start) * end for start in range(keep, length, chunk)
               for end in [min(start + chunk, length)])


def _price(keep: int, length: int, chunk: int, pairs_per_row: float) -> float:
    """A plan's price in rows of Linear work, computed here apart from prefix_reuse.plan_cost: rows
    run, attention pairs over pairs_per_row, FORWARD_ROWS per forward."""
    rows = length if keep == 0 else length - keep
    forwards = 1 if keep == 0 else -(-(length - keep) // chunk)
    return rows + _pairs(keep, length, chunk) / pairs_per_row + FORWARD_ROWS * forwards


SMOLLM2_PAIRS_PER_ROW = 3072.0   # by hand below: SmolLM2-135M's layer weights / (2 * 9 heads * 64)


@pytest.mark.parametrize("pairs_per_row", [288.0, SMOLLM2_PAIRS_PER_ROW, 26_600.0])
def test_a_reuse_plan_is_the_cheapest_priced_plan(pairs_per_row):
    """Over splits of prompts up to 600 tokens, at the tiny Llama's, SmolLM2's and an
    8B Llama's (26,600) ratio: a plan keeps the whole shared prefix or nothing; it costs no more than a
    fresh prefill nor than the rest in 1 to 16 even chunks; a rest behind a prefix at least
    as long is always kept."""
    reused = chunked = 0
    for length in range(2, 601, 11):
        for shared in range(0, length, 3):
            keep, chunk = reuse_plan(shared, length, pairs_per_row)
            rest = length - shared
            assert keep in (0, shared) and chunk >= 1
            price = _price(keep, length, chunk, pairs_per_row)
            assert price <= _price(0, length, length, pairs_per_row), (shared, length, chunk)
            if shared == 0:
                assert (keep, chunk) == (0, length)
                continue
            for chunks in range(1, min(rest, 16) + 1):
                assert price <= _price(shared, length, -(-rest // chunks), pairs_per_row) + 1e-9, \
                    (shared, length, chunk, chunks)
            if shared >= rest:
                assert keep == shared   # fewer rows and, in one forward, no more attention than fresh
            reused += keep > 0
            chunked += keep > 0 and chunk < rest
    assert reused > 1000
    if pairs_per_row < 1000:
        assert chunked > 50     # where attention weighs more, long rests run in chunks


def test_a_plan_s_price_in_closed_form_is_the_chunk_by_chunk_sum():
    """plan_cost sums its chunks' attention in closed form (so a 128k-token prompt is priced in
    microseconds, not by a loop over chunks per plan); it equals the chunk-by-chunk sum, chunk
    sizes that divide the rest and ones that leave a short last chunk alike, fresh prefills too."""
    for length in (2, 3, 64, 65, 600, 4097):
        for keep in sorted({0, 1, length // 3, length - 1}):
            rest = length - keep
            for chunk in sorted({1, 2, 7, 64, max(1, rest // 3), rest, length}):
                expected = _price(keep, length, length if keep == 0 else chunk, SMOLLM2_PAIRS_PER_ROW)
                got = plan_cost(keep, length, length if keep == 0 else chunk, SMOLLM2_PAIRS_PER_ROW)
                assert got == pytest.approx(expected, rel=1e-12), (keep, length, chunk)


def test_with_unknown_shapes_only_a_rest_within_the_kept_prefix_is_kept():
    """pairs_per_row 0 (a model whose shapes were not read): one forward where the rest is no
    longer than the kept prefix (attention within a fresh prefill's, fewer rows), else nothing."""
    assert reuse_plan(300, 500, 0.0) == (300, 200)
    assert reuse_plan(200, 500, 0.0) == (0, 500)
    assert reuse_plan(0, 500, 0.0) == (0, 500)


def test_attention_pairs_per_row_follows_the_model_s_shapes(models, smollm2):
    """The tiny Llama (hidden 64, 4 heads of 16, 2 KV heads, intermediate 128): layer weights
    4096 + 2 * 2048 + 4096 + 3 * 64 * 128 = 36,864 over 2 * 4 * 16; SmolLM2-135M (hidden 576,
    9 heads of 64, 3 KV heads, intermediate 1536): 3,538,944 over 2 * 9 * 64."""
    assert attention_pairs_per_row(models["sdpa"]) == 36_864 / 128 == 288.0
    assert attention_pairs_per_row(smollm2[0]) == 3_538_944 / 1152 == SMOLLM2_PAIRS_PER_ROW
    assert attention_pairs_per_row(object()) == 0.0


def test_short_shared_instructions_are_kept_and_long_prompts_with_little_shared_run_fresh():
    """At SmolLM2's ratio: an extraction's ~109 shared tokens of 224 and an edit's 39 of 233 run
    the rest in one forward, where the rule of attention within a fresh prefill's (K^2 / R chunks
    of at least 64) kept neither; an agent's schema (323 of 783) in one forward; a long prompt
    sharing little runs fresh. The planted rule (always keep, one forward) prices above a fresh
    prefill there, and the plan's choice below it."""
    P = SMOLLM2_PAIRS_PER_ROW
    assert reuse_plan(109, 224, P) == (109, 115)
    assert reuse_plan(39, 233, P) == (39, 194)
    assert reuse_plan(323, 783, P) == (323, 460)
    for shared, length in ((24, 3000), (60, 1500), (2, 250)):
        assert reuse_plan(shared, length, P) == (0, length)
        assert _price(shared, length, length - shared, P) > _price(0, length, length, P)
    assert _price(109, 224, 115, P) < _price(0, 224, 224, P)


@pytest.mark.parametrize("attn", ATTENTIONS)
def test_a_rest_longer_than_the_kept_prefix_runs_in_chunks_and_equals_a_fresh_prefill(models, attn):
    """A prompt sharing 200 cached tokens with 300 new ones behind them: at the tiny Llama's ratio
    the prefill keeps the 200, runs the 300 in 2 forwards of 150, and gives a fresh prefill's logits; the trees after it too."""
    model = models[attn]
    verifier = HFVerifier(model)
    rng = np.random.default_rng(5)
    shared = rng.integers(2, verifier.vocab_size, 200).astype(np.int32)
    verifier.prefill(np.r_[shared, rng.integers(2, verifier.vocab_size, 40)].astype(np.int32))
    prompt = np.r_[shared, rng.integers(2, verifier.vocab_size, 300)].astype(np.int32)
    assert reuse_plan(200, 500, 288.0) == (200, 150) and verifier.cached_prefix(prompt) == 200
    forwards = []
    handle = model.model.register_forward_pre_hook(lambda module, args, kwargs: forwards.append(
        kwargs["input_ids"].shape[-1]), with_kwargs=True)
    try:
        tokens, logits = verifier.prefill(prompt, 1)
    finally:
        handle.remove()
    assert forwards == [150, 150] and verifier.prefix_reused == 200 and verifier.n_past == 500
    np.testing.assert_allclose(logits[0], _fresh_logits(model, prompt), atol=FP32_ATOL, rtol=0)
    fresh = HFVerifier(model, self_check=False, reuse_prefix=False)
    fresh.prefill(prompt)
    tree = DraftTree.build(rng.integers(2, verifier.vocab_size, 5), [-1, 0, 1, 0, 3])
    np.testing.assert_allclose(verifier.verify(tree, 5)[1], fresh.verify(tree, 5)[1], atol=FP32_ATOL, rtol=0)
