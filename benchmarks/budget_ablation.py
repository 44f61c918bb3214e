"""Ablation of the auto budget: each rule removed or set to its simplest form, replayed beside today's.

Every ablation is built here, in the benchmark, by a CostAwareBudget setting or by swapping one part
of the budget for its simplest form while the replay runs (unittest.mock.patch): no library option
exists for it. Each is replayed as benchmarks/budget_sim.py replays "auto" (the recorded SmolLM2
traces through the real loop on a simulated clock, one budget per dataset) on every cost table of
draftcore.tools.cost_model plus the recorded H200 ONNX table, and with --fresh as well: each trace
alone on a fresh verifier (a new deployment's first request: the floor). Writes
bench_out/budget_ablation.json and prints the markdown table (ratio of each ablation's speedup to
today's) that docs/budget.md carries.

    .venv/bin/python benchmarks/budget_ablation.py [--only NAME,...] [--settings] [--markdown PATH]
"""
import argparse
import contextlib
import math
from unittest import mock

import numpy as np

from _common import TRACES, TRACES_EOS, HERE, write_json

from draftcore import CostAwareBudget
from draftcore.tools.cost_model import COST_TABLES, CostModel
from draftcore.tools.replay import replay
from draftcore.tools.report import make_report, show_table, table_text
from draftcore.tools.traces import read_traces
import draftcore.budget as budget_pkg

WORKLOADS = [TRACES, f"{HERE}/data/smollm2_workload_traces.jsonl.gz", f"{HERE}/data/smollm2_pydoc_traces.jsonl.gz"]
# The H200's ONNX Runtime (CUDA EP) step costs, ms by nodes: docs/results/gpu-check_onnx_h200_2026-11-27.json.
EXTRA_TABLES = {"onnx-cuda-h200": {1: 16.558, 2: 17.649, 4: 18.07, 8: 17.56, 16: 17.838, 32: 17.723, 64: 19.696}}


def _part(name):
    """A module of the budget package, wherever it lives (the names below patch its classes)."""
    import importlib
    return importlib.import_module(f"draftcore.budget.{name}")


def _patches(*targets):
    """A context factory entering each (object, attribute, value) patch."""
    @contextlib.contextmanager
    def context():
        with contextlib.ExitStack() as stack:
            for obj, attr, value in targets:
                stack.enter_context(mock.patch.object(obj, attr, value))
            yield
    return context


def _no_context():
    return contextlib.nullcontext()


