"""HFVerifier in every dtype (fp32, fp16, bf16) on every device here (CPU, and CUDA when present).

fp16 and bf16 forwards of k tokens differ from k one-token forwards by far more than fp32 ones (the
reductions run in another order and round at every step; docs/design.md, section "Numerics"), so
the checks are the ones that still mean something there:
- the construction self-check's tolerance for the dtype passes the model and refuses the same
  weights behind a forward that drops the tree mask;
- tree logits equal per-branch plain logits within a bound relative to the largest logit, the same
  bound the construction-time self-check uses for that dtype;
- speculative greedy output equals `model.generate(do_sample=False)` in the same dtype token for
  token, except after a near-tie whose top-2 gap is within that dtype's noise (reported, not failed).
On CPU these run the same code paths that serve CUDA (device placement of ids, positions, masks and
the cache; argmax on the device); on a CUDA machine they run there as well.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import draftcore  # noqa: E402
from draftcore.adapters.torch_hf import HFVerifier  # noqa: E402
from draftcore.adapters.torch_hf.selfcheck import RELATIVE_TOLERANCE  # noqa: E402
from draftcore.selfcheck import check_tree_attention, relative_error  # noqa: E402
from fixtures.tiny_llama import tiny_llama  # noqa: E402

from test_hf_verifier import (MaskDroppingLlama, _node_path, assert_same_greedy, generate_greedy,  # noqa: E402
                              random_tree)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Greedy near-tie bound per dtype: a first mismatch where the baseline's top-2 logits are closer than
# this is reported as a near-tie; anything wider fails. ~ the largest k-token vs 1-token logit
# difference seen on the tiny model (fp32 5e-5, fp16 ~1e-2, bf16 ~8e-2), with margin.
TIE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-2, torch.bfloat16: 0.25}


@pytest.fixture(scope="module", params=[(d, t, a) for d in DEVICES for t in DTYPES for a in ("sdpa", "eager")],
                ids=lambda p: "-".join(p))
def model_and_verifier(request):
    device, dtype_name, attn = request.param
    model = tiny_llama(seed=0, attn_implementation=attn).to(device=device, dtype=DTYPES[dtype_name])
    return model, HFVerifier(model)  # construction runs the self-check in this dtype on this device


def test_verifier_follows_the_model(model_and_verifier):
    model, verifier = model_and_verifier
    assert verifier.dtype == model.dtype and verifier.device == model.device


def test_self_check_tolerance_separates_correct_from_mask_dropping(model_and_verifier):
    """The dtype's tolerance sits between what the check measures on this model and on the same
    weights behind a forward that throws the tree mask away (selfcheck.RELATIVE_TOLERANCE)."""
    model, verifier = model_and_verifier
    tol = RELATIVE_TOLERANCE[verifier.dtype]
    correct = check_tree_attention(verifier, float("inf"))
    dropping = MaskDroppingLlama(model.config)
    dropping.load_state_dict(model.state_dict())
    dropping = dropping.to(device=model.device, dtype=model.dtype).eval()
    wrong = check_tree_attention(HFVerifier(dropping, self_check=False), float("inf"))
    print(f"self-check error {correct:.3g}, mask dropped {wrong:.3g}, tolerance {tol:g}")
    assert correct <= tol / 3 and wrong >= 3 * tol


def test_tree_logits_equal_per_branch_logits(model_and_verifier):
    model, verifier = model_and_verifier
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, verifier.vocab_size, 11).astype(np.int32)
    tree = random_tree(rng, 24, "random", verifier.vocab_size)
    verifier.prefill(prompt)
    tokens, logits = verifier.verify(tree, 24)
    assert logits.dtype == np.float32 and logits.shape == (24, verifier.vocab_size)
    tol = RELATIVE_TOLERANCE[verifier.dtype]
    for leaf in tree.leaves():
        path = _node_path(tree, leaf)
        want = verifier.plain_logits(np.r_[prompt, tree.tokens[path]])[-len(path):]
        assert relative_error(logits[path], want) <= tol, f"leaf {leaf}"
    # a masked-out cousin would move logits by O(1): the bound is far below that
    assert tol <= 0.1
    np.testing.assert_array_equal(tokens, logits.argmax(-1))
    # the argmax of every row is taken where the logits live, also when no row is copied out
    only_tokens, no_rows = verifier.verify(tree)
    assert no_rows.shape == (0, verifier.vocab_size)
    np.testing.assert_array_equal(only_tokens, tokens)


def test_speculative_greedy_equals_generate_in_this_dtype(model_and_verifier):
    model, verifier = model_and_verifier
    steps = tokens = 0
    for seed in range(3):
        rng = np.random.default_rng(seed)
        block = rng.integers(2, verifier.vocab_size, 12)
        prompt = np.r_[block, block, block[:5]].astype(np.int32)
        result = draftcore.speculate(verifier, prompt, max_new_tokens=40, budget=16, eos_token_id=1)
        want = generate_greedy(model, prompt, 40, eos_token_id=1)
        assert_same_greedy(verifier, prompt, result.tokens, want, tie_tol=TIE_TOLERANCE[verifier.dtype])
        steps, tokens = steps + result.stats.steps, tokens + result.stats.new_tokens
    assert tokens >= 1.2 * steps  # drafts were really accepted in this dtype, not only bonus tokens


def test_tf32_matmuls_on_cuda_get_fp16s_bound_and_nothing_else_does():
    """float32 on CUDA rounds like fp16 once TF32 matmuls are allowed (set_float32_matmul_precision
    "high" or "medium"); the CPU, and "highest", keep float32's bound."""
    from draftcore.adapters.torch_hf.selfcheck import tolerance

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert tolerance(torch.float32, torch.device("cuda")) == RELATIVE_TOLERANCE[torch.float32]
        for precision in ("high", "medium"):
            torch.set_float32_matmul_precision(precision)
            assert tolerance(torch.float32, torch.device("cuda")) == RELATIVE_TOLERANCE[torch.float16]
            assert tolerance(torch.float32, "cuda:0") == RELATIVE_TOLERANCE[torch.float16]
            assert tolerance(torch.float32, torch.device("cpu")) == RELATIVE_TOLERANCE[torch.float32]
            assert tolerance(torch.bfloat16, torch.device("cuda")) == RELATIVE_TOLERANCE[torch.bfloat16]
            assert tolerance(torch.float32) == RELATIVE_TOLERANCE[torch.float32]
    finally:
        torch.set_float32_matmul_precision(before)
