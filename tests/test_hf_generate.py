"""`model.generate(..., custom_generate=speculative_generate)` is transformers' own generate(),
speculatively: the same tokens greedy (with EOS, stop strings, processors, streamers, return_dict),
the same distribution sampling (chi-square, and a planted wrong rule caught), and every option it
cannot honour refused by name."""
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import draftcore  # noqa: E402
import draftcore.acceptance  # noqa: E402
from draftcore import BusyError, ConfigError, TrieDrafter  # noqa: E402
from draftcore.adapters.torch_hf import release, speculative_generate  # noqa: E402
from draftcore.adapters.torch_hf import verifier_pool  # noqa: E402
from naive_sampling import goodness_of_fit, naive_probs, naive_process, naive_sample_step  # noqa: E402
from onnx_fixtures import save_tiny_llama  # noqa: E402
from transformers import (AutoTokenizer, LogitsProcessor, StoppingCriteriaList, StopStringCriteria,  # noqa: E402
                          TextIteratorStreamer)

PROMPTS = [[0, 300, 301, 302, 303, 300, 301, 302, 303, 300, 301],
           [0, 17, 42, 99, 17, 42, 99, 17, 42],
           [0, 5, 6, 7, 8, 9, 10, 5, 6]]


# Past the tiny model's default 512 positions (and llama.cpp's default n_batch): a long request.
LONG_PROMPT = [0] + np.random.default_rng(7).integers(2, 512, 599).tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model, tokenizer): the tiny random Llama (vocab 512) with a word-level tokenizer, built with
    room for 2,048 positions (the verifier's max_context follows max_position_embeddings; the
    weights are those of the default 512)."""
    folder = tmp_path_factory.mktemp("tiny-generate")
    model = save_tiny_llama(folder, seed=0, vocab_size=512, max_position=2048)
    yield model, AutoTokenizer.from_pretrained(folder, local_files_only=True)
    release(model)


class ForwardCounter:
    def __init__(self, model):
        self.calls = 0
        self.handle = model.model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.calls += 1


def ids(prompt):
    return torch.tensor([prompt])


def test_greedy_equals_generate_and_drafts_are_accepted(tiny):
    model, _ = tiny
    counter = ForwardCounter(model)
    try:
        for _ in range(2):   # the second round drafts from what the first taught the trie
            for prompt in PROMPTS:
                want = model.generate(ids(prompt), max_new_tokens=48, do_sample=False)
                counter.calls = 0
                got = model.generate(ids(prompt), custom_generate=speculative_generate, max_new_tokens=48,
                                     do_sample=False)
                assert torch.equal(got, want), prompt
    finally:
        counter.handle.remove()
    assert counter.calls < 48   # the last call verified more than one token per forward


def test_a_request_longer_than_the_fixed_sizes_equals_generate(tiny, small_context_buffer):
    """A 600-token prompt, past the default 512 positions, and 120 new tokens, past the first size of
    speculate's context buffer (made 16 here), which grows as tokens arrive: the output is
    generate()'s own."""
    model, _ = tiny
    want = model.generate(ids(LONG_PROMPT), max_new_tokens=120, do_sample=False)
    got = model.generate(ids(LONG_PROMPT), custom_generate=speculative_generate, max_new_tokens=120,
                         do_sample=False)
    assert want.shape[1] == len(LONG_PROMPT) + 120   # no early EOS: the request ran its whole length
    assert torch.equal(got, want)
    assert small_context_buffer   # the buffer grew past its first size


