"""Tokens per step of every drafter on recorded traces, no model: trie, n-gram (the paper's chain
and draftcore's variants), the composite without its window, and transformers' prompt-lookup rule,
at fixed budgets of 16/32/64 candidates, each drafter carried across a dataset's requests.

Datasets: the 80 SmolLM2 greedy traces in benchmarks/data (HumanEval, MT-Bench; EOS 2). The Jacobi
window is left out: a replay knows the model's token only on the recorded output (draftcore.tools.replay).
Tokens per step do not depend on the machine's speed, so this may run beside other work.

    python benchmarks/drafter_replay.py [--budgets 16,32,64] [--only NAME,...]
"""
import argparse
import time

from _common import TRACES, TRACES_EOS, write_json

from draftcore import CompositeDrafter, NGramDrafter, TrieDrafter
from draftcore.tools.peers import PromptLookupDrafter
from draftcore.tools.replay import replay
from draftcore.tools.report import make_report, show_table
from draftcore.tools.traces import read_traces

VOCAB = 49152
DRAFTERS = {
    "trie": lambda: TrieDrafter(token_limit=VOCAB),
    "ngram paper (chain N=5 K=7)": NGramDrafter.paper,
    "ngram chain + model tokens": lambda: NGramDrafter(branching=1),
    "ngram tree b=2": lambda: NGramDrafter(branching=2, learn_from_model=False),
    "ngram tree b=2 + model tokens": lambda: NGramDrafter(branching=2),
    "ngram tree b=4 K=12 + model tokens": lambda: NGramDrafter(branching=4, draft_length=12),
    "composite, no window (trie + ngram)": lambda: CompositeDrafter(token_limit=VOCAB, window=False),
    "transformers prompt lookup (10 tokens)": PromptLookupDrafter,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="16,32,64")
    parser.add_argument("--only", default=None, help="comma-separated drafter labels (substring match)")
    args = parser.parse_args()
    traces = read_traces(TRACES)
    budgets = [int(b) for b in args.budgets.split(",")]
    chosen = [k for k in DRAFTERS if not args.only or any(o in k for o in args.only.split(","))]
    rows, records, names = [], [], []
    for label in chosen:
        row = [label]
        t0 = time.perf_counter()
        for budget in budgets:
            cells = replay(traces, DRAFTERS[label], budget=budget, cost=None, eos_token_id=TRACES_EOS)
            names = list(cells)
            row += [f"{s.tokens_per_step:.2f}" for s in cells.values()]
            records += [{"drafter": label, "budget": budget, "dataset": name, "tokens_per_step": s.tokens_per_step}
                        for name, s in cells.items()]
        rows.append(row + [f"{time.perf_counter() - t0:.0f}s"])
        print(f"{label}: {', '.join(rows[-1][1:])}", flush=True)   # progress; the table follows
    header = ["drafter"] + [f"{n} @{b}" for b in budgets for n in names] + ["replay time"]
    print()
    shown = show_table("", header, rows)
    report = make_report("Tokens per step of every drafter on the recorded traces (replay, no model)", [shown])
    print("\nwrote", write_json("drafter_replay.json", report, records=records))


if __name__ == "__main__":
    main()
