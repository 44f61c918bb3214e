"""HFVerifier (draftcore.adapters.torch_hf): tree forwards, commits, greedy exactness, refusals.

The reference for every tree node is a plain causal forward over prompt + the node's root path: a
tree-masked forward must give the same logits, and speculative greedy output must equal
`model.generate(do_sample=False)`. "The same" within float noise: a forward over k tokens reduces in
another order than k one-token forwards, so fp32 logits differ by ~1e-6 relative, and a greedy run
may diverge after a near-tie, a step whose top-2 logits are closer than that noise
(docs/design.md, section "Numerics"; `assert_same_greedy` reports such a divergence, not fails).
"""
from __future__ import annotations

import inspect
import re
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub from tests

import draftcore  # noqa: E402
from draftcore import BackendError, ConfigError, DraftcoreError, DraftTree, InputError  # noqa: E402
from draftcore.acceptance import greedy_accept  # noqa: E402
from draftcore.adapters.torch_hf import HFVerifier  # noqa: E402
from draftcore.adapters.torch_hf.kv_cache import cache_keyword  # noqa: E402
from draftcore.adapters.torch_hf.selfcheck import check_tree_attention  # noqa: E402
from draftcore.selfcheck import N_POSITIONS  # noqa: E402
from fixtures.tiny_llama import tiny_llama  # noqa: E402
from transformers import DynamicCache, LlamaForCausalLM  # noqa: E402

FP32_ATOL = 1e-4
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ATTENTIONS = ["sdpa", "eager", "draftcore_sdpa"]   # the last: gqa_attention.py, grouped heads under a mask


# ------------------------------------------------------------------ helpers

