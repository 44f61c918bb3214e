"""ONNX Runtime backend (CPU EP): draftcore's export of the tiny random Llama, tree verify against
PyTorch, greedy speculation against ORT's own plain greedy, chain mode on a 2-D-mask graph, and the
refusals of bad input. Skipped, saying so, when onnxruntime or onnx is not installed."""
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'draftcore[onnx]')")
pytest.importorskip("onnx", reason="onnx is not installed (pip install 'draftcore[onnx]')")
torch = pytest.importorskip("torch")

import draftcore  # noqa: E402
from draftcore.adapters.onnx import OrtVerifier, export  # noqa: E402
from draftcore.adapters.onnx.export import legacy_exporter  # noqa: E402
from draftcore.errors import ConfigError, InputError  # noqa: E402
from draftcore.tree import DraftTree  # noqa: E402

from onnx_fixtures import plain_greedy  # noqa: E402
from fixtures.tiny_llama import tiny_llama  # noqa: E402

CPU = ["CPUExecutionProvider"]
NEAR_TIE = 1e-3
PROMPTS = [[1, 200, 201, 202, 203, 200, 201, 202], [1, 17, 42, 99, 17, 42], [1] + list(range(100, 120))]


@pytest.fixture(scope="module")
def model():
    """The tiny random Llama with room for 2,048 positions (the export records max_position_embeddings
    as its max_context; the weights are those of the default 512)."""
    return tiny_llama(seed=0, max_position=2048)


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    return export(model, tmp_path_factory.mktemp("onnx"))


@pytest.fixture(scope="module")
def verifier(exported):
    return OrtVerifier(exported, providers=CPU)


def torch_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0].numpy()


def test_the_export_is_tree_mode_and_records_its_context(verifier, model):
    assert verifier.mode == "tree" and verifier.max_tree_leaves is None
    assert not model.training   # the exporter leaves the caller's model as it was
    assert verifier.max_context == model.config.max_position_embeddings
    assert verifier.vocab_size == model.config.vocab_size and verifier.interface.has_argmax


def test_tree_logits_equal_each_branch_run_alone(verifier, model):
    rng = np.random.default_rng(5)
    prompt = rng.integers(2, 256, 9).astype(np.int32)
    parents = [-1, 0, 1, 2, 0, 4, 1, 6, 6, 0]
    tree = DraftTree.build(rng.integers(2, 256, len(parents)).astype(np.int32), parents)
    verifier.prefill(prompt)
    tokens, logits = verifier.verify(tree, len(tree))
    assert np.array_equal(tokens, logits.argmax(axis=1))
    for node in range(len(tree)):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        want = torch_logits(model, list(prompt) + [int(tree.tokens[i]) for i in reversed(path)])[-1]
        assert np.abs(logits[node] - want).max() < 1e-4 * max(1.0, np.abs(want).max()), node


def test_commit_of_a_branch_keeps_that_branch(verifier, model):
    prompt = np.array([1, 5, 6, 7], np.int32)
    tree = DraftTree.build([9, 10, 11, 12, 13], [-1, 0, 1, 0, 3])
    verifier.prefill(prompt)
    verifier.verify(tree)
    verifier.commit(np.array([0, 3, 4], np.int32))
    assert verifier.n_past == 7
    _, after = verifier.verify(DraftTree.root_only(20), 1)
    want = torch_logits(model, [1, 5, 6, 7, 9, 12, 13, 20])[-1]
    assert np.abs(after[0] - want).max() < 1e-4 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("drafter", ["trie", "composite"])
def test_speculative_greedy_equals_ort_plain_greedy(verifier, drafter):
    for prompt in PROMPTS:
        want = plain_greedy(verifier, prompt, 60)
        result = draftcore.speculate(verifier, np.asarray(prompt, np.int32), max_new_tokens=60, drafter=drafter,
                                     budget=16)
        assert np.array_equal(result.tokens, want), (drafter, prompt)
    assert result.stats.tokens_per_step > 1.0


def test_a_request_longer_than_the_fixed_sizes_equals_ort_plain_greedy(verifier, small_context_buffer):
    """A 700-token prompt, past the default 512 positions, in one run, and 150 new tokens past the
    first size of speculate's context buffer (made 16 here): the output is ORT's own plain greedy."""
    prompt = np.r_[1, np.random.default_rng(3).integers(2, 256, 699)].astype(np.int32)
    want = plain_greedy(verifier, prompt, 150)
    result = draftcore.speculate(verifier, prompt, max_new_tokens=150, budget=16)
    np.testing.assert_array_equal(result.tokens, want)
    assert result.stats.tokens_per_step > 1.0 and small_context_buffer


