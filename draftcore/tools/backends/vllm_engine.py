"""vLLM engines with and without speculation, for `make test-vllm` and benchmarks/vllm_proposer.py.

    llm = build_llm(model_dir, "draftcore", k=8, max_num_seqs=8)
    outputs = generate(llm, prompts, max_tokens=128)      # token ids in, token ids out
    spec_metrics(llm), proposer_stats(llm)

Methods: "none" (no speculation), "ngram" (vLLM's own n-gram proposer), "suffix" (vLLM's suffix
decoding, when arctic-inference is installed), "draftcore" (DraftcoreProposer via custom_class).
Prompts are token ids (vLLM's tokenizer is not needed: skip_tokenizer_init), so every method sees
exactly the same ids. Imports vLLM: use it only where vLLM is installed.
"""
from __future__ import annotations

import os

import numpy as np

METHODS = ("none", "ngram", "suffix", "draftcore")
PROPOSER = "draftcore.adapters.vllm.DraftcoreProposer"


def speculative_config(method: str, k: int, ngram: tuple[int, int] = (2, 5), proposer: str = PROPOSER) -> dict | None:
    """vLLM's speculative_config for `method` (ngram: prompt_lookup_min, _max; proposer: the class
    "draftcore" names, by import path)."""
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": ngram[0],
                "prompt_lookup_max": ngram[1]}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if method == "draftcore":
        return {"method": "custom_class", "model": proposer, "num_speculative_tokens": k}
    raise ValueError(f"method: {method!r}; expected one of {METHODS}")


def build_llm(model_dir, method: str, *, k: int = 8, max_num_seqs: int = 1, max_model_len: int = 2048,
              memory_share: float = 0.3, ngram: tuple[int, int] = (2, 5), seed: int = 0, proposer: str = PROPOSER):
    """An LLM over `model_dir` (an HF folder, fp32) decoding with `method`. On the CPU backend
    `memory_share` is the share of RAM vLLM reserves (its gpu_memory_utilization); `proposer` is
    the custom-class proposer of method "draftcore" (another class, for benchmarks)."""
    # Callables sent to workers (proposer_stats) need vLLM's pickle-based serialization.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vllm import LLM
    return LLM(model=str(model_dir), dtype="float32", max_model_len=max_model_len, max_num_seqs=max_num_seqs,
               gpu_memory_utilization=memory_share, speculative_config=speculative_config(method, k, ngram, proposer),
               enforce_eager=True, skip_tokenizer_init=True, seed=seed, disable_log_stats=False)


def generate(llm, prompts, *, max_tokens: int, temperature: float = 0.0, seed: int | None = None,
             logprobs: int | None = None, eos_token_id: int | None = None):
    """[(token ids int32[], [top logprobs per token] or None)] for each prompt (lists of token ids),
    all submitted at once (vLLM batches them up to max_num_seqs). Greedy at temperature 0."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed, logprobs=logprobs,
                            ignore_eos=eos_token_id is None, stop_token_ids=[eos_token_id] if eos_token_id else None,
                            detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts], params,
                        use_tqdm=False)
    result = []
    for out in outs:
        completion = out.outputs[0]
        tops = None
        if logprobs:
            tops = [sorted((float(v.logprob) for v in step.values()), reverse=True) for step in completion.logprobs]
        result.append((np.asarray(completion.token_ids, np.int32), tops))
    return result


def spec_metrics(llm) -> dict:
    """vLLM's speculative-decoding counters: drafts, draft_tokens, accepted_tokens (0 without speculation)."""
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    found = {v: 0 for v in names.values()}
    for metric in llm.get_metrics():
        key = names.get(metric.name)
        if key is not None and hasattr(metric, "value"):
            found[key] += int(metric.value)
    return found


def proposer_stats(llm) -> list[dict]:
    """DraftcoreProposer.stats() of every worker that runs one ({} where none does)."""
    def stats(worker):
        runner = getattr(worker, "model_runner", None)
        drafter = getattr(runner, "drafter", None)
        return drafter.stats() if hasattr(drafter, "stats") else {}
    return llm.collective_rpc(stats)


def shutdown(llm) -> None:
    """Stop the engine's processes now (rather than at garbage collection)."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