def random_tree(rng, n: int, shape: str, vocab: int) -> DraftTree:
    """A tree of n nodes: "chain" (one deep branch), "bush" (every node a child of the root),
    "random" (each node's parent uniform over earlier nodes), "binary" (node i's parent (i-1)//2)."""
    if shape == "chain":
        parents = np.arange(-1, n - 1)
    elif shape == "bush":
        parents = np.r_[-1, np.zeros(n - 1, int)]
    elif shape == "random":
        parents = np.r_[-1, [rng.integers(0, i) for i in range(1, n)]]
    elif shape == "binary":
        parents = np.r_[-1, (np.arange(1, n) - 1) // 2]
    else:
        raise ValueError(shape)
    return DraftTree.build(rng.integers(0, vocab, n), parents)


def assert_tree_matches_plain(verifier, context, tree, logits, atol=FP32_ATOL):
    """Every node's logits equal a plain forward over context + the node's root path."""
    leaves = tree.leaves()
    covered = np.zeros(len(tree), bool)
    for leaf in leaves:
        path = _node_path(tree, leaf)
        want = verifier.plain_logits(np.r_[context, tree.tokens[path]])[-len(path):]
        np.testing.assert_allclose(logits[path], want, atol=atol, rtol=0,
                                   err_msg=f"leaf {leaf} of {tree!r}")
        covered[path] = True
    assert covered.all()


def _node_path(tree, node):
    path = []
    while node >= 0:
        path.append(node)
        node = tree.parents[node]
    return np.array(path[::-1])


def generate_greedy(model, prompt, max_new_tokens, eos_token_id=None):
    """int32[k]: transformers' own greedy decoding, the baseline speculative output must equal."""
    ids = torch.from_numpy(np.asarray(prompt, np.int64))[None].to(model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    return out[0, ids.shape[1]:].cpu().numpy().astype(np.int32)


def assert_same_greedy(verifier, prompt, got, want, tie_tol):
    """got == want token for token, except after a near-tie (module docstring): a first mismatch
    where the baseline's top-2 logits differ by less than tie_tol is reported, not failed."""
    n = min(len(got), len(want))
    mismatch = np.flatnonzero(got[:n] != want[:n])
    if mismatch.size == 0:
        assert len(got) == len(want), (got, want)
        return
    i = int(mismatch[0])
    top2 = np.sort(verifier.plain_logits(np.r_[prompt, want[:i]])[-1])[-2:]
    gap = float(top2[1] - top2[0])
    assert gap < tie_tol, f"real mismatch at token {i} (top-2 gap {gap:.3g}): got {got}, want {want}"
    print(f"near-tie at token {i} (top-2 gap {gap:.2g}); outputs diverge from there")


@pytest.fixture(scope="module")
def tiny_models():
    return {attn: tiny_llama(seed=0, attn_implementation=attn) for attn in ATTENTIONS}


@pytest.fixture(scope="module", params=[{1: "torch"}, {1: "weight-major"}, {1: "packed"},
                                        {2: "weight-major", 3: "packed"}],
                ids=["linear", "weight-major", "packed", "weight-major-then-packed"])
def verifiers(tiny_models, request):
    """Every tree test runs four times: the decoder's Linear layers as torch runs them, all of them
    as `W @ x.T` inside WeightMajorLinear (weight_major.py), all of them (the head too) through
    oneDNN on packed weights (packed_linear.py), and forwards of 1-2 tokens as `W @ x.T`, larger
    ones packed; on the tiny models timing would pick by chance."""
    return {attn: HFVerifier(model, linear_ways=request.param) for attn, model in tiny_models.items()}


# ------------------------------------------------------------------ tree forwards

@pytest.mark.parametrize("attn", ATTENTIONS)
@pytest.mark.parametrize("shape,n", [("chain", 1), ("chain", 12), ("bush", 16), ("binary", 15),
                                     ("random", 24), ("random", 40)])
def test_tree_logits_equal_per_branch_plain_logits(verifiers, attn, shape, n):
    verifier = verifiers[attn]
    rng = np.random.default_rng(n)
    prompt = rng.integers(0, verifier.vocab_size, 11).astype(np.int32)
    tree = random_tree(rng, n, shape, verifier.vocab_size)
    verifier.prefill(prompt)
    tokens, logits = verifier.verify(tree, n)
    assert logits.shape == (n, verifier.vocab_size) and logits.dtype == np.float32
    assert verifier.n_past == len(prompt)  # nothing committed yet
    assert_tree_matches_plain(verifier, prompt, tree, logits)
    # argmax is taken on the device from the same logits: same tokens, int32 on the host
    assert tokens.dtype == np.int32 and tokens.shape == (n,)
    np.testing.assert_array_equal(tokens, logits.argmax(-1))


@pytest.mark.parametrize("attn", ATTENTIONS)
def test_verify_returns_the_first_n_logits_rows_and_every_nodes_argmax(verifiers, attn):
    """verify(tree, k) returns exactly k rows, equal to the first k rows of verify(tree, n), and
    the argmax of every node's full logits (the lookahead nodes' included), whatever k is."""
    verifier = verifiers[attn]
    rng = np.random.default_rng(21)
    prompt = rng.integers(0, verifier.vocab_size, 9).astype(np.int32)
    candidates = random_tree(rng, 7, "random", verifier.vocab_size)
    window = rng.integers(0, verifier.vocab_size, 5)  # a lookahead chain under the root
    tree = DraftTree.build(np.r_[candidates.tokens, window],
                           np.r_[candidates.parents, 0, np.arange(7, 11)], n_lookahead=5)
    n = len(tree)
    verifier.prefill(prompt)
    full_tokens, full = verifier.verify(tree, n)
    np.testing.assert_array_equal(full_tokens, full.argmax(-1))
    for k in (0, 1, 3, tree.n_candidates, n):
        tokens, logits = verifier.verify(tree, k)  # replaces the previous tree: the same forward again
        assert logits.shape == (k, verifier.vocab_size) and logits.dtype == np.float32
        assert logits.flags.c_contiguous
        np.testing.assert_array_equal(logits, full[:k])
        assert tokens.dtype == np.int32 and tokens.shape == (n,)
        np.testing.assert_array_equal(tokens, full.argmax(-1))
    verifier.commit(np.array([0], np.int32))
    assert verifier.n_past == len(prompt) + 1


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_matches_plain_forward(tiny_models, device):
    model = tiny_models["sdpa"].to(device)
    try:
        verifier = HFVerifier(model)
        prompt = np.arange(3, 40, 3, dtype=np.int32)
        tokens, logits = verifier.prefill(prompt, 1)
        assert logits.shape == (1, verifier.vocab_size) and logits.dtype == np.float32
        np.testing.assert_allclose(logits[0], verifier.plain_logits(prompt)[-1], atol=FP32_ATOL, rtol=0)
        assert tokens.dtype == np.int32 and tokens.tolist() == [int(logits.argmax())]
        assert verifier.n_past == len(prompt)
        tokens_only, no_logits = verifier.prefill(prompt)  # n_logits=0: the argmax alone
        assert no_logits.shape == (0, verifier.vocab_size) and no_logits.dtype == np.float32
        np.testing.assert_array_equal(tokens_only, tokens)
        assert verifier.n_past == len(prompt)
    finally:
        model.to("cpu")


@pytest.mark.parametrize("attn", ATTENTIONS)
def test_commit_gather_then_verify_equals_fresh_prefill(verifiers, attn):
    """Commit non-contiguous and contiguous paths, keep verifying: every later tree sees exactly
    the committed sequence, as a fresh prefill of that sequence would."""
    verifier = verifiers[attn]
    rng = np.random.default_rng(7)
    context = rng.integers(0, verifier.vocab_size, 9).astype(np.int32)
    verifier.prefill(context)
    for step, shape in enumerate(["random", "binary", "chain", "bush", "random"]):
        tree = random_tree(rng, 14, shape, verifier.vocab_size)
        _, logits = verifier.verify(tree, len(tree))
        assert_tree_matches_plain(verifier, context, tree, logits)
        leaf = tree.leaves()[-1] if step % 2 == 0 else tree.leaves()[0]  # last leaf: a gather
        path = _node_path(tree, leaf).astype(np.int32)
        verifier.commit(path)
        context = np.r_[context, tree.tokens[path]].astype(np.int32)
        assert verifier.n_past == len(context)
    # one more root-only step against a fresh prefill of everything committed
    got = verifier.verify(DraftTree.root_only(5), 1)[1][0]
    fresh = HFVerifier(verifier.model, self_check=False)
    want = fresh.prefill(np.r_[context, 5].astype(np.int32), 1)[1][0]
    np.testing.assert_allclose(got, want, atol=FP32_ATOL, rtol=0)


def test_verify_again_without_commit_replaces_the_tree(verifiers):
    verifier = verifiers["sdpa"]
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, verifier.vocab_size, 10).astype(np.int32)
    verifier.prefill(prompt)
    first = random_tree(rng, 8, "random", verifier.vocab_size)
    second = random_tree(rng, 6, "binary", verifier.vocab_size)
    verifier.verify(first)
    _, logits = verifier.verify(second, len(second))  # the first tree's KV must be gone
    assert_tree_matches_plain(verifier, prompt, second, logits)
    verifier.commit(np.array([0, 2, 5], np.int32))  # a gather in the second tree (binary: 5 -> 2 -> 0)
    assert verifier.n_past == len(prompt) + 3


# ------------------------------------------------------------------ greedy exactness

def _oracle_tree(root, truth, rng, vocab, branches=3, depth=5):
    """A bush of `branches` chains under `root`; the true continuation is the LAST chain (so an
    accepted path is never the first k nodes: commit must gather) and its tail is cut at a random
    depth, after which it goes wrong."""
    tokens, parents = [root], [-1]
    keep = rng.integers(0, depth + 1)
    for b in range(branches):
        prev = 0
        for d in range(depth):
            if b == branches - 1 and d < min(keep, len(truth)):
                token = truth[d]
            else:
                token = rng.integers(0, vocab)
            tokens.append(token)
            parents.append(prev)
            prev = len(tokens) - 1
    return DraftTree.build(tokens, parents)


@pytest.mark.parametrize("attn", ATTENTIONS)
def test_manual_greedy_loop_with_gathers_equals_generate(tiny_models, verifiers, attn):
    """A loop written out here (prefill, verify, greedy_accept, commit), fed trees that hold the
    baseline's own continuation on a non-first branch, reproduces model.generate exactly."""
    model, verifier = tiny_models[attn], verifiers[attn]
    rng = np.random.default_rng(11)
    prompt = rng.integers(2, verifier.vocab_size, 16).astype(np.int32)
    n_new = 40
    want = generate_greedy(model, prompt, n_new)
    out = [int(verifier.prefill(prompt)[0][0])]
    accepted = []
    while len(out) < n_new:
        tree = _oracle_tree(out[-1], want[len(out):], rng, verifier.vocab_size)
        path, next_token = greedy_accept(tree.tokens, tree.parents, verifier.verify(tree)[0], len(tree))
        verifier.commit(path)
        accepted.append(len(path) - 1)
        out.extend(tree.tokens[path[1:]].tolist() + [int(next_token)])
    np.testing.assert_array_equal(np.array(out[:n_new], np.int32), want)
    assert max(accepted) >= 3  # long non-contiguous paths were really committed


@pytest.mark.parametrize("attn", ATTENTIONS)
@pytest.mark.parametrize("budget", [1, 8, 24])
def test_speculate_greedy_equals_generate(tiny_models, verifiers, attn, budget):
    model, verifier = tiny_models[attn], verifiers[attn]
    for seed in range(3):
        rng = np.random.default_rng(seed)
        block = rng.integers(2, verifier.vocab_size, 12)
        prompt = np.r_[block, block, block[:5]].astype(np.int32)  # repetition the trie can draft from
        result = draftcore.speculate(verifier, prompt, max_new_tokens=48, budget=budget, eos_token_id=1)
        want = generate_greedy(model, prompt, 48, eos_token_id=1)
        assert_same_greedy(verifier, prompt, result.tokens, want, tie_tol=1e-4)


@pytest.mark.parametrize("attn", ATTENTIONS)
def test_bare_speculate_call_equals_generate(tiny_models, attn):
    """`draftcore.speculate(verifier, prompt)` with no drafter and no budget (the verifier's own
    Session: a TrieDrafter and a CostAwareBudget that learn across calls) is plain greedy decoding.
    Whether the auto budget drafts depends on this machine's timings (on a loaded CI machine it
    once verified the root alone), so what the session's drafter learnt is checked under a fixed
    budget: its drafts are accepted."""
    model = tiny_models[attn]
    verifier = HFVerifier(model)
    prompts, wants = [], []
    for seed in range(4):
        rng = np.random.default_rng(100 + seed)
        block = rng.integers(2, verifier.vocab_size, 12)
        prompts.append(np.r_[block, block, block[:5]].astype(np.int32))
        wants.append(generate_greedy(model, prompts[-1], 48, eos_token_id=1))
        result = draftcore.speculate(verifier, prompts[-1], max_new_tokens=48, eos_token_id=1)
        assert_same_greedy(verifier, prompts[-1], result.tokens, wants[-1], tie_tol=1e-4)
    session = draftcore.Session.of(verifier)
    assert isinstance(session.drafter, draftcore.TrieDrafter) and session.drafter is session.drafter
    assert isinstance(session.budget, draftcore.CostAwareBudget)
    steps = tokens = 0
    for prompt, want in zip(prompts, wants):
        result = draftcore.speculate(verifier, prompt, max_new_tokens=48, eos_token_id=1, budget=16)
        assert_same_greedy(verifier, prompt, result.tokens, want, tie_tol=1e-4)
        steps, tokens = steps + result.stats.steps, tokens + result.stats.new_tokens
    assert tokens > 2 * steps  # the session's drafter learnt the outputs: its drafts are accepted


# ------------------------------------------------------------------ the split head (head.py)

class ScaledLogitsLlama(LlamaForCausalLM):
    """A forward that is more than decoder + head (as logit scaling or soft-capping models are)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 0.5
        return out


def _copy_into(cls, seed=0):
    source = tiny_llama(seed=seed)
    model = cls(source.config)
    model.load_state_dict(source.state_dict())
    return model.eval()


def test_split_head_is_used_on_cpu_for_a_plain_linear_head(verifiers):
    assert all(v.split_head for v in verifiers.values())  # so the tree tests above exercise it
    assert len({tuple(v.linear_ways.items()) for v in verifiers.values()}) == 1


def test_packed_linear_equals_f_linear_repacks_changed_weights_and_passes_the_rest_through():
    """Inside the mode, F.linear of a packed weight (1, 2 and 7 rows, 2-D and 3-D, with and without
    bias) equals torch's own; a weight changed in place is packed again (never a stale copy); a
    replaced weight, another dtype and an unpacked weight are left to torch."""
    from draftcore.adapters.torch_hf.packed_linear import PackedLinears

    gen = torch.Generator().manual_seed(0)
    linear, other = torch.nn.Linear(16, 48), torch.nn.Linear(16, 8)
    packed = PackedLinears([linear])
    assert len(packed) == 1 and packed.nbytes == 48 * 16 * 4
    f = torch.nn.functional.linear
    with torch.inference_mode():
        for shape in [(1, 16), (2, 16), (1, 7, 16), (3, 1, 16)]:
            x = torch.randn(*shape, generator=gen)
            for b in (None, linear.bias):
                want = f(x, linear.weight, b)
                with packed.mode():
                    got = f(x, linear.weight, b)
                assert packed.linear(x, linear.weight, b) is not None   # the packed path ran
                assert got.shape == want.shape and got.view(*shape[:-1], 6, 8).shape[-2:] == (6, 8)
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    x = torch.randn(5, 16, generator=gen)
    with torch.no_grad():
        linear.weight.mul_(-3.0)   # in place: the version counter moves
    with torch.inference_mode(), packed.mode():
        torch.testing.assert_close(f(x, linear.weight, linear.bias), x @ linear.weight.T + linear.bias,
                                   atol=1e-5, rtol=1e-5)
        assert packed.linear(x, other.weight) is None and packed.linear(x.double(), linear.weight) is None
        torch.testing.assert_close(f(x, other.weight), x @ other.weight.T, atol=1e-6, rtol=1e-6)
        replaced = torch.nn.Parameter(torch.randn(48, 16, generator=gen))
        assert packed.linear(x, replaced) is None
        with pytest.raises(RuntimeError):   # what torch says outside the mode too
            f(x.double(), linear.weight)


def test_packed_linear_is_checked_chosen_and_validated(tiny_models):
    """True packs (or is a ConfigError naming why it cannot); None measures; a model whose logits
    change under the mode, a forward that is more than decoder + head, and a float64 model are not
    packed by default and refused when True; a bad value is a ConfigError."""
    model = tiny_models["sdpa"]
    first, second = HFVerifier(model, packed_linear=True), HFVerifier(model, packed_linear=True)
    assert first.packed_linear and "packed" in first.linear_ways.values()
    assert "torch" not in first.linear_ways.values()   # the packed weights stand in for torch's Linear
    assert first._split_head.packed is second._split_head.packed   # one copy of the weights per model
    assert not HFVerifier(model, packed_linear=False).packed_linear
    assert "packed" not in HFVerifier(model, packed_linear=False).linear_ways.values()
    assert isinstance(HFVerifier(model).packed_linear, bool)
    sensitive = _copy_into(LinearSensitiveLlama)
    assert not HFVerifier(sensitive).packed_linear
    from draftcore.adapters.torch_hf import packed_linear   # copies made but not used are not kept
    assert packed_linear.shared(sensitive.get_decoder(), sensitive.get_output_embeddings()) is None
    with pytest.raises(ConfigError, match="packed_linear=True, but the model's logits through oneDNN differ"):
        HFVerifier(sensitive, packed_linear=True)
    with pytest.raises(ConfigError, match="linear_ways=.*packed.*, but the model's logits through oneDNN differ"):
        HFVerifier(sensitive, linear_ways={4: "torch", 16: "packed"})
    with pytest.raises(ConfigError, match="packed_linear=True, but the model's forward is more than"):
        HFVerifier(_copy_into(ScaledLogitsLlama), packed_linear=True)
    double = tiny_llama(seed=0).double()
    assert not HFVerifier(double).packed_linear
    with pytest.raises(ConfigError, match="no float32 CPU Linear layers"):
        HFVerifier(double, packed_linear=True)
    for bad in (1, "yes", 0.5):
        with pytest.raises(ConfigError, match="packed_linear"):
            HFVerifier(model, packed_linear=bad)
    with pytest.raises(ConfigError, match="runs some sizes packed, but packed_linear=False"):
        HFVerifier(model, linear_ways={1: "packed"}, packed_linear=False)
    with pytest.raises(ConfigError, match="runs no sizes packed, but packed_linear=True"):
        HFVerifier(model, linear_ways={1: "torch"}, packed_linear=True)
    assert HFVerifier(model, linear_ways={4: "torch", 16: "packed"}, packed_linear=True).packed_linear


def test_packed_linear_by_default_only_where_the_copies_fit_in_memory(tiny_models, monkeypatch):
    """The default never packs weights that would take more than a quarter of the available memory
    (measured faster or not); True packs regardless."""
    from draftcore.adapters.torch_hf import head, packed_linear

    model = tiny_models["sdpa"]
    nbytes = packed_linear.linear_bytes(model.get_decoder(), model.get_output_embeddings())
    assert 0 < nbytes and packed_linear.fits_in_memory(nbytes) and not packed_linear.fits_in_memory(2 ** 62)
    monkeypatch.setattr(packed_linear, "_available_memory", lambda: 4 * nbytes - 1)
    assert not packed_linear.fits_in_memory(nbytes)
    # packed would win wherever it may run: memory alone decides
    monkeypatch.setattr(head, "_linear_plan", lambda *args, **kw: ({1: args[-1][-1]}, {}))
    assert not HFVerifier(model).packed_linear
    assert HFVerifier(model, packed_linear=True).packed_linear


# Planted medians (ms) of the decoder + head by tokens: (torch's Linear, W @ x.T, packed).
_SLOW_MEMORY = {1: (58, 50, 51), 2: (70, 41, 50), 4: (75, 60, 52), 8: (80, 70, 53), 16: (95, 90, 60)}
_PACKED_EVERYWHERE = {1: (27, 26, 21), 2: (40, 24, 22), 4: (45, 30, 23), 8: (55, 40, 28), 16: (80, 60, 40)}
# construction's medians on the second 2-core EPYC: a split "from 1 token up" kept torch's Linear everywhere
_SECOND_MACHINE = {1: (79, 107, 95), 2: (102, 95, 98), 4: (131, 98, 106), 8: (138, 126, 120), 16: (175, 174, 156)}
_WEIGHT_MAJOR_EVERYWHERE = {1: (58, 50, 52), 2: (70, 41, 43), 4: (75, 50, 58), 8: (80, 70, 79), 16: (95, 88, 90)}
_TIES = {n: (50, 50, 50) for n in (1, 2, 4, 8, 16)}
_ALL = ("torch", "weight-major", "packed")


@pytest.mark.parametrize("table,usable,want", [
    (_SLOW_MEMORY, _ALL, "WW" + "PPP"),
    (_PACKED_EVERYWHERE, _ALL, "PPPPP"),
    (_SECOND_MACHINE, _ALL, "TWWPP"),
    (_SECOND_MACHINE, ("torch", "weight-major"), "TWWWW"),
    (_SECOND_MACHINE, ("torch", "packed"), "TPPPP"),
    (_WEIGHT_MAJOR_EVERYWHERE, _ALL, "WWWWW"),
    (_TIES, _ALL, "TTTTT"),            # torch's own Linear wins a tie
])
def test_linear_plan_keeps_the_fastest_way_per_size(tiny_models, monkeypatch, table, usable, want):
    """Which way runs which forward size follows construction's medians, size by size: the least
    median among the usable ways (torch's own on a tie); only the usable ways are timed."""
    from draftcore.adapters.torch_hf import head, packed_linear

    timed = []

    def planted(calls, reps=3):
        timed.extend(calls)
        return {(n, way): table[n][_ALL.index(way)] / 1e3 for n, way in calls}

    monkeypatch.setattr(head, "interleaved_medians", planted)
    model = tiny_models["sdpa"]
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    linears = packed_linear.PackedLinears.of(decoder, lm_head)
    ways, timings = head._linear_plan(decoder, lm_head, linears, model.config.vocab_size, torch.device("cpu"),
                                      list(usable))
    assert "".join(way[0].upper() for _, way in sorted(ways.items())) == want
    assert {way for _, way in timed} == set(usable)
    assert timings[16] == {way: table[16][_ALL.index(way)] for way in usable}


def test_packed_linear_true_runs_the_largest_trees_packed_even_where_w_x_t_wins(tiny_models, monkeypatch):
    """Asked for, the packed weights stand in for torch's Linear: they run the sizes where they beat
    `W @ x.T`, and the largest trees even where they beat it nowhere."""
    from draftcore.adapters.torch_hf import head

    real = head.interleaved_medians

    def planted(table):
        def medians(calls, reps=3):
            if not all(isinstance(key, tuple) for key in calls):
                return real(calls, reps)   # two_rows_beat_one
            return {(n, way): table[n][_ALL.index(way)] / 1e3 for n, way in calls}
        return medians

    model = tiny_models["sdpa"]
    monkeypatch.setattr(head, "interleaved_medians", planted(_WEIGHT_MAJOR_EVERYWHERE))
    assert HFVerifier(model, packed_linear=True).linear_ways == {1: "weight-major", 2: "weight-major",
                                                                 4: "weight-major", 8: "weight-major", 16: "packed"}
    monkeypatch.setattr(head, "interleaved_medians", planted(_SECOND_MACHINE))
    assert HFVerifier(model, packed_linear=True).linear_ways == {1: "packed", 2: "weight-major",
                                                                 4: "weight-major", 8: "packed", 16: "packed"}
    assert HFVerifier(model).linear_ways == {1: "torch", 2: "weight-major", 4: "weight-major", 8: "packed",
                                             16: "packed"}


def test_split_head_runs_small_forwards_weight_major_and_larger_ones_packed(tiny_models, monkeypatch):
    """With ways {2: weight-major, 16: packed}, forwards of 1-2 tokens never enter the packed mode
    and larger ones do; every size gives the model's own logits."""
    from draftcore.adapters.torch_hf import packed_linear
    from draftcore.adapters.torch_hf.head import SplitHead

    model = tiny_models["sdpa"]
    linears = packed_linear.PackedLinears.of(model.get_decoder(), model.get_output_embeddings())
    entered = []
    mode = linears.mode
    monkeypatch.setattr(linears, "mode", lambda: entered.append(True) or mode())
    split = SplitHead(model.get_decoder(), model.get_output_embeddings(), ways={2: "weight-major", 16: "packed"},
                      packed=linears)
    assert [split.way(n) for n in (1, 2, 3, 16, 40)] == ["weight-major"] * 2 + ["packed"] * 3
    for n in range(1, 6):
        ids = torch.arange(3, 3 + n)[None]
        del entered[:]
        with torch.inference_mode():
            got, want = split(input_ids=ids, use_cache=False), model(input_ids=ids).logits[0]
        assert bool(entered) == (n > 2)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_weight_major_linear_equals_f_linear_or_passes_through():
    """Inside the mode, CPU F.linear of 1, 2 and 7 rows (with and without bias, 2-D and 3-D input)
    equals torch's own; a dtype mismatch is left to torch, which raises as it would outside."""
    from draftcore.adapters.torch_hf.weight_major import WeightMajorLinear

    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(48, 16, generator=gen), torch.randn(48, generator=gen)
    for shape in [(1, 16), (2, 16), (1, 7, 16), (3, 1, 16)]:
        x = torch.randn(*shape, generator=gen)
        for b in (None, bias):
            want = torch.nn.functional.linear(x, weight, b)
            with WeightMajorLinear():
                got = torch.nn.functional.linear(x, weight, b)
                viewed = got.view(*shape[:-1], 6, 8)  # callers reshape the result with .view()
            assert got.shape == want.shape and got.is_contiguous()
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            assert viewed.shape[-2:] == (6, 8)
    with pytest.raises(RuntimeError), WeightMajorLinear():
        torch.nn.functional.linear(torch.ones(2, 16, dtype=torch.float64), weight)


def test_linear_ways_are_measured_checked_and_validated(tiny_models):
    """The default times each way at 1-16 tokens and reports what it kept; given ways are kept as
    given and nothing is timed; a model whose decoder gives other logits inside the mode never runs
    W @ x.T, and asking for it there is a ConfigError; a bad value is a ConfigError naming it."""
    from draftcore.adapters.torch_hf.head import WAYS

    model = tiny_models["sdpa"]
    measured = HFVerifier(model)
    assert set(measured.linear_ways) == set(measured.linear_timings) == {1, 2, 4, 8, 16}
    assert set(measured.linear_ways.values()) <= set(WAYS)
    assert measured.kernel_choices["linear_ways"] == measured.linear_ways
    given = HFVerifier(model, linear_ways={3: "weight-major", 9: "torch"})
    assert given.linear_ways == {3: "weight-major", 9: "torch"} and given.linear_timings == {}
    sensitive = _copy_into(LinearSensitiveLlama)
    assert "weight-major" not in HFVerifier(sensitive).linear_ways.values()
    with pytest.raises(ConfigError, match="linear_ways=.*, but the model's logits with its Linear layers as W @ x.T"):
        HFVerifier(sensitive, linear_ways={8: "weight-major"})
    for bad in ({}, [1], {0: "torch"}, {"4": "torch"}, {True: "torch"}, {2.0: "torch"}, {1: "fast"}):
        with pytest.raises(ConfigError, match="linear_ways: expected a non-empty dict"):
            HFVerifier(model, linear_ways=bad)


@pytest.mark.parametrize("pad_single_row", [False, True])
def test_split_head_one_row_either_way_equals_the_model(tiny_models, pad_single_row):
    """A one-node verify's logits through the split head, padded to two rows or not (the choice
    two_rows_beat_one makes per machine), equal the model's own forward."""
    from draftcore.adapters.torch_hf.head import SplitHead, two_rows_beat_one

    model = tiny_models["sdpa"]
    split = SplitHead(model.get_decoder(), model.get_output_embeddings(), pad_single_row=pad_single_row)
    ids = torch.arange(3, 10)[None]
    with torch.inference_mode():
        got = split(input_ids=ids, use_cache=False)
        want = model(input_ids=ids, use_cache=False).logits[0]
        one = split(input_ids=ids[:, :1], use_cache=False)
    torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=0)
    assert one.shape == (1, model.config.vocab_size)
    torch.testing.assert_close(one, want[:1], atol=FP32_ATOL, rtol=0)
    assert isinstance(two_rows_beat_one(model.get_output_embeddings().weight), bool)


@pytest.mark.parametrize("variant", ["scaled logits", "head with bias"])
def test_split_head_reproduces_the_model_or_is_not_used(variant):
    """A forward that scales its logits must not get the split head (it would return unscaled
    logits); a Linear head with a bias gets it, bias included. Either way tree logits equal the
    model's own plain forwards."""
    if variant == "scaled logits":
        model = _copy_into(ScaledLogitsLlama)
    else:
        model = tiny_llama(seed=0)
        with torch.no_grad():
            bias = torch.linspace(-2.0, 2.0, model.lm_head.out_features)
            model.lm_head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)
            model.lm_head.bias.copy_(bias)
    verifier = HFVerifier(model)
    assert verifier.split_head is (variant == "head with bias")
    rng = np.random.default_rng(3)
    context = rng.integers(0, verifier.vocab_size, 9).astype(np.int32)
    tree = random_tree(rng, 12, "random", verifier.vocab_size)
    verifier.prefill(context)
    assert_tree_matches_plain(verifier, context, tree, verifier.verify(tree, len(tree))[1])


