"""`Llama(draft_model=DraftcoreDraftModel())`: llama-cpp-python's own calls, unchanged, with
draftcore drafting. Greedy completions (plain, streamed, chat) equal the same Llama settings without
a draft model, on the tiny F32 GGUF (exact) and, slow, on SmolLM2 in F32; drafts are accepted.
Past n_batch positions through `speculative_llama` (a SpeculativeLlama, no logits_all needed: its own
tests are tests/test_llamacpp_speculative_llama.py); a Llama built by hand without logits_all is
refused by name; quantized batches that differ from one-token decoding are warned about once."""
import warnings

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from draftcore import BusyError, ConfigError, TrieDrafter  # noqa: E402
from draftcore.adapters.llamacpp import DraftcoreDraftModel, InexactBatchWarning, speculative_llama  # noqa: E402
from draftcore.adapters.llamacpp.draft_model import MAX_DRAFT_TOKENS, best_chain  # noqa: E402
from draftcore.tree import DraftTree  # noqa: E402

F32 = llama_cpp.GGML_TYPE_F32
# One thread for batches too (llama-cpp-python's n_threads_batch defaults to every core): on a loaded
# 2-core machine two threads made a 300-token speculative completion take 22 s instead of 0.1 s.
EXACT = dict(n_threads=1, n_threads_batch=1, type_k=F32, type_v=F32, flash_attn=False, verbose=False, seed=0)
PROMPTS = [[1, 300, 301, 302, 303, 300, 301, 302, 303, 300, 301],
           [1, 17, 42, 99, 17, 42, 99, 17, 42],
           [1, 260, 261, 262, 263, 264, 260, 261]]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    from fixtures.gguf_writer import write_tiny_llama_gguf
    path = tmp_path_factory.mktemp("gguf-draft") / "tiny.gguf"
    write_tiny_llama_gguf(path, seed=0, vocab_size=512)
    return str(path)


def completion(llm, prompt, max_tokens=48, **options):
    out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, **options)
    choice = out["choices"][0]
    return choice["text"], choice["finish_reason"], out["usage"]


def test_completions_equal_plain_and_drafts_are_accepted(tiny_gguf):
    """Both the default (auto budget) and a fixed budget equal plain. Acceptance is asserted on the
    fixed one: the auto budget sizes drafts from measured step times, so on a loaded machine it
    may rightly draft nothing (CI once saw 3 drafted tokens in 282 steps)."""
    plain = llama_cpp.Llama(tiny_gguf, n_ctx=512, **EXACT)
    auto, fixed = DraftcoreDraftModel(), DraftcoreDraftModel(budget=8)
    for draft_model in (auto, fixed):
        spec = llama_cpp.Llama(tiny_gguf, n_ctx=512, draft_model=draft_model, **EXACT)
        for _ in range(2):   # the second round drafts from what the trie learnt in the first
            for prompt in PROMPTS:
                assert completion(spec, prompt) == completion(plain, prompt), prompt
        assert draft_model.steps > 0
    assert fixed.accepted_tokens > 0 and fixed.drafted_tokens >= fixed.accepted_tokens
    want = completion(plain, PROMPTS[0])[0]
    streamed = spec.create_completion(PROMPTS[0], max_tokens=48, temperature=0.0, stream=True)
    assert "".join(chunk["choices"][0]["text"] for chunk in streamed) == want


def test_a_fixed_budget_and_a_shared_trie_still_equal_plain(tiny_gguf):
    plain = llama_cpp.Llama(tiny_gguf, n_ctx=512, **EXACT)
    shared = TrieDrafter()
    models = [DraftcoreDraftModel(shared, budget=4), DraftcoreDraftModel("ngram", max_draft_tokens=6)]
    for draft_model in models:
        spec = llama_cpp.Llama(tiny_gguf, n_ctx=512, draft_model=draft_model, **EXACT)
        for prompt in PROMPTS + PROMPTS[:1]:
            assert completion(spec, prompt) == completion(plain, prompt)
        assert draft_model.steps > 0 and draft_model.drafted_tokens > 0


