"""Median wall time of one HFVerifier.verify forward by tree size (SmolLM2-135M, CPU by default).

    python benchmarks/hf_verify_cost.py [--n-past 200] [--reps 9] [--dtype float32] [--attn sdpa]

Each sample: verify a random tree of n nodes after a prefill of n_past tokens, then commit the root
only, so n_past grows by one per sample (as in decoding). The cost curve is what a budget policy
should follow (DESIGN.md "Backends").
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    import torch
    from draftcore import DraftTree
    from draftcore.adapters.torch_hf import HFVerifier, load_smollm2

    ap = argparse.ArgumentParser()
    ap.add_argument("--n-past", type=int, default=200)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    model, _ = load_smollm2(dtype=getattr(torch, args.dtype), device=args.device, attn_implementation=args.attn)
    verifier = HFVerifier(model)
    rng = np.random.default_rng(0)
    print(f"SmolLM2-135M {args.dtype} {args.attn} {args.device}, torch threads {torch.get_num_threads()}, "
          f"n_past ~{args.n_past}")
    for n in [int(s) for s in args.sizes.split(",")]:
        verifier.prefill(rng.integers(0, verifier.vocab_size, args.n_past).astype(np.int32))
        parents = np.r_[-1, [rng.integers(0, i) for i in range(1, n)]] if n > 1 else np.array([-1])
        times = []
        for rep in range(args.reps + 2):  # two warm-up forwards
            tree = DraftTree.build(rng.integers(0, verifier.vocab_size, n), parents)
            if args.device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            verifier.verify(tree, "argmax")  # returns host int32: the forward is complete
            times.append(time.perf_counter() - t0)
            verifier.commit(np.zeros(1, np.int32))
        ms = np.array(times[2:]) * 1e3
        print(f"  n={n:3d}: median {np.median(ms):7.1f} ms  (min {ms.min():6.1f}, max {ms.max():6.1f})")


if __name__ == "__main__":
    main()
