"""Simulated speed of draft-budget policies: replay real traces under a measured cost table.

Each policy runs the real speculate loop over the recorded SmolLM2 outputs (draftcore.tools.replay,
no model) with the library's default drafter, fresh for each dataset. A simulated clock prices every
verify from a cost table measured on a real machine (ms per forward by tree nodes;
draftcore.tools.cost_model), so the auto budget sees the costs it would see there. Speedup = plain
decoding's simulated time (one cost(1) per token) over the replay's; drafting time is not counted.
"""
import argparse

from _common import TRACES, TRACES_EOS, write_json

from draftcore.tools.cost_model import COST_TABLES, CostModel
from draftcore.tools.replay import replay
from draftcore.tools.report import make_report, show_table
from draftcore.tools.traces import read_traces


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--costs", default=",".join(COST_TABLES),
                        help="built-in cost table names separated by ',', or 'nodes:ms,nodes:ms,...' tables "
                             "separated by ';'")
    parser.add_argument("--traces", nargs="+", default=[TRACES], help="JSONL trace files (.gz allowed)")
    parser.add_argument("--eos", type=int, default=TRACES_EOS)
    parser.add_argument("--policies", default="fixed 4,fixed 8,fixed 16,fixed 64,auto")
    args = parser.parse_args()
    traces = [t for path in args.traces for t in read_traces(path)]
    by_dataset: dict = {}
    for trace in traces:
        by_dataset.setdefault(trace.dataset, []).append(trace)
    rows, records = [], []
    for spec in args.costs.split(";" if ":" in args.costs else ","):
        cost = CostModel.named(spec)
        for policy in args.policies.split(","):
            budget = None if policy == "auto" else int(policy.split()[-1])
            cells = [cost.name, policy]
            for name, subset in by_dataset.items():
                (summary,) = replay(subset, budget=budget, cost=cost, eos_token_id=args.eos).values()
                cells.append(f"{summary.speedup:.2f}x ({summary.tokens_per_step:.2f})")
                records.append({"cost": cost.name, "policy": policy, "dataset": name,
                                "simulated_speedup": summary.speedup, "tokens_per_step": summary.tokens_per_step})
            rows.append(cells)
            print(", ".join(cells), flush=True)   # progress; the table follows
    header = ["cost table", "policy"] + [f"{name}: speedup (tokens/step)" for name in by_dataset]
    shown = show_table("", header, rows)
    report = make_report("Simulated speedup of draft-budget policies (replayed traces, measured cost tables)", [shown])
    print("wrote", write_json("budget_sim.json", report, records=records))


if __name__ == "__main__":
    main()
