"""llama.cpp backend: tree verify, commit and the chain fallback, on an exact float32 fixture.

The fixture is a tiny random Llama held twice with the same weights: in HF (fp32) and in llama.cpp
(F32 GGUF written by draftcore/tools/fixtures/gguf_writer.py, f32 KV cache, no flash attention). A multi-token forward
never gives bit-identical logits to single-token ones (docs/design.md, "Numerics"), so logits are
compared with a tolerance, and greedy tokens token for token except that a first difference is
allowed where the reference's top-2 logit gap is below NEAR_TIE (there two correct forwards may pick
different tokens; the comparison ends there).
"""
import subprocess
import sys
import warnings

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from draftcore.adapters.llamacpp import ChainOnlyWarning, InexactBatchWarning, LlamaCppVerifier  # noqa: E402
from draftcore.adapters.llamacpp import batch as batch_module  # noqa: E402
from draftcore.adapters.llamacpp import branches  # noqa: E402
from draftcore.adapters.llamacpp import verifier as verifier_module  # noqa: E402
from draftcore.adapters.llamacpp.numerics import default_max_tree_nodes  # noqa: E402
from draftcore.checks import MISSING  # noqa: E402
from draftcore.errors import BackendError, ConfigError, DraftcoreError, InputError  # noqa: E402
from draftcore.tree import DraftTree  # noqa: E402

VOCAB = 512
ATOL = 1e-4        # logits: llama.cpp F32 vs a differently batched forward (measured ~1e-6)
NEAR_TIE = 1e-3    # greedy: a top-2 gap below this may flip between two exact-in-f32 forwards
F32 = llama_cpp.GGML_TYPE_F32
# One thread: llama.cpp's worker threads spin at barriers, and on a shared 2-core machine two of them
# next to any other process run this file 4x slower (measured: 60 s vs 16 s).
EXACT = dict(n_threads=1, type_k=F32, type_v=F32, flash_attn=False)

