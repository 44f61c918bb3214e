"""llama.cpp backend: tree verify, commit and the chain fallback, on an exact float32 fixture.

The fixture is a tiny random Llama held twice with the same weights: in HF (fp32) and in llama.cpp
(F32 GGUF written by draftcore's gguf_writer, f32 KV cache, no flash attention). A multi-token
forward never gives bit-identical logits to single-token ones, so logits are compared with a
tolerance and greedy tokens with the near-tie rule of DESIGN.md "Numerics".
"""
import warnings

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from draftcore.adapters.llamacpp import ChainOnlyWarning, LlamaCppVerifier, write_tiny_llama_gguf  # noqa: E402
from draftcore.adapters.llamacpp import branches  # noqa: E402
from draftcore.errors import ConfigError, DraftcoreError, InputError  # noqa: E402
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
    """(path of the tiny F32 GGUF, the same model in HF or None when torch/transformers are missing)."""
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
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
    ref = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=512, **EXACT)

    def logits(tokens):
        tokens = np.asarray(tokens, np.int32)
        first = ref.prefill(tokens[:1], "logits")
        if len(tokens) == 1:
            return first[None]
        return np.vstack([first, ref.verify(DraftTree.chain(int(tokens[1]), tokens[2:]), "logits")])

    logits.last = lambda tokens: ref.prefill(np.asarray(tokens, np.int32), "logits")
    return logits


def random_tree(rng, root, n, branching=0.5):
    """A random tree of n nodes; a node's parent is the previous node with probability 1 - branching."""
    parents = [-1]
    for i in range(1, n):
        parents.append(i - 1 if rng.random() > branching else int(rng.integers(0, i)))
    tokens = [root] + rng.integers(3, VOCAB, n - 1).tolist()
    return DraftTree.build(tokens, parents)


