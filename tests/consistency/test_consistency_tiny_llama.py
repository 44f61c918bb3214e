"""The tiny random Llama (fp32) through every installed backend: the same greedy tokens from plain
decoding everywhere, speculative greedy equal to each backend's own plain greedy (every drafter),
and per-node tree logits equal to PyTorch's per-branch forwards within the numerics tolerance."""
import numpy as np
import pytest

import draftcore
import draftcore.tools.variants  # noqa: F401  (the variants kept for measurement are checked too)
from draftcore.drafters import drafter_names
from draftcore.tree import DraftTree

from consistency_backends import BACKENDS, TREE_BACKENDS
from consistency_greedy import assert_same_greedy, plain_greedy

PROMPTS = [[0, 300, 301, 302, 303, 300, 301, 302], [0, 17, 42, 99, 256, 17, 42], [0] + list(range(400, 420))]
NEW = 24
ATOL = 1e-4   # logits of a k-token forward vs one-token PyTorch forwards (fp32: ~1e-6 measured)


def hf_greedy(model, prompt, n_new):
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n_new,
                             min_new_tokens=n_new, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prompt", PROMPTS, ids=["repeat", "short", "ramp"])
def test_plain_greedy_equals_transformers_generate(make_verifier, tiny_folder, backend, prompt):
    tokens, gaps = plain_greedy(make_verifier(backend), prompt, NEW)
    assert_same_greedy(hf_greedy(tiny_folder[1], prompt, NEW), tokens, gaps, f"generate() vs {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("drafter", drafter_names())
def test_speculative_greedy_equals_the_backends_plain_greedy(make_verifier, backend, drafter):
    verifier = make_verifier(backend)
    accepted = 0
    for prompt in PROMPTS:
        want, gaps = plain_greedy(verifier, prompt, NEW)
        result = draftcore.speculate(verifier, np.asarray(prompt, np.int32), max_new_tokens=NEW, drafter=drafter,
                                     budget=8)
        assert_same_greedy(result.tokens, want, gaps, f"{backend} {drafter}")
        accepted += sum(k * c for k, c in enumerate(result.stats.accepted_hist))
    # A chain backend verifies no lookahead window, so the Jacobi drafter there has no model outputs to
    # harvest and (correctly) drafts nothing: its equality is still checked, acceptance cannot be.
    if not (drafter.startswith("jacobi") and backend not in TREE_BACKENDS):
        assert accepted > 0, f"{backend} {drafter}: no draft token was ever accepted (the test would prove nothing)"


@pytest.mark.parametrize("backend", TREE_BACKENDS)
def test_tree_logits_equal_pytorch_per_branch(make_verifier, tiny_folder, backend):
    import torch

    model, verifier = tiny_folder[1], make_verifier(backend)
    rng = np.random.default_rng(3)
    prompt = rng.integers(2, 512, 7).astype(np.int32)
    tokens = rng.integers(2, 512, 7)
    parents = [-1, 0, 1, 0, 3, 3, 1]
    tree = DraftTree.build(tokens, parents)
    verifier.prefill(prompt)
    _, logits = verifier.verify(tree, len(tree))
    for node in range(len(tree)):
        path, at = [], node
        while at >= 0:
            path.append(int(tokens[at]))
            at = parents[at]
        with torch.no_grad():
            want = model(torch.tensor([list(prompt) + path[::-1]])).logits[0, -1].numpy()
        np.testing.assert_allclose(logits[node], want, atol=ATOL, rtol=0, err_msg=f"{backend} node {node}")


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b not in TREE_BACKENDS])
def test_chain_backends_take_one_branch(make_verifier, backend):
    verifier = make_verifier(backend)
    assert verifier.mode == "chain" and verifier.max_tree_leaves == 1