PROMPTS = [
    [1, 300, 301, 302, 303, 300, 301, 302],
    [1, 17, 42, 99, 256, 17, 42],
    [1] + list(range(400, 420)),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(path of the tiny F32 GGUF, the same model in HF: the fixtures' tiny_llama, vocabulary 512)."""
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fixtures.gguf_writer import write_tiny_llama_gguf
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    model = write_tiny_llama_gguf(path, seed=0, vocab_size=VOCAB)
    return path, model


@pytest.fixture(scope="module")
def verifier(tiny):
    return LlamaCppVerifier.from_gguf(tiny[0], n_ctx=512, n_seq_max=33, **EXACT)


@pytest.fixture(scope="module")
def reference(tiny):
    """A second context for fresh evaluations: `reference(tokens)` gives float32[T, vocab], the
    logits at every position; `reference.last(tokens)` those at the last one."""
    ref = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=512, reuse_prefix=False, **EXACT)

    def logits(tokens):
        tokens = np.asarray(tokens, np.int32)
        first = ref.prefill(tokens[:1], 1)[1]
        if len(tokens) == 1:
            return first
        return np.vstack([first, ref.verify(DraftTree.chain(int(tokens[1]), tokens[2:]), len(tokens) - 1)[1]])

    logits.last = lambda tokens: ref.prefill(np.asarray(tokens, np.int32), 1)[1][0]
    return logits


def random_tree(rng, root, n, branching=0.5):
    """A random tree of n nodes; a node's parent is the previous node with probability 1 - branching."""
    parents = [-1]
    for i in range(1, n):
        parents.append(i - 1 if rng.random() > branching else int(rng.integers(0, i)))
    tokens = [root] + rng.integers(3, VOCAB, n - 1).tolist()
    return DraftTree.build(tokens, parents)


def window_tree(root, levels, positions, *, lookahead_levels=0, first_token=3):
    """A 2-D window: `levels` chains of `positions` tokens under the root, the last
    `lookahead_levels` of them lookahead nodes. levels * positions + 1 nodes, `levels` leaves."""
    tokens, parents = [root], [-1]
    for _ in range(levels):
        for j in range(positions):
            parents.append(0 if j == 0 else len(tokens) - 1)
            tokens.append(first_token + len(tokens) % (VOCAB - first_token))
    return DraftTree.build(tokens, parents, n_lookahead=lookahead_levels * positions)


def random_path(rng, tree):
    """Root-to-node path of a random node (node indices are usually not contiguous)."""
    return np.array(branches.root_path(tree.parents, int(rng.integers(0, len(tree)))), np.int32)


def assert_committed_only(v, n_past):
    """Seq 0 holds positions 0 .. n_past - 1 and no other sequence has a cell."""
    mem = v._mem
    assert llama_cpp.llama_memory_seq_pos_min(mem, 0) == 0
    assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == n_past - 1
    for seq in range(1, v.limits.n_seq_max):
        assert llama_cpp.llama_memory_seq_pos_max(mem, seq) == -1, f"seq {seq} still has cells"


def plain_greedy(v, prompt, n_new):
    """The verifier's own plain greedy decoding: prefill, then one root-only verify per token.
    Returns (tokens, top-2 gap of the logits that chose each token)."""
    logits = v.prefill(np.asarray(prompt, np.int32), 1)[1][0]
    tokens, gaps = [], []
    for _ in range(n_new):
        top2 = np.sort(logits)[-2:]
        tokens.append(int(logits.argmax()))
        gaps.append(float(top2[1] - top2[0]))
        logits = v.verify(DraftTree.root_only(tokens[-1]), 1)[1][0]
        v.commit(np.array([0], np.int32))
    return tokens, gaps


def assert_same_greedy(got, want, gaps, what, tie=NEAR_TIE):
    """Equal token for token, except that a first mismatch at a near-tie ends the comparison."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            assert gaps[i] < tie, f"{what}: token {i} differs ({a} vs {b}), top-2 gap {gaps[i]:.3g}"
            warnings.warn(f"{what}: near-tie at token {i} (gap {gaps[i]:.2g}); compared {i} tokens")
            return
    assert len(got) == len(want), what


def greedy_path(tree, tokens):
    import draftcore.jit
    return draftcore.jit.kernels("draftcore.acceptance").greedy_accept(
        tree.tokens, tree.parents, tokens, tree.n_candidates)[0]


# ---------------------------------------------------------------- imports

def _modules_after(statement):
    code = f"import sys; {statement}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_llama_cpp_is_imported_before_numba():
    """A CUDA llama-cpp-python crashed where numba's LLVM was initialised first: the adapter loads
    llama_cpp before anything that may load numba, and `import draftcore` loads no numba at all."""
    modules = _modules_after("import draftcore.adapters.llamacpp")
    assert "llama_cpp" in modules
    assert "numba" not in modules or modules.index("llama_cpp") < modules.index("numba")
    assert "numba" not in _modules_after("import draftcore")


def test_numba_loaded_first_is_warned_about_on_gpu_builds():
    code = ("import warnings, numba, llama_cpp; llama_cpp.llama_supports_gpu_offload = lambda: True\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    import draftcore.adapters.llamacpp\n"
            "print([str(w.message) for w in seen if w.category is RuntimeWarning])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "SIGSEGV" in out and "before building any drafter" in out


def test_fixtures_are_not_part_of_the_adapter():
    import draftcore.adapters.llamacpp as adapter
    assert sorted(adapter.__all__) == ["AllLogitsCostWarning", "ChainOnlyWarning", "DraftcoreDraftModel",
                                     "InexactBatchWarning", "LlamaCppVerifier", "SpeculativeLlama",
                                     "speculative_llama"]
    assert not hasattr(adapter, "write_llama_gguf") and not hasattr(adapter, "write_tiny_llama_gguf")


# ---------------------------------------------------------------- GGUF fixture: HF == llama.cpp

@pytest.mark.parametrize("prompt", PROMPTS)
def test_hf_and_llamacpp_give_the_same_greedy_tokens(tiny, verifier, reference, prompt):
    import torch

    model = tiny[1]
    want, gaps = plain_greedy(verifier, prompt, 16)
    sequence = list(prompt) + want
    with torch.no_grad():
        hf = model(torch.tensor([sequence])).logits[0].numpy()
    got = hf[len(prompt) - 1:-1].argmax(axis=1).tolist()
    assert_same_greedy(got, want, gaps, "HF vs llama.cpp")
    np.testing.assert_allclose(reference(sequence), hf, atol=ATOL, rtol=0)


def test_tied_embeddings_round_trip(tmp_path):
    """What tiny_llama does not vary: tied embeddings (no output.weight), as many KV heads as heads,
    another rope_theta."""
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    import torch
    from fixtures.gguf_writer import write_llama_gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, initializer_range=0.1,
                         tie_word_embeddings=True, rope_theta=500.0, max_position_embeddings=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = LlamaForCausalLM(config).eval()
    write_llama_gguf(model, tmp_path / "tied.gguf")
    v = LlamaCppVerifier.from_gguf(tmp_path / "tied.gguf", n_ctx=64, **EXACT)
    ids = [1, 5, 250, 7, 9, 299]
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, -1].numpy()
    tokens, logits = v.prefill(np.array(ids, np.int32), 1)
    np.testing.assert_allclose(logits[0], want, atol=ATOL, rtol=0)
    assert tokens.dtype == np.int32 and tokens.tolist() == [int(logits[0].argmax())]


# ---------------------------------------------------------------- tree mode

def test_limits_are_the_contexts(verifier, tiny, stock_llama):
    # On a CPU trees stay within 63 nodes unless asked otherwise: batches of 64+ take other kernels.
    assert verifier.limits.n_batch == 512 and verifier.max_tree_nodes == 63   # not leaves + 1 either
    assert verifier.max_tree_leaves == 32 and not verifier.chain_only    # n_seq_max 33 - 1
    chain = LlamaCppVerifier.from_llama(stock_llama)
    assert chain.chain_only and chain.max_tree_leaves is None
    assert chain.max_tree_nodes == min(chain.limits.n_batch, 63)
    wide = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=128, n_seq_max=4, max_tree_nodes=128, **EXACT)
    assert wide.max_tree_nodes == 128 == wide.limits.n_batch             # asked for: n_batch (n_ctx 128) allows it
    wide.close()
    assert default_max_tree_nodes(512, offloaded=True) == 512 and default_max_tree_nodes(32, offloaded=False) == 32
    capped = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=128, n_seq_max=4, max_tree_nodes=63, **EXACT)
    assert capped.max_tree_nodes == 63 and capped.max_tree_leaves == 3
    capped.prefill(np.array(PROMPTS[0], np.int32))
    with pytest.raises(InputError, match="max_tree_nodes"):
        capped.verify(DraftTree.chain(5, np.arange(3, 66)))             # 64 nodes
    capped.close()
    with pytest.raises(ConfigError, match="max_tree_nodes"):
        LlamaCppVerifier.from_gguf(tiny[0], n_ctx=128, n_batch=32, max_tree_nodes=33, **EXACT)


def test_tree_logits_equal_per_branch_forwards(verifier, reference):
    rng = np.random.default_rng(0)
    prompt = np.array(PROMPTS[0], np.int32)
    for n, branching in [(2, 1.0), (5, 0.5), (9, 0.7), (16, 0.4), (24, 0.9)]:
        first = int(verifier.prefill(prompt)[0][0])
        tree = random_tree(rng, first, n, branching)
        before = verifier.n_decodes
        tokens, logits = verifier.verify(tree, n)
        assert verifier.n_decodes == before + 1, "one llama_decode per tree"
        assert logits.dtype == np.float32 and logits.shape == (n, VOCAB)
        np.testing.assert_array_equal(tokens, logits.argmax(axis=1))
        again, none = verifier.verify(tree)   # a second verify replaces the first
        assert again.dtype == np.int32 and none.shape == (0, VOCAB)
        np.testing.assert_array_equal(again, tokens)
        some = verifier.verify(tree, n // 2)[1]
        np.testing.assert_array_equal(some, logits[:n // 2])
        for node in range(n):
            want = reference.last(np.concatenate([prompt, tree.path_tokens(node)]))
            np.testing.assert_allclose(logits[node], want, atol=ATOL, rtol=0, err_msg=f"n={n} node={node}")


@pytest.mark.parametrize("lookahead_levels", [0, 2])
def test_a_window_of_many_nodes_and_few_leaves_is_one_decode(tiny, reference, lookahead_levels):
    """31 nodes, 3 leaves: a context with 3 leaf sequences takes it whole (the old node limit,
    leaves + 1 = 4, refused it), and every node's logits equal its own branch's forward."""
    v = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=256, n_seq_max=4, **EXACT)
    prompt = np.array(PROMPTS[1], np.int32)
    tree = window_tree(int(v.prefill(prompt)[0][0]), 3, 10, lookahead_levels=lookahead_levels)
    assert len(tree) == 31 and len(tree.leaves()) == 3 == v.max_tree_leaves
    assert len(tree) <= v.max_tree_nodes
    before = v.n_decodes
    tokens, logits = v.verify(tree, len(tree))
    assert v.n_decodes == before + 1
    np.testing.assert_array_equal(tokens, logits.argmax(axis=1))
    for node in range(len(tree)):
        want = reference.last(np.concatenate([prompt, tree.path_tokens(node)]))
        np.testing.assert_allclose(logits[node], want, atol=ATOL, rtol=0, err_msg=f"node {node}")
    v.commit(np.arange(5, dtype=np.int32))
    assert_committed_only(v, len(prompt) + 5)
    v.close()


def test_commit_many_steps_keeps_only_the_path(verifier, reference):
    rng = np.random.default_rng(1)
    context = list(PROMPTS[1])
    root = int(verifier.prefill(np.array(context, np.int32))[0][0])
    assert_committed_only(verifier, len(context))
    for step in range(40):
        tree = random_tree(rng, root, int(rng.integers(1, 20)), branching=0.6)
        model_tokens, _ = verifier.verify(tree)
        path = random_path(rng, tree)
        verifier.commit(path)
        context += tree.tokens[path].tolist()
        assert verifier.n_past == len(context)
        assert_committed_only(verifier, len(context))
        root = int(model_tokens[path[-1]])
    # The cache now holds exactly `context`: the next forward equals a fresh evaluation.
    tree = random_tree(rng, root, 12, branching=0.5)
    logits = verifier.verify(tree, 12)[1]
    for node in (0, 5, 11):
        want = reference.last(np.concatenate([np.array(context, np.int32), tree.path_tokens(node)]))
        np.testing.assert_allclose(logits[node], want, atol=ATOL, rtol=0)


def test_advance_is_a_root_only_verify_and_its_commit(verifier):
    """advance(t) leaves the cache as verify(root_only(t)) + commit([0]) does, and returns that
    verify's token: the same llama_decode, bit for bit (the next tree's logits are equal); a tree
    left pending by verify is dropped first, as a second verify would drop it."""
    prompt = np.array(PROMPTS[0], np.int32)

    def run(step):
        verifier.reset()   # both runs from an empty cache: the second prefill reuses nothing of the first's
        root = int(verifier.prefill(prompt)[0][0])
        tokens = []
        for i in range(12):
            if i == 5:
                verifier.verify(DraftTree.build([root, 3, 4], [-1, 0, 0]))   # left pending
            root = step(root)
            tokens.append(root)
            assert_committed_only(verifier, len(prompt) + i + 1)
        return tokens, verifier.verify(DraftTree.chain(root, [7, 8]), 3)[1]

    def verify_and_commit(root):
        token = int(verifier.verify(DraftTree.root_only(root))[0][0])
        verifier.commit(np.zeros(1, np.int32))
        return token

    want_tokens, want_logits = run(verify_and_commit)
    got_tokens, got_logits = run(verifier.advance)
    assert got_tokens == want_tokens
    np.testing.assert_array_equal(got_logits, want_logits)


def test_advance_refuses_bad_input_and_changes_nothing(tiny):
    fresh = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=64, n_seq_max=3, n_threads=1)
    with pytest.raises(InputError, match="^advance: no sequence started"):
        fresh.advance(5)
    n_ctx = fresh.max_context
    root = int(fresh.prefill(np.arange(n_ctx - 2, dtype=np.int32) % VOCAB)[0][0])
    fresh.verify(DraftTree.build([root, 3], [-1, 0]))   # refused calls below must leave it pending
    for bad in (VOCAB, -1, 2.0, True, "5", None, np.int64(VOCAB)):
        with pytest.raises(InputError, match=rf"^token: expected a token id in \[0, {VOCAB}\), got"):
            fresh.advance(bad)
    assert fresh.n_past == n_ctx - 2
    fresh.commit(np.array([0, 1], np.int32))             # the pending tree survived every refusal
    with pytest.raises(InputError, match=f"^advance: the context holds max_context={n_ctx} tokens"):
        fresh.advance(root)
    assert fresh.n_past == n_ctx
    assert_committed_only(fresh, n_ctx)
    fresh.close()
    with pytest.raises(InputError, match="^advance: this verifier was closed"):
        fresh.advance(1)


def test_chain_verify_uses_sequence_zero(verifier, reference):
    from draftcore.protocols import Verifier
    assert isinstance(verifier, Verifier)
    prompt = np.array(PROMPTS[2], np.int32)
    root = int(verifier.prefill(prompt)[0][0])
    chain = DraftTree.chain(root, [10, 11, 12])
    tokens, logits = verifier.verify(chain, 4)
    assert llama_cpp.llama_memory_seq_pos_max(verifier._mem, 1) == -1   # no leaf sequence used
    verifier.commit(np.array([0, 1], np.int32))
    assert_committed_only(verifier, len(prompt) + 2)
    want = reference(np.concatenate([prompt, chain.tokens]))[len(prompt):]
    np.testing.assert_allclose(logits, want, atol=ATOL, rtol=0)
    np.testing.assert_array_equal(tokens, logits.argmax(axis=1))


# ---------------------------------------------------------------- chain-only fallback

@pytest.fixture(scope="module")
def stock_llama(tiny):
    return llama_cpp.Llama(str(tiny[0]), n_ctx=256, n_threads=1, n_threads_batch=1, type_k=F32, type_v=F32,
                           verbose=False)


def test_chain_fallback_warns_once_and_stays_exact(stock_llama, verifier):
    v = LlamaCppVerifier.from_llama(stock_llama)
    assert v.chain_only and v.n_decodes == 0   # the self-check's decodes are not counted
    rng = np.random.default_rng(2)
    prompt = np.array(PROMPTS[0], np.int32)
    with pytest.warns(ChainOnlyWarning):
        for _ in range(3):
            first = v.prefill(prompt)[0]
            np.testing.assert_array_equal(first, verifier.prefill(prompt)[0])
            tree = random_tree(rng, int(first[0]), 10, branching=0.6)
            tokens, logits = v.verify(tree, len(tree))     # every node: every branch decoded
            want_tokens, want_logits = verifier.verify(tree, len(tree))
            np.testing.assert_allclose(logits, want_logits, atol=ATOL, rtol=0)
            np.testing.assert_array_equal(tokens, logits.argmax(axis=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChainOnlyWarning)  # said once, not again
        context = list(prompt)
        root = int(v.prefill(prompt)[0][0])
        for _ in range(15):
            tree = random_tree(rng, root, 8, branching=0.5)
            out, _ = v.verify(tree)
            path = greedy_path(tree, out)
            v.commit(path)
            context += tree.tokens[path].tolist()
            assert_committed_only(v, len(context))
            root = int(out[path[-1]])
        # logits of every node decode every branch; a commit on an earlier branch decodes the path again
        tree = DraftTree.build([root, 3, 4, 5, 6], [-1, 0, 1, 0, 3])
        v.verify(tree, 5)
        v.commit(np.array([0, 1, 2], np.int32))
        context += tree.tokens[[0, 1, 2]].tolist()
        assert v.n_redecoded == 2   # nodes 1, 2: the root stayed cached
        assert_committed_only(v, len(context))
        fresh = verifier.prefill(np.array(context + [9], np.int32), 1)[1]
        np.testing.assert_allclose(v.verify(DraftTree.root_only(9), 1)[1], fresh, atol=ATOL, rtol=0)


def test_chain_fallback_greedy_walk_matches_tree_mode(stock_llama, verifier):
    """Greedy outputs along the accepted path match tree mode, also when the walk leaves the best
    branch; nodes of branches never decoded are MISSING (-1), never a made-up token."""
    v = LlamaCppVerifier.from_llama(stock_llama)
    prompt = np.array(PROMPTS[1], np.int32)
    t0 = int(verifier.prefill(prompt)[0][0])
    t1 = int(verifier.verify(DraftTree.chain(t0, []))[0][0])
    # Node 1 is a wrong best guess; node 2 (second child) is the model's token: the walk must switch.
    # Node 5 (third child) is never walked into.
    tree = DraftTree.build([t0, (t1 + 1) % VOCAB, t1, 7, 8, (t1 + 2) % VOCAB], [-1, 0, 0, 2, 2, 0])
    want, _ = verifier.verify(tree)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChainOnlyWarning)
        v.prefill(prompt)
        decodes = v.n_decodes
        got, logits = v.verify(tree)
    assert v.n_decodes - decodes == 2      # best branch, then the branch the walk moved into
    assert logits.shape == (0, VOCAB)
    path = greedy_path(tree, want)
    np.testing.assert_array_equal(greedy_path(tree, got), path)
    decoded = [0, 1, 2, 3]                 # branches [0, 1] and [2, 3]
    np.testing.assert_array_equal(got[decoded], want[decoded])
    assert got[4] == MISSING and got[5] == MISSING
    v.commit(path)
    assert_committed_only(v, len(prompt) + path.shape[0])


def test_chain_fallback_decodes_lookahead_and_logits_branches(stock_llama, verifier):
    """Lookahead nodes (a drafter observes them) and the first n_logits nodes are always evaluated;
    the greedy walk goes through candidates only."""
    v = LlamaCppVerifier.from_llama(stock_llama)
    prompt = np.array(PROMPTS[2], np.int32)
    root = int(verifier.prefill(prompt)[0][0])
    # candidates 1-2 and 3-4 (two branches), then a 2 x 3 lookahead window under the root
    tree = DraftTree.build([root, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [-1, 0, 1, 0, 3, 0, 5, 6, 0, 8, 9],
                           n_lookahead=6)
    assert tree.n_candidates == 5
    want, want_logits = verifier.verify(tree, len(tree))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChainOnlyWarning)
        v.prefill(prompt)
        got, _ = v.verify(tree)
        evaluated = np.flatnonzero(got != MISSING)
        assert set(range(5, 11)) <= set(evaluated.tolist())            # the whole window
        np.testing.assert_array_equal(got[evaluated], want[evaluated])
        assert set(evaluated.tolist()) <= set(range(11)) and (got[got != MISSING] >= 0).all()
        got, logits = v.verify(tree, 4)                                   # nodes 0 .. 3: both branches
        assert (got[:5] != MISSING).all() and (got[5:] != MISSING).all()
        np.testing.assert_allclose(logits, want_logits[:4], atol=ATOL, rtol=0)
        path = greedy_path(tree, got)
        assert path.max() < tree.n_candidates
        v.commit(path)
    assert_committed_only(v, len(prompt) + path.shape[0])


class StatelessDrafter:
    """A drafter that serves its request itself and keeps nothing between calls: subclasses propose."""

    def start(self, prompt):
        pass

    def update(self, tokens):
        pass

    def finish(self):
        pass


class ObservingDrafter(StatelessDrafter):
    """Proposes a best branch the model rejects next to a second branch, and records the context of
    every proposal with the (tree, node_tokens) the loop then hands to `observe`."""

    def __init__(self):
        self.seen = []

    def propose(self, context, budget):
        self.context = context.copy()
        if budget < 4:
            return DraftTree.root_only(int(context[-1]))
        return DraftTree.build([int(context[-1]), 3, 4, 5, 6], [-1, 0, 1, 0, 3])

    def observe(self, tree, node_tokens, path):
        self.seen.append((self.context, tree, node_tokens.copy()))


def test_the_loop_observes_missing_nodes_as_minus_one(stock_llama, verifier):
    import draftcore
    v = LlamaCppVerifier.from_llama(stock_llama)
    drafter = ObservingDrafter()
    prompt = np.array(PROMPTS[0], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChainOnlyWarning)
        result = draftcore.speculate(v, prompt, max_new_tokens=12, drafter=drafter, budget=4)
    want, gaps = plain_greedy(verifier, prompt, 12)
    assert_same_greedy(result.tokens.tolist(), want, gaps, "chain-only speculate")
    n_missing = 0
    for context, tree, node_tokens in drafter.seen:
        verifier.prefill(context[:-1])
        tree_mode, _ = verifier.verify(tree)     # every node evaluated
        evaluated = node_tokens != MISSING
        assert evaluated[0]
        np.testing.assert_array_equal(node_tokens[evaluated], tree_mode[evaluated])
        n_missing += int((~evaluated).sum())
    assert n_missing, "no step left a branch undecoded: the test would test nothing"


def test_strict_and_own_context(stock_llama, verifier):
    with pytest.raises(ConfigError, match="n_seq_max"):
        LlamaCppVerifier.from_llama(stock_llama, strict=True)
    v = LlamaCppVerifier.from_llama(stock_llama, own_context=True, n_seq_max=9)
    assert not v.chain_only and v.max_tree_leaves == 8
    prompt = np.array(PROMPTS[2], np.int32)
    tree = random_tree(np.random.default_rng(3), int(v.prefill(prompt)[0][0]), 8, branching=0.8)
    verifier.prefill(prompt)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChainOnlyWarning)
        np.testing.assert_allclose(v.verify(tree, 8)[1], verifier.verify(tree, 8)[1], atol=ATOL, rtol=0)
    v.close()


# ---------------------------------------------------------------- the construction self-check

def _by_depth(parents):
    """A batch order by depth (a valid topological order) under which tagging every node with every
    leaf's sequence keeps each sequence's positions non-decreasing, as llama.cpp requires."""
    depths = np.zeros(len(parents), np.int64)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return np.argsort(depths, kind="stable").astype(np.int32)


class CousinsBatch(batch_module.Batch):
    """Planted bug: every node carries every leaf's sequence id, so it also sees its cousins."""

    def set_tree(self, tokens, depths, membership, n_past):
        super().set_tree(tokens, depths, np.ones_like(membership), n_past)