def test_chain_mode_on_a_2d_mask_graph(model, tmp_path):
    """A standard decoder graph (2-D attention mask, no argmax output): chain mode, trees cut to one
    branch by the loop, the same greedy output as its own plain decoding."""
    path = export_2d_mask_graph(model, tmp_path)
    chain = OrtVerifier(path, providers=CPU, max_context=512)
    assert chain.mode == "chain" and chain.max_tree_leaves == 1 and not chain.interface.has_argmax
    with pytest.raises(InputError, match="chain mode"):
        chain.prefill(np.array([1, 2], np.int32))
        chain.verify(DraftTree.build([3, 4, 5], [-1, 0, 0]))
    for prompt in PROMPTS:
        want = plain_greedy(chain, prompt, 40)
        result = draftcore.speculate(chain, np.asarray(prompt, np.int32), max_new_tokens=40, budget=8)
        assert np.array_equal(result.tokens, want)


def export_2d_mask_graph(model, folder):
    """The tiny Llama traced with a 2-D mask and optimum's input/output names (no argmax)."""
    from transformers import DynamicCache

    from draftcore.adapters.torch_hf.kv_cache import cache_keyword, returned_cache

    n_layers, kv, hd = model.config.num_hidden_layers, model.config.num_key_value_heads, 16
    keyword = cache_keyword(model)

    class Standard(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache()
            for i in range(n_layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True, **{keyword: cache})
            return (out.logits, *[t for layer in returned_cache(out).layers for t in (layer.keys, layer.values)])

    past = [f"past_key_values.{i}.{k}" for i in range(n_layers) for k in ("key", "value")]
    present = [f"present.{i}.{k}" for i in range(n_layers) for k in ("key", "value")]
    example = (torch.zeros((1, 3), dtype=torch.long), torch.ones((1, 5), dtype=torch.long),
               torch.arange(2, 5)[None], *[torch.zeros((1, kv, 2, hd)) for _ in past])
    dynamic = {"input_ids": {1: "q"}, "attention_mask": {1: "total"}, "position_ids": {1: "q"}, "logits": {1: "q"}}
    dynamic.update({n: {2: "past"} for n in past})
    dynamic.update({n: {2: "total"} for n in present})
    path = folder / "model.onnx"
    with torch.no_grad(), legacy_exporter():
        torch.onnx.export(Standard().eval(), example, str(path), input_names=["input_ids", "attention_mask", "position_ids",
                                                                       *past],
                          output_names=["logits", *present], dynamic_axes=dynamic, opset_version=17, dynamo=False)
    return path


def test_the_self_check_allows_tf32_only_where_the_cuda_ep_runs_it(verifier):
    """The CUDA EP's float32 matmuls run in TF32 by default (on an H200 a correct branch came out
    1.2e-3 off); the check keeps its float32 bound on the CPU EP and where `use_tf32` is "0"."""
    from draftcore.adapters.onnx.verifier import self_check_tolerance

    class Session:   # what get_provider_options() returns for a CUDA EP session
        def __init__(self, **cuda):
            self.cuda = {"device_id": "0", **cuda}

        def get_provider_options(self):
            return {"CUDAExecutionProvider": self.cuda, "CPUExecutionProvider": {}}

    cpu = self_check_tolerance(verifier._session, np.float32)
    assert cpu == 1e-3
    assert self_check_tolerance(Session(use_tf32="1"), np.float32) == 1e-2
    assert self_check_tolerance(Session(), np.float32) == 1e-2
    assert self_check_tolerance(Session(use_tf32="0"), np.float32) == cpu
    assert self_check_tolerance(Session(use_tf32="1"), np.float16) == 3e-2   # TF32 touches float32 only


# ------------------------------------------------------------------ bad input


def test_providers_must_be_explicit_and_installed(exported):
    with pytest.raises(ConfigError, match="providers: expected an explicit list"):
        OrtVerifier(exported)
    with pytest.raises(ConfigError, match="'NoSuchExecutionProvider' is not available"):
        OrtVerifier(exported, providers=["NoSuchExecutionProvider"])
    with pytest.raises(ConfigError, match="providers: expected a non-empty list"):
        OrtVerifier(exported, providers="CPUExecutionProvider")


def test_a_graph_without_decoder_inputs_is_refused_listing_what_it_has(tmp_path):
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["logits"])], "g",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "q"])],
                              [helper.make_tensor_value_info("logits", TensorProto.INT64, [1, "q"])])
    path = tmp_path / "model.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(ConfigError, match=r"input_ids\[1, 'q'\]"):
        OrtVerifier(path, providers=CPU)