def random_path(rng, tree):
    """Root-to-node path of a random node (node indices are usually not contiguous)."""
    node = int(rng.integers(0, len(tree)))
    path = []
    while node >= 0:
        path.append(node)
        node = int(tree.parents[node])
    return np.array(path[::-1], np.int32)


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
    logits = v.prefill(np.asarray(prompt, np.int32), "logits")
    tokens, gaps = [], []
    for _ in range(n_new):
        top2 = np.sort(logits)[-2:]
        tokens.append(int(logits.argmax()))
        gaps.append(float(top2[1] - top2[0]))
        logits = v.verify(DraftTree.root_only(tokens[-1]), "logits")[0]
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
    pytest.importorskip("transformers")
    import torch

    model = write_tiny_llama_gguf(tmp_path / "tied.gguf", seed=1, vocab_size=300, tie_word_embeddings=True,
                                  num_key_value_heads=4, rope_theta=500.0)
    v = LlamaCppVerifier.from_gguf(tmp_path / "tied.gguf", n_ctx=64, **EXACT)
    ids = [1, 5, 250, 7, 9, 299]
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(v.prefill(np.array(ids, np.int32), "logits"), want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------- tree mode

def test_tree_logits_equal_per_branch_forwards(verifier, reference):
    rng = np.random.default_rng(0)
    prompt = np.array(PROMPTS[0], np.int32)
    for n, branching in [(2, 1.0), (5, 0.5), (9, 0.7), (16, 0.4), (24, 0.9)]:
        first = verifier.prefill(prompt)
        tree = random_tree(rng, first, n, branching)
        before = verifier.n_decodes
        logits = verifier.verify(tree, "logits")
        assert verifier.n_decodes == before + 1, "one llama_decode per tree"
        argmax = verifier.verify(tree, "argmax")  # a second verify replaces the first
        assert argmax.dtype == np.int32 and argmax.shape == (n,)
        np.testing.assert_array_equal(argmax, logits.argmax(axis=1))
        for node in range(n):
            want = reference.last(np.concatenate([prompt, tree.path_tokens(node)]))
            np.testing.assert_allclose(logits[node], want, atol=ATOL, rtol=0, err_msg=f"n={n} node={node}")


def test_commit_many_steps_keeps_only_the_path(verifier, reference):
    rng = np.random.default_rng(1)
    context = list(PROMPTS[1])
    root = verifier.prefill(np.array(context, np.int32))
    assert_committed_only(verifier, len(context))
    for step in range(40):
        tree = random_tree(rng, root, int(rng.integers(1, 20)), branching=0.6)
        model_tokens = verifier.verify(tree)
        path = random_path(rng, tree)
        verifier.commit(path)
        context += tree.tokens[path].tolist()
        assert verifier.n_past == len(context)
        assert_committed_only(verifier, len(context))
        root = int(model_tokens[path[-1]])
    # The cache now holds exactly `context`: the next forward equals a fresh evaluation.
    tree = random_tree(rng, root, 12, branching=0.5)
    logits = verifier.verify(tree, "logits")
    for node in (0, 5, 11):
        want = reference.last(np.concatenate([np.array(context, np.int32), tree.path_tokens(node)]))
        np.testing.assert_allclose(logits[node], want, atol=ATOL, rtol=0)


def test_chain_verify_uses_sequence_zero(verifier, reference):
    from draftcore.protocols import Verifier
    assert isinstance(verifier, Verifier)
    prompt = np.array(PROMPTS[2], np.int32)
    root = verifier.prefill(prompt)
    chain = DraftTree.chain(root, [10, 11, 12])
    logits = verifier.verify(chain, "logits")
    assert llama_cpp.llama_memory_seq_pos_max(verifier._mem, 1) == -1   # no leaf sequence used
    verifier.commit(np.array([0, 1], np.int32))
    assert_committed_only(verifier, len(prompt) + 2)
    want = reference(np.concatenate([prompt, chain.tokens]))[len(prompt):]
    np.testing.assert_allclose(logits, want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------- chain-only fallback

@pytest.fixture(scope="module")
def stock_llama(tiny):
    return llama_cpp.Llama(str(tiny[0]), n_ctx=256, n_threads=1, n_threads_batch=1, type_k=F32, type_v=F32,
                           verbose=False)


def test_chain_fallback_warns_once_and_stays_exact(stock_llama, verifier):
    v = LlamaCppVerifier.from_llama(stock_llama)
    assert v.chain_only and v.max_leaves == 0
    rng = np.random.default_rng(2)
    prompt = np.array(PROMPTS[0], np.int32)
    with pytest.warns(ChainOnlyWarning):
        for _ in range(3):
            first = v.prefill(prompt)
            assert first == verifier.prefill(prompt)
            tree = random_tree(rng, first, 10, branching=0.6)
            logits = v.verify(tree, "logits")
            np.testing.assert_allclose(logits, verifier.verify(tree, "logits"), atol=ATOL, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChainOnlyWarning)  # said once, not again
        context = list(prompt)
        root = v.prefill(prompt)
        for _ in range(15):
            tree = random_tree(rng, root, 8, branching=0.5)
            out = v.verify(tree, "argmax")
            path = _greedy_path(tree, out)
            v.commit(path)
            context += tree.tokens[path].tolist()
            assert_committed_only(v, len(context))
            root = int(out[path[-1]])
        # logits mode decodes every branch; a commit on an earlier branch decodes the path again
        tree = DraftTree.build([root, 3, 4, 5, 6], [-1, 0, 1, 0, 3])
        v.verify(tree, "logits")
        v.commit(np.array([0, 1, 2], np.int32))
        context += tree.tokens[[0, 1, 2]].tolist()
        assert v.n_redecoded == 2   # nodes 1, 2: the root stayed cached
        assert_committed_only(v, len(context))
        fresh = verifier.prefill(np.array(context + [9], np.int32), "logits")
        np.testing.assert_allclose(v.verify(DraftTree.root_only(9), "logits")[0], fresh, atol=ATOL, rtol=0)


def _greedy_path(tree, out):
    from draftcore.acceptance import greedy_accept
    return greedy_accept(tree.tokens, tree.parents, out)[0]


def test_chain_fallback_greedy_walk_matches_tree_mode(stock_llama, verifier):
    """Greedy outputs along the accepted path match tree mode, also when the walk leaves the best branch."""
    v = LlamaCppVerifier.from_llama(stock_llama)
    prompt = np.array(PROMPTS[1], np.int32)
    t0 = verifier.prefill(prompt)
    t1 = int(verifier.verify(DraftTree.chain(t0, []))[0])
    # Node 1 is a wrong best guess; node 2 (second child) is the model's token: the walk must switch.
    tree = DraftTree.build([t0, (t1 + 1) % VOCAB, t1, 7, 8], [-1, 0, 0, 2, 2])
    want = verifier.verify(tree)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChainOnlyWarning)
        v.prefill(prompt)
        decodes = v.n_decodes
        got = v.verify(tree)
    assert v.n_decodes - decodes == 2      # best branch, then the branch the walk moved into
    path = _greedy_path(tree, want)
    np.testing.assert_array_equal(_greedy_path(tree, got), path)
    np.testing.assert_array_equal(got[path], want[path])
    v.commit(path)
    assert_committed_only(v, len(prompt) + path.shape[0])


def test_strict_and_own_context(stock_llama, verifier):
    with pytest.raises(ConfigError, match="n_seq_max"):
        LlamaCppVerifier.from_llama(stock_llama, strict=True)
    v = LlamaCppVerifier.from_llama(stock_llama, own_context=True, n_seq_max=9)
    assert not v.chain_only and v.max_leaves == 8
    prompt = np.array(PROMPTS[2], np.int32)
    tree = random_tree(np.random.default_rng(3), v.prefill(prompt), 8, branching=0.8)
    verifier.prefill(prompt)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChainOnlyWarning)
        np.testing.assert_allclose(v.verify(tree, "logits"), verifier.verify(tree, "logits"), atol=ATOL, rtol=0)
    v.close()


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
    root = fresh.prefill(np.arange(n_ctx - 10, dtype=np.int32) % VOCAB)
    n_past = fresh.n_past
    pending = DraftTree.build([root, 3, 4], [-1, 0, 0])
    fresh.verify(pending)  # refused calls below must leave this verified tree in place
    bad_trees = [
        [root, 2, 3],                                                   # not a DraftTree
        DraftTree.chain(root, [VOCAB + 3]),                             # token outside the vocabulary
        DraftTree.chain(root, np.arange(3, 13)),                        # n_ctx - 10 + 11 > n_ctx
        DraftTree.build([root, 3, 4, 5], [-1, 0, 0, 0]),                # 3 leaves > n_seq_max 3 - 1
        DraftTree(np.array([root, 3], np.int32), np.array([-1, 5], np.int32), np.array([0, 1], np.int32)),
    ]
    for tree in bad_trees:
        with pytest.raises(InputError):
            fresh.verify(tree)
    with pytest.raises(InputError, match="want"):
        fresh.verify(DraftTree.root_only(root), want="probs")
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
    fresh.close()
    with pytest.raises(InputError, match="closed"):
        fresh.prefill(np.array([1], np.int32))
    assert issubclass(InputError, DraftcoreError) and issubclass(ConfigError, DraftcoreError)