def test_self_check_passes_correct_contexts_and_catches_a_broken_batch(tiny, stock_llama, monkeypatch):
    for v in (LlamaCppVerifier.from_gguf(tiny[0], n_ctx=64, n_seq_max=4, **EXACT),
              LlamaCppVerifier.from_gguf(tiny[0], n_ctx=64, n_seq_max=4, n_threads=1, flash_attn=True),
              LlamaCppVerifier.from_llama(stock_llama)):
        assert v.self_check_error < 1e-3 and v.n_past == 0 and v.n_decodes == 0
        with pytest.raises(InputError, match="prefill first"):
            v.verify(DraftTree.root_only(3))          # the check's sequence is gone
    with pytest.raises(ConfigError, match="self_check=False"):
        LlamaCppVerifier.from_gguf(tiny[0], n_ctx=64, max_tree_nodes=4, **EXACT)   # the check's tree: 5 nodes
    monkeypatch.setattr(verifier_module, "Batch", CousinsBatch)
    monkeypatch.setattr(verifier_module.branches, "preorder", _by_depth)
    with pytest.raises(BackendError, match="tree-masked logits disagree"):
        LlamaCppVerifier.from_gguf(tiny[0], n_ctx=64, n_seq_max=4, **EXACT)
    unchecked = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=64, n_seq_max=4, self_check=False, **EXACT)
    assert unchecked.self_check_error is None
    unchecked.close()


