"""`speculative_llama` / `SpeculativeLlama`: llama-cpp-python's own loop drafting with draftcore,
asking llama.cpp only for the logits rows its sampler reads (issue #87).

Each llama_decode's output rows, read from the batch it was given: the prompt's last row, every row
of a verify step; a `Llama(draft_model=...)` built by hand asks every row (the rule the same check
rejects). Greedy output equal to a plain `llama_cpp.Llama` with the same settings at 128k and 262k
vocabularies (completion past n_batch, a prompt longer than n_batch, streaming, chat, reset,
save_state / load_state mid-conversation), with drafts accepted. logprobs refused by name without
logits_all, honoured with it; pickling; the n_batch bound; the warning that names the drop-in."""
import math
import pickle
import warnings

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from draftcore import ConfigError  # noqa: E402
from draftcore.adapters.llamacpp import (AllLogitsCostWarning, DraftcoreDraftModel, SpeculativeLlama,  # noqa: E402
                                         speculative_llama)
from draftcore.adapters.llamacpp.logits_cost import warn_if_slow  # noqa: E402

F32 = llama_cpp.GGML_TYPE_F32
# As tests/test_llamacpp_draft_model.py: one thread for batches too, F32 weights and cache (batches
# are exact), and a small n_batch so that conversations pass it and a 262k vocabulary's logits
# buffers (n_batch x n_vocab floats, in llama.cpp and in Llama.scores) stay at 64 MB.
N_BATCH = 64
SETTINGS = dict(n_ctx=512, n_batch=N_BATCH, chat_format="chatml", n_threads=1, n_threads_batch=1, type_k=F32,
                type_v=F32, flash_attn=False, verbose=False, seed=0)
REPEATING = [1, 300, 301, 302, 303] * 6                   # 30 tokens: the trie drafts from its repeats
LONGER_THAN_N_BATCH = [1, 17, 42, 99] * 20                # 80 tokens: two prompt batches


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """gguf(vocab_size): the path of a tiny random F32 Llama with that vocabulary, written once."""
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    from fixtures.gguf_writer import write_tiny_llama_gguf
    folder, paths = tmp_path_factory.mktemp("gguf-speculative"), {}

    def path(vocab_size: int) -> str:
        if vocab_size not in paths:
            paths[vocab_size] = str(folder / f"tiny-{vocab_size}.gguf")
            write_tiny_llama_gguf(paths[vocab_size], seed=0, vocab_size=vocab_size)
        return paths[vocab_size]
    return path


def completion(llm, prompt, max_tokens=100, **options):
    out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, **options)
    choice = out["choices"][0]
    return choice["text"], choice["finish_reason"], out["usage"]


def chat(llm, messages, max_tokens=60):
    out = llm.create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=0.0)
    return out["choices"][0], out["usage"]


# -- the rows each llama_decode asks for --------------------------------------------------------------------
class RecordsRows:
    """Records, per generate call, each eval's token count and the output flags of its (last)
    llama_decode, read from the batch llama-cpp-python filled (`Llama._batch`)."""

    def __init__(self, *args, **kwargs):
        self.calls = []
        super().__init__(*args, **kwargs)

    def generate(self, *args, **kwargs):
        self.calls.append([])
        return (yield from super().generate(*args, **kwargs))

    def eval(self, tokens):
        super().eval(tokens)
        batch = self._batch.batch
        flags = [bool(batch.logits[i]) for i in range(batch.n_tokens)] if len(tokens) else []
        self.calls[-1].append((len(tokens), flags))


class RecordedSpeculativeLlama(RecordsRows, SpeculativeLlama):
    pass


class RecordedLlama(RecordsRows, llama_cpp.Llama):
    pass


def rows_off_the_rule(calls) -> list:
    """(call, eval, tokens, rows asked) of every eval whose decode asked for other rows than generate
    samples: the last row after its first eval (the prompt), every row after the later ones."""
    off = []
    for c, evals in enumerate(calls):
        for e, (n, flags) in enumerate(evals):
            if n == 0:
                continue   # an exact cache hit: nothing decoded
            want = [False] * (len(flags) - 1) + [True] if e == 0 else [True] * n
            if flags != want:
                off.append((c, e, n, sum(flags)))
    return off


def test_the_prompt_asks_its_last_row_and_a_step_every_row(gguf):
    """The drop-in asks llama.cpp for 1 row of a prompt and k + 1 rows of a step with k drafted
    tokens; a Llama(draft_model=...) built by hand (logits_all forced on) asks for every prompt row,
    which the same check rejects."""
    path = gguf(512)
    spec = RecordedSpeculativeLlama(path, draft_model=DraftcoreDraftModel(budget=8), **SETTINGS)
    by_hand = RecordedLlama(path, draft_model=DraftcoreDraftModel(budget=8, self_check=False), logits_all=True,
                            **SETTINGS)
    for llm in (spec, by_hand):
        for prompt in (REPEATING, REPEATING, [1, 17, 42, 99] * 8):
            completion(llm, prompt, max_tokens=40)
    assert rows_off_the_rule(spec.calls) == []
    steps = [n for evals in spec.calls for n, _ in evals[1:]]
    assert max(steps) > 1 and spec.draft_model.accepted_tokens > 0   # drafts were verified
    # llama-cpp-python reuses the cached prefix: all but the last token of the repeated prompt, the BOS
    assert [evals[0][0] for evals in spec.calls] == [30, 1, 31]
    off = rows_off_the_rule(by_hand.calls)
    assert {(c, e, n, rows) for c, e, n, rows in off} >= {(0, 0, 30, 30), (2, 0, 31, 31)}