def test_drafters_by_name_need_nothing_but_the_text():
    """The menu's text drafters, "composite" built without its Jacobi window (this loop reports no
    model outputs to feed one), and, once the tooling has registered them, the variants without one."""
    from draftcore.drafters import CompositeDrafter, NGramDrafter
    import draftcore.tools.variants  # noqa: F401

    assert isinstance(DraftcoreDraftModel("trie").drafter, TrieDrafter)
    assert isinstance(DraftcoreDraftModel("ngram").drafter, NGramDrafter)
    for name in ("composite", "composite-nowindow"):
        drafter = DraftcoreDraftModel(name).drafter
        assert isinstance(drafter, CompositeDrafter) and drafter.window is False and drafter.jacobi is None
    assert DraftcoreDraftModel("ngram-paper").drafter.branching == 1
    for name in ("jacobi", "jacobi-paper", "no-such-drafter"):
        with pytest.raises(ConfigError, match=f"drafter: .*'{name}'"):
            DraftcoreDraftModel(name)


def test_bad_arguments_and_concurrent_use_are_refused():
    with pytest.raises(ConfigError, match="drafter: .*'jacobi'"):
        DraftcoreDraftModel("jacobi")
    with pytest.raises(ConfigError, match="max_draft_tokens"):
        DraftcoreDraftModel(max_draft_tokens=0)
    with pytest.raises(ConfigError, match="drafter: expected a Drafter"):
        DraftcoreDraftModel(drafter=42)
    draft_model = DraftcoreDraftModel()
    draft_model._busy.acquire()
    try:
        with pytest.raises(BusyError, match="one at a time"):
            draft_model(np.array([1, 2, 3], np.intc))
    finally:
        draft_model._busy.release()
    assert draft_model.steps == 0   # the refused call changed nothing


def test_the_chain_is_each_nodes_first_child():
    tree = DraftTree.build([5, 6, 7, 8, 9, 10], [-1, 0, 0, 1, 1, 3], scores=[1, .9, .5, .8, .3, .6])
    chain = best_chain(tree)
    assert chain.tokens.tolist() == [5, 6, 8, 10] and chain.parents.tolist() == [-1, 0, 1, 2]
    assert np.allclose(chain.scores, [1, .9, .8, .6])


def test_a_new_context_starts_a_new_request():
    draft_model = DraftcoreDraftModel(budget=8)
    text = np.array([1, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6], np.intc)
    assert draft_model(text).tolist()[:2] == [7, 8]   # drafted from the prompt's own repeat
    draft_model(np.append(text, [7, 8]).astype(np.intc))   # continues: the chain's outcome is learnt
    assert draft_model.accepted_tokens == 1
    other = np.array([1, 9, 9, 9], np.intc)
    draft_model(other)   # not an extension: the first request ends, a new one starts
    assert draft_model._context.tolist() == other.tolist() and draft_model.steps == 3


# -- conversations longer than n_batch (512) ----------------------------------------------------------------
LONG_PROMPT = PROMPTS[0] * 30   # 330 tokens: prompt + 300 new ones pass n_batch=512 during generation
STREAM_PROMPT = PROMPTS[0] * 44  # 484 tokens: with 100 streamed ones, past n_batch


@pytest.fixture(scope="module")
def plain_1024(tiny_gguf):
    return llama_cpp.Llama(tiny_gguf, n_ctx=1024, **EXACT)


def test_speculative_llama_equals_plain_past_n_batch(tiny_gguf, plain_1024):
    """Completion, streaming and a two-turn chat whose positions pass n_batch (512, the default):
    speculative_llama's default logits_all=False keeps no logits buffer past n_batch rows and needs
    none. On the F32 tiny GGUF batches are exact: the construction self-check warns about nothing."""
    draft_model = DraftcoreDraftModel(budget=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactBatchWarning)
        spec = speculative_llama(tiny_gguf, n_ctx=1024, draft_model=draft_model, **EXACT)
        assert isinstance(spec, llama_cpp.Llama) and spec.draft_model is draft_model and spec._logits_all is False
        assert draft_model.self_check_error is not None                 # checked at construction
        want = completion(plain_1024, LONG_PROMPT, max_tokens=300)
        assert want[2]["total_tokens"] > 600 and completion(spec, LONG_PROMPT, max_tokens=300) == want
        # streamed: a longer prompt and fewer new tokens (llama-cpp-python streams 300 tokens in 3 s)
        text, _, usage = completion(plain_1024, STREAM_PROMPT, max_tokens=100)
        streamed = spec.create_completion(STREAM_PROMPT, max_tokens=100, temperature=0.0, stream=True)
        assert usage["total_tokens"] > 550 and "".join(c["choices"][0]["text"] for c in streamed) == text
        messages = [{"role": "user", "content": "abcd efgh " * 25}]
        for turn in range(2):   # ~500 positions after the first turn, ~980 after the second
            want = plain_1024.create_chat_completion(messages=messages, max_tokens=120, temperature=0.0)
            got = spec.create_chat_completion(messages=messages, max_tokens=120, temperature=0.0)
            assert got["choices"][0] == want["choices"][0] and got["usage"] == want["usage"]
            messages += [want["choices"][0]["message"], {"role": "user", "content": "ijkl mnop " * 10}]
        assert want["usage"]["total_tokens"] > 900
    assert draft_model.accepted_tokens > 0
    assert isinstance(speculative_llama(tiny_gguf, n_ctx=256, **EXACT).draft_model, DraftcoreDraftModel)