# ---------------------------------------------------------------- bad input

def test_bad_inputs_raise_draftcore_errors(tiny, verifier):
    path = tiny[0]
    fresh = LlamaCppVerifier.from_gguf(path, n_ctx=64, n_seq_max=3, n_threads=1)
    with pytest.raises(InputError, match="prefill first"):
        fresh.verify(DraftTree.root_only(5))
    with pytest.raises(InputError, match="no verified tree"):
        fresh.commit(np.array([0], np.int32))
    n_ctx = fresh.max_context  # llama.cpp may round n_ctx up: what it reports is the limit
    bad_prompts = [np.array([], np.int32), np.array([1.5, 2.0]), np.array([1, VOCAB]), np.array([[1, 2]]),
                   np.ones(n_ctx + 1, np.int32), [1, -2]]
    for prompt in bad_prompts:
        with pytest.raises(InputError):
            fresh.prefill(prompt)
    for n_logits in (2, -1, 0.5, True, "1"):
        with pytest.raises(InputError, match="n_logits"):
            fresh.prefill(np.array([1, 2], np.int32), n_logits)
    root = int(fresh.prefill(np.arange(n_ctx - 10, dtype=np.int32) % VOCAB)[0][0])
    n_past = fresh.n_past
    pending = DraftTree.build([root, 3, 4], [-1, 0, 0])
    fresh.verify(pending)  # refused calls below must leave this verified tree in place
    bad_trees = [
        [root, 2, 3],                                                   # not a DraftTree
        DraftTree.chain(root, [VOCAB + 3]),                             # token outside the vocabulary
        DraftTree.chain(root, np.arange(3, 13)),                        # n_ctx - 10 + 11 > n_ctx
        DraftTree.build([root, 3, 4, 5], [-1, 0, 0, 0]),                # 3 leaves > n_seq_max 3 - 1
        DraftTree(np.array([root, 3], np.int32), np.array([-1, 5], np.int32), np.array([0, 1], np.int32)),
        DraftTree(np.array([root, 3], np.int32), np.array([-1, 0], np.int32), np.array([0, 1], np.int32),
                  n_lookahead=2),                                       # the root is never a lookahead node
    ]
    for tree in bad_trees:
        with pytest.raises(InputError):
            fresh.verify(tree)
    with pytest.raises(InputError, match="3 leaves.*n_seq_max=3"):
        fresh.verify(bad_trees[3])
    for n_logits in (4, -1, 1.0, False, None, "all"):
        with pytest.raises(InputError, match="n_logits"):
            fresh.verify(pending, n_logits)
    assert fresh.n_past == n_past
    fresh.commit(np.array([0, 2], np.int32))
    assert_committed_only(fresh, n_past + 2)
    n_past += 2

    tree = DraftTree.build([root, 3, 4, 5], [-1, 0, 1, 0])
    fresh.verify(tree)
    for bad_path in ([1, 2], [0, 2], [0, 1, 3], [0, 9], [], [0.0, 1.0]):
        with pytest.raises(InputError):
            fresh.commit(np.asarray(bad_path))
    fresh.commit(np.array([0, 3], np.int32))
    assert_committed_only(fresh, n_past + 2)

    with pytest.raises(ConfigError):
        LlamaCppVerifier.from_gguf(path.parent / "missing.gguf")
    with pytest.raises(ConfigError, match="not_a_param"):
        LlamaCppVerifier.from_gguf(path, not_a_param=1)
    with pytest.raises(ConfigError):
        LlamaCppVerifier.from_gguf(path, n_seq_max=1)
    with pytest.raises(ConfigError):
        LlamaCppVerifier.from_llama("model.gguf")
    # unchecked, llama.cpp aborts (type_k=9999: GGML_ASSERT) or crashes (type_k=-1) on these, or ctypes
    # raises a bare TypeError
    for bad, name in ((dict(type_k=9999), "type_k"), (dict(type_v=-1), "type_v"), (dict(type_k="f32"), "type_k"),
                      (dict(n_gpu_layers="x"), "n_gpu_layers"), (dict(n_gpu_layers=1.5), "n_gpu_layers"),
                      (dict(n_ubatch=2.5), "n_ubatch"), (dict(flash_attn="yes"), "flash_attn")):
        with pytest.raises(ConfigError, match=f"^{name}: .*got"):
            LlamaCppVerifier.from_gguf(path, n_ctx=64, **bad)
    with pytest.raises(ConfigError, match="^path: .*None"):
        LlamaCppVerifier.from_gguf(None)
    with pytest.raises(InputError, match="^text: expected a str"):
        fresh.encode(3)
    fresh.close()
    with pytest.raises(InputError, match="closed"):
        fresh.prefill(np.array([1], np.int32))
    assert issubclass(InputError, DraftcoreError) and issubclass(ConfigError, DraftcoreError)


