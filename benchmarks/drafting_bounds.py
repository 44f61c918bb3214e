"""Headroom on the recorded traces: tokens per step that no drafter of a family can beat
(draftcore.tools.bounds), beside what the trie and the composite (without its window) reach in a
replay at the same budgets, no model.

A budget of N candidates can verify a chain N deep, so each bound is taken at max_draft = N. The
bounds need no node budget beyond that: they are what a drafter that always guessed its family's
best continuation would reach. Tokens per step do not depend on the machine's speed.

    python benchmarks/drafting_bounds.py [--budgets 16,32,64] [--traces PATH ...] [--costs hf-cpu,...] [--out NAME]

--traces: recorded traces (`draftcore record`) instead of the repo's HumanEval / MT-Bench ones, e.g.
the workloads: `draftcore record --backend hf --dataset agent --n 10 --out agent.jsonl.gz`.
--costs: cost tables (draftcore.tools.cost_model) to price the bounds in speed too: per table, the
decode speedup over one-token steps of the copy families' best drafter (copy_speedup_bound, drafts
up to 64 deep) beside the library's default (the trie, auto budget) replayed on that table. A speed
target above the bound on a machine's table cannot be met there by copying from the context.
"""
import argparse

from _common import TRACES, TRACES_EOS, write_json

from draftcore import CompositeDrafter, TrieDrafter
from draftcore.drafters.trie_research import TrieResearch
from draftcore.tools.bounds import chain_bound, copy_bound, copy_or_frequent_bound, copy_speedup_bound
from draftcore.tools.replay import replay
from draftcore.tools.report import make_report, show_table
from draftcore.tools.traces import read_traces

VOCAB = 49152
BOUNDS = {
    "bound: copy what followed the last 2 tokens": lambda t, n: copy_bound(t, context=2, max_draft=n),
    "bound: copy what followed the root": lambda t, n: copy_bound(t, max_draft=n),
    "bound: copy, or one of the 64 most frequent tokens": lambda t, n: copy_or_frequent_bound(t, k=64, max_draft=n),
    "bound: chained 3-grams": lambda t, n: chain_bound(t, n=3, max_draft=n),
    "bound: chained 2-grams": lambda t, n: chain_bound(t, n=2, max_draft=n),
}
DRAFTERS = {
    "trie without its frequent-token stage": lambda: TrieDrafter(token_limit=VOCAB, research=TrieResearch(use_top=False)),
    "trie": lambda: TrieDrafter(token_limit=VOCAB),
    "composite, no window": lambda: CompositeDrafter(token_limit=VOCAB, window=False),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="16,32,64")
    parser.add_argument("--traces", nargs="+", default=[TRACES], help="trace files (default: the repo's)")
    parser.add_argument("--costs", default="", help="cost tables to price the bounds on (comma-separated)")
    parser.add_argument("--out", default="drafting_bounds.json", help="file name under bench_out/")
    args = parser.parse_args()
    traces = [t for path in args.traces for t in read_traces(path)]
    budgets = [int(b) for b in args.budgets.split(",")]
    results = {}   # label -> budget -> dataset -> tokens per step
    for label, bound in BOUNDS.items():
        results[label] = {n: bound(traces, n) for n in budgets}
    for label, make in DRAFTERS.items():
        results[label] = {n: {d: s.tokens_per_step for d, s in
                              replay(traces, make, budget=n, cost=None, eos_token_id=TRACES_EOS).items()}
                          for n in budgets}
    results["target: 1.1x the trie"] = {n: {d: 1.1 * v for d, v in results["trie"][n].items()} for n in budgets}
    datasets = list(results["trie"][budgets[0]])
    header = ["tokens per step"] + [f"{d} @{n}" for n in budgets for d in datasets]
    rows = [[label] + [f"{results[label][n][d]:.2f}" for n in budgets for d in datasets] for label in results]
    shown = [show_table("", header, rows)]
    records = [{"what": label, "budget": n, "dataset": d, "tokens_per_step": v}
               for label, by_budget in results.items() for n, by_set in by_budget.items() for d, v in by_set.items()]
    costs = [c for c in args.costs.split(",") if c]
    if costs:
        speed_rows, speed_records = speed_bounds(traces, costs, datasets)
        shown.append(show_table("decode speedup over one-token steps, by cost table",
                                ["cost table", "what"] + datasets, speed_rows))
        records += speed_records
    report = make_report("Drafting headroom: bounds of drafter families beside the trie and the composite", shown)
    print("\nwrote", write_json(args.out, report, records=records))


SPEED_BOUNDS = {
    "bound: copy what followed the root": 0,
    "bound: copy, or one of the 64 most frequent tokens": 64,
}


def speed_bounds(traces, costs, datasets):
    """Per cost table: the copy families' speedup bounds and the library default's replayed speedup."""
    rows, records = [], []
    for cost in costs:
        measured = {label: copy_speedup_bound(traces, cost, frequent=k) for label, k in SPEED_BOUNDS.items()}
        measured["trie, auto budget (replayed)"] = {d: s.speedup for d, s in
                                                   replay(traces, cost=cost, eos_token_id=TRACES_EOS).items()}
        for label, by_set in measured.items():
            rows.append([cost, label] + [f"{by_set[d]:.2f}x" for d in datasets])
            records += [{"what": label, "cost": cost, "dataset": d, "speedup": v} for d, v in by_set.items()]
    return rows, records


if __name__ == "__main__":
    main()
