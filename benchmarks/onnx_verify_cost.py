"""Median wall time of one OrtVerifier step by tree size: verify a tree, commit its root (SmolLM2-135M
fp32, draftcore's tree export, ONNX Runtime's CPU EP by default).

    .venv/bin/python benchmarks/onnx_verify_cost.py [--n-past 200] [--reps 15] [--sizes 1,2,4,8,16,32,64]

The table is what the auto budget would measure of ONNX Runtime on this machine: the `onnx-cpu`
cost table of draftcore.tools.cost_model, which the budget's replays (budget_sim.py,
budget_ablation.py) price steps by. Each sample verifies a fresh random tree after ~n_past tokens and
commits the root alone, as decoding does, so n_past grows by one per sample.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from _common import write_json


def main():
    from draftcore import DraftTree
    from draftcore.adapters.onnx import OrtVerifier
    from draftcore.adapters.onnx.builds import tree_export
    from draftcore.tools.backends.default_model import default_hf_folder
    from draftcore.tools.report import make_report, show_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-past", type=int, default=200)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--provider", default="CPUExecutionProvider")
    args = ap.parse_args()

    verifier = OrtVerifier(str(tree_export(default_hf_folder(), "float32")), providers=[args.provider])
    rng = np.random.default_rng(0)
    title = f"SmolLM2-135M fp32, draftcore's tree export, {args.provider}, n_past ~{args.n_past}"
    print(title, flush=True)
    rows, records, table = [], [], {}
    for n in [int(s) for s in args.sizes.split(",")]:
        verifier.prefill(rng.integers(3, verifier.vocab_size, args.n_past).astype(np.int32))
        parents = np.r_[-1, [rng.integers(0, i) for i in range(1, n)]].astype(np.int32)
        times = []
        for _ in range(args.reps + 2):   # two warm-ups
            tree = DraftTree.build(rng.integers(3, verifier.vocab_size, n).astype(np.int32), parents)
            t0 = time.perf_counter()
            verifier.verify(tree)
            verifier.commit(np.zeros(1, np.int32))
            times.append(time.perf_counter() - t0)
        ms = np.array(times[2:]) * 1e3
        table[n] = round(float(np.median(ms)), 2)
        rows.append([n, f"{np.median(ms):.1f}", f"{ms.min():.1f}", f"{ms.max():.1f}"])
        records.append({"nodes": n, "step_ms": ms.tolist()})
        print(f"  n={n}: median {rows[-1][1]} ms", flush=True)   # progress; the table follows
    shown = show_table(title, ["tree nodes", "verify + commit ms (median)", "min", "max"], rows)
    report = make_report("OrtVerifier step wall time by tree size (SmolLM2-135M)", [shown],
                         settings={"provider": args.provider, "n_past": args.n_past, "reps": args.reps})
    print("ms_by_nodes", table)
    print("wrote", write_json("onnx_verify_cost.json", report, records=records, ms_by_nodes=table))


if __name__ == "__main__":
    main()