def test_integer_settings_a_field_cannot_hold_are_refused_not_wrapped(tiny):
    """ctypes wraps an integer outside a field's C type silently: from_gguf(n_ctx=2**32 + 512) built a
    context of 512 cells, n_threads=2**32 + 1 ran one thread. Refused, naming the field, the value and
    the range of its C type."""
    for name, value in (("n_ctx", 2**32 + 512), ("n_batch", 2**32 + 64), ("n_threads", 2**32 + 1),
                        ("n_ubatch", 2**32 + 16), ("n_gpu_layers", 2**31)):
        with pytest.raises(ConfigError, match=rf"^{name}: llama.cpp's field takes a c_u?int, got {value} "
                                              rf"\(outside \[-?[0-9]+, [0-9]+\]\)"):
            LlamaCppVerifier.from_gguf(tiny[0], **{"n_ctx": 64, "n_threads": 1, name: value})


# ---------------------------------------------------------------- tree walks and batch tags (pure numpy)

def test_branch_heads_visit_every_node_once():
    rng = np.random.default_rng(4)
    for _ in range(50):
        tree = random_tree(rng, 1, int(rng.integers(1, 30)), branching=float(rng.random()))
        first = branches.first_children(tree.parents)
        covered = []
        for head in branches.branch_heads(tree.parents):
            covered += branches.best_chain(first, head)
        assert sorted(covered) == list(range(len(tree)))
        assert len(branches.branch_heads(tree.parents)) == len(tree.leaves())


