"""Drafting time per decode step: the jitted trie vs its naive pure-Python twin (fixtures/naive_trie.py),
on the same stream — the 80 real SmolLM2 traces replayed in file order, trie carried across them.

A step's drafting time is what the decode loop measures: request.update(accepted tokens) plus
request.propose(context, decoding_length). Both drafters see the same steps (the replay's accepted
lengths come from the trace, and both produce the same trees, so the steps are identical).
"""
import argparse
import time

import numpy as np
from _common import TRACES, write_json

from draftcore import DraftTree, TrieDrafter
from fixtures.naive_trie import NaiveTrie
from draftcore.tools.replay import replay
from draftcore.tools.report import make_report, show_table
from draftcore.tools.traces import read_traces


class NaiveTrieDrafter:
    """The naive reference behind the Drafter protocol."""

    returns_valid_trees = True

    def __init__(self, **options):
        self.trie = NaiveTrie(**options)

    def start(self, prompt):
        self.trie.start(prompt)

    def update(self, tokens):
        self.trie.update(tokens)

    def propose(self, context, budget):
        tokens, parents, depths, scores = self.trie.propose(context, budget)
        return DraftTree(np.asarray(tokens, np.int32), np.asarray(parents, np.int32),
                         np.asarray(depths, np.int32), np.asarray(scores, np.float32))

    def finish(self):
        self.trie.finish()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decoding-length", type=int, default=64)
    parser.add_argument("--branch-length", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="jitted replays (the median of each is kept)")
    args = parser.parse_args()
    traces = read_traces(TRACES)
    options = dict(capacity=1 << 18, branch_length=args.branch_length)
    rows, payload = [], {}
    for label, make, repeats in [("draftcore (numba)", lambda: TrieDrafter(**options), args.repeats),
                                 ("naive Python reference", lambda: NaiveTrieDrafter(**options), 1)]:
        p50s, p90s, tps = [], [], None
        t0 = time.perf_counter()
        for _ in range(repeats):
            summaries = replay(traces, make(), budget=args.decoding_length, eos_token_id=2)
            secs = np.concatenate([s.draft_seconds for s in summaries.values()]) * 1e6
            p50s.append(np.median(secs))
            p90s.append(np.quantile(secs, 0.9))
            tps = {k: round(s.tokens_per_step, 3) for k, s in summaries.items()}
        payload[label] = {"p50_us": float(np.median(p50s)), "p90_us": float(np.median(p90s)),
                          "tokens_per_step": tps, "steps": int(secs.shape[0])}
        print(label, payload[label], f"{time.perf_counter() - t0:.1f}s", flush=True)
    fast, slow = payload["draftcore (numba)"], payload["naive Python reference"]
    for label, p in payload.items():
        rows.append([label, f"{p['p50_us']:.1f}", f"{p['p90_us']:.1f}", p["steps"],
                     f"{p['tokens_per_step']}"])
    rows.append(["ratio naive / numba", f"{slow['p50_us'] / fast['p50_us']:.0f}x",
                 f"{slow['p90_us'] / fast['p90_us']:.0f}x", "", ""])
    print()
    shown = show_table(f"decoding length {args.decoding_length}, branch length {args.branch_length}",
                       ["drafter", "µs per step p50", "p90", "steps", "tokens/step"], rows)
    report = make_report("Drafting time per decode step: the jitted trie vs its naive Python twin", [shown],
                         settings={"decoding_length": args.decoding_length, "branch_length": args.branch_length})
    print("wrote", write_json("trie_speed.json", report, results=payload))


if __name__ == "__main__":
    main()
