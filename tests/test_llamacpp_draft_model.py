"""`Llama(draft_model=DraftcoreDraftModel())`: llama-cpp-python's own calls, unchanged, with
draftcore drafting. Greedy completions (plain, streamed, chat) equal the same Llama settings without
a draft model, on the tiny F32 GGUF (exact) and, slow, on SmolLM2 in F32; drafts are accepted."""
import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from draftcore import BusyError, ConfigError, TrieDrafter  # noqa: E402
from draftcore.adapters.llamacpp import DraftcoreDraftModel  # noqa: E402
from draftcore.adapters.llamacpp.draft_model import best_chain  # noqa: E402
from draftcore.tree import DraftTree  # noqa: E402

F32 = llama_cpp.GGML_TYPE_F32
EXACT = dict(n_threads=1, type_k=F32, type_v=F32, flash_attn=False, verbose=False, seed=0)
PROMPTS = [[1, 300, 301, 302, 303, 300, 301, 302, 303, 300, 301],
           [1, 17, 42, 99, 17, 42, 99, 17, 42],
           [1, 260, 261, 262, 263, 264, 260, 261]]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    from gguf_writer import write_tiny_llama_gguf
    path = tmp_path_factory.mktemp("gguf-draft") / "tiny.gguf"
    write_tiny_llama_gguf(path, seed=0, vocab_size=512)
    return str(path)


def completion(llm, prompt, **options):
    out = llm.create_completion(prompt, max_tokens=48, temperature=0.0, **options)
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


# -- SmolLM2 F32: real text, chat completion --------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_f32_gguf(smollm2, tmp_path_factory):
    from draftcore.adapters.torch_hf.smollm2 import packaged_gguf
    from gguf_writer import write_llama_gguf
    return str(write_llama_gguf(smollm2[0], tmp_path_factory.mktemp("smol-f32") / "smollm2-f32.gguf",
                                tokenizer_from=packaged_gguf()))


@pytest.mark.slow
def test_smollm2_f32_completions_and_chat_equal_plain(smollm2_f32_gguf):
    settings = dict(n_ctx=1024, n_threads=2, type_k=F32, type_v=F32, flash_attn=False, verbose=False, seed=0)
    plain = llama_cpp.Llama(smollm2_f32_gguf, **settings)
    # A fixed budget, so that drafts are verified whatever the machine's load (the auto budget's
    # sizes follow measured step times; the tiny-model test covers the default's equality).
    draft_model = DraftcoreDraftModel(budget=4)
    spec = llama_cpp.Llama(smollm2_f32_gguf, draft_model=draft_model, **settings)
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