def test_leaf_membership_tags_each_node_with_the_leaves_below_it():
    # the tree of draftcore/tree.py: t x y z w, parents -1 0 1 1 0; leaves y z w -> seqs 1 2 3
    tree = DraftTree.build([9, 1, 2, 3, 4], [-1, 0, 1, 1, 0])
    np.testing.assert_array_equal(batch_module.leaf_membership(tree), [
        [1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    rng = np.random.default_rng(6)
    for _ in range(20):
        tree = random_tree(rng, 1, int(rng.integers(1, 30)), branching=float(rng.random()))
        membership = batch_module.leaf_membership(tree)
        assert membership.shape == (len(tree), len(tree.leaves())) and membership[0].all()
        np.testing.assert_array_equal(membership[tree.leaves()], np.eye(len(tree.leaves()), dtype=bool))


# ---------------------------------------------------------------- speculate on the fixture

def test_speculate_equals_plain_greedy(verifier):
    import draftcore
    for prompt in PROMPTS:
        prompt = prompt * 3  # repetition gives the trie drafter something to propose
        want, gaps = plain_greedy(verifier, prompt, 40)
        for budget in (12, None):  # None: the bare call (the verifier's session drafter, auto budget)
            result = draftcore.speculate(verifier, np.array(prompt, np.int32), max_new_tokens=40, budget=budget)
            assert_same_greedy(result.tokens.tolist(), want, gaps, f"speculate (budget {budget}) vs plain greedy")
            assert_committed_only(verifier, len(prompt) + len(result.tokens) - 1)


class BushDrafter(StatelessDrafter):
    """Every drafted node a child of the root: as many leaves as nodes, the most a tree can have."""

    def propose(self, context, budget):
        return DraftTree.build([int(context[-1])] + list(range(3, 3 + budget)), [-1] + [0] * budget)


def test_speculate_never_drafts_more_leaves_than_one_verify_takes(tiny):
    """A context with n_seq_max=4 verifies trees of at most 3 leaves; speculate cuts the tree to
    max_tree_leaves, whatever the budget says, and stays exact."""
    import draftcore
    small = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=256, n_seq_max=4, **EXACT)
    assert small.max_tree_leaves == 3 and small.max_tree_nodes == min(small.limits.n_batch, 63)
    small.prefill(np.array(PROMPTS[0], np.int32))
    with pytest.raises(InputError, match="n_seq_max"):  # what a bigger tree would meet
        small.verify(DraftTree.build([5] + list(range(3, 8)), [-1] + [0] * 5))
    for budget in (16, "auto"):
        result = draftcore.speculate(small, np.array(PROMPTS[0], np.int32), max_new_tokens=24,
                                     drafter=BushDrafter(), budget=budget)
        assert max(result.stats.budget_hist) <= 3
        want, gaps = plain_greedy(small, PROMPTS[0], 24)
        assert_same_greedy(result.tokens.tolist(), want, gaps, f"budget {budget}")
    small.close()


@pytest.fixture(scope="module")
def long_gguf(tmp_path_factory):
    """The fixture's model written with room for 2,048 positions (the same weights: only the GGUF's
    context length, llama.cpp's n_ctx_train, differs)."""
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    from fixtures.gguf_writer import write_tiny_llama_gguf
    path = tmp_path_factory.mktemp("gguf-long") / "tiny-2048.gguf"
    write_tiny_llama_gguf(path, seed=0, vocab_size=VOCAB, max_position=2048)
    return path


# 700 tokens that repeat a 40-token block: drafts get accepted from the first steps.
LONG_PROMPT = np.r_[1, np.tile(np.random.default_rng(3).integers(3, VOCAB, 40), 18)[:699]].astype(np.int32)


@pytest.mark.parametrize("context", ["tree", "tree, small batches", "stock Llama, small batches"])
def test_a_request_longer_than_the_batch_sizes_equals_plain_greedy(long_gguf, context, small_context_buffer):
    """llama-cpp-python's drop-in crashed once a conversation passed n_batch positions; this one goes
    past every fixed size at once: a 700-token prompt, past the default n_batch of 512 (prefilled in
    chunks), then new tokens up to the context's last cell (n_ctx 1,024) and past the first size of
    speculate's buffer (made 16 here). With n_batch 64 and n_ubatch 16 the prefill takes 11 batches
    and a tree of up to 41 nodes spans three ubatches; a stock Llama (one sequence) verifies it
    branch by branch. Each equals its own plain greedy decoding."""
    import draftcore
    small = dict(n_batch=64, n_ubatch=16)
    if context == "tree":
        v = LlamaCppVerifier.from_gguf(long_gguf, n_ctx=1024, **EXACT)
    elif context == "tree, small batches":
        v = LlamaCppVerifier.from_gguf(long_gguf, n_ctx=1024, **small, **EXACT)
    else:
        llm = llama_cpp.Llama(str(long_gguf), n_ctx=1024, n_threads=1, n_threads_batch=1, type_k=F32, type_v=F32,
                              verbose=False, **small)
        v = LlamaCppVerifier.from_llama(llm)
    n_batch = 512 if context == "tree" else 64
    assert v.max_context == 1024 and v.limits.n_batch == n_batch < LONG_PROMPT.shape[0]
    n_new = v.max_context - LONG_PROMPT.shape[0]
    want, gaps = plain_greedy(v, LONG_PROMPT, n_new)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChainOnlyWarning)
        result = draftcore.speculate(v, LONG_PROMPT, max_new_tokens=n_new, budget=40)
    assert_same_greedy(result.tokens.tolist(), want, gaps, context)
    assert_committed_only(v, v.max_context - 1)
    assert result.stats.tokens_per_step > 1.5 and max(result.stats.budget_hist) > 16 and small_context_buffer
    v.close()


# ---------------------------------------------------------------- the real model, F32 (slow: ~20 s)
# 30 layers in float32 on two backends drift further apart than the tiny fixture: ties below 1e-2.

SMOLLM2_PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]


@pytest.fixture(scope="module")
def smollm2_f32(tmp_path_factory):
    """SmolLM2-135M-Instruct in HF fp32 and as an F32 GGUF written from it (tokenizer copied from the
    packaged Q4_1 GGUF), with a llama.cpp verifier over the latter."""
    pytest.importorskip("gguf")
    smollm2 = pytest.importorskip("draftcore.adapters.torch_hf.smollm2")
    try:
        source = smollm2.packaged_gguf()
    except DraftcoreError as exc:
        pytest.skip(str(exc))
    from fixtures.gguf_writer import write_llama_gguf
    model, _ = smollm2.load_smollm2()
    path = tmp_path_factory.mktemp("smollm2") / "smollm2-f32.gguf"
    write_llama_gguf(model, path, tokenizer_from=source)
    verifier = LlamaCppVerifier.from_gguf(path, n_ctx=1024, **EXACT)
    yield model, verifier
    verifier.close()


