"""What drafters gain from the model's tokens at rejected candidates, on the real model.

    python benchmarks/model_outputs_value.py [--budget 8] [--datasets mtbench,humaneval] [--n 20]

Replay cannot measure this: a recorded trace knows the model's token only on the recorded output,
so what the n-gram tables learn from `observe` (`NGramDrafter(learn_from_model=True)`, the model's
token at every verified candidate off the accepted path) is invisible there, and replayed on the
HF CPU cost table the composite trails the trie. This script runs SmolLM2 (HF, CPU) greedily
through `draftcore.speculate` with a fixed budget, so tokens per step do not depend on this
machine's speed (or its load), for:

    trie            TrieDrafter()
    composite       CompositeDrafter(window=False): trie + n-gram tables that learn from the model
    composite-blind the same with NGramDrafter(learn_from_model=False)

Each drafter is new for its dataset and kept across the dataset's prompts (as the bench keeps a
session's drafter); the first prompt warms it and is not counted. Every output must equal the first
drafter's (all are greedy and lossless), or the script fails.
"""
from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

from _common import markdown_table, write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DRAFTERS = ("trie", "composite", "composite-blind")


def make_drafter(name: str):
    from draftcore.drafters.composite import CompositeDrafter
    from draftcore.drafters.ngram import NGramDrafter
    from draftcore.drafters.trie import TrieDrafter
    if name == "trie":
        return TrieDrafter()
    if name == "composite":
        return CompositeDrafter(window=False)
    return CompositeDrafter(window=False, ngram=NGramDrafter(learn_from_model=False))


def main():
    import draftcore
    from draftcore.adapters.torch_hf import HFVerifier
    from draftcore.adapters.torch_hf.bench import load_model, load_prompts

    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=8, help="drafted candidates verified per step (fixed)")
    ap.add_argument("--datasets", default="mtbench,humaneval")
    ap.add_argument("--n", type=int, default=20, help="prompts counted per dataset (one more warms up)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()

    model, tokenizer = load_model(None)
    eos = tokenizer.eos_token_id
    rows, results = [], []
    for dataset in args.datasets.split(","):
        prompts = load_prompts(tokenizer, dataset, args.n + 1)
        reference = None
        for name in DRAFTERS:
            drafter, verifier = make_drafter(name), HFVerifier(model)
            outputs, per_prompt, tokens, steps = [], [], 0, 0
            for prompt in prompts:
                result = draftcore.speculate(verifier, prompt.ids, max_new_tokens=args.max_new_tokens,
                                             drafter=drafter, budget=args.budget, eos_token_id=eos)
                if prompt.idx == 0:
                    continue   # warm-up
                outputs.append(result.tokens)
                per_prompt.append(result.stats.tokens_per_step)
                tokens, steps = tokens + result.stats.new_tokens, steps + result.stats.steps
            if reference is None:
                reference = outputs
            elif not all(np.array_equal(a, b) for a, b in zip(outputs, reference)):
                raise SystemExit(f"{dataset}: {name} changed the greedy output (expected {DRAFTERS[0]}'s)")
            results.append(dict(dataset=dataset, drafter=name, budget=args.budget, prompts=len(per_prompt),
                                tokens_per_step_median=statistics.median(per_prompt),
                                tokens_per_step_all=tokens / steps))
            rows.append([dataset, name, f"{statistics.median(per_prompt):.3f}", f"{tokens / steps:.3f}"])
            print(f"{dataset} {name}: median {rows[-1][2]}, all tokens {rows[-1][3]}", flush=True)
    print(f"\nSmolLM2-135M fp32, HF CPU, fixed budget {args.budget}, {args.n} prompts a dataset; "
          f"outputs identical across drafters")
    print(markdown_table(["dataset", "drafter", "tokens/step (median)", "tokens/step (all)"], rows))
    print("wrote", write_json("model_outputs_value.json", dict(config=vars(args), results=results)))


if __name__ == "__main__":
    main()
