"""Exactness past 256 tokens of context on llama.cpp: where one-token decoding splits its attention
across threads and a verify does not (adapters/llamacpp/numerics.py, split_attention_from).

The rule is read from the context's settings, not measured at construction; these tests measure it on
the installed llama.cpp and the packaged SmolLM2 Q4_1 weights (whose batches are bit-exact at short
contexts with flash attention on): after 300 cached tokens a 4-token chain's logits differ from
one-token decoding's exactly where the rule says so, and after 200 they never do. If a llama.cpp
update changes its kernels, this is the test that says the rule no longer holds.
"""
import warnings

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import draftcore  # noqa: E402
from draftcore.adapters.llamacpp import DraftcoreDraftModel, InexactBatchWarning, LlamaCppVerifier  # noqa: E402
from draftcore.adapters.llamacpp.numerics import split_attention_from  # noqa: E402
from draftcore.selfcheck import chain_against_one_token  # noqa: E402

F16, F32, Q8_0 = llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_F32, llama_cpp.GGML_TYPE_Q8_0
BF16 = 30   # ggml's id; llama-cpp-python 0.3.36 has no constant for it (context.GGML_TYPE_IDS)


def _params(**fields):
    params = llama_cpp.llama_context_default_params()
    defaults = dict(n_ctx=1024, type_k=F16, type_v=F16, flash_attn_type=llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED)
    for name, value in {**defaults, **fields}.items():
        setattr(params, name, value)
    return params


@pytest.mark.parametrize("fields, n_threads, offloaded, expected", [
    ({}, 2, False, 257),
    ({"type_k": F32, "type_v": F32}, 8, False, 257),
    ({"flash_attn_type": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO}, 2, False, 257),   # AUTO is on for a CPU
    ({}, 1, False, None),                                          # one thread: one piece, as a batch row
    ({"type_k": Q8_0, "type_v": Q8_0}, 2, False, None),            # quantized cache: never split
    ({"type_k": BF16, "type_v": BF16}, 2, False, None),            # BF16 neither
    ({"type_v": Q8_0}, 2, False, None),                            # K and V must share F16/F32
    ({"flash_attn_type": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}, 2, False, None),
    ({"n_ctx": 256}, 2, False, None),                              # the view never reaches 512 cells
    ({}, 2, True, None),                                           # GPU kernels: not measured, not claimed
], ids=["f16", "f32-8-threads", "flash-auto", "one-thread", "q8_0", "bf16", "mixed", "no-flash", "short-context", "gpu"])
def test_the_rule_reads_the_settings(fields, n_threads, offloaded, expected):
    params = _params(**fields)
    assert split_attention_from(llama_cpp, params, n_ctx=params.n_ctx, n_threads=n_threads,
                                offloaded=offloaded) == expected


@pytest.mark.parametrize("kv_type, n_threads", [(F16, 2), (F16, 1), (Q8_0, 2), (BF16, 2)],
                         ids=["f16-2", "f16-1", "q8_0-2", "bf16-2"])
def test_the_rule_matches_what_llama_cpp_computes(packaged_gguf, kv_type, n_threads):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InexactBatchWarning)
        v = LlamaCppVerifier.from_gguf(packaged_gguf, n_ctx=1024, n_threads=n_threads, flash_attn=True,
                                       type_k=kv_type, type_v=kv_type, reuse_prefix=False)
    try:
        assert v.self_check_error == 0.0                          # short contexts: bit-exact
        assert chain_against_one_token(v, 200) == 0.0                 # a view of 256 cells: never split
        past = chain_against_one_token(v, 300)                        # a view of 512 cells
        if v.split_attention_from is None:
            assert past == 0.0
        else:
            assert v.split_attention_from == 257 and past > 0.05  # measured 0.95 (F16, 2 threads)
    finally:
        v.close()


