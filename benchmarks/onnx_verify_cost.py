"""Median wall time of one OrtVerifier step by tree size: verify a tree, commit its root (SmolLM2-135M
fp32, draftcore's tree export, ONNX Runtime's CPU EP by default).

    .venv/bin/python benchmarks/onnx_verify_cost.py [--n-past 200] [--reps 15] [--sizes 1,2,4,8,16,32,64]

The table is what the auto budget would measure of ONNX Runtime on this machine: the `onnx-cpu`
cost table of draftcore.tools.cost_model, which the budget's replays (budget_sim.py,
budget_ablation.py) price steps by. The timing is the GPU check's (gpu_check.verify_cost_ms, with
the commit timed): each sample verifies a fresh random tree after ~n_past tokens and commits the
root alone, as decoding does.
"""
from __future__ import annotations

import argparse

import numpy as np
from _common import write_json
from gpu_check import verify_cost_ms


def main():
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
    title = f"SmolLM2-135M fp32, draftcore's tree export, {args.provider}, n_past ~{args.n_past}"
    samples: dict = {}
    table = verify_cost_ms(verifier, [int(s) for s in args.sizes.split(",")], args.n_past, args.reps,
                           with_commit=True, samples=samples)
    rows = [[n, f"{np.median(ms):.1f}", f"{min(ms):.1f}", f"{max(ms):.1f}"] for n, ms in samples.items()]
    shown = show_table(title, ["tree nodes", "verify + commit ms (median)", "min", "max"], rows)
    report = make_report("OrtVerifier step wall time by tree size (SmolLM2-135M)", [shown],
                         settings={"provider": args.provider, "n_past": args.n_past, "reps": args.reps})
    print("ms_by_nodes", table)
    print("wrote", write_json("onnx_verify_cost.json", report,
                              records=[{"nodes": n, "step_ms": ms} for n, ms in samples.items()], ms_by_nodes=table))


if __name__ == "__main__":
    main()