class LinearSensitiveLlama(LlamaForCausalLM):
    """A model whose layers' output depends on the Linear kernel: under WeightMajorLinear its MLPs
    return zeros (standing in for any module whose F.linear must not be rerouted)."""

    def __init__(self, config):
        super().__init__(config)
        for layer in self.model.layers:
            layer.mlp.register_forward_hook(_zero_when_rerouted)


def _zero_when_rerouted(module, args, output):
    from torch.overrides import _get_current_function_mode
    return output * 0 if _get_current_function_mode() is not None else output


# ------------------------------------------------------------------ the self-check

class MaskDroppingLlama(LlamaForCausalLM):
    """A model that throws the 4-D mask away (as some custom forwards do): tree nodes see cousins."""

    def forward(self, *args, attention_mask=None, **kwargs):
        return super().forward(*args, attention_mask=None, **kwargs)


def _mask_dropping_model():
    return _copy_into(MaskDroppingLlama)


def test_self_check_refuses_a_model_that_ignores_the_mask():
    with pytest.raises(BackendError, match="MaskDroppingLlama") as refused:
        HFVerifier(_mask_dropping_model())
    message = str(refused.value)  # the advice: what is wrong and the two ways out
    assert "4-D attention mask" in message and "attn_implementation='sdpa' or 'eager'" in message
    assert "self_check=False at your own risk" in message


