"""Tokens per step (and simulated speedup) of trie drafter configurations on recorded traces, no model.

Datasets: the 80 SmolLM2 greedy traces recorded into benchmarks/data (HumanEval, MT-Bench; EOS 2)
and the HumanEval canonical solutions (prompt + reference solution, SmolLM2's tokenizer when the hf
backend is installed, else bytes). Every replay runs the real speculate loop (draftcore.tools.replay).

Rows: the library's default (the bare call: the verifier's session TrieDrafter and auto budget, as
`draftcore replay` with no options), the configuration of the Lookahead paper (branch length 12,
one retrieval stage, no output boost: `TrieDrafter.paper()`), and the default with one setting
changed; each with the auto budget and fixed budgets of 16/32/64 candidates, the trie carried
across requests in file order or reset for every request. Speedups are simulated with a measured
cost table (--cost, default hf-cpu): plain decoding's time over the replay's, drafting not counted.
"""
import argparse
import time

from _common import TRACES, TRACES_EOS, write_json

from draftcore import TrieDrafter
from draftcore.drafters.trie_research import TrieResearch
from draftcore.tools.canonical import humaneval_canonical_traces
from draftcore.tools.replay import replay
from draftcore.tools.report import make_report, show_table
from draftcore.tools.traces import read_traces

CONFIGS = [
    ("library default: TrieDrafter()", None),
    ("Lookahead paper: TrieDrafter.paper()", TrieDrafter.paper),
    ("parallel layout", lambda: TrieDrafter(layout="parallel")),
    ("single-branch layout", lambda: TrieDrafter(layout="single")),
    ("branch length 12", lambda: TrieDrafter(branch_length=12)),
    ("no most-frequent-token stage", lambda: TrieDrafter(research=TrieResearch(use_top=False))),
    ("no boost of the current output", lambda: TrieDrafter(recent_weight=0.0)),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the auto budget and 64 only")
    parser.add_argument("--cost", default="hf-cpu", help="cost table of the simulated speedup")
    args = parser.parse_args()
    datasets = [(read_traces(TRACES), TRACES_EOS), (humaneval_canonical_traces(164), None)]
    budgets = ["auto", 64] if args.quick else ["auto", 16, 32, 64]
    rows, records, names = [], [], []
    for label, factory in CONFIGS:
        for carry in (True, False):
            for budget in budgets:
                t0 = time.perf_counter()
                cells = {}
                for traces, eos in datasets:
                    cells.update(replay(traces, factory, budget=budget, cost=args.cost, eos_token_id=eos,
                                        reset_per_request=not carry))
                names = list(cells)
                rows.append([label, "carried" if carry else "reset", budget]
                            + [f"{s.tokens_per_step:.2f} ({s.speedup:.2f}x)" for s in cells.values()]
                            + [f"{time.perf_counter() - t0:.1f}s"])
                records += [{"config": label, "carried": carry, "budget": budget, "dataset": name,
                             "tokens_per_step": s.tokens_per_step, "simulated_speedup": s.speedup,
                             "budget_hist": s.budget_hist} for name, s in cells.items()]
                print(", ".join(str(c) for c in rows[-1]), flush=True)   # progress; the table follows
    header = ["config", "trie", "budget"] + [f"{n}: tokens/step (sim. speedup, {args.cost})" for n in names]
    print()
    shown = show_table("", header + ["replay time"], rows)
    report = make_report("Trie drafter configurations on recorded traces (replay, no model)", [shown],
                         settings={"cost": args.cost})
    print("\nwrote", write_json("replay_table.json", report, records=records))


if __name__ == "__main__":
    main()