def ablations():
    """name -> (what it is, CostAwareBudget settings, a context factory patching parts for the replay)."""
    out = {"today": ("the budget as it is", {}, _no_context)}

    def add(name, what, settings=None, context=_no_context):
        out[name] = (what, settings or {}, context)

    # windows and their trials
    add("windows always", "window_cost=inf: every window rides (no probe, no trials, no charge)",
        {"window_cost": float("inf")})
    lookahead = _part("lookahead")
    probe = getattr(lookahead, "LookaheadProbe", None)
    if probe is not None and hasattr(probe, "trial"):
        add("no window trials", "a dropped window never rides again to be re-measured",
            context=_patches((probe, "trial", lambda self, step: False)))
        add("no window probe", "a drafter is asked for its window every step, even after one was dropped",
            context=_patches((probe, "wants", lambda self: True)))
    # an experiment always afforded, charged nothing to the floor
    unguarded = (("window experiments unguarded", "a window's first step and trials ride without asking the floor"))
    if hasattr(getattr(lookahead, "Windows", None), "at_worst"):
        add(*unguarded, context=_patches((lookahead.Windows, "at_worst", staticmethod(
            lambda costs, n_lookahead, n_draft, guard: (float(n_draft + 1 + n_lookahead), 0.0)))))
    elif hasattr(CostAwareBudget, "_window_at_worst"):   # before the window part owned it
        add(*unguarded, context=_patches((CostAwareBudget, "_window_at_worst",
                                          lambda self, n_lookahead, n_draft: (float(n_draft + 1 + n_lookahead), 0.0))))
    # aftermath
    try:
        aftermath = _part("aftermath")
    except ImportError:
        aftermath = None
    if aftermath is not None:
        def settle(self, table, n_candidates, n_lookahead, seconds, teaches):
            return [(table, n_candidates, n_lookahead, seconds)] if teaches else []
        add("no aftermath", "a step's cost is its own seconds, learnt at once",
            context=_patches((aftermath.Aftermath, "settle", settle),
                             (aftermath.Aftermath, "holds", lambda self, table, n: False),
                             (aftermath.Aftermath, "flush", lambda self: [])))
    # corrections
    add("no bias", "bias correction a constant 1",
        context=_patches((CostAwareBudget, "bias", lambda self: 1.0)))
    add("no gamble", "gamble correction a constant 1",
        context=_patches((CostAwareBudget, "gamble_correction", lambda self: 1.0)))
    add("no corrections", "bias and gamble constant 1",
        context=_patches((CostAwareBudget, "bias", lambda self: 1.0),
                         (CostAwareBudget, "gamble_correction", lambda self: 1.0)))
    # explore
    try:
        explore = _part("explore")
        add("no explore", "always the best menu size, never a neighbour",
            context=_patches((explore.Explorer, "pick", lambda self, step, best, value: best)))
    except (ImportError, AttributeError):
        pass
    # idle skipping
    try:
        idle = _part("idle")
        add("no idle skipping", "the drafter is asked every drafting step (no idle or hopeless skips)",
            context=_patches((idle.IdleSkipping, "skip", lambda self: False),
                             (idle.IdleSkipping, "after_choice", lambda self, k, hopeless: k)))
        add("idle: skip without measuring", "idle skipping whether or not asking the drafter costs (no idle_cost test)",
            context=_patches((idle.IdleSkipping, "asking_costs", lambda self: True)))
        after_choice = idle.IdleSkipping.after_choice
        add("idle: no hopeless skip", "a hopeless proposal skips no step",
            context=_patches((idle.IdleSkipping, "after_choice", lambda self, k, hopeless: after_choice(self, k, False))))
    except (ImportError, AttributeError):
        pass
    add("explore_backoff=1", "explorations, pause trials and window trials at fixed intervals", {"explore_backoff": 1})
    # calibration
    calibration = _part("calibration")
    cells = calibration.Calibration.cells
    ranks = calibration.RANKS
    add("calibration: no rank", "one rank bucket: acceptance by score bin only",
        context=_patches((calibration.Calibration, "cells",
                          lambda self, tree, m: cells(self, tree, m) // ranks * ranks)))
    mid = calibration.BINS // 2 * ranks
    add("calibration: no score", "one score bin (prior 0.5): acceptance by rank only",
        context=_patches((calibration.Calibration, "cells",
                          lambda self, tree, m: cells(self, tree, m) % ranks + mid)))
    add("calibration: no memory", "memory=None: acceptance evidence never fades", {"memory": None})
    # context buckets
    try:
        contexts = _part("contexts")
        add("one context bucket", "one cost table for every context length",
            context=_patches((contexts.ContextCosts, "at", lambda self, n_past: None)))
    except (ImportError, AttributeError):
        pass
    # first-step clamp and the reach
    costs = _part("costs")
    if hasattr(costs.CostTable, "_guessable"):
        add("no first-step clamp", "a tree's first measurement is taken whole (no clamp at OUTLIER x its guess)",
            context=_patches((costs.CostTable, "_guessable", lambda self: False)))
    add("no reach limit", "any menu size from the first step (no growth by doubling from 2 nodes)",
        context=_patches((costs.CostTable, "reachable", lambda self: len(self.sizes))))
    # pause trials
    add("no pause trials", "trial_steps=0: drafting is never paused", {"trial_steps": 0})
    # floor guard
    add("no floor guard", "max_loss=inf: every tree affordable", {"max_loss": float("inf")})
    floor = _part("floor")
    if hasattr(floor, "CARRIED_SLACK"):
        add("no carried slack", "each request starts with FIRST_SLACK, none carried over",
            context=_patches((floor, "CARRIED_SLACK", floor.FIRST_SLACK)))
    return out


def setting_variants():
    """name -> (what, settings, context): each constant or option set to a neighbouring value, or to
    another setting's value so that the two could become one (docs/budget.md, "Settings: what
    merging them would cost")."""
    def constant(module, **values):
        return _patches(*((_part(module), name, value) for name, value in values.items()))
    cost_aware = "cost_aware"
    out = {"today": ("the budget as it is", {}, _no_context)}
    for name, what, settings, context in [
        ("pause trials at most ARM_MEMORY steps apart", "MAX_BACKOFF 4 for pausing", {},
         constant("pausing", MAX_BACKOFF=4)),
        ("no MAX_BACKOFF cap", "intervals back off without a cap", {},
         _patches((_part("pausing"), "MAX_BACKOFF", 10**9), (_part("explore"), "MAX_BACKOFF", 10**9))),
        ("SETTLED_TRIALS 0", "a pause win is always confirmed soon", {}, constant("pausing", SETTLED_TRIALS=0)),
        ("SETTLED_TRIALS never", "a pause win is never confirmed soon", {}, constant("pausing", SETTLED_TRIALS=10**9)),
        ("PAUSE_MARGIN 0.02", "= idle_cost", {}, constant("pausing", PAUSE_MARGIN=0.02)),
        ("PAUSE_MARGIN 0.1", "", {}, constant("pausing", PAUSE_MARGIN=0.1)),
        ("trial_every 16", "= explore_every", {"trial_every": 16}, _no_context),
        ("trial_every 32", "", {"trial_every": 32}, _no_context),
        ("CORRECTION_MEMORY 64", "", {}, constant(cost_aware, CORRECTION_MEMORY=64)),
        ("CORRECTION_MEMORY 16", "", {}, constant(cost_aware, CORRECTION_MEMORY=16)),
        ("one correction prior: 4", "GAMBLE_PRIOR = BIAS_PRIOR", {}, constant(cost_aware, GAMBLE_PRIOR=4.0)),
        ("one correction prior: 8", "", {}, constant(cost_aware, BIAS_PRIOR=8.0, GAMBLE_PRIOR=8.0)),
        ("one correction prior: 12", "BIAS_PRIOR = GAMBLE_PRIOR", {}, constant(cost_aware, BIAS_PRIOR=12.0)),
        ("one correction floor: 0.25", "GAMBLE_FLOOR = BIAS_FLOOR", {}, constant(cost_aware, GAMBLE_FLOOR=0.25)),
        ("one correction floor: 0.5", "= HOPELESS", {}, constant(cost_aware, BIAS_FLOOR=0.5, GAMBLE_FLOOR=0.5)),
        ("one correction floor: 0.6", "BIAS_FLOOR = GAMBLE_FLOOR", {}, constant(cost_aware, BIAS_FLOOR=0.6)),
        ("AFTERMATH_FLOOR 0", "", {}, constant("aftermath", AFTERMATH_FLOOR=0.0)),
        ("PAUSE_TRIAL 2", "", {}, constant("pausing", PAUSE_TRIAL=2)),
        ("PAUSE_TRIAL 8", "", {}, constant("pausing", PAUSE_TRIAL=8)),
        ("CALIBRATION_PRIOR 1", "", {}, constant("calibration", CALIBRATION_PRIOR=1.0)),
        ("CALIBRATION_PRIOR 4", "", {}, constant("calibration", CALIBRATION_PRIOR=4.0)),
        ("CARRIED_SLACK 2", "", {}, constant("floor", CARRIED_SLACK=2.0)),
        ("CARRIED_SLACK 8", "", {}, constant("floor", CARRIED_SLACK=8.0)),
        ("idle_skip 4", "", {"idle_skip": 4}, _no_context),
        ("optimism 0.1", "= window_cost", {"optimism": 0.1}, _no_context),
        ("HOPELESS 1/3", "", {}, _patches((_part(cost_aware), "HOPELESS", 1 / 3), (_part("explore"), "HOPELESS", 1 / 3))),
    ]:
        out[name] = (what or name, settings, context)
    return out


def run_one(traces_by_dataset, cost, settings, context, fresh, carried=None):
    """{dataset: speedup} (or, fresh: {dataset: [per-request speedups]}). carried ("forward" or
    "reversed"): every trace through one budget, the datasets in file order or the reverse, as one
    deployment serving one workload after another."""
    result = {}
    with context():
        if carried:
            ordered = [t for subset in traces_by_dataset.values() for t in subset]
            summaries = replay(ordered if carried == "forward" else ordered[::-1],
                               budget=CostAwareBudget(**settings), cost=cost, eos_token_id=TRACES_EOS)
            return {name: summary.speedup for name, summary in summaries.items()}
        for name, subset in traces_by_dataset.items():
            if fresh:
                result[name] = [next(iter(replay([t], budget=CostAwareBudget(**settings), cost=cost,
                                                 eos_token_id=TRACES_EOS).values())).speedup for t in subset]
            else:
                (summary,) = replay(subset, budget=CostAwareBudget(**settings), cost=cost,
                                    eos_token_id=TRACES_EOS).values()
                result[name] = summary.speedup
    return result


def markdown(records, names, tables, datasets, fresh):
    """Rows: ablation; columns: cost table x dataset; cells: speedup ratio to today's (fresh: median)."""
    def value(rec):
        return float(np.median(rec)) if fresh else rec
    head = ["ablation"] + [f"{t} {d}" for t in tables for d in datasets]
    lines = []
    for name in names:
        if name == "today":
            cells = [f"{value(records[name][t][d]):.2f}x" for t in tables for d in datasets]
        else:
            cells = [f"{value(records[name][t][d]) / value(records['today'][t][d]):.3f}" for t in tables
                     for d in datasets]
        lines.append([name] + cells)
    return head, lines


def compact(records, names, tables, datasets, fresh):
    """One row per ablation: its worst and best ratio to today's over every table and workload, and
    where the worst is (fresh: by median, and the requests below 0.95x in all against today's)."""
    def value(rec):
        return float(np.median(rec)) if fresh else rec
    rows = []
    for name in names:
        if name == "today":
            continue
        ratios = [(value(records[name][t][d]) / value(records["today"][t][d]), t, d) for t in tables for d in datasets]
        worst, best = min(ratios), max(ratios)
        row = [name, f"{worst[0]:.3f} ({worst[1]} {worst[2]})", f"{best[0]:.3f} ({best[1]} {best[2]})"]
        if fresh:
            below = sum(int((np.array(records[name][t][d]) < 0.95).sum()) for t in tables for d in datasets)
            row.append(str(below))
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="ablation names separated by ',' (today always runs)")
    parser.add_argument("--settings", action="store_true",
                        help="replay the settings' variants (setting_variants) instead of the rules' ablations")
    parser.add_argument("--out", default="budget_ablation.json")
    parser.add_argument("--markdown", default="", help="also write the tables as markdown to this path")
    args = parser.parse_args()
    traces = [t for path in WORKLOADS for t in read_traces(path)]
    by_dataset: dict = {}
    for trace in traces:
        by_dataset.setdefault(trace.dataset, []).append(trace)
    tables = {name: CostModel(table, name) for name, table in {**COST_TABLES, **EXTRA_TABLES}.items()}
    chosen = setting_variants() if args.settings else ablations()
    if args.only:
        keep = {"today", *args.only.split(",")}
        chosen = {k: v for k, v in chosen.items() if k in keep}
    modes = ("replay", "fresh", "forward", "reversed")
    records = {mode: {} for mode in modes}
    for name, (what, settings, context) in chosen.items():
        for mode in modes:
            records[mode][name] = {t: run_one(by_dataset, cost, settings, context, mode == "fresh",
                                              mode if mode in ("forward", "reversed") else None)
                                   for t, cost in tables.items()}
        worst = min(records["replay"][name][t][d] / records["replay"]["today"][t][d]
                    for t in tables for d in by_dataset)
        print(f"{name}: worst replay ratio {worst:.3f}", flush=True)
    names, datasets = list(chosen), list(by_dataset)
    sections = []
    for mode in modes:
        fresh = mode == "fresh"
        head = ["ablation", "worst ratio to today (where)", "best ratio (where)"] + (
            ["requests below 0.95x, all tables"] if fresh else [])
        rows = compact(records[mode], names, list(tables), datasets, fresh)
        if fresh:
            below = sum(int((np.array(records[mode]["today"][t][d]) < 0.95).sum()) for t in tables for d in datasets)
            rows.insert(0, ["today", "1", "1", str(below)])
        what = {"replay": "speedup (one budget per dataset)", "fresh": "median first-request speedup",
                "forward": "speedup, one budget carried over all datasets in file order",
                "reversed": "speedup, one budget carried over all datasets in reverse order"}[mode]
        sections.append(show_table(f"{mode}: ratio of each ablation's {what} to today's", head, rows))
        full_head, full_rows = markdown(records[mode], names, list(tables), datasets, fresh)
        sections.append(show_table(f"{mode}, per cost table and workload", full_head, full_rows))
    report = make_report("Auto budget ablation (replayed traces, recorded cost tables)", sections)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n\n".join(table_text(section) for section in sections) + "\n")
    descriptions = {name: (what, {k: (v if math.isfinite(v) else "inf") if isinstance(v, float) else v
                                  for k, v in settings.items()}) for name, (what, settings, _) in chosen.items()}
    print("wrote", write_json(args.out, report, records=records, ablations=descriptions,
                              tables={t: c.ms_by_nodes for t, c in tables.items()}))


if __name__ == "__main__":
    main()