def test_a_llama_without_logits_all_is_refused_by_name(tiny_gguf):
    """Llama(draft_model=...) without logits_all=True sizes its logits buffer for n_batch positions:
    past them llama-cpp-python failed with a numpy broadcast ValueError. The first draft-model call
    raises a ConfigError naming the argument and the drop-in instead, whatever the prompt's length,
    and drafts nothing. speculative_llama needs no logits_all (it writes no such buffer) and takes
    logits_all=False as its default (test_speculative_llama_equals_plain_past_n_batch)."""
    draft_model = DraftcoreDraftModel(budget=8)
    spec = llama_cpp.Llama(tiny_gguf, n_ctx=1024, draft_model=draft_model, **EXACT)
    for prompt in (LONG_PROMPT, PROMPTS[1]):
        with pytest.raises(ConfigError, match=r"logits_all: .*logits_all=False.*Expected .*speculative_llama"
                                              r".*or logits_all=True"):
            completion(spec, prompt, max_tokens=300)
    assert draft_model.steps == 0
    assert speculative_llama(tiny_gguf, n_ctx=1024, logits_all=False, **EXACT)._logits_all is False
    with pytest.raises(ConfigError, match="draft_model: expected"):
        speculative_llama(tiny_gguf, draft_model=42, **EXACT)
    with pytest.raises(ConfigError, match="llm: expected a llama_cpp.Llama"):
        draft_model.check_llama(42)


def test_max_draft_tokens_is_bounded_by_one_batch():
    """A chain longer than n_batch - 1 (511 by default) cannot be verified in one forward; 10**9 used
    to be accepted and took 37 s to build its budget."""
    assert MAX_DRAFT_TOKENS == 511
    assert DraftcoreDraftModel(max_draft_tokens=511).max_draft_tokens == 511
    for n in (512, 10**9):
        with pytest.raises(ConfigError, match=f"max_draft_tokens: expected at most 511 .*n_batch.*got {n}"):
            DraftcoreDraftModel(max_draft_tokens=n)


def test_inexact_batches_are_warned_about_once(packaged_gguf):
    """SmolLM2 Q4_1 with flash attention off: multi-token batches differ from one-token decoding
    (the self-check measures 0.016 relative), so the drop-in's greedy text can differ from plain.
    The first call warns once, naming flash_attn=True, at the user's line; speculative_llama warns
    at construction instead. Flash attention on: bit-exact, no warning."""
    from draftcore.adapters.llamacpp.numerics import NEAR_TIE_ONLY
    settings = dict(n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False)
    draft_model = DraftcoreDraftModel(budget=4)
    llm = llama_cpp.Llama(packaged_gguf, flash_attn=False, draft_model=draft_model, **settings)
    with pytest.warns(InexactBatchWarning, match="DraftcoreDraftModel: .*flash_attn=True") as caught:
        for prompt in ("def add(a, b):", "def add(a, b):", "Hello"):
            llm.create_completion(prompt, max_tokens=8, temperature=0.0)
    assert [w.category for w in caught if w.category is InexactBatchWarning] == [InexactBatchWarning]  # once
    assert caught[0].filename == __file__
    assert draft_model.self_check_error > NEAR_TIE_ONLY and draft_model.steps > 0
    with pytest.warns(InexactBatchWarning, match="flash_attn=True") as caught:
        llm = speculative_llama(packaged_gguf, flash_attn=False, **settings)
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactBatchWarning)
        llm.create_completion("def add(a, b):", max_tokens=8, temperature=0.0)   # checked already
        exact = speculative_llama(packaged_gguf, flash_attn=True, **settings)
        exact.create_completion("def add(a, b):", max_tokens=8, temperature=0.0)
    assert exact.draft_model.self_check_error == 0.0