def test_self_check_leaves_the_verifier_empty():
    verifier = HFVerifier(_mask_dropping_model(), self_check=False)
    assert not verifier.split_head  # the decoder would honour the mask its forward drops: not used
    with pytest.raises(BackendError, match="4-D attention mask"):
        check_tree_attention(verifier)
    assert verifier.n_past == 0
    with pytest.raises(InputError, match="before prefill"):
        verifier.verify(DraftTree.root_only(3))


def test_passing_self_check_leaves_the_verifier_empty(verifiers):
    fresh = HFVerifier(verifiers["sdpa"].model)
    assert fresh.n_past == 0
    with pytest.raises(InputError, match="before prefill"):
        fresh.verify(DraftTree.root_only(3))
    assert check_tree_attention(fresh) <= 1e-5  # fp32: ~1e-6 (selfcheck.RELATIVE_TOLERANCE)
    assert fresh.n_past == 0


def test_self_check_needs_its_positions():
    model = tiny_llama(seed=2)
    with pytest.raises(ConfigError, match=f"max_context: the tree-mask self-check needs {N_POSITIONS}"):
        HFVerifier(model, max_context=N_POSITIONS - 1)
    assert HFVerifier(model, max_context=N_POSITIONS - 1, self_check=False).max_context == N_POSITIONS - 1
    HFVerifier(model, max_context=N_POSITIONS)


