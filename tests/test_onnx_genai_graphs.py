"""onnxruntime-genai builds of the tiny random Llama (made offline by its model builder): chain mode
with one KV buffer bound as past and present, and the build rewired for tree mode (rewire.py).
Each is checked against the copying path / the original graph, and each self-check is shown to catch
a planted fault. Skipped, saying so, when onnxruntime, onnx or onnxruntime-genai is missing."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'draftcore[onnx]')")
onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'draftcore[onnx]')")
pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (draftcore[onnx-genai])")
pytest.importorskip("torch")

import draftcore  # noqa: E402
from draftcore.adapters.onnx import OrtVerifier, kv, rewire  # noqa: E402
from draftcore.errors import BackendError, ConfigError  # noqa: E402
from draftcore.selfcheck import plain_decoding_logits  # noqa: E402
from draftcore.tree import DraftTree  # noqa: E402

from onnx_fixtures import genai_folder, gqa_tree_folder, plain_greedy, save_tiny_llama  # noqa: E402

CPU = ["CPUExecutionProvider"]
PROMPTS = [[1, 200, 201, 202, 203, 200, 201, 202], [1, 17, 42, 99, 17, 42], [1] + list(range(100, 120))]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    hf = tmp_path_factory.mktemp("hf")
    save_tiny_llama(hf, seed=0, vocab_size=512)
    cache = tmp_path_factory.mktemp("cache")
    return hf, genai_folder(hf, cache), gqa_tree_folder(hf, cache)


# ------------------------------------------------------------------ one buffer as past and present

def test_a_genai_folder_shares_its_buffer_and_decodes_as_the_copying_path(folders):
    _, genai, _ = folders
    shared, copying = OrtVerifier(genai, providers=CPU), OrtVerifier(genai, providers=CPU, share_buffer=False)
    assert shared.shares_buffer and not copying.shares_buffer
    for prompt in PROMPTS:
        np.testing.assert_array_equal(plain_greedy(shared, prompt, 24), plain_greedy(copying, prompt, 24))


def test_a_shared_buffer_keeps_a_prefix_in_place_and_equals_the_copying_path(folders):
    """A follow-up prompt (the conversation so far plus a message) keeps the buffer's rows of the
    shared prefix where they are and runs only the rest; its logits and the greedy tokens after it
    are the copying path's without reuse."""
    _, genai, _ = folders
    shared = OrtVerifier(genai, providers=CPU)
    copying = OrtVerifier(genai, providers=CPU, share_buffer=False, reuse_prefix=False)
    prompt = np.asarray(PROMPTS[2], np.int32)
    first = plain_greedy(shared, prompt, 12)       # leaves the prompt and 11 committed tokens cached
    follow_up = np.r_[prompt, first[:11], 300, 301, 302, 303].astype(np.int32)
    logits = shared.prefill(follow_up, 1)[1]
    assert shared.prefix_reused == len(prompt) + 11
    np.testing.assert_allclose(logits, copying.prefill(follow_up, 1)[1], atol=1e-4, rtol=0)
    np.testing.assert_array_equal(plain_greedy(shared, follow_up, 24), plain_greedy(copying, follow_up, 24))


@pytest.mark.parametrize("drafter", ["trie", "composite"])
def test_speculation_over_a_shared_buffer_equals_plain_greedy(folders, drafter):
    _, genai, _ = folders
    verifier, accepted = OrtVerifier(genai, providers=CPU), 0
    for prompt in PROMPTS:
        want = plain_greedy(OrtVerifier(genai, providers=CPU, share_buffer=False), prompt, 40)
        result = draftcore.speculate(verifier, np.asarray(prompt, np.int32), max_new_tokens=40, drafter=drafter,
                                     budget=6)
        np.testing.assert_array_equal(result.tokens, want)
        accepted += sum(k * c for k, c in enumerate(result.stats.accepted_hist))
    assert accepted > 0   # partial commits happened on the buffer, not only one-token steps