@pytest.mark.slow
def test_smollm2_f32_matches_hf_and_speculates_exactly(smollm2_f32):
    import torch

    draftcore = pytest.importorskip("draftcore")
    model, verifier = smollm2_f32
    assert verifier.vocab_size == 49152 and not verifier.chain_only
    for text in SMOLLM2_PROMPTS:
        prompt = verifier.encode(text)
        assert verifier.decode(prompt) == text
        want, gaps = plain_greedy(verifier, prompt, 24)
        with torch.no_grad():
            hf = model(torch.tensor([prompt.tolist() + want])).logits[0].numpy()
        hf_tokens = hf[len(prompt) - 1:-1].argmax(axis=1).tolist()
        assert_same_greedy(hf_tokens, want, gaps, "SmolLM2 HF vs llama.cpp", tie=1e-2)
        result = draftcore.speculate(verifier, prompt, max_new_tokens=24, budget=8, eos_token_id=2)
        got = result.tokens.tolist()
        assert_same_greedy(got, want[:len(got)], gaps, "SmolLM2 speculate", tie=1e-2)


# ---------------------------------------------------------------- cells in position order (flash attention)
# CPU flash attention sums over KV cells in cell order. With it on, a batch of <= 63 tokens gives
# bit-identical logits to one-token decoding, so tokens must also sit in cells in position order: a
# commit that skips a rejected node re-decodes the path's tail rather than leave a hole that a later
# token would fill (measured on the old commit: 7.8e-4 here, 0.67 on Q4_1 SmolLM2).

@pytest.fixture(scope="module")
def flash_verifier(tiny):
    v = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=512, n_seq_max=33, n_threads=1, flash_attn=True)
    yield v
    v.close()


def test_preorder_puts_the_best_branch_first():
    assert branches.preorder(np.array([-1, 0, 1, 2, 1, 0, 5], np.int32)).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert branches.preorder(np.array([-1, 0, 0, 1, 2, 3], np.int32)).tolist() == [0, 1, 3, 5, 2, 4]
    rng = np.random.default_rng(5)
    for _ in range(50):
        tree = random_tree(rng, 1, int(rng.integers(1, 30)), branching=float(rng.random()))
        order = branches.preorder(tree.parents)
        assert sorted(order.tolist()) == list(range(len(tree)))
        where = np.empty(len(tree), int)
        where[order] = np.arange(len(tree))
        assert (where[tree.parents[1:]] < where[1:]).all(), "a parent comes before its children"
        best = branches.best_chain(branches.first_children(tree.parents), 0)
        assert order[:len(best)].tolist() == best


def test_commit_off_the_best_branch_keeps_logits_bit_identical(flash_verifier):
    v = flash_verifier
    prompt = np.array(PROMPTS[0], np.int32)
    tokens, _ = plain_greedy(v, prompt, 12)
    v.prefill(prompt)
    for token in tokens[:-1]:
        v.verify(DraftTree.root_only(token))
        v.commit(np.array([0], np.int32))
    want = v.verify(DraftTree.root_only(tokens[-1]), 1)[1][0]  # after prompt + tokens, one at a time
    first = int(v.prefill(prompt)[0][0])
    assert first == tokens[0]
    # node 1 (first child, the batch's second cell) is rejected; the path goes through node 2
    tree = DraftTree.build([tokens[0], (tokens[1] + 1) % VOCAB, tokens[1], 7], [-1, 0, 0, 1])
    redecoded = v.n_redecoded
    out, _ = v.verify(tree)
    assert out[2] == tokens[2]
    v.commit(np.array([0, 2], np.int32))
    assert v.n_redecoded == redecoded + 1          # node 2 decoded again, after node 0's cell
    assert_committed_only(v, len(prompt) + 2)
    for token in tokens[2:-1]:
        v.verify(DraftTree.root_only(token))
        v.commit(np.array([0], np.int32))
    np.testing.assert_array_equal(v.verify(DraftTree.root_only(tokens[-1]), 1)[1][0], want)


def test_speculate_with_flash_attention_is_token_identical(flash_verifier):
    """No near-tie allowance: with flash attention and ordered cells the logits are bit-identical."""
    import draftcore
    for prompt in PROMPTS:
        prompt = prompt * 3
        want, _ = plain_greedy(flash_verifier, prompt, 40)
        result = draftcore.speculate(flash_verifier, np.array(prompt, np.int32), max_new_tokens=40, budget=12)
        assert result.tokens.tolist() == want


# ---------------------------------------------------------------- `draftcore bench --backend llamacpp` and the example

def test_bench_methods_on_the_packaged_model(packaged_gguf):
    from draftcore.tools.backends import llamacpp as bench
    handle, tokenizer = bench.load_model(packaged_gguf, n_threads=1, n_ctx=512)  # a path: llama.cpp tokenizes
    assert tokenizer is handle.llm and 2 in handle.eos_ids
    assert bench.METHODS == ("plain", "prompt_lookup", "bare", "trie")
    prompts = bench.load_prompts(tokenizer, "humaneval", 1) + bench.load_prompts(tokenizer, "mtbench", 1)
    assert prompts[1].ids[0] == handle.llm.tokenize(b"<|im_start|>", add_bos=False, special=True)[0]
    methods = bench.make_methods(handle, tokenizer, list(bench.METHODS) + ["trie-fixed4", "nodraft", "composite"])
    assert [m.name for m in methods][2] == "draftcore bare call"
    for prompt in prompts:
        for m in methods:
            m.reset()
        runs = [m.run(prompt.ids, 8) for m in methods]
        reference = runs[0].tokens
        assert reference.dtype == np.int32 and len(reference) == 8 and runs[0].steps == 8
        for m, run in zip(methods, runs):
            np.testing.assert_array_equal(run.tokens, reference, err_msg=m.name)
            assert 1 <= run.steps <= 8 and run.seconds > 0
            assert max(run.budgets or {0: 0}) <= bench.MAX_TREE_NODES - 1, m.name
        np.testing.assert_array_equal(bench.plain_greedy(handle, tokenizer, prompt.ids, 8), reference)
    with pytest.raises(ConfigError, match="methods"):
        bench.make_methods(handle, tokenizer, ["plain", "trie-fixed99"])
    with pytest.raises(ConfigError, match="dtype"):
        bench.load_model(packaged_gguf, dtype="float16")
    with pytest.raises(InputError, match="dataset"):
        bench.load_prompts(tokenizer, "gsm8k", 1)
    pydoc = bench.load_prompts(tokenizer, "pydoc", 2)
    assert [p.dataset for p in pydoc] == ["pydoc", "pydoc"]
    assert all(400 <= len(p.ids) <= 1200 and p.ids[0] == prompts[1].ids[0] for p in pydoc)
    for kind in ("edit", "agent", "extract"):   # chat prompts through the GGUF's template, like pydoc's
        workload = bench.load_prompts(tokenizer, kind, 2)
        assert [p.dataset for p in workload] == [kind, kind] and all(p.ids[0] == prompts[1].ids[0] for p in workload)


def _requantized(source, target, ftype) -> str:
    """`source` GGUF requantized to `ftype` with llama.cpp's own quantizer (what users run)."""
    import ctypes
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread, params.allow_requantize = ftype, 2, True
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) == 0
    return str(target)