# transformers >= 5.24 takes the cache as `cache`, and warns (FutureWarning, removal in 5.40) on `past_key_values`
NEW_CACHE_NAME = "cache" in inspect.signature(LlamaForCausalLM.forward).parameters


class OldCacheNameLlama(LlamaForCausalLM):
    """A forward declaring the cache by its name before transformers 5.24."""

    def forward(self, *args, past_key_values=None, **kwargs):
        name = "cache" if NEW_CACHE_NAME else "past_key_values"
        return super().forward(*args, **{name: past_key_values}, **kwargs)


def test_the_cache_is_passed_by_the_name_the_forward_declares():
    import warnings

    assert cache_keyword(OldCacheNameLlama(tiny_llama(seed=2).config)) == "past_key_values"
    assert cache_keyword(tiny_llama(seed=2)) == ("cache" if NEW_CACHE_NAME else "past_key_values")
    tree = DraftTree.build([5, 6, 7, 8], [-1, 0, 1, 0])
    for cls in (LlamaForCausalLM, OldCacheNameLlama):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            verifier = HFVerifier(_copy_into(cls))   # its self-check prefills, verifies and commits
            verifier.prefill(np.arange(2, 7, dtype=np.int32))
            tokens, _ = verifier.verify(tree)
            verifier.commit(np.array([0, 1], np.int32))
        deprecations = [str(w.message) for w in caught if "past_key_values" in str(w.message)]
        assert deprecations == [], (cls.__name__, deprecations)
        assert verifier.n_past == 7


