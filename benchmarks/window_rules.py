"""What the auto budget's window rules are worth on a real model, where a replay cannot tell.

A replay (benchmarks/budget_ablation.py) drafts with the trie, which builds no lookahead window, so
the rules that keep or drop the composite drafter's Jacobi window (window_cost, its trials and probe:
draftcore/budget/lookahead.py) read 0.0 % there. This runs the composite drafter on SmolLM2 through
HFVerifier three ways beside plain decoding, interleaved per prompt:

    composite (auto budget)                 the budget as it is: a window rides while it pays
    composite, windows always               CostAwareBudget(window_cost=inf): every window rides
    composite-nowindow (auto budget)        no window is ever built

    .venv/bin/python benchmarks/window_rules.py --datasets humaneval,mtbench,edit --n 6
"""
from __future__ import annotations

import argparse
import sys

from _common import write_report

import draftcore
import draftcore.tools.variants  # noqa: F401  (registers composite-nowindow)
from draftcore.adapters.torch_hf import HFVerifier
from draftcore.tools.backends import load_backend
from draftcore.tools.bench import draftcore_method, run_benchmark, summarize, with_control
from draftcore.tools.report import command_line, make_report, table, table_text

HEADER = ["dataset", "method", "prompts", "tok/s (median)", "vs plain (median)", "all tokens / all time", "lowest",
          "tokens/step", "identical"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="humaneval,mtbench,edit")
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--out", default="bench_out/window_rules")
    args = parser.parse_args(argv)
    backend = load_backend("hf")
    model, tokenizer = backend.load_model(None)
    (plain,) = backend.make_methods(model, tokenizer, ("plain",))
    first = HFVerifier(model, tokenizer=tokenizer)

    def verifier():   # one per method, so that no method reuses another's cached prefix
        return HFVerifier(model, tokenizer=tokenizer, self_check=False, linear_ways=first.linear_ways)

    eos = tokenizer.eos_token_id
    methods = with_control([
        plain,
        draftcore_method("composite (auto budget)", first, draftcore.CostAwareBudget, eos_token_id=eos,
                         drafter="composite"),
        draftcore_method("composite, windows always (window_cost=inf)", verifier(),
                         lambda: draftcore.CostAwareBudget(window_cost=float("inf")), eos_token_id=eos,
                         drafter="composite"),
        draftcore_method("composite-nowindow (auto budget)", verifier(), draftcore.CostAwareBudget,
                         eos_token_id=eos, drafter="composite-nowindow"),
    ])
    prompts = [p for name in args.datasets.split(",") for p in backend.load_prompts(tokenizer, name, args.n + 1)]
    records = run_benchmark(methods, prompts, args.new, warmup=1)
    rows = [[row["dataset"], row["method"], row["prompts"], f"{row['tok_s']:.1f}", f"{row['speedup']:.2f}x",
             f"{row['speedup_all']:.2f}x", f"{row['speedup_min']:.2f}x", f"{row['tokens_per_step']:.2f}",
             f"{row['identical']}/{row['prompts']}"] for row in summarize(records, baseline=plain.name)]
    kept = table(f"the composite drafter's window rules on HF, {args.new} new tokens", HEADER, rows)
    print(table_text(kept))
    report = make_report("The auto budget's window rules on a real model", [kept],
                         command=command_line(sys.argv if argv is None else ["benchmarks/window_rules.py", *argv]))
    print("wrote", write_report(args.out + ".json", report, records={"hf": records}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
