"""The most any drafter that copies from its context could speed up a request end to end, measured
on this machine, beside what the trie does (SmolLM2-135M, HF float32, CPU).

    python benchmarks/end_to_end_bound.py [--datasets agent] [--n 15] [--warmup 5]

A decode bound (draftcore.tools.bounds) says how few verify steps copying could take; a user sees
the whole request: the prefill too, and plain decoding pays it in full where a verifier that keeps a
shared prefix (reuse_prefix) pays only the rest. So, request after request of each dataset:

  plain     `model.generate(do_sample=False)`, timed (the bench's "plain greedy"); its output is
            the reference;
  trie      the bench's "draftcore trie (auto budget)" (its own verifier, trie and budget kept across
            the dataset), timed; identical to plain or not;
  bound     a third verifier prefills the prompt as the trie's does (keeping what it shares with the
            previous prompt), timed, and the faster of that and the trie's own prefill counts; then,
            at that context, one verify of a chain of n nodes is timed for each n in --sizes (the
            fastest of --reps: on a noisy machine the bound takes the machine's best moments, so
            that noise cannot put it below the trie). The fastest decode of plain's output by
            the best copying drafter (`copy_decode_seconds`: each step drafts what the output holds
            and some earlier text continued, every earlier request's prompt and output seen, at these
            costs) is added to that prefill: bound = plain seconds / (prefill + that decode).

The bound leaves out everything but forwards (drafting, acceptance, the loop): a real drafter of
the family is slower. Plain's first token comes from its prefill, as the verifier's does, so the
decode bound starts at the second. The table gives medians over the requests after the first
--warmup (the drafter's history), and all tokens over all time. A target above the bound's column
cannot be met on this machine by a trie, prompt lookup or suffix decoding, however good.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from _common import write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def chain_costs(verifier, sizes, reps, rng) -> dict[int, float]:
    """{nodes: fastest ms} of one verify of a chain of that many nodes after the verifier's cached
    context (nothing committed: each verify drops the one before)."""
    from draftcore import DraftTree

    costs = {}
    for n in sizes:
        times = []
        for _ in range(reps + 1):   # the first is a warm-up
            tree = DraftTree.chain(int(rng.integers(0, verifier.vocab_size)),
                                   rng.integers(0, verifier.vocab_size, n - 1).astype(np.int32))
            start = time.perf_counter()
            verifier.verify(tree)   # returns host data: the forward is complete
            times.append(time.perf_counter() - start)
        costs[n] = 1e3 * min(times[1:])
    return costs


def add_bounds(requests, traces, frequent: int) -> None:
    """Give each request (a dict with plain_s, prefill_s and chain_ms, its verify ms by chain size)
    bound_copy and bound_copy_or_frequent: plain_s over (prefill_s + the copy oracle's fastest decode
    of its trace at its own chain costs), and the seconds that took (bound_*_s). `traces` in request
    order: later ones see the earlier ones, as a drafter kept across the requests does."""
    from draftcore.tools.bounds import copy_decode_seconds
    from draftcore.tools.cost_model import CostModel

    cost_models = [CostModel(r["chain_ms"]) for r in requests]
    for label, k in (("copy", 0), ("copy_or_frequent", frequent)):
        for r, (_, decode) in zip(requests, copy_decode_seconds(traces, cost_models, frequent=k), strict=True):
            r[f"bound_{label}_s"] = r["prefill_s"] + decode
            r[f"bound_{label}"] = r["plain_s"] / r[f"bound_{label}_s"]


def main():
    from draftcore.adapters.torch_hf import HFVerifier
    from draftcore.tools.backends import hf
    from draftcore.tools.bench import kernel_choices
    from draftcore.tools.report import make_report, show_table
    from draftcore.tools.traces import Trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="agent")
    ap.add_argument("--n", type=int, default=15, help="requests per dataset, the warm-up included")
    ap.add_argument("--warmup", type=int, default=5, help="first requests left out of the medians")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64", help="chain sizes whose verify is timed")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--frequent", type=int, default=64,
                    help="the second bound's k: a step may also draft one of the k most frequent tokens")
    args = ap.parse_args()
    if not 0 <= args.warmup < args.n:
        ap.error(f"--warmup: expected 0 <= warmup < --n ({args.n}) so that a request is measured, got {args.warmup}")
    sizes = [int(s) for s in args.sizes.split(",")]

    model, tokenizer = hf.load_model(None)
    plain, trie = hf.make_methods(model, tokenizer, names=("plain", "trie"))
    bound_verifier = HFVerifier(model, tokenizer=tokenizer, self_check=False,
                                linear_ways=trie.verifier.linear_ways)
    rng = np.random.default_rng(0)
    rows, records = [], []
    for dataset in args.datasets.split(","):
        trie.reset()
        bound_verifier.reset()   # each dataset starts with nothing cached, as the trie's verifier does
        requests = []
        for prompt in hf.load_prompts(tokenizer, dataset, args.n):
            reference = plain.run(prompt.ids, args.max_new_tokens)
            spec = trie.run(prompt.ids, args.max_new_tokens)
            start = time.perf_counter()
            bound_verifier.prefill(prompt.ids)
            prefill = min(time.perf_counter() - start, spec.prefill_seconds)
            costs = chain_costs(bound_verifier, sizes, args.reps, rng)
            output = np.asarray(reference.tokens, np.int32)
            requests.append({"dataset": dataset, "idx": prompt.idx, "prompt_tokens": len(prompt.ids),
                             "kept": bound_verifier.prefix_reused, "new_tokens": len(output),
                             "plain_s": reference.seconds, "trie_s": spec.seconds,
                             "identical": bool(np.array_equal(spec.tokens, output)),
                             "prefill_s": prefill, "chain_ms": costs,
                             # the prefill gives the first token; decoding starts from it
                             "trace": Trace(dataset, prompt.idx, np.r_[prompt.ids, output[:1]].astype(np.int32),
                                            output[1:])})
            print(f"{dataset} {prompt.idx}: {len(prompt.ids)} tokens, plain {reference.seconds:.2f} s, "
                  f"trie {spec.seconds:.2f} s, prefill {prefill:.2f} s", flush=True)
        add_bounds(requests, [r.pop("trace") for r in requests], args.frequent)
        records += requests
        measured = requests[args.warmup:]

        def median(key):
            return statistics.median(r[key] for r in measured)

        def all_time(seconds_key):
            return sum(r["plain_s"] for r in measured) / sum(r[seconds_key] for r in measured)

        rows.append([dataset, len(measured), f"{median('prompt_tokens'):.0f}", f"{median('kept'):.0f}",
                     f"{median('new_tokens'):.0f}", f"{median('plain_s'):.2f}", f"{median('prefill_s'):.2f}",
                     f"{statistics.median(r['plain_s'] / r['trie_s'] for r in measured):.2f}x / "
                     f"{all_time('trie_s'):.2f}x",
                     f"{median('bound_copy'):.2f}x / {all_time('bound_copy_s'):.2f}x",
                     f"{median('bound_copy_or_frequent'):.2f}x / {all_time('bound_copy_or_frequent_s'):.2f}x",
                     f"{sum(r['identical'] for r in measured)}/{len(measured)}"])
    header = ["dataset", "requests", "prompt tokens", "kept", "new tokens", "plain s", "bound's prefill s",
              "trie: median / all time", "bound, copy", f"bound, copy or {args.frequent} frequent",
              "trie identical"]
    shown = show_table(f"SmolLM2-135M float32, HF CPU, after the first {args.warmup} requests: speedup over "
                       f"plain generate() (medians over requests / all tokens over all time)", header, rows)
    report = make_report("End-to-end bound of copying drafters against the trie (SmolLM2-135M)", [shown],
                         settings={"kernels": kernel_choices([trie]), "sizes": sizes, "reps": args.reps})
    print("wrote", write_json("end_to_end_bound.json", report, records=records))


if __name__ == "__main__":
    main()