# ---------------------------------------------------------------- branch walks (pure numpy)

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


# ---------------------------------------------------------------- speculate on the fixture

def test_speculate_equals_plain_greedy(verifier):
    import draftcore
    for prompt in PROMPTS:
        prompt = prompt * 3  # repetition gives the trie drafter something to propose
        want, gaps = plain_greedy(verifier, prompt, 40)
        result = draftcore.speculate(verifier, np.array(prompt, np.int32), max_new_tokens=40, budget=12)
        assert_same_greedy(result.tokens.tolist(), want, gaps, "speculate vs plain greedy")
        assert_committed_only(verifier, len(prompt) + len(result.tokens) - 1)


class BushDrafter:
    """Every drafted node a child of the root: as many leaves as nodes, the most a tree can have."""

    def start(self, prompt):
        pass

    def update(self, tokens):
        pass

    def finish(self):
        pass

    def propose(self, context, budget):
        return DraftTree.build([int(context[-1])] + list(range(3, 3 + budget)), [-1] + [0] * budget)


def test_speculate_never_drafts_more_than_one_verify_takes(tiny):
    """A context with n_seq_max=4 verifies trees of at most 3 leaves; speculate asks for no more
    nodes than that (max_tree_nodes), whatever the budget says, and stays exact."""
    import draftcore
    small = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=256, n_seq_max=4, **EXACT)
    assert small.max_leaves == 3 and small.max_tree_nodes == 4
    with pytest.raises(InputError, match="n_seq_max"):  # what a bigger tree would meet
        small.prefill(np.array(PROMPTS[0], np.int32))
        small.verify(DraftTree.build([5] + list(range(3, 8)), [-1] + [0] * 5))
    small._discard_pending()
    for budget in (16, "auto"):
        result = draftcore.speculate(small, np.array(PROMPTS[0], np.int32), max_new_tokens=24,
                                     drafter=BushDrafter(), budget=budget)
        assert max(result.stats.budget_hist) <= 3
        want, gaps = plain_greedy(small, PROMPTS[0], 24)
        assert_same_greedy(result.tokens.tolist(), want, gaps, f"budget {budget}")
    small.close()


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
    model, _ = smollm2.load_smollm2()
    path = tmp_path_factory.mktemp("smollm2") / "smollm2-f32.gguf"
    from draftcore.adapters.llamacpp import write_llama_gguf
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
    want = v.verify(DraftTree.root_only(tokens[-1]), "logits")[0]  # after prompt + tokens, one at a time
    first = v.prefill(prompt)
    assert first == tokens[0]
    # node 1 (first child, the batch's second cell) is rejected; the path goes through node 2
    tree = DraftTree.build([tokens[0], (tokens[1] + 1) % VOCAB, tokens[1], 7], [-1, 0, 0, 1])
    redecoded = v.n_redecoded
    out = v.verify(tree)
    assert out[2] == tokens[2]
    v.commit(np.array([0, 2], np.int32))
    assert v.n_redecoded == redecoded + 1          # node 2 decoded again, after node 0's cell
    assert_committed_only(v, len(prompt) + 2)
    for token in tokens[2:-1]:
        v.verify(DraftTree.root_only(token))
        v.commit(np.array([0], np.int32))
    np.testing.assert_array_equal(v.verify(DraftTree.root_only(tokens[-1]), "logits")[0], want)


