"""Simulated speed of draft-budget policies: replay real traces under a measured cost table.

Each policy runs the real speculate loop over the recorded SmolLM2 outputs (draftcore.tools.replay,
no model) with the library's default drafter, fresh for each dataset. A simulated clock prices every
verify from a cost table measured on a real machine (ms per forward by tree nodes;
draftcore.tools.cost_model), so the auto budget sees the costs it would see there. Speedup = plain
decoding's simulated time (one cost(1) per token) over the replay's; drafting time is not counted.

With --fresh, every trace is replayed alone on a fresh verifier, so each is the first request a new
deployment serves: what learning sizes and acceptance costs a short request. Reported per dataset:
the median and lowest per-request speedup and the requests below 0.95x (the floor).
"""
import argparse

import numpy as np

from _common import TRACES, TRACES_EOS, write_json

from draftcore import CostAwareBudget
from draftcore.tools.cost_model import COST_TABLES, CostModel
from draftcore.tools.oracle_budget import ASSISTS
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
    parser.add_argument("--policies", default="fixed 4,fixed 8,fixed 16,fixed 64,auto",
                        help="'fixed N', 'auto' (the library's default budget), 'auto NAME=VALUE ...': a "
                             "CostAwareBudget with those settings, e.g. 'auto max_loss=inf', or 'oracle': each "
                             "step the best prefix of the proposal by the recorded output (the auto budget's "
                             "headroom, draftcore.tools.oracle_budget), or 'oracle-skip' / 'oracle-extend': the "
                             "auto budget told one thing the recording knows (AssistedBudget)")
    parser.add_argument("--fresh", type=int, default=0, metavar="N",
                        help="replay the first N traces of each dataset alone, each on a fresh verifier")
    args = parser.parse_args()
    traces = [t for path in args.traces for t in read_traces(path)]
    by_dataset: dict = {}
    for trace in traces:
        by_dataset.setdefault(trace.dataset, []).append(trace)
    rows, records = [], []
    for spec in args.costs.split(";" if ":" in args.costs else ","):
        cost = CostModel.named(spec)
        for policy in args.policies.split(","):
            budget = budget_factory(policy)
            cells = [cost.name, policy]
            for name, subset in by_dataset.items():
                if args.fresh:
                    speedups = np.array([next(iter(replay([trace], budget=budget(), cost=cost,
                                                          eos_token_id=args.eos).values())).speedup
                                         for trace in subset[:args.fresh]])
                    below = int((speedups < 0.95).sum())
                    cells.append(f"{np.median(speedups):.2f}x, lowest {speedups.min():.2f}x, "
                                 f"{below}/{len(speedups)} below 0.95x")
                    records.append({"cost": cost.name, "policy": policy, "dataset": name, "fresh": True,
                                    "speedups": speedups.tolist()})
                    continue
                (summary,) = replay(subset, budget=budget(), cost=cost, eos_token_id=args.eos).values()
                cells.append(f"{summary.speedup:.2f}x ({summary.tokens_per_step:.2f})")
                records.append({"cost": cost.name, "policy": policy, "dataset": name,
                                "simulated_speedup": summary.speedup, "tokens_per_step": summary.tokens_per_step})
            rows.append(cells)
            print(", ".join(cells), flush=True)   # progress; the table follows
    what = "first requests: median speedup, lowest, below the floor" if args.fresh else "speedup (tokens/step)"
    header = ["cost table", "policy"] + [f"{name}: {what}" for name in by_dataset]
    shown = show_table("", header, rows)
    report = make_report("Simulated speedup of draft-budget policies (replayed traces, measured cost tables)", [shown])
    print("wrote", write_json("budget_sim.json", report, records=records))


def budget_factory(policy: str):
    """A callable making a fresh budget for one replay: None (the library's default auto budget), an
    int (fixed), "oracle" or an ASSISTS name (replay builds it over its own verifier), or a
    CostAwareBudget with the settings named after 'auto'."""
    name, *settings = policy.split()
    if name == "fixed":
        return lambda: int(settings[0])
    if name in ("oracle",) + ASSISTS:
        return lambda: name
    if name != "auto":
        raise SystemExit(f"--policies: expected 'fixed N', 'oracle', {', '.join(map(repr, ASSISTS))} or "
                         f"'auto [NAME=VALUE ...]', got {policy!r}")
    if not settings:
        return lambda: None
    pairs = (setting.split("=", 1) for setting in settings)
    options = {key: int(value) if value.isdigit() else float(value) for key, value in pairs}
    return lambda: CostAwareBudget(**options)


if __name__ == "__main__":
    main()
