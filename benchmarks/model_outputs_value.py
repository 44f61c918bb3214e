"""What drafters gain from the model's tokens at rejected candidates, on the real model.

    python benchmarks/model_outputs_value.py [--budget 8] [--datasets mtbench,humaneval] [--n 20]
                                             [--drafters trie-blind,trie,composite,composite-blind]

Replay cannot measure this: a recorded trace knows the model's token only on the recorded output,
so what the trie and the n-gram tables learn from `observe` (`learn_from_model`, the model's
token at every verified candidate off the accepted path) is invisible there. This script runs
SmolLM2 (HF, CPU) greedily through `draftcore.speculate` with a fixed budget, so tokens per step do
not depend on this machine's speed (or its load), for (`--drafters`, the first is the reference):

    trie-blind            TrieDrafter(research=TrieResearch(learn_from_model=False))
    trie                  TrieDrafter(): it learns the model's tokens for the request in progress
    composite             CompositeDrafter(window=False): trie + n-gram tables, both learning
    composite-trie-blind  the same with TrieDrafter(research=TrieResearch(learn_from_model=False))
    composite-blind       neither learning

Each drafter is new for its dataset and kept across the dataset's prompts (as the bench keeps a
session's drafter); the first prompt warms it and is not counted. The drafters run side by side per
prompt (draftcore.tools.bench.run_benchmark); every output must equal the first drafter's (all are
greedy and lossless), or the script fails.
"""
from __future__ import annotations

import argparse
import os
import statistics

from _common import write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DRAFTERS = ("trie-blind", "trie", "composite", "composite-trie-blind", "composite-blind")


def make_drafter(name: str):
    from draftcore.drafters.composite import CompositeDrafter
    from draftcore.drafters.ngram import NGramDrafter
    from draftcore.drafters.trie import TrieDrafter
    from draftcore.drafters.trie_research import TrieResearch
    blind = TrieResearch(learn_from_model=False)
    makers = {
        "trie-blind": lambda: TrieDrafter(research=blind),
        "trie": TrieDrafter,
        "composite": lambda: CompositeDrafter(window=False),
        "composite-trie-blind": lambda: CompositeDrafter(window=False, trie=TrieDrafter(research=blind)),
        "composite-blind": lambda: CompositeDrafter(window=False, trie=TrieDrafter(research=blind),
                                                    ngram=NGramDrafter(learn_from_model=False)),
    }
    return makers[name]()


def drafter_method(name: str, verifier, budget: int, eos_token_id: int):
    """A bench Method: `speculate` with a new drafter of `name` per dataset, kept across its prompts."""
    import draftcore
    from draftcore.tools.bench import Method, Run

    state = {}

    def reset():
        state["drafter"] = make_drafter(name)

    def run(prompt_ids, max_new_tokens) -> Run:
        result = draftcore.speculate(verifier, prompt_ids, max_new_tokens=max_new_tokens, drafter=state["drafter"],
                                     budget=budget, eos_token_id=eos_token_id)
        st = result.stats
        return Run(result.tokens, st.time_total, st.steps, st.time_drafting, dict(st.budget_hist))

    return Method(name, run, reset)


def main():
    from draftcore.adapters.torch_hf import HFVerifier
    from draftcore.tools.backends.hf import load_model, load_prompts
    from draftcore.tools.bench import run_benchmark
    from draftcore.tools.report import make_report, show_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=8, help="drafted candidates verified per step (fixed)")
    ap.add_argument("--datasets", default="mtbench,humaneval")
    ap.add_argument("--n", type=int, default=20, help="prompts counted per dataset (one more warms up)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--drafters", default=",".join(DRAFTERS), help=f"some of {','.join(DRAFTERS)}")
    args = ap.parse_args()
    drafters = args.drafters.split(",")
    unknown = sorted(set(drafters) - set(DRAFTERS))
    if unknown:
        raise SystemExit(f"--drafters: {unknown[0]!r} is not one of {', '.join(DRAFTERS)}")

    model, tokenizer = load_model(None)
    methods = [drafter_method(name, HFVerifier(model), args.budget, tokenizer.eos_token_id) for name in drafters]
    prompts = [p for dataset in args.datasets.split(",") for p in load_prompts(tokenizer, dataset, args.n + 1)]
    records = run_benchmark(methods, prompts, args.max_new_tokens, warmup=1)
    changed = [r for r in records if r["identical"] is False]
    if changed:
        r = changed[0]
        raise SystemExit(f"{r['dataset']} prompt {r['idx']}: {r['method']} changed the greedy output "
                         f"(expected {drafters[0]}'s)")
    rows, results = [], []
    for dataset in args.datasets.split(","):
        for name in drafters:
            runs = [r for r in records if r["dataset"] == dataset and r["method"] == name]
            median = statistics.median(r["tokens_per_step"] for r in runs)
            overall = sum(r["new_tokens"] for r in runs) / sum(r["steps"] for r in runs)
            results.append(dict(dataset=dataset, drafter=name, budget=args.budget, prompts=len(runs),
                                tokens_per_step_median=median, tokens_per_step_all=overall))
            rows.append([dataset, name, f"{median:.3f}", f"{overall:.3f}"])
    title = (f"SmolLM2-135M fp32, HF CPU, fixed budget {args.budget}, {args.n} prompts a dataset; "
             f"outputs identical across drafters")
    shown = show_table(title, ["dataset", "drafter", "tokens/step (median)", "tokens/step (all)"], rows)
    report = make_report("What drafters gain from the model's tokens at rejected candidates", [shown],
                         settings={"budget": args.budget})
    print("wrote", write_json("model_outputs_value.json", report, config=vars(args), results=results))


if __name__ == "__main__":
    main()