class CacheIgnoringLlama(LlamaForCausalLM):
    """A forward that keeps its KV in a cache of its own instead of the one it is passed."""

    def forward(self, *args, **kwargs):
        keyword = cache_keyword(self)
        kwargs[keyword] = DynamicCache()
        return super().forward(*args, **kwargs)


def test_a_model_that_ignores_the_cache_is_a_backend_error():
    with pytest.raises(BackendError, match="does not use the KV cache"):
        HFVerifier(_copy_into(CacheIgnoringLlama))
    verifier = HFVerifier(_copy_into(CacheIgnoringLlama), self_check=False)
    with pytest.raises(BackendError, match="after prefill the KV cache holds 0 positions, expected 5"):
        verifier.prefill(np.arange(2, 7, dtype=np.int32))
    assert verifier.n_past == 0  # reset: nothing stale is kept


def test_refuses_maskless_attention_and_training_mode():
    model = tiny_llama(seed=1)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match="flash_attention_2"):
        HFVerifier(model, self_check=False)
    with pytest.raises(ConfigError, match="training mode"):
        HFVerifier(tiny_llama(seed=1).train(), self_check=False)
    with pytest.raises(ConfigError, match="model"):
        HFVerifier(object(), self_check=False)


# ------------------------------------------------------------------ bad input

@pytest.fixture
def prefilled(verifiers):
    verifier = verifiers["sdpa"]
    verifier.prefill(np.arange(2, 12, dtype=np.int32))
    return verifier


@pytest.mark.parametrize("prompt,match", [
    (np.zeros(0, np.int32), "empty"),
    (np.array([1.0, 2.0]), "dtype"),
    (np.array([[1, 2]], np.int32), "shape"),
    (np.array([1, 256], np.int32), "outside the vocabulary"),
    (np.array([-1], np.int32), "outside the vocabulary"),
])
def test_prefill_refuses_bad_prompts(prefilled, prompt, match):
    with pytest.raises(InputError, match=match):
        prefilled.prefill(prompt)
    assert prefilled.n_past == 10  # refused before any state changed


@pytest.mark.parametrize("bad", [-1, 2, 1.5, "logits", True, None])
def test_prefill_refuses_bad_n_logits(prefilled, bad):
    with pytest.raises(InputError, match=r"n_logits: expected an int in \[0, 1\]"):
        prefilled.prefill(np.arange(3, 9, dtype=np.int32), bad)
    assert prefilled.n_past == 10


def test_verify_refuses_bad_n_logits_and_changes_no_state(prefilled):
    """A bad n_logits is refused before the forward: the pending tree and its KV are untouched
    (committing it still works, and a later verify sees exactly the committed context)."""
    v = prefilled
    tree = DraftTree.build([3, 4, 5, 6], [-1, 0, 1, 0])
    n = len(tree)
    _, before = v.verify(tree, n)
    for bad in (-1, n + 1, 1.5, "logits"):
        with pytest.raises(InputError, match=rf"n_logits: expected an int in \[0, {n}\].*got"):
            v.verify(tree, bad)
        with pytest.raises(InputError, match=r"n_logits: expected an int in \[0, 2\]"):
            v.verify(DraftTree.chain(7, [8]), bad)
        assert v.n_past == 10
    v.commit(np.array([0, 3], np.int32))  # still the first tree's KV
    assert v.n_past == 12
    _, after = v.verify(DraftTree.root_only(9), 1)
    fresh = HFVerifier(v.model, self_check=False)
    _, want = fresh.prefill(np.r_[np.arange(2, 12), 3, 6, 9].astype(np.int32), 1)
    np.testing.assert_allclose(after, want, atol=FP32_ATOL, rtol=0)
    assert before.shape == (n, v.vocab_size)