def test_return_dict_eos_and_processors(tiny):
    model, _ = tiny
    prompt = PROMPTS[0]
    plain = model.generate(ids(prompt), max_new_tokens=40, do_sample=False)
    eos = int(plain[0, len(prompt) + 12])   # a token the output reaches: generation stops there
    options = dict(max_new_tokens=40, do_sample=False, eos_token_id=eos, return_dict_in_generate=True)
    want = model.generate(ids(prompt), **options)
    got = model.generate(ids(prompt), custom_generate=speculative_generate, **options)
    assert type(got) is type(want) and torch.equal(got.sequences, want.sequences)
    assert got.sequences.shape[1] < plain.shape[1] and int(got.sequences[0, -1]) == eos
    options = dict(max_new_tokens=40, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=3,
                   min_new_tokens=5, suppress_tokens=[int(plain[0, len(prompt) + 2])])
    want = model.generate(ids(prompt), **options)
    assert not torch.equal(want, plain)   # the processors change the output: the test can fail
    got = model.generate(ids(prompt), custom_generate=speculative_generate, **options)
    assert torch.equal(got, want)


@pytest.fixture(scope="module")
def byte_tokenizer():
    """SmolLM2's byte-level BPE tokenizer: its first 512 ids are text pieces for the tiny model's ids
    (StopStringCriteria needs a tokenizer whose vocabulary it can map to strings)."""
    from draftcore.adapters.torch_hf.smollm2 import load_smollm2_tokenizer
    return load_smollm2_tokenizer()


def test_stop_strings_and_the_streamer(tiny, byte_tokenizer):
    model, tokenizer = tiny[0], byte_tokenizer
    prompt = PROMPTS[1]
    plain = model.generate(ids(prompt), max_new_tokens=40, do_sample=False)
    stop = tokenizer.decode(plain[0, len(prompt) + 9:len(prompt) + 11])
    criteria = StoppingCriteriaList([StopStringCriteria(tokenizer, [stop])])
    want = model.generate(ids(prompt), max_new_tokens=40, do_sample=False, stopping_criteria=criteria)
    assert want.shape[1] < plain.shape[1]
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    got = {}
    worker = threading.Thread(target=lambda: got.setdefault("out", model.generate(
        ids(prompt), custom_generate=speculative_generate, max_new_tokens=40, do_sample=False,
        stopping_criteria=criteria, streamer=streamer)))
    worker.start()
    text = "".join(streamer)   # ends only if speculative_generate ends the streamer
    worker.join(timeout=60)
    assert torch.equal(got["out"], want)
    assert text == tokenizer.decode(want[0, len(prompt):])
    # transformers 5.x does not pass tokenizer= to a callable custom_generate, so stop_strings=
    # fails in transformers' own preparation (a clear ValueError) until it does; then it must match.
    try:
        out = model.generate(ids(prompt), custom_generate=speculative_generate, max_new_tokens=40, do_sample=False,
                             stop_strings=[stop], tokenizer=tokenizer)
    except ValueError as exc:
        assert "tokenizer" in str(exc)
    else:
        assert torch.equal(out, want)


class RecordingStreamer:
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


def test_streamer_gets_the_prompt_then_every_accepted_token_then_end(tiny):
    model, _ = tiny
    prompt = PROMPTS[2]
    streamer = RecordingStreamer()
    out = model.generate(ids(prompt), custom_generate=speculative_generate, max_new_tokens=30, do_sample=False,
                         streamer=streamer)
    assert streamer.puts[0] == prompt and streamer.ended == 1
    assert sum(streamer.puts[1:], []) == out[0, len(prompt):].tolist()