def test_a_missing_file_and_a_wrong_model_type_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="model: .* does not exist"):
        OrtVerifier(tmp_path / "nothing.onnx", providers=CPU)
    with pytest.raises(ConfigError, match="model: expected an onnxruntime.InferenceSession"):
        OrtVerifier(42, providers=CPU)


def test_prompt_over_max_context_is_refused_and_changes_nothing(exported):
    small = OrtVerifier(exported, providers=CPU, max_context=16, self_check=False)
    small.prefill(np.array([1, 2, 3], np.int32))
    with pytest.raises(InputError, match="prompt: 17 tokens exceed max_context 16"):
        small.prefill(np.arange(17, dtype=np.int32))
    assert small.n_past == 3
    with pytest.raises(InputError, match="max_new_tokens: .* exceeds the verifier's max_context 16"):
        draftcore.speculate(small, np.arange(10, dtype=np.int32), max_new_tokens=10)


def test_an_export_dtype_that_does_not_match_the_model_is_refused(model, tmp_path):
    with pytest.raises(ConfigError, match="dtype: 'float16' asked for, but the model is float32"):
        export(model, tmp_path, dtype="float16")
    with pytest.raises(ConfigError, match="dtype: expected None or one of"):
        export(model, tmp_path, dtype="int8")


def test_verify_before_prefill_and_commit_twice_are_refused(exported):
    fresh = OrtVerifier(exported, providers=CPU, self_check=False)
    with pytest.raises(InputError, match="before prefill"):
        fresh.verify(DraftTree.root_only(3))
    fresh.prefill(np.array([1, 2], np.int32))
    fresh.verify(DraftTree.root_only(3))
    fresh.commit(np.array([0], np.int32))
    with pytest.raises(InputError, match="commit\\(\\) needs a verified tree"):
        fresh.commit(np.array([0], np.int32))


def test_a_verifier_used_from_two_threads_is_refused_not_corrupted(exported):
    import threading

    from draftcore.errors import BusyError

    shared = OrtVerifier(exported, providers=CPU, self_check=False)
    prompt = np.asarray(PROMPTS[0], np.int32)
    want = plain_greedy(OrtVerifier(exported, providers=CPU, self_check=False), prompt, 40)
    barrier = threading.Barrier(2)
    for _ in range(3):
        outcomes = []

        def work():
            barrier.wait()
            try:
                outcomes.append(draftcore.speculate(shared, prompt, max_new_tokens=40, budget=4).tokens)
            except BusyError as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=work) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(outcomes) == 2 and any(not isinstance(o, BusyError) for o in outcomes)
        for outcome in outcomes:   # each either exact or refused, never a wrong output
            if not isinstance(outcome, BusyError):
                np.testing.assert_array_equal(outcome, want)


