"""Exactness and speed on llama.cpp by KV cache type: the F16 cache (llama.cpp's default) against a
Q8_0 one, several threads, prompts whose context passes 256 tokens.

With flash attention on, an F16/F32 cache and more than one thread, llama.cpp's one-token decoding
splits its attention across threads once the context passes 256 tokens, and a verify's batch does not
(adapters/llamacpp/numerics.py): draftcore's output then drifts from plain greedy. A Q8_0 cache never
splits. For each cache type the same weights are loaded with that cache, and every method runs every
prompt (interleaved, one short warm-up run each); per (cache, dataset): median tok/s, the median and
lowest per-prompt ratio to plain decoding with that same cache, tokens per step and outputs identical
to that plain decoding, with the new tokens where the others first differ. (The two caches' plain
outputs differ from each other too: a Q8_0 cache is another deployment, not a faster F16 one.)

    .venv/bin/python benchmarks/llamacpp_kv_exactness.py                       # agent,extract,edit; 5 each
    .venv/bin/python benchmarks/llamacpp_kv_exactness.py --datasets agent --n 3 --threads 2
"""
from __future__ import annotations

import argparse
import json
import sys

from _common import write_report

from draftcore.tools.backends import load_backend
from draftcore.tools.bench import per_prompt_speedups, run_benchmark, summarize
from draftcore.tools.report import command_line, machine_line, make_report, table, table_text

METHODS = ("plain", "nodraft", "bare", "trie")
CACHES = ("f16", "q8_0")


def run_cache(kv_cache: str, datasets, n: int, new_tokens: int, threads: int):
    backend = load_backend("llamacpp")
    handle, tokenizer = backend.load_model(None, n_threads=threads, kv_cache=kv_cache)
    prompts = [p for dataset in datasets for p in backend.load_prompts(tokenizer, dataset, n)]
    methods = backend.make_methods(handle, tokenizer, METHODS)
    for method in methods:   # one short warm-up run each: first-call costs are no method's speed
        method.run(prompts[0].ids[:64], 8)
    records = run_benchmark(methods, prompts, new_tokens, warmup=0)
    return records, methods[0].name, backend.model_settings(handle)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="agent,extract,edit")
    parser.add_argument("--n", type=int, default=5, help="prompts per dataset")
    parser.add_argument("--new", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="bench_out/llamacpp_kv_exactness")
    args = parser.parse_args(argv)
    datasets = args.datasets.split(",")
    rows, details = [], {}
    for kv_cache in CACHES:
        records, plain, settings = run_cache(kv_cache, datasets, args.n, args.new, args.threads)
        details[kv_cache] = {"records": records, "settings": settings}
        base = {(r["dataset"], r["idx"]): r for r in records if r["method"] == plain}
        first = len(rows)
        for row in summarize(records, baseline=plain):
            ratios = per_prompt_speedups([r for r in records if (r["dataset"], r["method"]) ==
                                          (row["dataset"], row["method"])], base)
            rows.append([kv_cache, row["dataset"], row["method"], row["prompts"], f"{row['tok_s']:.1f}",
                         f"{row['speedup']:.2f}x", f"{min(ratios):.2f}x", f"{row['tokens_per_step']:.2f}",
                         f"{row['identical']}/{row['prompts']}", _first_differences(records, row)])
        print(table_text(table("", HEADER, rows[first:])), flush=True)   # this cache's rows, as they come
    kept = [table(f"plain decoding and draftcore with each KV cache, {args.threads} threads, {args.new} new tokens "
                  f"(identical: to plain decoding with the same cache)", HEADER, rows)]
    report = make_report("llama.cpp exactness past 256 tokens of context, by KV cache type", kept,
                         command=command_line(sys.argv if argv is None else ["benchmarks/llamacpp_kv_exactness.py", *argv]),
                         settings={"llamacpp": json.dumps({k: d["settings"] for k, d in details.items()})})
    print(f"\nmachine: {machine_line(report['machine'])}")
    print("wrote", write_report(args.out + ".json", report, records={k: d["records"] for k, d in details.items()}))
    return 0


def _first_differences(records, row) -> str:
    """The new-token indices where this row's outputs first differ from plain decoding, sorted."""
    firsts = sorted(r["first_difference"] for r in records if (r["dataset"], r["method"]) ==
                    (row["dataset"], row["method"]) and r["identical"] is False)
    return ", ".join(str(i) for i in firsts) or "-"


HEADER = ["KV cache", "dataset", "method", "prompts", "tok/s (median)", "vs plain (median)", "lowest",
          "tokens/step", "identical", "first differences at"]

if __name__ == "__main__":
    sys.exit(main())
