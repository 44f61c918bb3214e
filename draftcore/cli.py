"""The `draftcore` command line: replay traces now; backends add `bench` and `record`.

    draftcore replay --traces traces.jsonl --decoding-length 64
    draftcore replay --humaneval-canonical 164 --layout parallel
"""
from __future__ import annotations

import argparse
import json
import sys

from .errors import DraftcoreError


def _add_trie_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("trie drafter")
    g.add_argument("--decoding-length", type=int, default=64, help="drafted nodes verified per step")
    g.add_argument("--branch-length", type=int, default=12)
    g.add_argument("--layout", choices=["hierarchical", "parallel", "single"], default="hierarchical")
    g.add_argument("--max-match", type=int, default=8)
    g.add_argument("--prompt-weight", type=float, default=4.0)
    g.add_argument("--no-fill", action="store_true", help="paper retrieval: one stage only")
    g.add_argument("--capacity", type=int, default=1 << 18)
    g.add_argument("--reset-per-request", action="store_true", help="a fresh trie for every request")


def make_trie(args):
    from .drafters.trie import TrieDrafter
    return TrieDrafter(capacity=args.capacity, branch_length=args.branch_length, max_match=args.max_match,
                       prompt_weight=args.prompt_weight, fill=not args.no_fill, layout=args.layout)


def _replay_command(args) -> int:
    from .replay import replay
    from .traces import read_traces
    traces = []
    for path in args.traces or []:
        traces += read_traces(path)
    if args.humaneval_canonical:
        from .canonical import humaneval_canonical_traces
        traces += humaneval_canonical_traces(args.humaneval_canonical, tokenizer=args.tokenizer)
    if not traces:
        raise DraftcoreError("traces: give --traces PATH and/or --humaneval-canonical N")
    if args.reset_per_request:
        summaries = {}
        for trace in traces:
            for name, s in replay([trace], make_trie(args), budget=args.decoding_length,
                                  eos_token_id=args.eos).items():
                summaries.setdefault(name, []).append(s)
        summaries = {name: _merge(parts) for name, parts in summaries.items()}
    else:
        summaries = replay(traces, make_trie(args), budget=args.decoding_length, eos_token_id=args.eos)
    rows = []
    print(f"{'dataset':<22} {'requests':>8} {'tokens/step':>11} {'draft µs p50':>12} {'p90':>8}  accepted-length histogram")
    for name, s in summaries.items():
        hist = " ".join(str(c) for c in s.accepted_hist)
        print(f"{name:<22} {s.requests:>8} {s.tokens_per_step:>11.3f} {s.draft_us(0.5):>12.1f} {s.draft_us(0.9):>8.1f}  {hist}")
        rows.append({"dataset": name, "requests": s.requests, "tokens_per_step": s.tokens_per_step,
                     "draft_us_p50": s.draft_us(0.5), "draft_us_p90": s.draft_us(0.9),
                     "accepted_hist": s.accepted_hist})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "results": rows}, f, indent=1, default=str)
    return 0


def _merge(parts):
    from .replay import ReplaySummary
    total = ReplaySummary()
    for s in parts:
        total.requests += s.requests
        total.new_tokens += s.new_tokens
        total.steps += s.steps
        total.draft_seconds += s.draft_seconds
        total.per_request_tps += s.per_request_tps
        for k, c in enumerate(s.accepted_hist):
            while len(total.accepted_hist) <= k:
                total.accepted_hist.append(0)
            total.accepted_hist[k] += c
    return total


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftcore", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("replay", help="replay (prompt, output) traces through a drafter, no model")
    p.add_argument("--traces", action="append", help="JSONL trace file (repeatable)")
    p.add_argument("--humaneval-canonical", type=int, default=0, metavar="N",
                   help="also replay the first N HumanEval prompts with their canonical solutions")
    p.add_argument("--tokenizer", choices=["auto", "smollm2", "bytes"], default="auto")
    p.add_argument("--eos", type=int, default=None, help="EOS token id of the traces")
    p.add_argument("--json", help="write the results here")
    _add_trie_options(p)
    p.set_defaults(func=_replay_command)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DraftcoreError as exc:
        print(f"draftcore: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
