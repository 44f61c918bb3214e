"""Tokens per step of the trie drafter on recorded traces, no model (seed 000 Table 3/4 ablations).

Datasets: the 80 real SmolLM2 greedy traces in ../shared/data (HumanEval, MT-Bench; EOS 2) and the
HumanEval canonical solutions (prompt + reference solution, SmolLM2 tokenizer when installed).
Rows: the paper's configuration and draftcore's defaults, each layout, decoding lengths 16/32/64,
with the trie carried across requests in file order or reset for every request.
"""
import argparse
import time

from _common import SHARED_TRACES, markdown_table, write_json

from draftcore import TrieDrafter
from draftcore.tools.canonical import humaneval_canonical_traces
from draftcore.tools.replay import replay
from draftcore.tools.traces import read_traces


def run(traces, factory, budget, carry, eos):
    if carry:
        return replay(traces, factory(), budget=budget, eos_token_id=eos)
    merged = {}
    for trace in traces:
        for name, s in replay([trace], factory(), budget=budget, eos_token_id=eos).items():
            m = merged.setdefault(name, [0, 0, []])
            m[0] += s.new_tokens
            m[1] += s.steps
            m[2] += s.draft_seconds
    from draftcore.tools.replay import ReplaySummary
    out = {}
    for name, (tokens, steps, secs) in merged.items():
        out[name] = ReplaySummary(new_tokens=tokens, steps=steps, draft_seconds=secs)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="decoding length 64 only")
    args = parser.parse_args()
    datasets = [("traces", read_traces(SHARED_TRACES), 2),
                ("canonical", humaneval_canonical_traces(164), None)]
    configs = [
        ("paper (L_b 12, 1 stage)", lambda: TrieDrafter.paper()),
        ("draftcore hierarchical", lambda: TrieDrafter()),
        ("draftcore parallel", lambda: TrieDrafter(layout="parallel")),
        ("draftcore single-branch", lambda: TrieDrafter(layout="single")),
        ("draftcore, L_b 12", lambda: TrieDrafter(branch_length=12)),
        ("draftcore, no stage 0", lambda: TrieDrafter(use_top=False)),
        ("draftcore, no output boost", lambda: TrieDrafter(recent_weight=0.0)),
    ]
    budgets = [64] if args.quick else [16, 32, 64]
    rows, records = [], []
    for label, factory in configs:
        for carry in (True, False):
            for budget in budgets:
                cells = {}
                t0 = time.perf_counter()
                for _, traces, eos in datasets:
                    for name, s in run(traces, factory, budget, carry, eos).items():
                        cells[name] = s
                row = [label, "carried" if carry else "reset", budget]
                for name in sorted(cells):
                    s = cells[name]
                    row.append(f"{s.tokens_per_step:.2f}")
                    records.append({"config": label, "carried": carry, "decoding_length": budget,
                                    "dataset": name, "tokens_per_step": s.tokens_per_step,
                                    "draft_us_p50": s.draft_us(0.5), "draft_us_p90": s.draft_us(0.9)})
                rows.append(row + [f"{time.perf_counter() - t0:.1f}s"])
                print(" | ".join(str(c) for c in rows[-1]), flush=True)
    header = ["config", "trie", "decoding length"] + sorted(cells) + ["replay time"]
    print()
    print(markdown_table(header, rows))
    print("\nwrote", write_json("replay_table.json", records))


if __name__ == "__main__":
    main()
