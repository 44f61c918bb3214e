"""What HFVerifier's construction-time kernel race picks on this machine, how steadily, and what
each pick costs afterwards (SmolLM2-135M fp32, CPU).

    python benchmarks/hf_kernel_race.py [--constructions 8] [--reps 15] [--sizes 1,2,4,8,16]
                                        [--compare "1:torch;16:weight-major;16:packed"]

1. `--constructions` fresh processes each load the model as `from_pretrained` gives it and build
   `HFVerifier(model)`: the way per tree size it chose for the Linear layers (`linear_ways`: torch's
   own, `W @ x.T` or packed weights), construction's medians behind it, and how long construction
   took. A race whose margins sit inside the machine's noise picks differently from one
   construction to the next.
2. In one process, verifiers given each plan seen (and those of `--compare`, `;`-separated
   `linear_ways` written as SIZE:WAY,...; by default each way at every size) verify a chain of each
   size after a 100-token prefill, interleaved, `--reps` times: milliseconds per verify + commit,
   median. This is what a plan costs once made, the race's noise aside.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from _common import write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def construct_once() -> dict:
    """One fresh construction in this process: its choices and seconds."""
    from draftcore.adapters.torch_hf import HFVerifier
    from draftcore.tools.backends import load_backend

    model, _ = load_backend("hf").load_model(None, attn="sdpa")
    start = time.perf_counter()
    verifier = HFVerifier(model)
    seconds = time.perf_counter() - start
    return {"linear_ways": verifier.linear_ways, "timings_ms": verifier.linear_timings, "seconds": seconds}


def constructions(n: int) -> list[dict]:
    """`n` fresh constructions, each in its own process (a warm process would reuse the packed copy)."""
    found = []
    for _ in range(n):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one"], capture_output=True, text=True,
                             check=True).stdout
        found.append(json.loads(out.strip().splitlines()[-1]))
        print(" ", found[-1], flush=True)
    return found


def plan_key(linear_ways: dict) -> tuple:
    """A `linear_ways` dict (its keys ints or, read back from JSON, strings) as a sortable key."""
    return tuple(sorted((int(size), way) for size, way in linear_ways.items()))


def label(plan: tuple) -> str:
    """`((1, 'torch'), (4, 'weight-major'), (16, 'packed'))` as "1 torch, 2-4 weight-major, 5+ packed"."""
    runs = []   # [low, high, way], consecutive sizes of one way merged
    low = 1
    for size, way in plan:
        if runs and runs[-1][2] == way:
            runs[-1][1] = size
        else:
            runs.append([low, size, way])
        low = size + 1
    runs[-1][1] = None   # the last way runs every larger tree too
    return ", ".join(f"{lo}+ {way}" if hi is None else (f"{lo} {way}" if lo == hi else f"{lo}-{hi} {way}")
                     for lo, hi, way in runs)


def steady_costs(choices, sizes, reps: int) -> dict:
    """{plan: {size: [seconds per verify + commit]}}, all plans interleaved in one process."""
    from draftcore import DraftTree
    from draftcore.adapters.torch_hf import HFVerifier
    from draftcore.tools.backends import load_backend

    model, _ = load_backend("hf").load_model(None, attn="sdpa")
    verifiers = {c: HFVerifier(model, linear_ways=dict(c)) for c in choices}
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 20000, 100).astype(np.int32)
    for verifier in verifiers.values():
        verifier.prefill(prompt)
    seconds = {c: {n: [] for n in sizes} for c in choices}
    for rep in range(reps + 1):   # the first round warms up
        for n in sizes:
            tree = DraftTree.build(rng.integers(100, 20000, n).astype(np.int32), [-1] + list(range(n - 1)))
            for choice, verifier in verifiers.items():
                start = time.perf_counter()
                verifier.verify(tree)
                verifier.commit(np.zeros(1, np.int32))
                if rep:
                    seconds[choice][n].append(time.perf_counter() - start)
    return seconds


def main() -> int:
    from draftcore.tools.report import make_report, show_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--constructions", type=int, default=8)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--sizes", default="1,2,4,8,16")
    ap.add_argument("--compare", default="1:torch;16:weight-major;16:packed",
                    help="plans timed beside the picked ones: linear_ways as SIZE:WAY,..., ';' between plans")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)   # a child: one construction
    args = ap.parse_args()
    if args.one:
        print(json.dumps(construct_once()))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{args.constructions} fresh constructions:", flush=True)
    found = constructions(args.constructions)
    picked: dict[tuple, int] = {}
    for f in found:
        key = plan_key(f["linear_ways"])
        picked[key] = picked.get(key, 0) + 1
    compared = {plan_key(dict(entry.split(":") for entry in plan.split(",")))
                for plan in args.compare.split(";") if plan}
    choices = sorted(set(picked) | compared, key=lambda c: (-picked.get(c, 0), c))
    costs = steady_costs(choices, sizes, args.reps)
    timed = sorted({int(n) for f in found for n in f["timings_ms"]})
    ways = sorted({way for f in found for by_way in f["timings_ms"].values() for way in by_way})

    seconds = [f["seconds"] for f in found]
    picks = show_table(f"{args.constructions} fresh constructions (construction took {min(seconds):.1f}-"
                       f"{max(seconds):.1f} s)", ["plan", "constructions that picked it"],
                       [[label(c), f"{picked.get(c, 0)}/{len(found)}"] for c in choices])
    medians = show_table("construction's medians of the decoder + head, ms: the lowest and highest over the "
                         "constructions", ["way", *[f"{n} token{'s' if n > 1 else ''}" for n in timed]],
                         [[way, *[_spread([f["timings_ms"][str(n)][way] for f in found
                                           if way in f["timings_ms"].get(str(n), {})]) for n in timed]]
                          for way in ways])
    steady = show_table(f"verify + commit of a chain after a 100-token prefill, ms (median of {args.reps})",
                        ["plan", *[f"{n} node{'s' if n > 1 else ''}" for n in sizes]],
                        [[label(c), *[f"{1e3 * np.median(costs[c][n]):.1f}" for n in sizes]] for c in choices])
    report = make_report("HFVerifier's kernel race: what fresh constructions pick, and what each pick costs",
                         [picks, medians, steady], settings={"attn": "sdpa", "reps": args.reps})
    records = {label(c): {str(n): costs[c][n] for n in sizes} for c in choices}
    print("wrote", write_json("hf_kernel_race.json", report, constructions=found, steady_seconds=records))
    return 0


def _spread(values) -> str:
    return "-" if not values else f"{min(values):.1f}-{max(values):.1f}"


if __name__ == "__main__":
    sys.exit(main())