def test_an_eval_outside_generate_asks_the_last_row_as_a_plain_llama(gguf):
    """A chat handler may call Llama.eval itself: that eval is no verify step."""
    spec = RecordedSpeculativeLlama(gguf(512), **SETTINGS)
    spec.calls.append([])
    spec.eval(REPEATING)
    completion(spec, REPEATING, max_tokens=8)
    spec.calls.append([])
    spec.eval([400, 401, 402])
    assert spec.calls[0] == [(30, [False] * 29 + [True])] and spec.calls[2] == [(3, [False, False, True])]


def test_an_abandoned_stream_closed_during_a_later_call_does_not_end_it(gguf):
    """A stream left unfinished closes its generate when it is collected, which may be in the middle
    of a later call: that call's steps still ask every row (else llama.cpp aborts the process)."""
    path = gguf(512)
    spec = speculative_llama(path, draft_model=DraftcoreDraftModel(budget=8), **SETTINGS)
    abandoned = spec.create_completion(REPEATING, max_tokens=100, temperature=0.0, stream=True)
    next(abandoned)
    stream = spec.create_completion(REPEATING, max_tokens=100, temperature=0.0, stream=True)
    text = next(stream)["choices"][0]["text"]
    del abandoned   # its generate is closed here
    text += "".join(chunk["choices"][0]["text"] for chunk in stream)
    assert text == completion(llama_cpp.Llama(path, **SETTINGS), REPEATING)[0]
    assert spec.draft_model.accepted_tokens > 0


# -- greedy output equals plain llama_cpp.Llama ---------------------------------------------------------
@pytest.mark.parametrize("vocab_size", [128_000, 262_144])
def test_greedy_output_equals_plain_on_large_vocabularies(gguf, vocab_size):
    path = gguf(vocab_size)
    plain = llama_cpp.Llama(path, **SETTINGS)
    draft_model = DraftcoreDraftModel(budget=8)
    spec = speculative_llama(path, draft_model=draft_model, **SETTINGS)
    assert isinstance(spec, llama_cpp.Llama) and spec.draft_model is draft_model
    assert spec.scores.shape == plain.scores.shape == (N_BATCH, vocab_size)   # no n_ctx x n_vocab buffer
    assert draft_model.all_logits_slowdown is None                            # nothing to warn about

    for prompt in (REPEATING, LONGER_THAN_N_BATCH, REPEATING):   # past n_batch; the last from the trie
        want = completion(plain, prompt)
        assert want[2]["total_tokens"] > N_BATCH and completion(spec, prompt) == want
    streamed = spec.create_completion(REPEATING, max_tokens=100, temperature=0.0, stream=True)
    assert "".join(chunk["choices"][0]["text"] for chunk in streamed) == completion(plain, REPEATING)[0]
    spec.reset()
    assert completion(spec, LONGER_THAN_N_BATCH) == completion(plain, LONGER_THAN_N_BATCH)

    # The dummy vocabulary spells a generated token "tok123" (a byte token per character) in the next
    # turn's prompt: short replies keep two turns within n_ctx.
    messages = [{"role": "user", "content": "abcd efgh " * 2}]
    reply, usage = chat(plain, messages, max_tokens=12)
    assert chat(spec, messages, max_tokens=12) == (reply, usage) and usage["total_tokens"] > N_BATCH
    saved = spec.save_state()                                    # mid-conversation
    assert completion(spec, REPEATING, max_tokens=20) == completion(plain, REPEATING, max_tokens=20)
    spec.load_state(saved)
    assert spec.n_tokens == saved.n_tokens
    messages += [reply["message"], {"role": "user", "content": "ijkl " * 2}]
    assert chat(spec, messages, max_tokens=30) == chat(plain, messages, max_tokens=30)
    assert draft_model.accepted_tokens > 0


