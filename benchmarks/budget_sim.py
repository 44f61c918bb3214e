"""Simulated speed of draft-budget policies: replay real traces with a measured cost table.

Tokens per step come from replaying the recorded SmolLM2 outputs (no model); the time of each verify
comes from a cost table measured on this project's machines (ms per forward by tokens in it), so a
policy's choices can be compared in seconds. Speedup = simulated tok/s over plain decoding's
(1 token per cost(1)); drafting time itself is not counted.
"""
import argparse

import numpy as np
from _common import SHARED_TRACES, markdown_table

from draftcore import CostAwareBudget, FixedBudget, TrieDrafter
from draftcore.acceptance import greedy_accept
from draftcore.tools.replay import TraceVerifier
from draftcore.tools.traces import read_traces

# ms per forward by number of tokens (DESIGN.md; larger sizes measured by benchmarks/hf_verify_cost.py)
COSTS = {
    "hf-cpu": {1: 43, 2: 70, 4: 65, 8: 63, 11: 80, 16: 95, 32: 140, 64: 230},
    "llamacpp-cpu": {1: 7.2, 2: 12.2, 4: 16.2, 8: 25.3, 11: 31.9, 16: 45, 32: 85, 64: 165},
    "gpu-flat": {1: 10, 64: 11, 128: 13},
}


def cost_fn(table):
    xs = np.array(sorted(table), float)
    ys = np.array([table[int(x)] for x in xs], float) / 1e3
    return lambda n: float(np.interp(n, xs, ys))


def simulate(traces, policy, cost, eos=2):
    tokens = seconds = 0.0
    budgets = {}
    drafter = TrieDrafter()
    for trace in traces:
        verifier = TraceVerifier(trace)
        out = trace.output_ids
        drafter.start(trace.prompt_ids)
        context = list(trace.prompt_ids) + [out[0]]
        seconds += cost(len(trace.prompt_ids)) if False else cost(1)  # prefill ~ one step here
        verifier.prefill(trace.prompt_ids)
        drafter.update(out[:1])
        n = 1
        while n < out.shape[0] and out[n - 1] != eos:
            ctx = np.asarray(context, np.int32)
            room = out.shape[0] - n - 1
            tree = drafter.propose(ctx, min(policy.request_size(), room)) if room > 0 else None
            if tree is None or tree.n_draft == 0:
                from draftcore.tree import DraftTree
                tree = DraftTree.root_only(int(ctx[-1]))
            keep = policy.choose(tree)
            tree = tree.truncated(1 + keep)
            budgets[tree.n_draft] = budgets.get(tree.n_draft, 0) + 1
            path, nxt = greedy_accept(tree.tokens, tree.parents, verifier.verify(tree))
            verifier.commit(path)
            dt = cost(len(tree))
            seconds += dt
            policy.observe(tree, path, dt)
            emitted = list(tree.tokens[path[1:]]) + [nxt]
            emitted = emitted[:out.shape[0] - n]
            context += emitted
            drafter.update(np.asarray(emitted, np.int32))
            n += len(emitted)
        tokens += n
        drafter.finish()
    return tokens / seconds, budgets


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--costs", default="hf-cpu,llamacpp-cpu,gpu-flat",
                        help="names of built-in cost tables, or 'size:ms,size:ms,...' tables separated by ';'")
    parser.add_argument("--traces", nargs="+", default=[str(SHARED_TRACES)], help="JSONL trace files")
    parser.add_argument("--policies", default="fixed 4,fixed 8,fixed 16,fixed 64,auto")
    args = parser.parse_args()
    traces = [t for path in args.traces for t in read_traces(path)]
    by_set = {name: [t for t in traces if t.dataset == name] for name in ("humaneval", "mtbench")}
    by_set = {name: subset for name, subset in by_set.items() if subset}
    rows = []
    for cost_name in args.costs.split(";" if ":" in args.costs else ","):
        cost = cost_fn(COSTS[cost_name] if cost_name in COSTS else
                       {int(a): float(b) for a, b in (kv.split(":") for kv in cost_name.split(","))})
        plain = 1.0 / cost(1)
        for label in args.policies.split(","):
            make = (lambda: CostAwareBudget()) if label == "auto" else (lambda n=int(label.split()[-1]): FixedBudget(n))
            cells = [cost_name, label]
            for name, subset in by_set.items():
                tps, budgets = simulate(subset, make(), cost)
                cells.append(f"{tps / plain:.2f}x")
            rows.append(cells)
            print(" | ".join(cells), flush=True)
    print(markdown_table(["cost table", "policy"] + [f"{n} speedup" for n in by_set], rows))


if __name__ == "__main__":
    main()