def test_speculate_with_flash_attention_is_token_identical(flash_verifier):
    """No near-tie allowance: with flash attention and ordered cells the logits are bit-identical."""
    for prompt in PROMPTS:
        prompt = prompt * 3
        want, _ = plain_greedy(flash_verifier, prompt, 40)
        result = draftcore_speculate(flash_verifier, np.array(prompt, np.int32), max_new_tokens=40, budget=12)
        assert result.tokens.tolist() == want


def draftcore_speculate(*args, **kwargs):
    import draftcore
    return draftcore.speculate(*args, **kwargs)


# ---------------------------------------------------------------- `draftcore bench --backend llamacpp` and the example

@pytest.fixture(scope="module")
def packaged_gguf():
    bench = pytest.importorskip("draftcore.adapters.llamacpp.bench")
    try:
        return bench.default_gguf()
    except DraftcoreError as exc:
        pytest.skip(str(exc))


def test_bench_methods_on_the_packaged_model(packaged_gguf):
    from draftcore.adapters.llamacpp import bench
    handle, tokenizer = bench.load_model(packaged_gguf, n_threads=1, n_ctx=512)  # a path: llama.cpp tokenizes
    assert tokenizer is handle.llm and 2 in handle.eos_ids
    prompts = bench.load_prompts(tokenizer, "humaneval", 1) + bench.load_prompts(tokenizer, "mtbench", 1)
    assert prompts[1].ids[0] == handle.llm.tokenize(b"<|im_start|>", add_bos=False, special=True)[0]
    methods = bench.make_methods(handle, tokenizer, ["plain", "prompt_lookup", "trie", "trie-fixed4"])
    for prompt in prompts:
        for m in methods:
            m.reset()
        runs = [m.run(prompt.ids, 8) for m in methods]
        reference = runs[0].tokens
        assert reference.dtype == np.int32 and len(reference) == 8 and runs[0].steps == 8
        for m, run in zip(methods, runs):
            np.testing.assert_array_equal(run.tokens, reference, err_msg=m.name)
            assert 1 <= run.steps <= 8 and run.seconds > 0
        np.testing.assert_array_equal(bench.plain_greedy(handle, tokenizer, prompt.ids, 8), reference)
    with pytest.raises(ConfigError, match="methods"):
        bench.make_methods(handle, tokenizer, ["plain", "trie-fixed99"])
    with pytest.raises(ConfigError, match="dtype"):
        bench.load_model(packaged_gguf, dtype="float16")
    with pytest.raises(InputError, match="dataset"):
        bench.load_prompts(tokenizer, "gsm8k", 1)


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

@pytest.mark.parametrize("variant", ["exact", "no_removal"])
def test_speculative_sampling_matches_the_exact_distribution(verifier, reference, monkeypatch, variant):
    """Speculative sampling through llama.cpp (verify(tree, "logits"), trie-drafted trees) against the
    exact distribution of the first 3 new tokens, enumerated from one-token forwards of the reference
    context with the same processors (T=0.8, top-k 3: 27 sequences). Chi-square, fixed seeds. The
    planted variant (a rejected child's mass not removed) must fail the same test."""
    import draftcore
    import draftcore.sampling
    from draftcore.processors import LogitsProcessor, softmax
    from naive_sampling import goodness_of_fit, naive_sample_step

    if variant != "exact":
        monkeypatch.setattr(draftcore.sampling, "sample_step",
                            lambda *args: naive_sample_step(*args, variant))

    params = dict(temperature=0.8, top_k=3)
    length, n_samples = 3, 1500
    prompt = np.array(PROMPTS[0] * 2, np.int32)

    exact = {}

    def enumerate_from(prefix, prob):
        if len(prefix) == length:
            exact[tuple(prefix)] = prob
            return
        processor = LogitsProcessor.from_params(draftcore.SamplingParams(**params), VOCAB)
        context = np.r_[prompt, prefix].astype(np.int32)
        processor.start(context)
        p = softmax(processor.process_next(reference.last(context))[None])[0].astype(np.float64)
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