class BanLastToken(LogitsProcessor):
    """A user processor that is a pure function of (input_ids, scores)."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, input_ids[:, -1]] = -float("inf")
        return scores


def test_user_processors_run_per_node_only_when_declared_pure(tiny):
    model, _ = tiny
    prompt = PROMPTS[0]
    processors = transformers.LogitsProcessorList([BanLastToken()])
    want = model.generate(ids(prompt), max_new_tokens=30, do_sample=False, logits_processor=processors)
    with pytest.raises(ConfigError, match="pure_logits_processors=True"):
        model.generate(ids(prompt), custom_generate=speculative_generate, max_new_tokens=30, do_sample=False,
                       logits_processor=processors)
    got = model.generate(ids(prompt), custom_generate=speculative_generate, max_new_tokens=30, do_sample=False,
                         logits_processor=processors, pure_logits_processors=True)
    assert torch.equal(got, want)


@pytest.mark.parametrize("options, named", [
    (dict(num_beams=2), "num_beams"),
    (dict(num_return_sequences=2, do_sample=True), "num_return_sequences"),
    (dict(do_sample=True, typical_p=0.5), "typical_p"),
    (dict(do_sample=True, epsilon_cutoff=0.01), "epsilon_cutoff"),
    (dict(prompt_lookup_num_tokens=3), "prompt_lookup_num_tokens"),
    (dict(return_dict_in_generate=True, output_scores=True), "output_scores"),
    (dict(return_dict_in_generate=True, output_logits=True), "output_logits"),
    (dict(pure_logits_processors="yes"), "pure_logits_processors"),
    (dict(drafter="no-such-drafter"), "drafter"),
])
def test_options_it_cannot_honour_are_refused_by_name(tiny, options, named):
    model, _ = tiny
    with pytest.raises(ConfigError, match=named):
        model.generate(ids(PROMPTS[0]), custom_generate=speculative_generate, max_new_tokens=5, **options)


def test_batches_and_padding_are_refused(tiny):
    model, _ = tiny
    with pytest.raises(ConfigError, match="input_ids: shape"):
        model.generate(torch.tensor([PROMPTS[1], PROMPTS[1]]), custom_generate=speculative_generate, max_new_tokens=5)
    mask = torch.ones(1, len(PROMPTS[1]), dtype=torch.long)
    mask[0, 0] = 0
    with pytest.raises(ConfigError, match="attention_mask"):
        model.generate(ids(PROMPTS[1]), attention_mask=mask, custom_generate=speculative_generate, max_new_tokens=5)


def test_concurrent_calls_get_their_own_verifier_and_equal_plain(tiny):
    model, _ = tiny
    wants = [model.generate(ids(p), max_new_tokens=32, do_sample=False) for p in PROMPTS]
    results, errors = {}, []

    def run(i):
        try:
            for _ in range(3):
                results[i] = model.generate(ids(PROMPTS[i]), custom_generate=speculative_generate, max_new_tokens=32,
                                            do_sample=False)
                assert torch.equal(results[i], wants[i])
        except BaseException as exc:   # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    pool = verifier_pool.pool_of(model)
    with pool.verifier(), pool.verifier(), pool.verifier(), pool.verifier():   # every verifier held
        with pytest.raises(BusyError, match="generate\\(\\) calls on this LlamaForCausalLM are running"):
            model.generate(ids(PROMPTS[0]), custom_generate=speculative_generate, max_new_tokens=5)


def test_each_call_gets_the_idle_verifier_holding_most_of_its_prompt(tiny):
    """Two conversations interleaved on one model: each generate() call is served by the pool's
    verifier whose cache holds its conversation, so its prefill runs only the new message."""
    model, _ = tiny
    pool = verifier_pool.pool_of(model)
    rng = np.random.default_rng(3)
    a, b = ([0] + rng.integers(2, 512, 60).tolist() for _ in range(2))
    with pool.verifier() as va, pool.verifier() as vb:     # two verifiers, neither holding a or b
        va.prefill(np.asarray(a, np.int32))
        vb.prefill(np.asarray(b, np.int32))
    for conversation, holder in ((b, vb), (a, va), (b, vb)):
        prompt = conversation + [5, 6, 7]
        want = model.generate(ids(prompt), max_new_tokens=16, do_sample=False)
        got = model.generate(ids(prompt), custom_generate=speculative_generate, max_new_tokens=16, do_sample=False)
        assert torch.equal(got, want)
        assert holder.prefix_reused >= len(conversation), (holder.prefix_reused, len(conversation))
        conversation += [5, 6, 7] + got[0, len(prompt):].tolist()[:-1]


# -- sampling: the distribution of plain sampling -------------------------------------------------------
SAMPLE_PROMPT = [0, 300, 301, 302, 300, 301]
LENGTH = 3
N_SAMPLES = 1200


def exact_probs(model) -> dict:
    out = {}

    def expand(prefix, prob):
        if len(prefix) == LENGTH:
            out[tuple(prefix)] = prob
            return
        tokens = SAMPLE_PROMPT + prefix
        with torch.no_grad():
            logits = model(ids(tokens)).logits[0, -1].float().numpy()
        p = naive_probs(naive_process(logits, tokens, len(SAMPLE_PROMPT), temperature=0.8, top_k=3))
        for token in np.flatnonzero(p > 0):
            expand(prefix + [int(token)], prob * float(p[token]))

    expand([], 1.0)
    return out


def sample_fit(model):
    drafter = TrieDrafter()
    counts = {}
    for seed in range(N_SAMPLES):
        torch.manual_seed(seed)
        out = model.generate(ids(SAMPLE_PROMPT), custom_generate=speculative_generate, max_new_tokens=LENGTH,
                             do_sample=True, temperature=0.8, top_k=3, drafter=drafter, budget=6)
        key = tuple(out[0, len(SAMPLE_PROMPT):].tolist())
        counts[key] = counts.get(key, 0) + 1
    return goodness_of_fit(counts, exact_probs(model))


def test_sampling_follows_plain_sampling(tiny):
    model, _ = tiny
    p, stat, df = sample_fit(model)
    assert p > 1e-3, (p, stat, df)


def test_torch_manual_seed_replays_a_sampled_call(tiny):
    """torch.manual_seed replays a drop-in call as it replays plain generate(): the same seed gives
    the same tokens over repeated calls with the model's default (learning) drafter and auto budget,
    and with budget=0; another seed gives another sample."""
    model, _ = tiny
    prompt = ids(SAMPLE_PROMPT * 4)
    options = dict(custom_generate=speculative_generate, max_new_tokens=40, do_sample=True, top_k=20, top_p=0.9,
                   temperature=0.8)

    def run(seed, **extra):
        torch.manual_seed(seed)
        return model.generate(prompt, **options, **extra)

    try:
        first = run(123)
        for _ in range(3):
            assert torch.equal(run(123), first)
        assert torch.equal(run(123, budget=0), first) and torch.equal(run(123, budget=8), first)
        assert not torch.equal(run(124), first)
    finally:
        release(model)


def test_a_planted_wrong_rule_is_caught(tiny, monkeypatch):
    def planted(tokens, parents, n_walk, u, p, uniform):
        return naive_sample_step(tokens, parents, n_walk, u, p, uniform, "child_coins")

    monkeypatch.setattr(draftcore.acceptance, "sample_step", planted)
    p, stat, df = sample_fit(tiny[0])
    assert p < 1e-6, (p, stat, df)


# -- SmolLM2 fp32: real prompts through generate() -----------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["humaneval", "mtbench"])
def test_smollm2_drop_in_equals_generate(smollm2, dataset):
    from draftcore.tools.backends.hf import load_prompts
    from test_hf_verifier import assert_same_greedy

    model, tokenizer, verifier = smollm2
    model.generate(ids([1, 2, 3]), custom_generate=speculative_generate, max_new_tokens=1)   # builds the verifier
    counter = ForwardCounter(model)
    steps = tokens = 0
    try:
        for prompt in load_prompts(tokenizer, dataset, 4):
            options = dict(max_new_tokens=48, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.eos_token_id)
            want = model.generate(ids(list(prompt.ids)), **options)[0, len(prompt.ids):].numpy()
            counter.calls = 0
            # A fixed budget: the auto budget may rightly decline to draft on MT-Bench on a machine where
            # trees cost more, and then the equality would prove nothing about drafts.
            got = model.generate(ids(list(prompt.ids)), custom_generate=speculative_generate, budget=8, **options)
            got = got[0, len(prompt.ids):].numpy()
            steps, tokens = steps + counter.calls, tokens + len(got)
            assert_same_greedy(verifier, prompt.ids, got, want, 1e-3)
    finally:
        counter.handle.remove()
        release(model)
    assert steps < tokens   # drafts were accepted: the equality above proved something