def test_genais_fp16_cuda_build_runs_chain_mode_equal_to_its_own_plain_greedy(folders, tmp_path):
    """The build the GPU check's chain section runs on CUDA (genai makes fp16 for that device; its fp32
    CUDA build leaves present.N.key produced by no node): made here, run on the CPU EP, with fp16 KV
    in one shared buffer."""
    from draftcore.adapters.onnx.builds import genai_build
    hf, _, _ = folders
    build = genai_build(hf, "float16", execution_provider="cuda", cache_dir=tmp_path)
    verifier = OrtVerifier(build, providers=CPU)
    assert verifier.mode == "chain" and verifier.interface.kv_dtype == np.float16 and verifier.shares_buffer
    for prompt in PROMPTS:
        want = plain_greedy(OrtVerifier(build, providers=CPU, share_buffer=False), prompt, 32)
        result = draftcore.speculate(verifier, np.asarray(prompt, np.int32), max_new_tokens=32, budget=6)
        np.testing.assert_array_equal(result.tokens, want)


def test_the_buffer_grows_past_its_first_size_keeping_its_rows(folders):
    """A 300-token prompt sizes the buffer to 364 rows; 120 more tokens make it grow (a Pad on the
    session's providers) with every row where it was."""
    _, genai, _ = folders
    prompt = [1] + [int(t) for t in np.random.default_rng(3).integers(2, 512, 299)]
    shared = OrtVerifier(genai, providers=CPU)
    tokens = plain_greedy(shared, prompt, 120)
    assert shared._shared.capacity > 364
    np.testing.assert_array_equal(tokens, plain_greedy(OrtVerifier(genai, providers=CPU, share_buffer=False),
                                                       prompt, 120))


@pytest.mark.parametrize("build", ["genai", "tree"])
def test_speculation_past_the_buffers_first_size_to_max_context_equals_plain_greedy(folders, build,
                                                                                    small_context_buffer):
    """A 300-token prompt makes the shared buffer's first allocation 364 rows (kv.SharedCache); 212
    new tokens grow it, up to max_context (512), where it stops, and fill the context to its last
    cell (speculate's own buffer, made 16 here, grows too). The rewired tree build, whose presents
    are new each run, runs the same request. Both equal the copying path's plain greedy."""
    _, genai, tree = folders
    block = np.random.default_rng(3).integers(2, 512, 37)
    prompt = np.r_[1, np.tile(block, 10)[:299]].astype(np.int32)
    verifier = OrtVerifier(genai if build == "genai" else tree, providers=CPU)
    n_new = verifier.max_context - prompt.shape[0]
    want = plain_greedy(OrtVerifier(genai, providers=CPU, share_buffer=False), prompt, n_new)
    result = draftcore.speculate(verifier, prompt, max_new_tokens=n_new, budget=8)
    np.testing.assert_array_equal(result.tokens, want)
    assert result.stats.tokens_per_step > 1.0 and small_context_buffer
    if build == "genai":
        assert verifier.shares_buffer and verifier._shared.capacity == verifier.max_context == 512


def test_the_self_check_catches_layers_that_share_one_buffer(folders, monkeypatch):
    """Planted fault: every layer's buffer is the same memory (what wrapping one numpy array in
    every OrtValue does on the CPU EP). The construction check must refuse it."""
    _, genai, _ = folders
    real = kv.SharedCache.reserve

    def aliased(self, length):
        real(self, length)
        self.values = [self.values[0]] * len(self.values)

    monkeypatch.setattr(kv.SharedCache, "reserve", aliased)
    with pytest.raises(BackendError, match="one KV buffer as past and present"):
        OrtVerifier(genai, providers=CPU)


def test_share_buffer_is_refused_where_it_cannot_hold(folders):
    _, genai, tree = folders
    with pytest.raises(ConfigError, match="share_buffer: True needs a chain-mode graph"):
        OrtVerifier(tree, providers=CPU, share_buffer=True)
    with pytest.raises(ConfigError, match="share_buffer: expected True, False or None, got 'yes'"):
        OrtVerifier(genai, providers=CPU, share_buffer="yes")


# ------------------------------------------------------------------ the genai build rewired for trees