# -- SmolLM2 F32: real text, chat completion --------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_f32_gguf(smollm2, tmp_path_factory):
    from draftcore.adapters.torch_hf.smollm2 import packaged_gguf
    from fixtures.gguf_writer import write_llama_gguf
    return str(write_llama_gguf(smollm2[0], tmp_path_factory.mktemp("smol-f32") / "smollm2-f32.gguf",
                                tokenizer_from=packaged_gguf()))


@pytest.mark.slow
def test_smollm2_f32_completions_and_chat_equal_plain(smollm2_f32_gguf):
    settings = dict(n_ctx=1024, n_threads=2, type_k=F32, type_v=F32, flash_attn=False, verbose=False, seed=0)
    plain = llama_cpp.Llama(smollm2_f32_gguf, **settings)
    # A fixed budget, so that drafts are verified whatever the machine's load (the auto budget's
    # sizes follow measured step times; the tiny-model test covers the default's equality).
    # logits_all=True: n_ctx exceeds n_batch (test_a_llama_without_logits_all_is_refused_by_name).
    draft_model = DraftcoreDraftModel(budget=4)
    spec = llama_cpp.Llama(smollm2_f32_gguf, draft_model=draft_model, logits_all=True, **settings)
    prompts = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
               "def is_palindrome(s: str) -> bool:\n"]
    for prompt in prompts + prompts:
        assert completion(spec, prompt) == completion(plain, prompt)
    streamed = spec.create_completion(prompts[0], max_tokens=48, temperature=0.0, stream=True)
    assert "".join(chunk["choices"][0]["text"] for chunk in streamed) == completion(plain, prompts[0])[0]
    messages = [{"role": "user", "content": "Write a Python function that reverses a list."}]
    for _ in range(2):
        want = plain.create_chat_completion(messages=messages, temperature=0.0, max_tokens=48)
        got = spec.create_chat_completion(messages=messages, temperature=0.0, max_tokens=48)
        assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert draft_model.accepted_tokens > 0


# -- logits_all with a large vocabulary --------------------------------------------------------------------
def test_a_prompt_made_slow_by_logits_all_is_warned_about_with_the_measured_cost(tmp_path):
    """A draft model makes llama-cpp-python compute and copy every position's logits. Over a
    262,144-token vocabulary (a tiny random Llama: the head is nearly all of the model) that makes a
    prompt's evaluation several times slower: the drop-in measures it on its first Llama and warns
    once, naming the vocabulary and the way out (speculative_llama; LlamaCppVerifier for trees). Over
    512 tokens it stays under the threshold. A SpeculativeLlama is never measured (it computes the
    rows it samples only: tests/test_llamacpp_speculative_llama.py)."""
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    from draftcore.adapters.llamacpp.logits_cost import (SLOWDOWN_WARNED, AllLogitsCostWarning,
                                                         all_logits_slowdown, warn_if_slow)
    from fixtures.gguf_writer import write_tiny_llama_gguf
    big = tmp_path / "vocab262k.gguf"
    write_tiny_llama_gguf(big, seed=0, vocab_size=262_144)
    draft_model = DraftcoreDraftModel(budget=4)
    llm = llama_cpp.Llama(str(big), n_ctx=256, logits_all=True, draft_model=draft_model, **EXACT)
    with pytest.warns(AllLogitsCostWarning, match=r"262,144-token vocabulary .*speculative_llama.*LlamaCppVerifier") as caught:
        for _ in range(2):
            llm.create_completion([1, 300, 301, 302, 300, 301], max_tokens=4, temperature=0.0)
    assert [w.category for w in caught if w.category is AllLogitsCostWarning] == [AllLogitsCostWarning]
    assert caught[0].filename == __file__
    assert draft_model.all_logits_slowdown > 2 * SLOWDOWN_WARNED
    # The rule itself, without timing: silent at or below the threshold.
    with warnings.catch_warnings():
        warnings.simplefilter("error", AllLogitsCostWarning)
        warn_if_slow(SLOWDOWN_WARNED, 512)
    small = tmp_path / "vocab512.gguf"
    write_tiny_llama_gguf(small, seed=0, vocab_size=512)
    assert all_logits_slowdown(llama_cpp, llama_cpp.Llama(str(small), n_ctx=256, **EXACT)) < 0.5 * \
        draft_model.all_logits_slowdown