def test_bad_verify_and_commit_calls(prefilled):
    v = prefilled
    with pytest.raises(InputError, match="DraftTree"):
        v.verify(np.array([3, 4], np.int32))
    with pytest.raises(InputError, match="outside the vocabulary"):
        v.verify(DraftTree.chain(3, [4, 999]))
    broken = DraftTree(np.array([3, 4, 5], np.int32), np.array([-1, 2, 0], np.int32), np.array([0, 1, 1], np.int32))
    with pytest.raises(InputError, match="malformed"):
        v.verify(broken)
    with pytest.raises(InputError, match="commit\\(\\) needs a verified tree"):
        v.commit(np.array([0], np.int32))
    assert v.n_past == 10

    tree = DraftTree.build([3, 4, 5, 6], [-1, 0, 1, 0])
    v.verify(tree)
    for path, match in [(np.zeros(0, np.int32), "non-empty"), (np.array([0.0, 1.0]), "int32"),
                        (np.array([1, 2], np.int32), "root"), (np.array([0, 4], np.int32), "\\[0, 4\\)"),
                        (np.array([0, 2], np.int32), "not a child"), (np.array([0, 3, 2], np.int32), "not a child")]:
        with pytest.raises(InputError, match=match):
            v.commit(path)
    assert v.n_past == 10
    v.commit(np.array([0, 1, 2], np.int32))  # still committable after the refusals
    assert v.n_past == 13
    with pytest.raises(InputError, match="verified tree"):
        v.commit(np.array([0], np.int32))  # each tree commits once


def test_context_limits():
    model = tiny_llama(seed=2)
    with pytest.raises(ConfigError, match="max_context"):
        HFVerifier(model, max_context=0)
    v = HFVerifier(model, max_context=16)
    with pytest.raises(InputError, match="max_context 16"):
        v.prefill(np.arange(17, dtype=np.int32))
    v.prefill(np.arange(12, dtype=np.int32))
    with pytest.raises(InputError, match="exceed max_context 16"):
        v.verify(DraftTree.chain(3, [4, 5, 6, 7]))
    v.verify(DraftTree.chain(3, [4, 5, 6]))  # exactly full is fine
    assert HFVerifier(model, self_check=False).max_context == model.config.max_position_embeddings


def test_every_refusal_is_a_draftcore_error():
    assert issubclass(InputError, DraftcoreError) and issubclass(ConfigError, DraftcoreError)
    assert issubclass(BackendError, DraftcoreError)


def test_text_methods_exist_only_with_a_tokenizer(verifiers):
    verifier = verifiers["sdpa"]
    assert not hasattr(verifier, "encode") and not hasattr(verifier, "decode")
    assert isinstance(verifier, draftcore.Verifier)


def test_missing_smollm2_package_is_a_draftcore_error(monkeypatch):
    from draftcore.adapters.torch_hf import smollm2
    monkeypatch.setattr(smollm2, "PACKAGE", "no_such_package_for_draftcore_tests")
    with pytest.raises(DraftcoreError, match="not installed"):
        smollm2.packaged_gguf()


def test_a_gguf_that_is_not_a_file_is_refused_by_name(tmp_path):
    from draftcore.adapters.torch_hf import smollm2
    missing = tmp_path / "smollm2.gguf"
    with pytest.raises(DraftcoreError, match="gguf: .*smollm2.gguf.*not a file"):
        smollm2.converted_folder(tmp_path / "cache", gguf=missing)
    assert not (tmp_path / "cache").exists()   # refused before anything was written


def test_import_draftcore_does_not_import_torch():
    code = "import sys, draftcore, draftcore.adapters; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ the real model

SMOLLM2_PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "List three primary colors, one per line:\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    from draftcore.adapters.torch_hf import load_smollm2
    from draftcore.adapters.torch_hf.smollm2 import packaged_gguf
    try:
        packaged_gguf()
    except DraftcoreError as exc:
        pytest.skip(str(exc))
    model, tokenizer = load_smollm2()
    return model, tokenizer, HFVerifier(model, tokenizer=tokenizer)


def test_smollm2_speculative_greedy_equals_generate(smollm2):
    model, tokenizer, verifier = smollm2
    assert verifier.vocab_size == 49152 and verifier.dtype == torch.float32
    assert model.config._attn_implementation == "draftcore_sdpa"   # load_smollm2's default: grouped under a mask
    assert check_tree_attention(verifier) <= 1e-4  # fp32: ~2e-6 here (selfcheck.RELATIVE_TOLERANCE)
    eos = tokenizer.eos_token_id
    for text in SMOLLM2_PROMPTS:
        prompt = verifier.encode(text)
        assert prompt.dtype == np.int32
        result = draftcore.speculate(verifier, prompt, max_new_tokens=24, budget=8, eos_token_id=eos)
        want = generate_greedy(model, prompt, 24, eos_token_id=eos)
        assert_same_greedy(verifier, prompt, result.tokens, want, tie_tol=1e-2)


def test_smollm2_text_prompt(smollm2):
    _, _, verifier = smollm2
    result = draftcore.speculate(verifier, SMOLLM2_PROMPTS[2], max_new_tokens=8)
    assert isinstance(result.text, str) and result.text == verifier.decode(result.tokens)


def _forward_hooks(model) -> list:
    return [h for m in (model, model.get_decoder()) for h in (*m._forward_hooks.values(),
                                                                *m._forward_pre_hooks.values())]


def test_bench_counts_every_forward_split_head_included():
    """The HF harness counts steps with a hook that also sees split-head verifies: plain greedy
    takes one forward per token, draftcore one per speculate step. The hook lives only while a
    run executes: none stays on the model."""
    from draftcore.tools.backends.hf import METHODS, make_methods

    assert METHODS == ("plain", "prompt_lookup", "nodraft", "bare", "trie")
    model = tiny_llama(seed=0)
    plain, trie, nodraft, bare = make_methods(model, None, names=("plain", "trie-fixed16", "nodraft", "bare"),
                                              eos_token_id=1)
    assert not _forward_hooks(model)
    block = np.random.default_rng(5).integers(2, model.config.vocab_size, 10)
    prompt = np.r_[block, block, block[:4]].astype(np.int32)
    want = plain.run(prompt, 32)
    assert want.steps == len(want.tokens)
    assert not _forward_hooks(model)
    got = trie.run(prompt, 32)
    result = draftcore.speculate(HFVerifier(model), prompt, max_new_tokens=32, budget=16, eos_token_id=1)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert got.steps == result.stats.steps < len(got.tokens)
    alone = nodraft.run(prompt, 32)  # the verifier's forward alone: one token per step, as plain
    np.testing.assert_array_equal(alone.tokens, want.tokens)
    assert alone.steps == len(alone.tokens) and alone.budgets == {0: len(alone.tokens) - 1}
    for _ in range(3):  # the bare call: the verifier's session, which keeps learning across runs
        called = bare.run(prompt, 32)
        np.testing.assert_array_equal(called.tokens, want.tokens)
        assert 1 <= called.steps <= len(called.tokens)  # how much it drafts is the auto budget's call, timed
    assert not _forward_hooks(model)


