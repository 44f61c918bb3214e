"""llama.cpp with every layer offloaded to the GPU: the same contracts as on the CPU.

Runs only where llama-cpp-python was built with a GPU backend (CUDA here); the CPU build used by CI
skips this file. Same fixture as test_llamacpp_verifier.py (tiny random Llama, F32 weights, f32 KV).
GPU kernels choose different reduction orders for one token and for a batch (docs/design.md,
"Numerics"), so logits are compared with a tolerance, and greedy tokens token for token except that a
first difference is allowed where plain decoding's top-2 logit gap is below NEAR_TIE.
"""
import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")
if not llama_cpp.llama_supports_gpu_offload():
    pytest.skip("llama-cpp-python is built without GPU offload (CPU build)", allow_module_level=True)

import draftcore  # noqa: E402
from draftcore.adapters.llamacpp import LlamaCppVerifier  # noqa: E402

from test_llamacpp_verifier import (PROMPTS, assert_committed_only, assert_same_greedy,  # noqa: E402
                                    plain_greedy, random_tree, tiny)  # noqa: F401 (fixture)

F32 = llama_cpp.GGML_TYPE_F32
GPU = dict(n_gpu_layers=-1, type_k=F32, type_v=F32)
RELATIVE_ATOL = 1e-3   # |tree - per-branch| / max |logit|; a node that sees a cousin is off by O(1)
NEAR_TIE = 1e-2


@pytest.fixture(scope="module", params=[False, True], ids=["no-flash", "flash"])
def gpu_pair(tiny, request):
    """(tree verifier, reference verifier) on the GPU, flash attention off or on."""
    v = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=512, n_seq_max=33, flash_attn=request.param, **GPU)
    ref = LlamaCppVerifier.from_gguf(tiny[0], n_ctx=512, flash_attn=request.param, **GPU)
    print(f"construction self-check on the GPU (flash {request.param}): relative error {v.self_check_error:.2g}")
    yield v, ref
    v.close()
    ref.close()


def test_tree_logits_equal_per_branch_forwards_on_gpu(gpu_pair):
    v, ref = gpu_pair
    rng = np.random.default_rng(3)
    worst = 0.0
    for n in (2, 9, 24, 40):
        prompt = rng.integers(3, v.vocab_size, 10).astype(np.int32)
        tree = random_tree(rng, int(rng.integers(3, v.vocab_size)), n)
        v.prefill(prompt)
        tokens, logits = v.verify(tree, n)
        for node in range(n):
            want = ref.prefill(np.r_[prompt, tree.path_tokens(node)].astype(np.int32), 1)[1][0]
            err = np.abs(logits[node] - want).max() / max(1.0, np.abs(want).max())
            worst = max(worst, err)
            assert err <= RELATIVE_ATOL, f"n={n} node {node}: relative error {err:.3g}"
        np.testing.assert_array_equal(tokens, logits.argmax(-1))      # argmax taken on the device's rows
        np.testing.assert_array_equal(v.verify(tree)[0], tokens)
    print(f"largest relative logit error, tree vs per-branch on the GPU: {worst:.2g}")


def test_speculate_equals_plain_greedy_on_gpu(gpu_pair):
    v, _ = gpu_pair
    for prompt in PROMPTS:
        prompt = prompt * 3
        want, gaps = plain_greedy(v, prompt, 40)
        for budget in (12, None):  # None: the bare call (session drafter, auto budget)
            result = draftcore.speculate(v, np.array(prompt, np.int32), max_new_tokens=40, budget=budget)
            assert_same_greedy(result.tokens.tolist(), want, gaps, f"GPU speculate (budget {budget}) vs plain",
                               tie=NEAR_TIE)
            assert_committed_only(v, len(prompt) + len(result.tokens) - 1)
        assert result.stats.new_tokens > result.stats.steps  # drafts were accepted on the GPU too