def test_a_splitting_context_is_warned_about_at_the_callers_line(packaged_gguf):
    with pytest.warns(InexactBatchWarning, match=r"n_threads=2.*GGML_TYPE_Q8_0.*n_threads=1") as caught:
        v = LlamaCppVerifier.from_gguf(packaged_gguf, n_ctx=1024, n_threads=2, flash_attn=True)
    assert caught[0].filename == __file__ and v.split_attention_from == 257
    v.close()
    unchecked = LlamaCppVerifier.from_gguf(packaged_gguf, n_ctx=1024, n_threads=2, self_check=False)
    assert unchecked.split_attention_from is None                 # nothing checked, nothing warned
    unchecked.close()
    settings = dict(n_ctx=1024, n_threads=2, flash_attn=True, logits_all=True, verbose=False)
    draft_model = DraftcoreDraftModel(budget=4)
    llm = llama_cpp.Llama(packaged_gguf, draft_model=draft_model, **settings)
    with pytest.warns(InexactBatchWarning, match="DraftcoreDraftModel: .*GGML_TYPE_Q8_0"):
        draft_model.check_llama(llm)
    assert draft_model.split_attention_from == 257
    exact = DraftcoreDraftModel(budget=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactBatchWarning)
        exact.check_llama(llama_cpp.Llama(packaged_gguf, draft_model=exact, type_k=Q8_0, type_v=Q8_0, **settings))
    assert exact.split_attention_from is None


def _long_prompt(llm, tokens: int) -> list[int]:
    """A chat request over a slice of Python's reference documentation, about `tokens` long."""
    from pydoc_data.topics import topics
    text = llm.detokenize(llm.tokenize(topics["compound"].encode(), add_bos=False)[:tokens]).decode("utf-8", "ignore")
    chat = f"<|im_start|>user\nSummarise this:\n\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return llm.tokenize(chat.encode(), add_bos=False, special=True)


def test_a_quantized_kv_cache_keeps_long_prompts_exact_on_two_threads(packaged_gguf):
    """The advice the warning gives, end to end: Q8_0 K and V caches, 2 threads, a prompt of ~400
    tokens. The trie's speculative output equals llama-cpp-python's plain greedy with no near-tie
    allowance, and drafts were accepted (with an F16 cache the same run differed on 6 of 6 agent
    prompts, numerics.py)."""
    settings = dict(n_ctx=1024, n_threads=2, n_threads_batch=2, flash_attn=True, type_k=Q8_0, type_v=Q8_0,
                    verbose=False)
    llm = llama_cpp.Llama(packaged_gguf, **settings)
    prompt = _long_prompt(llm, 400)
    assert len(prompt) > 400
    want = []
    for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        want.append(token)
        if token == llm.token_eos() or len(want) >= 96:
            break
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactBatchWarning)
        v = LlamaCppVerifier.from_llama(llm, own_context=True, max_tree_nodes=16)
    trie = draftcore.TrieDrafter()
    result = draftcore.speculate(v, np.asarray(prompt, np.int32), max_new_tokens=len(want), drafter=trie, budget=8,
                                 eos_token_id=[llm.token_eos()])
    v.close()
    assert result.tokens.tolist() == want
    assert sum(result.stats.accepted_hist[1:]) > 0, "no draft was accepted: the test would test nothing"


def test_the_bench_loads_the_kv_cache_it_is_told(packaged_gguf, monkeypatch):
    """`draftcore bench --backend llamacpp` runs every method with one KV cache type, from
    DRAFTCORE_LLAMACPP_KV (f16 by default) or load_model's kv_cache, and records it; an unknown one
    is refused by name."""
    from draftcore.errors import ConfigError
    from draftcore.tools.backends import llamacpp as bench
    monkeypatch.setenv("DRAFTCORE_LLAMACPP_KV", "q8_0")
    handle, _ = bench.load_model(None, n_ctx=512)
    assert bench.model_settings(handle)["kv_cache"] == "q8_0"
    assert (handle.llm.context_params.type_k, handle.llm.context_params.type_v) == (Q8_0, Q8_0)
    monkeypatch.delenv("DRAFTCORE_LLAMACPP_KV")
    assert bench.model_settings(bench.load_model(None, n_ctx=512)[0])["kv_cache"] == "f16"
    with pytest.raises(ConfigError, match=r"kv_cache \(DRAFTCORE_LLAMACPP_KV\).*'bf16'"):
        bench.load_model(None, kv_cache="bf16")