def test_a_genai_graph_with_a_symbolic_head_size_needs_its_config(tmp_path):
    """onnxruntime-genai's graphs leave the head size symbolic ('kv_cache_dim'): it is read from
    genai_config.json, and a copy of model.onnx without its folder's configs is refused by name."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (draftcore[onnx-genai])")
    import shutil

    from onnx_fixtures import genai_folder, save_tiny_llama

    save_tiny_llama(tmp_path / "hf", seed=0, vocab_size=512)
    folder = genai_folder(tmp_path / "hf", tmp_path / "cache")
    verifier = OrtVerifier(folder, providers=CPU)
    assert verifier.mode == "chain" and verifier.interface.head_dim is None
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copy(folder / name, alone / name)
    with pytest.raises(ConfigError, match="symbolic head dimension"):
        OrtVerifier(alone / "model.onnx", providers=CPU, max_context=64)


def test_a_prefill_keeps_the_prefix_shared_with_the_cache_and_equals_a_fresh_one(exported, model):
    """reuse_prefix (default): the next prompt's prefix shared with the committed tokens (prompt,
    then accepted paths) keeps its KV, only the rest runs, and the logits are a fresh prefill's; a
    prompt that differs at once, or reuse_prefix=False, keeps nothing."""
    verifier, fresh = OrtVerifier(exported, providers=CPU), OrtVerifier(exported, providers=CPU, reuse_prefix=False)
    rng = np.random.default_rng(4)
    first = rng.integers(2, 256, 60).astype(np.int32)
    verifier.prefill(first)
    assert verifier.prefix_reused == 0
    tree = DraftTree.build(rng.integers(2, 256, 5), [-1, 0, 1, 0, 3])
    verifier.verify(tree)
    verifier.commit(np.array([0, 3, 4], np.int32))          # a branch: gathered, in path order
    committed = np.r_[first, tree.tokens[[0, 3, 4]]].astype(np.int32)
    prompt = np.r_[committed, rng.integers(2, 256, 90)].astype(np.int32)   # a rest longer than the prefix
    assert verifier.cached_prefix(prompt) == len(committed) and verifier.n_past == len(committed)
    runs = verifier.runs
    tokens, logits = verifier.prefill(prompt, 1)
    assert verifier.prefix_reused == len(committed) and verifier.n_past == len(prompt) and verifier.runs == runs + 1
    want_tokens, want = fresh.prefill(prompt, 1)
    assert fresh.prefix_reused == 0
    np.testing.assert_allclose(logits, want, atol=1e-5, rtol=0)
    assert tokens[0] == want_tokens[0]
    np.testing.assert_allclose(logits[0], torch_logits(model, prompt)[-1], atol=1e-4, rtol=0)
    after = DraftTree.build(rng.integers(2, 256, 4), [-1, 0, 0, 2])   # trees after it see the new prompt
    np.testing.assert_allclose(verifier.verify(after, 4)[1], fresh.verify(after, 4)[1], atol=1e-5, rtol=0)
    verifier.prefill(np.r_[(prompt[0] + 1) % 256, prompt[1:]].astype(np.int32))
    assert verifier.prefix_reused == 0
    with pytest.raises(ConfigError, match="reuse_prefix: expected True or False, got 'yes'"):
        OrtVerifier(exported, providers=CPU, self_check=False, reuse_prefix="yes")


def test_self_check_and_tokenizer_are_checked_at_construction(exported, monkeypatch):
    """bool("no") is True: a coerced self_check="no" would run the check; a tokenizer without
    encode and decode would fail later, in speculate, as an AttributeError."""
    monkeypatch.setattr(OrtVerifier, "_self_check", lambda self: pytest.fail("the self-check ran"))
    with pytest.raises(ConfigError, match="self_check: expected True or False, got 'no'"):
        OrtVerifier(exported, providers=CPU, self_check="no")
    with pytest.raises(ConfigError, match=r"tokenizer: expected None or a tokenizer with encode\(text\) and "
                                          r"decode\(ids\).*got 5"):
        OrtVerifier(exported, providers=CPU, self_check=False, tokenizer=5)


def test_a_failed_reused_prefill_leaves_an_empty_verifier(exported, monkeypatch):
    verifier = OrtVerifier(exported, providers=CPU)
    prompt = np.arange(2, 40, dtype=np.int32)
    verifier.prefill(prompt)

    def fail(*args, **kwargs):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(verifier, "_forward", fail)
    with pytest.raises(RuntimeError, match="planted failure"):
        verifier.prefill(np.r_[prompt, 5].astype(np.int32))
    monkeypatch.undo()
    assert verifier.n_past == 0 and verifier.prefix_reused == 0 and verifier.cached_prefix(np.r_[prompt, 5]) == 0
    with pytest.raises(InputError, match="before prefill"):
        verifier.verify(DraftTree.root_only(3))


def test_chain_mode_keeps_a_shared_prefix_too(model, tmp_path):
    """A 2-D-mask graph runs the rest behind kept positions under its causal mask: the same logits
    as a fresh prefill, and speculation after it equals plain decoding."""
    path = export_2d_mask_graph(model, tmp_path)
    chain = OrtVerifier(path, providers=CPU, max_context=512)
    fresh = OrtVerifier(path, providers=CPU, max_context=512, reuse_prefix=False)
    prompt = np.asarray(PROMPTS[2], np.int32)
    want = plain_greedy(fresh, prompt, 30)
    chain.prefill(prompt)
    follow_up = np.r_[prompt, want[:10], 7, 8, 9].astype(np.int32)
    chain.verify(DraftTree.chain(int(want[0]), want[1:10]))
    chain.commit(np.arange(10, dtype=np.int32))
    logits = chain.prefill(follow_up, 1)[1]
    assert chain.prefix_reused == len(prompt) + 10
    np.testing.assert_allclose(logits, fresh.prefill(follow_up, 1)[1], atol=1e-5, rtol=0)