def test_contexts_whose_batches_are_not_exact_are_warned_about(packaged_gguf, tmp_path):
    """Real weights and settings: Q4_1 with flash attention off, and Q4_K_M (repacked for the CPU, the
    default) with it on, compute a batch differently from one token; each warning names what to
    change. Q4_1 with flash attention on gives bit-exact batches: no warning, and speculative output
    equal to plain greedy with no near-tie allowance."""
    import draftcore
    from draftcore.adapters.llamacpp.numerics import NEAR_TIE_ONLY
    k_quant = _requantized(packaged_gguf, tmp_path / "q4_k_m.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)
    for path, flash_attn, remedy in ((packaged_gguf, False, "flash_attn=True"), (k_quant, True, "Q4_0, Q4_1 and Q8_0")):
        with pytest.warns(InexactBatchWarning, match=remedy) as caught:
            v = LlamaCppVerifier.from_gguf(path, n_ctx=512, n_threads=1, flash_attn=flash_attn)
        assert caught[0].filename == __file__          # points at the caller's line
        assert v.self_check_error > NEAR_TIE_ONLY
        v.close()
    settings = dict(n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False)
    with pytest.warns(InexactBatchWarning, match="flash_attn=True"):
        LlamaCppVerifier.from_llama(llama_cpp.Llama(packaged_gguf, flash_attn=False, **settings), own_context=True).close()
    unchecked = LlamaCppVerifier.from_gguf(packaged_gguf, n_ctx=512, n_threads=1, flash_attn=False, self_check=False)
    assert unchecked.self_check_error is None                # nothing measured, nothing warned
    unchecked.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactBatchWarning)
        exact = [LlamaCppVerifier.from_gguf(packaged_gguf, n_ctx=512, n_threads=1, flash_attn=True),
                 LlamaCppVerifier.from_llama(llama_cpp.Llama(packaged_gguf, flash_attn=True, **settings), own_context=True)]
    for v in exact:
        assert v.self_check_error == 0.0
        prompt = [1, 300, 301, 302, 303, 304, 305] * 4
        want, _ = plain_greedy(v, prompt, 40)
        result = draftcore.speculate(v, np.array(prompt, np.int32), max_new_tokens=40, budget=12)
        assert result.tokens.tolist() == want                          # no near-tie allowance
        # ... and the steps verified batches: most drafted 4 or more tokens, some were accepted.
        assert result.stats.drafted_tokens >= 4 * result.stats.steps and result.stats.tokens_per_step > 1.2
        v.close()


def test_wrap_llamacpp_example(tiny):
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "wrap_llamacpp.py")
    spec = importlib.util.spec_from_file_location("wrap_llamacpp", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    llm = llama_cpp.Llama(str(tiny[0]), n_ctx=256, n_threads=1, n_threads_batch=1, flash_attn=True, verbose=False)
    text, stats = example.compare(llm, PROMPTS[0] * 3, max_new_tokens=16)
    assert isinstance(text, str) and stats["identical"] and stats["tokens_per_step"] >= 1.0


# ---------------------------------------------------------------- sampling on the fixture

@pytest.mark.parametrize("variant", ["exact", "child_coins"])
def test_speculative_sampling_matches_the_exact_distribution(verifier, reference, monkeypatch, variant):
    """Speculative sampling through llama.cpp (verify(tree, n_logits) with the candidates' logits,
    trie-drafted trees) against the exact distribution of the first 3 new tokens, enumerated from
    one-token forwards of the reference context with the same processors (T=0.8, top-k 3: 27
    sequences). Chi-square, fixed seeds. The planted variant (a coin per child from the same uniform)
    must fail the same test."""
    import draftcore
    import draftcore.jit
    from naive_sampling import goodness_of_fit, naive_sample_step

    processors = draftcore.jit.kernels("draftcore.processors")
    if variant != "exact":
        acceptance = draftcore.jit.kernels("draftcore.acceptance")  # warmed up before it is patched

        def planted(tokens, parents, n_walk, u, p, uniform):
            return naive_sample_step(tokens, parents, n_walk, u, p, uniform, variant)

        monkeypatch.setattr(acceptance, "sample_step", planted)

    params = dict(temperature=0.8, top_k=3)
    length, n_samples = 3, 1500
    prompt = np.array(PROMPTS[0] * 2, np.int32)

    exact = {}

    def enumerate_from(prefix, prob):
        if len(prefix) == length:
            exact[tuple(prefix)] = prob
            return
        processor = processors.LogitsProcessor.from_params(draftcore.SamplingParams(**params), VOCAB)
        context = np.r_[prompt, prefix].astype(np.int32)
        processor.start(context)
        p = processors.softmax(processor.process_next(reference.last(context))[None])[0].astype(np.float64)
        for token in np.flatnonzero(p > 0):
            enumerate_from(prefix + [int(token)], prob * p[token] / p.sum())

    enumerate_from([], 1.0)
    assert len(exact) == 27 and abs(sum(exact.values()) - 1) < 1e-9

    trie = draftcore.TrieDrafter()
    counts, accepted_multi = {}, 0
    for seed in range(n_samples):
        result = draftcore.speculate(verifier, prompt, max_new_tokens=length, drafter=trie, budget=8,
                                     sampling=dict(params, seed=seed))
        key = tuple(result.tokens[:length].tolist())
        counts[key] = counts.get(key, 0) + 1
        accepted_multi += sum(result.stats.accepted_hist[1:])
    p_value, stat, df = goodness_of_fit(counts, exact)
    if variant != "exact":
        assert p_value < 1e-6, (variant, p_value, stat, df)
        return
    assert p_value > 1e-3, (p_value, stat, df, counts)
    assert accepted_multi > 0.1 * n_samples, "drafts were never accepted: the test would test nothing"


@pytest.mark.parametrize("flash_attn", [False, True], ids=["no-flash", "flash"])
def test_self_check_on_the_packaged_quantized_model(packaged_gguf, monkeypatch, flash_attn):
    """Q4_1 SmolLM2: a correct context passes (measured, worst of the check's two token draws: 0.039
    with flash attention off, 0 with it on), a batch whose nodes see their cousins does not (>= 0.27).
    Off, the context passes but is warned about: its batches are not exact (numerics.py)."""
    with pytest.warns(InexactBatchWarning) if not flash_attn else warnings.catch_warnings():
        if flash_attn:
            warnings.simplefilter("error", InexactBatchWarning)
        v = LlamaCppVerifier.from_gguf(packaged_gguf, n_ctx=64, n_seq_max=4, n_threads=1, flash_attn=flash_attn)
    assert v.self_check_error < verifier_module.QUANTIZED_WEIGHTS_TOLERANCE / 2
    v.close()
    monkeypatch.setattr(verifier_module, "Batch", CousinsBatch)
    monkeypatch.setattr(verifier_module.branches, "preorder", _by_depth)
    with pytest.raises(BackendError, match="relative error"):
        LlamaCppVerifier.from_gguf(packaged_gguf, n_ctx=64, n_seq_max=4, n_threads=1, flash_attn=flash_attn)
