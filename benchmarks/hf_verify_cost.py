"""Median wall time of one HFVerifier.verify forward by tree size (SmolLM2-135M, CPU by default).

    python benchmarks/hf_verify_cost.py [--n-past 200] [--reps 9] [--dtype float32] [--attn sdpa]

Each sample: verify a random tree of n nodes after a prefill of n_past tokens, then commit the root
only, so n_past grows by one per sample (as in decoding). The cost curve is what a budget policy
weighs against acceptance: a bigger tree pays off only while its extra accepted tokens outweigh its
extra verify time (draftcore.CostAwareBudget learns this curve online from measured step times).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from _common import write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    import torch
    from draftcore import DraftTree
    from draftcore.adapters.torch_hf import HFVerifier, kv_cache, load_smollm2
    from draftcore.tools.report import make_report, show_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-past", type=int, default=200)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--attn", default="draftcore_sdpa", help="draftcore_sdpa (load_smollm2's default), sdpa, eager")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    model, _ = load_smollm2(dtype=getattr(torch, args.dtype), device=args.device, attn_implementation=args.attn)
    verifier = HFVerifier(model)
    keyword = kv_cache.cache_keyword(model)   # looked up once, outside the timed forwards
    rng = np.random.default_rng(0)
    title = (f"SmolLM2-135M {args.dtype} {args.attn} {args.device}, torch threads {torch.get_num_threads()}, "
             f"n_past ~{args.n_past}")
    print(title, flush=True)
    rows, records = [], []
    for n in [int(s) for s in args.sizes.split(",")]:
        verifier.prefill(rng.integers(0, verifier.vocab_size, args.n_past).astype(np.int32))
        parents = np.r_[-1, [rng.integers(0, i) for i in range(1, n)]] if n > 1 else np.array([-1])
        times, plain = [], []
        for rep in range(args.reps + 2):  # two warm-up forwards
            tree = DraftTree.build(rng.integers(0, verifier.vocab_size, n), parents)
            times.append(_timed(lambda: verifier.verify(tree), args.device))
            verifier.commit(np.zeros(1, np.int32))
            # the same n tokens as a plain causal chain on a copy-free cache view: the cost without
            # draftcore (no tree mask, no explicit positions), interleaved so load affects both alike
            plain.append(_timed(lambda: _plain_forward(verifier, tree.tokens, keyword), args.device))
        ms, ms_plain = np.array(times[2:]) * 1e3, np.array(plain[2:]) * 1e3
        rows.append([n, f"{np.median(ms):.1f}", f"{ms.min():.1f}", f"{ms.max():.1f}", f"{np.median(ms_plain):.1f}"])
        records.append({"nodes": n, "verify_ms": ms.tolist(), "plain_causal_ms": ms_plain.tolist()})
        print(f"  n={n}: median {rows[-1][1]} ms", flush=True)   # progress; the table follows
    header = ["tree nodes", "verify ms (median)", "min", "max", "plain causal forward ms (median)"]
    shown = show_table(title, header, rows)
    report = make_report("HFVerifier.verify wall time by tree size (SmolLM2-135M)", [shown],
                         settings={"dtype": args.dtype, "attn": args.attn, "device": args.device,
                                   "n_past": args.n_past, "reps": args.reps})
    print("wrote", write_json("hf_verify_cost.json", report, records=records))


def _timed(fn, device) -> float:
    import torch
    if device != "cpu":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()  # both return host data, so the forward is complete
    return time.perf_counter() - t0


def _plain_forward(verifier, tokens, keyword):
    """Forward `tokens` as a causal chain after the verifier's cache (passed by the name `keyword`),
    then drop their KV again."""
    import torch
    from draftcore.adapters.torch_hf import kv_cache
    cache, n_past = verifier._cache, verifier.n_past
    with torch.inference_mode():
        ids = torch.from_numpy(tokens).to(verifier.device, torch.long)[None]
        out = verifier.model(input_ids=ids, use_cache=True, **{keyword: cache})
        result = out.logits[0].argmax(-1).cpu().numpy()
    kv_cache.truncate(cache, n_past)
    return result


if __name__ == "__main__":
    main()
