"""Host-side cost of exact tree sampling over a real vocabulary, per verify step.

Processing (repetition penalty, temperature, top-k, top-p, min-p) plus the acceptance walk over
SmolLM2's 49,152-token vocabulary, on a 17-node chain whose every drafted token is all but certain,
so the walk reaches the leaf and every row is processed (the worst case: a walk that stops early
processes only the rows it reached). Compare with a verify forward (benchmarks/hf_verify_cost.py).
Prints the median and p90 over the repetitions, in milliseconds.

    .venv/bin/python benchmarks/sampling_overhead.py [--reps 30]
"""
import argparse
import time

import numpy as np
from _common import write_json

from draftcore import DraftTree, SamplingParams
from draftcore.sampling import make_rule
from draftcore.tools.report import make_report, show_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--nodes", type=int, default=17)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n, vocab = args.nodes, args.vocab
    tree = DraftTree.chain(int(rng.integers(0, vocab)), rng.integers(0, vocab, n - 1))
    logits = rng.normal(0, 3, (n, vocab)).astype(np.float32)
    logits[np.arange(n - 1), tree.tokens[1:]] += 40.0
    tokens = logits.argmax(axis=1).astype(np.int32)
    rule = make_rule(SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                                    seed=0), vocab)
    rule.start(rng.integers(0, vocab, 500).astype(np.int32))
    path, _ = rule.accept(tree, tokens, logits)
    assert path.shape[0] == n, "the walk should reach the leaf"
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        rule.accept(tree, tokens, logits)
        times.append(time.perf_counter() - t0)
    ms = 1e3 * np.array(times)
    row = [f"{n}-node chain", vocab, f"{np.median(ms):.3f}", f"{np.percentile(ms, 90):.3f}", args.reps]
    shown = show_table("", ["tree", "vocab", "ms per step (median)", "p90", "reps"], [row])
    report = make_report("Host-side cost of exact tree sampling per verify step", [shown])
    print("wrote", write_json("sampling_overhead.json", report, milliseconds=ms.tolist()))


if __name__ == "__main__":
    main()