def test_bench_runs_any_drafter_with_a_fixed_budget_by_name():
    """"DRAFTER-fixedN": that drafter, FixedBudget(N): every step verifies at most N drafted nodes,
    and the output is plain greedy's."""
    from draftcore.tools.backends.hf import make_methods

    model = tiny_llama(seed=0)
    plain, ngram = make_methods(model, None, names=("plain", "ngram-fixed3"), eos_token_id=1)
    assert ngram.name == "draftcore ngram (budget 3)"
    block = np.random.default_rng(5).integers(2, model.config.vocab_size, 10)
    prompt = np.r_[block, block, block[:4]].astype(np.int32)
    got = ngram.run(prompt, 32)
    np.testing.assert_array_equal(got.tokens, plain.run(prompt, 32).tokens)
    assert max(got.budgets) == 3 and got.steps < len(got.tokens)
    with pytest.raises(ConfigError, match="DRAFTER-fixedN"):
        make_methods(model, None, names=("draft-fixed3",), eos_token_id=1)


def test_bench_removes_its_hook_when_a_run_fails():
    from draftcore.tools.backends.hf import make_methods

    model = tiny_llama(seed=0)
    (plain,) = make_methods(model, None, names=("plain",), eos_token_id=1)
    with pytest.raises(Exception):
        plain.run(np.array([999], np.int32), 4)  # outside the vocabulary: the embedding lookup fails
    assert not _forward_hooks(model)


def test_bench_load_tokenizer_reads_an_hf_folder(tmp_path):
    from draftcore.tools.backends.hf import load_tokenizer
    from draftcore.adapters.torch_hf.smollm2 import packaged_gguf
    try:
        packaged_gguf()
    except DraftcoreError as exc:
        pytest.skip(str(exc))
    smollm2_tokenizer = load_tokenizer()
    assert smollm2_tokenizer.vocab_size == 49152
    smollm2_tokenizer.save_pretrained(tmp_path)
    again = load_tokenizer(str(tmp_path))
    text = "def f(x):\n    return x"
    assert again.encode(text) == smollm2_tokenizer.encode(text)


def test_grouped_sdpa_equals_transformers_sdpa_and_delegates_the_rest():
    # draftcore_sdpa hands SDPA the grouped K/V heads under a mask instead of copies; same attention.
    from draftcore.adapters.torch_hf.gqa_attention import grouped_sdpa_attention_forward
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class Layer(torch.nn.Module):
        num_key_value_groups = 3
        is_causal = True

    gen = torch.Generator().manual_seed(0)
    key, value = torch.randn(1, 2, 9, 8, generator=gen), torch.randn(1, 2, 9, 8, generator=gen)
    for q_len, masked in ((4, True), (1, True), (4, False)):
        query = torch.randn(1, 6, q_len, 8, generator=gen)
        mask = None
        if masked:   # an additive tree mask: each query sees the cache and a random subset of the rest
            allowed = torch.rand(1, 1, q_len, 9, generator=gen) < 0.6
            allowed[..., :5] = True
            mask = torch.zeros(1, 1, q_len, 9).masked_fill(~allowed, torch.finfo(torch.float32).min)
        want, _ = sdpa_attention_forward(Layer(), query, key, value, mask, scaling=0.35)
        got, _ = grouped_sdpa_attention_forward(Layer(), query, key, value, mask, scaling=0.35)
        assert got.shape == want.shape == (1, q_len, 6, 8)
        if masked and q_len > 1:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        else:   # transformers' own path, untouched
            assert torch.equal(got, want)


def test_grouped_sdpa_leaves_plain_generate_bitwise_unchanged():
    # load_smollm2's default must not move the baseline: generate's unmasked prefill and one-token
    # decodes go to transformers' sdpa, so every logit is bitwise the one an sdpa model gives.
    ids = torch.randint(2, 256, (1, 40), generator=torch.Generator().manual_seed(3))
    outputs = []
    for attn in ("sdpa", "draftcore_sdpa"):
        model = tiny_llama(seed=0, attn_implementation=attn)
        with torch.inference_mode():
            outputs.append(model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                          do_sample=False, output_logits=True, return_dict_in_generate=True,
                                          pad_token_id=1))
    want, got = outputs
    assert torch.equal(got.sequences, want.sequences)
    assert all(torch.equal(g, w) for g, w in zip(got.logits, want.logits))


# ------------------------------------------------------------------ options refused at construction

@pytest.mark.parametrize("bad", ["no", 1, None])
def test_self_check_must_be_a_bool(tiny_models, bad, monkeypatch):
    """bool("no") is True: a coerced self_check="no" would run the check the user turned off."""
    ran = []
    monkeypatch.setattr("draftcore.adapters.torch_hf.verifier.check_tree_attention", ran.append)
    with pytest.raises(ConfigError, match=f"self_check: expected True or False, got {bad!r}"):
        HFVerifier(tiny_models["sdpa"], self_check=bad)
    assert not ran


@pytest.mark.parametrize("bad", [5, "gpt2", object()])
def test_tokenizer_without_encode_and_decode_is_refused_at_construction(tiny_models, bad):
    """Not later, in speculate, as AttributeError: 'int' object has no attribute 'encode'."""
    with pytest.raises(ConfigError, match=r"tokenizer: expected None or a tokenizer with encode\(text\) and "
                                          r"decode\(ids\).*got " + re.escape(repr(bad)[:20])):
        HFVerifier(tiny_models["sdpa"], self_check=False, tokenizer=bad)


def test_a_tokenizer_with_encode_and_decode_is_taken(tiny_models):
    class Bytes:
        def encode(self, text):
            return list(text.encode())

        def decode(self, ids):
            return bytes(ids).decode()

    verifier = HFVerifier(tiny_models["sdpa"], self_check=False, tokenizer=Bytes())
    assert verifier.decode(verifier.encode("hi")) == "hi"