# -- logprobs ----------------------------------------------------------------------------------------------
def test_logprobs_are_refused_by_name_without_logits_all_and_honoured_with_it(gguf):
    """logits_all=False (the default) keeps no rows to read logprobs from: llama-cpp-python refuses
    them, naming logprobs, as for any Llama built without logits_all. With logits_all=True every row
    is computed and copied as llama-cpp-python does: prompt (echo) and completion logprobs equal a
    plain Llama(logits_all=True)'s, within float noise of batch against one-token decoding."""
    path = gguf(512)
    spec = speculative_llama(path, draft_model=DraftcoreDraftModel(budget=8), **SETTINGS)
    with pytest.raises(ValueError, match="logprobs .*logits_all=False"):
        spec.create_completion(REPEATING, max_tokens=8, temperature=0.0, logprobs=2)
    with pytest.raises(ValueError, match="logprobs .*logits_all=False"):
        spec.create_chat_completion(messages=[{"role": "user", "content": "abcd"}], logprobs=True,
                                    top_logprobs=2, max_tokens=8, temperature=0.0)

    plain = llama_cpp.Llama(path, logits_all=True, **SETTINGS)
    draft_model = DraftcoreDraftModel(budget=8)
    spec = speculative_llama(path, draft_model=draft_model, logits_all=True, **SETTINGS)
    assert spec.scores.shape[0] >= 512
    prompt = "abcd efgh abcd efgh abcd efgh abcd"   # text: llama-cpp-python echoes only text prompts
    for _ in range(2):   # the second time from the trie
        for echo in (False, True):
            want = plain.create_completion(prompt, max_tokens=40, temperature=0.0, logprobs=2, echo=echo)
            got = spec.create_completion(prompt, max_tokens=40, temperature=0.0, logprobs=2, echo=echo)
            want, got = want["choices"][0], got["choices"][0]
            assert got["text"] == want["text"] and got["logprobs"]["tokens"] == want["logprobs"]["tokens"]
            got_lp = [x for x in got["logprobs"]["token_logprobs"] if x is not None]
            want_lp = [x for x in want["logprobs"]["token_logprobs"] if x is not None]
            assert all(map(math.isfinite, got_lp)) and np.allclose(got_lp, want_lp, atol=1e-3)
    assert draft_model.accepted_tokens > 0


# -- construction --------------------------------------------------------------------------------------------
def test_a_step_must_fit_one_batch(gguf):
    """llama-cpp-python samples a step from the last llama_decode's rows only: a chain longer than
    n_batch - 1 is refused at construction (the Llama is closed), and for a Llama built by hand at
    its first draft-model call."""
    path = gguf(512)
    settings = {**SETTINGS, "n_batch": 16}
    with pytest.raises(ConfigError, match=r"max_draft_tokens: expected at most n_batch - 1 = 15 .*n_batch=16.*got 16"):
        speculative_llama(path, draft_model=DraftcoreDraftModel(max_draft_tokens=16), **settings)
    assert speculative_llama(path, draft_model=DraftcoreDraftModel(max_draft_tokens=15), **settings).n_batch == 16
    by_hand = llama_cpp.Llama(path, draft_model=DraftcoreDraftModel(max_draft_tokens=16, self_check=False),
                              logits_all=True, **settings)
    with pytest.raises(ConfigError, match="max_draft_tokens: expected at most n_batch - 1 = 15"):
        completion(by_hand, REPEATING, max_tokens=8)


def test_other_draft_models_and_bad_arguments(gguf):
    """Any LlamaDraftModel drafts (its chain cut to one batch); such a SpeculativeLlama pickles and
    comes back a SpeculativeLlama. A DraftcoreDraftModel does not pickle: refused by name."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    path = gguf(512)
    plain = llama_cpp.Llama(path, **SETTINGS)
    lookup = speculative_llama(path, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=100), **SETTINGS)
    assert completion(lookup, REPEATING) == completion(plain, REPEATING)
    copy = pickle.loads(pickle.dumps(lookup))
    assert type(copy) is SpeculativeLlama and copy._logits_all is False
    assert completion(copy, LONGER_THAN_N_BATCH) == completion(plain, LONGER_THAN_N_BATCH)

    with pytest.raises(ConfigError, match="draft_model: a DraftcoreDraftModel cannot be pickled.*speculative_llama"):
        pickle.dumps(speculative_llama(path, **SETTINGS))
    with pytest.raises(ConfigError, match="draft_model: expected"):
        speculative_llama(path, draft_model=42, **SETTINGS)
    with pytest.raises(ConfigError, match="logits_all: expected True or False, got 'yes'"):
        speculative_llama(path, logits_all="yes", **SETTINGS)


def test_a_draft_model_attached_later_checks_the_drop_in_at_its_first_call(gguf):
    """The draft model finds a SpeculativeLlama in Llama.generate's frame, as it finds a Llama: its
    first call checks it (self-check), and does not refuse it for having no n_ctx-row buffer."""
    path = gguf(512)
    spec = speculative_llama(path, **SETTINGS)
    later = DraftcoreDraftModel(budget=8)
    spec.draft_model = later
    assert completion(spec, REPEATING) == completion(llama_cpp.Llama(path, **SETTINGS), REPEATING)
    assert later.self_check_error is not None and later.steps > 0 and later.all_logits_slowdown is None


def test_the_cost_warning_of_a_llama_built_by_hand_names_the_drop_in():
    """The rule, without timing (the timed warning on a 262k vocabulary is
    tests/test_llamacpp_draft_model.py's)."""
    with pytest.warns(AllLogitsCostWarning, match=r"262,144-token vocabulary .*6\.8x .*speculative_llama\(model_path"):
        warn_if_slow(6.8, 262_144)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AllLogitsCostWarning)
        warn_if_slow(1.2, 262_144)