def test_the_rewired_build_is_tree_mode_with_the_original_kernels(folders):
    _, genai, tree = folders
    verifier = OrtVerifier(tree, providers=CPU)   # its self-check ran a branching tree
    assert verifier.mode == "tree" and verifier.interface.has_argmax
    graph = onnx.load(str(tree / "model.onnx"), load_external_data=False).graph
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert attention and all(n.input[9] == "position_ids" and n.input[10] == "attention_mask" for n in attention)


def test_rewired_tree_logits_equal_each_branch_decoded_by_the_original(folders):
    """Every node of a branching tree gets the logits the original genai model gives its path,
    decoded one token at a time (chain mode, copying path)."""
    _, genai, tree = folders
    rewired = OrtVerifier(tree, providers=CPU)
    original = OrtVerifier(genai, providers=CPU, share_buffer=False)
    prompt = np.array([1, 17, 42, 99, 17], np.int32)
    branching = DraftTree.build([5, 6, 7, 8, 9, 10], [-1, 0, 1, 1, 0, 4])
    rewired.prefill(prompt)
    _, logits = rewired.verify(branching, len(branching))
    for node in range(len(branching)):
        path = branching.path_tokens(node)
        want = plain_decoding_logits(original, prompt, path)[-1]
        np.testing.assert_allclose(logits[node], want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("drafter", ["trie", "composite", "jacobi"])
def test_tree_speculation_on_the_rewired_build_equals_the_original_plain_greedy(folders, drafter):
    _, genai, tree = folders
    verifier = OrtVerifier(tree, providers=CPU)
    for prompt in PROMPTS:
        want = plain_greedy(OrtVerifier(genai, providers=CPU, share_buffer=False), prompt, 40)
        result = draftcore.speculate(verifier, np.asarray(prompt, np.int32), max_new_tokens=40, drafter=drafter,
                                     budget=8)
        np.testing.assert_array_equal(result.tokens, want)


def test_a_rewiring_without_the_tree_mask_is_caught(folders, tmp_path, monkeypatch):
    """Planted fault: positions wired, the tree mask not (every node sees its earlier siblings).
    tree_from_genai's check refuses it and keeps nothing."""
    _, genai, _ = folders
    real = rewire._rewire

    def without_bias(model, **sizes):
        real(model, **sizes)
        for node in model.graph.node:
            if node.op_type == "GroupQueryAttention":
                node.input[10] = ""

    monkeypatch.setattr(rewire, "_rewire", without_bias)
    with pytest.raises(BackendError, match="tree-masked logits disagree"):
        rewire.tree_from_genai(genai, tmp_path / "bad")
    assert not (tmp_path / "bad" / "model.onnx").exists()


def test_folders_and_graphs_the_rewiring_does_not_fit_are_refused(folders, tmp_path):
    hf, genai, tree = folders
    with pytest.raises(ConfigError, match="has no genai_config.json"):
        rewire.tree_from_genai(hf, tmp_path / "a")
    import json
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)   # a tree-mode graph: 4-D mask, position_ids already there
    (copy / "genai_config.json").write_text((genai / "genai_config.json").read_text())
    with pytest.raises(ConfigError, match="no 2-D attention_mask input"):
        rewire.tree_from_genai(copy, tmp_path / "b")
    config = json.loads((genai / "genai_config.json").read_text())
    config["model"]["decoder"]["head_size"] = 0
    odd = tmp_path / "odd"
    shutil.copytree(genai, odd)
    (odd / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="head_size=0, expected a positive integer"):
        rewire.tree_from_genai(odd, tmp_path / "c")


def test_the_export_command_rewires_a_genai_build(folders, tmp_path, capsys):
    from draftcore.adapters.onnx.__main__ import main

    hf, genai, _ = folders
    assert main(["--from-genai", str(genai), str(tmp_path / "tree")]) == 0
    assert "checked against the original genai model" in capsys.readouterr().out
    assert OrtVerifier(tmp_path / "tree", providers=CPU).mode == "tree"
    assert main(["--from-genai", str(hf), str(tmp_path / "no")]) == 2
    assert "has no genai_config.json" in capsys.readouterr().err
