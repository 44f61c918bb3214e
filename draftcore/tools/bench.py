"""The benchmark harness: methods run side by side on the same prompts, interleaved prompt by prompt.

A backend supplies the methods (plain greedy, its peers' speculation, draftcore with each drafter)
as `Method` objects; this module runs them, checks outputs against the first method's, and reports
medians. Nothing here imports a framework: the backends do.

Interleaving matters on a noisy machine: a slow minute hurts every method alike instead of one.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from ..validate import positive_int
from .near_ties import first_difference
from . import variants  # noqa: F401  (registers the measured variants: every method runs them by name)
from .report import make_report, table, table_text

FLOOR = 0.95   # a prompt's ratio to plain decoding below this counts against the floor (benchmarks/floor.py too)


@dataclass
class Run:
    """One method on one prompt."""

    tokens: np.ndarray       # int32 generated ids
    seconds: float           # wall clock of the generation (prefill included)
    steps: int               # model forwards, prefill included
    drafting_seconds: float = 0.0
    budgets: dict = field(default_factory=dict)
    lookahead_nodes: int = 0     # lookahead-window nodes verified over the run (jacobi, composite)
    prefix_reused: int = 0       # prompt tokens whose cached KV the prefill kept (HFVerifier's reuse_prefix)
    prefill_seconds: float = 0.0  # of `seconds`, the prefill's (draftcore methods)


@dataclass
class Method:
    """name: shown in the table; run(prompt_ids, max_new_tokens) -> Run; reset(): new dataset;
    restart(): new round of the whole prompt list (for state a method keeps across datasets).
    sampled: the method samples, so its output is compared with no other (identical is None).
    verifier: the draftcore verifier it runs, if any (reports read its kernel choices)."""

    name: str
    run: Callable[[np.ndarray, int], Run]
    reset: Callable[[], None] = lambda: None
    sampled: bool = False
    restart: Callable[[], None] = lambda: None
    verifier: object = None


def draftcore_method(name: str, verifier, budget_factory: Callable, *, eos_token_id=None, sampling=None,
                     count_forwards: Callable[[], int] | None = None, drafter: str = "trie") -> Method:
    """draftcore.speculate over `verifier` with a drafter (by name, drafter_names()) and a budget that
    live across one dataset's prompts (as a server keeps them across requests) and start afresh with
    each dataset, as does the verifier's sequence (a verifier that reuses a cached prompt prefix,
    HFVerifier's reuse_prefix, starts each dataset with none: give each method its own verifier, or
    one method's run would reuse another's prefill of the same prompt).

    budget_factory: () -> a budget for speculate: an int (fixed) or a policy object such as
        `CostAwareBudget()` (not "auto", which would be the verifier's session budget, never reset).
    sampling: None for greedy, else speculate's sampling options; each prompt gets the next seed.
    count_forwards: () -> the backend's own running count of model forwards; a Run's steps are its
        increase over the run (exact even where a long prompt takes several forwards). Default: the
        speculate loop's steps.
    """
    from ..drafters import make_drafter

    make_drafter(drafter, verifier.vocab_size)  # an unknown name fails here, before any run
    state = {}
    seeds = iter(range(1 << 62))

    def reset():
        state["drafter"] = make_drafter(drafter, verifier.vocab_size)
        state["budget"] = budget_factory()
        _forget_sequence(verifier)

    def run(prompt_ids, max_new_tokens) -> Run:
        if not state:
            reset()
        return _speculate_run(verifier, prompt_ids, max_new_tokens, count_forwards, drafter=state["drafter"],
                              budget=state["budget"], eos_token_id=eos_token_id,
                              sampling=_next_seed(sampling, seeds))

    return Method(name, run, reset, sampled=sampling is not None, verifier=verifier)


def kernel_choices(methods: Sequence[Method]) -> dict:
    """{method names: what their verifier chose on this machine} for the verifiers that report it
    (a `kernel_choices` attribute: HFVerifier's split head, Linear kernels, one-token forwards);
    methods sharing a verifier share one entry, under their names joined by " + "."""
    by_verifier: dict[int, tuple[list, dict]] = {}
    for method in methods:
        choices = getattr(method.verifier, "kernel_choices", None)
        if choices is not None:
            by_verifier.setdefault(id(method.verifier), ([], choices))[0].append(method.name)
    return {" + ".join(names): choices for names, choices in by_verifier.values()}


def fixed_budget_method(name: str, max_draft: int | None = None) -> tuple[str, int] | None:
    """(drafter, n) for a method name "DRAFTER-fixedN" (a drafter of drafter_names() verifying up to
    N drafted nodes every step, FixedBudget(N)), else None. A fixed size beside the auto budget shows
    what the budget's choices cost or gain on this machine. A drafter's lookahead window (jacobi,
    composite) rides along whole with the N nodes, as FixedBudget keeps it: only the cost-aware budget
    drops it where verify is not free (`composite-nowindow-fixedN` is the composite without one).

    max_draft: the most drafted nodes the backend's verifier takes; a larger N is a ConfigError.
    """
    from ..drafters import drafter_names
    from ..errors import ConfigError

    match = re.fullmatch(r"(.+)-fixed(\d+)", name)
    if match is None or match.group(1) not in drafter_names():
        return None
    n = int(match.group(2))
    if max_draft is not None and n > max_draft:
        raise ConfigError(f"methods: {name!r} drafts {n} nodes a step; this backend's verifier takes at most "
                          f"{max_draft} (expected DRAFTER-fixedN with 0 <= N <= {max_draft})")
    return match.group(1), n


def fixed_budget_methods(names, make_method: Callable[[str, int], Method],
                         max_draft: int | None = None) -> dict[str, Callable[[], Method]]:
    """{name: () -> Method} for every "DRAFTER-fixedN" among `names` (fixed_budget_method), the
    method built by make_method(drafter, n): the entries a backend adds to its table of methods."""
    table = {}
    for name in names:
        fixed = fixed_budget_method(name, max_draft)
        if fixed is not None:
            table[name] = lambda fixed=fixed: make_method(*fixed)
    return table


def bare_call_method(name: str, verifier, *, eos_token_id=None, sampling=None,
                     count_forwards: Callable[[], int] | None = None) -> Method:
    """`draftcore.speculate(verifier, prompt)` with no drafter and no budget: what a user gets from
    the bare call (the verifier's `Session.of`, kept across every prompt and dataset; reset only
    when a new round of the whole prompt list starts, `run_benchmark(rounds=...)`, together with
    the verifier's sequence)."""
    from ..session import Session

    seeds = iter(range(1 << 62))

    def restart():
        Session.of(verifier).reset()
        _forget_sequence(verifier)

    def run(prompt_ids, max_new_tokens) -> Run:
        return _speculate_run(verifier, prompt_ids, max_new_tokens, count_forwards, eos_token_id=eos_token_id,
                              sampling=_next_seed(sampling, seeds))

    return Method(name, run, sampled=sampling is not None, restart=restart, verifier=verifier)


def _forget_sequence(verifier) -> None:
    """Empty the verifier's cache where it can (`reset`, not part of the protocol): a prompt prefix
    it reuses must come from the same method's earlier requests of this dataset or round."""
    reset = getattr(verifier, "reset", None)
    if callable(reset):
        reset()


def _speculate_run(verifier, prompt_ids, max_new_tokens, count_forwards, **options) -> Run:
    from ..speculate import speculate

    before = count_forwards() if count_forwards else 0
    result = speculate(verifier, prompt_ids, max_new_tokens=max_new_tokens, **options)
    st = result.stats
    steps = count_forwards() - before if count_forwards else st.steps
    return Run(result.tokens, st.time_total, steps, st.time_drafting, dict(st.budget_hist), st.lookahead_nodes,
               getattr(verifier, "prefix_reused", 0), st.time_prefill)


def _next_seed(sampling, seeds):
    """This run's sampling options: None (greedy), or `sampling` with the next seed of `seeds`."""
    return None if sampling is None else dict(sampling, seed=next(seeds))


@dataclass
class Prompt:
    dataset: str
    idx: int
    ids: np.ndarray


def run_benchmark(methods: Sequence[Method], prompts: Sequence[Prompt], max_new_tokens: int, *,
                  warmup: int = 1, rounds: int = 1, progress=None) -> list[dict]:
    """Run every method on every prompt (methods interleaved per prompt); the first `warmup` prompts
    of each dataset are run but not recorded. The first method is the reference for identical-output
    checks (none for sampled methods, or when the reference samples). Returns one record per
    (method, recorded prompt).

    rounds: how many times the whole prompt list is run. Each round starts afresh (`Method.restart`,
    then `Method.reset` at every dataset), so a method that learns from past outputs never sees a
    prompt's output before generating it, and every round does the same work; only the machine's
    noise differs. Round r runs each prompt's methods in order rotated by r (round 1: the second
    method first): a method that always ran right after another (a baseline always right after the
    previous prompt's largest trees, on a shared session or cache) would carry what that leaves
    behind into every round. A record is then the round of median speed of that method on that
    prompt (the lower median when `rounds` is even), with every round's tokens/s (and identical
    output) beside it; its output counts as identical only if it was in every round.
    """
    rounds = positive_int("rounds", rounds)
    by_round = [_run_round(methods, prompts, max_new_tokens, warmup, progress, shift=r) for r in range(rounds)]
    return [_median_round(runs) for runs in zip(*by_round)] if rounds > 1 else by_round[0]


def _run_round(methods, prompts, max_new_tokens: int, warmup: int, progress, shift: int = 0) -> list[dict]:
    """One round: every prompt, its methods run in order rotated by `shift`, recorded in `methods` order."""
    for method in methods:
        method.restart()
    order = [(shift + i) % len(methods) for i in range(len(methods))]
    records = []
    seen: dict[str, int] = {}
    for prompt in prompts:
        seen[prompt.dataset] = seen.get(prompt.dataset, 0) + 1
        if seen[prompt.dataset] == 1:
            for method in methods:
                method.reset()
        runs = {i: methods[i].run(prompt.ids, max_new_tokens) for i in order}
        reference = None if methods[0].sampled else runs[0].tokens
        for i, method in enumerate(methods):
            run = runs[i]
            if seen[prompt.dataset] <= warmup:
                continue
            n = run.tokens.shape[0]
            records.append({
                "dataset": prompt.dataset, "idx": prompt.idx, "method": method.name,
                "new_tokens": int(n), "seconds": run.seconds, "steps": run.steps,
                "tokens_per_second": n / run.seconds if run.seconds > 0 else 0.0,
                "tokens_per_step": n / run.steps if run.steps else 0.0,
                "drafting_share": run.drafting_seconds / run.seconds if run.seconds > 0 else 0.0,
                "identical": (None if method.sampled or reference is None
                              else bool(np.array_equal(run.tokens, reference))),
                "first_difference": (None if method.sampled or reference is None
                                     else _first_difference(run.tokens, reference)),
                "budgets": {int(k): int(v) for k, v in run.budgets.items()},
                "lookahead_nodes": int(run.lookahead_nodes),
                "prefix_reused": int(run.prefix_reused),
                "prefill_seconds": float(run.prefill_seconds),
            })
        if progress is not None:
            progress(prompt)
    return records


def _median_round(runs: Sequence[dict]) -> dict:
    """One (method, prompt)'s records from every round, as the record of its median-speed round."""
    assert len({(r["dataset"], r["idx"], r["method"]) for r in runs}) == 1, "rounds recorded other runs"
    speeds = [r["tokens_per_second"] for r in runs]
    chosen = dict(runs[int(np.argsort(speeds, kind="stable")[(len(runs) - 1) // 2])])
    chosen["tokens_per_second_by_round"] = speeds
    if chosen["identical"] is not None:
        chosen["identical_by_round"] = [r["identical"] for r in runs]
        chosen["identical"] = all(r["identical"] for r in runs)
        chosen["first_difference"] = next((r["first_difference"] for r in runs if not r["identical"]),
                                          chosen["first_difference"])
    return chosen


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    position = first_difference(b, a)
    return -1 if position is None else position


def summarize(records: list[dict], baseline: str) -> list[dict]:
    """Per (dataset, method): median tok/s, speedup vs `baseline` (median of per-prompt ratios,
    measured side by side), tokens per step (total tokens / total steps), drafting share,
    identical-output count, and the per-prompt speedup range."""
    rows = []
    by_key: dict[tuple, list[dict]] = {}
    for r in records:
        by_key.setdefault((r["dataset"], r["method"]), []).append(r)
    base = {(r["dataset"], r["idx"]): r for r in records if r["method"] == baseline}
    for (dataset, method), rs in by_key.items():
        ratios = per_prompt_speedups(rs, base)
        total_tokens = sum(r["new_tokens"] for r in rs)
        paired = [(r, base[(r["dataset"], r["idx"])]) for r in rs if (r["dataset"], r["idx"]) in base]
        base_rate = sum(b["new_tokens"] for _, b in paired) / max(sum(b["seconds"] for _, b in paired), 1e-12)
        rate = sum(r["new_tokens"] for r, _ in paired) / max(sum(r["seconds"] for r, _ in paired), 1e-12)
        rows.append({
            "dataset": dataset, "method": method, "prompts": len(rs),
            "tok_s": float(np.median([r["tokens_per_second"] for r in rs])),
            "speedup": float(np.median(ratios)) if ratios else float("nan"),
            "speedup_all": rate / base_rate if paired and base_rate > 0 else float("nan"),
            "speedup_min": float(np.min(ratios)) if ratios else float("nan"),
            "below_floor": sum(ratio < FLOOR for ratio in ratios),
            "tokens_per_step": total_tokens / max(sum(r["steps"] for r in rs), 1),
            "drafting_share": float(np.median([r["drafting_share"] for r in rs])),
            "identical": (None if any(r["identical"] is None for r in rs)
                          else sum(r["identical"] for r in rs)),
        })
    return rows


def per_prompt_speedups(records: list[dict], base: dict) -> list[float]:
    """Each record's tokens per second over its baseline's on the same prompt; `base` maps
    (dataset, idx) to the baseline's record (prompts without one, or of zero time, are left out)."""
    return [base[(r["dataset"], r["idx"])]["seconds"] / r["seconds"] * r["new_tokens"]
            / max(base[(r["dataset"], r["idx"])]["new_tokens"], 1)
            for r in records if (r["dataset"], r["idx"]) in base and r["seconds"] > 0]


SUMMARY_HEADER = ["dataset", "method", "prompts", "tok/s (median)", "speedup vs plain (median)",
                  "all tokens / all time", "min per-prompt speedup", f"prompts below {FLOOR}x", "tokens/step",
                  "drafting share", "identical"]


def summary_table(rows: list[dict]) -> dict:
    """summarize()'s rows as the table the bench prints and its report keeps (report.table); rows
    summarized before a column existed show "–" there."""
    def ratio(value):
        return "–" if value is None else f"{value:.2f}x"

    cells = [[r["dataset"], r["method"], r["prompts"], f"{r['tok_s']:.1f}", ratio(r["speedup"]),
              ratio(r.get("speedup_all")), ratio(r["speedup_min"]),
              "–" if r.get("below_floor") is None else f"{r['below_floor']}/{r['prompts']}",
              f"{r['tokens_per_step']:.2f}", f"{100 * r['drafting_share']:.1f}%", _identical_cell(r)] for r in rows]
    return table("", SUMMARY_HEADER, cells)


def with_control(methods: Sequence[Method]) -> list[Method]:
    """`methods` and, last, the first of them (the reference) once more, named "<name>, again": its
    ratios to the first run are the machine's own noise between two runs of the same thing, the
    yardstick for the other methods' lowest ratios and prompts below the floor."""
    return [*methods, replace(methods[0], name=f"{methods[0].name}, again")]


def format_table(rows: list[dict]) -> str:
    """summarize()'s rows as a markdown table."""
    return table_text(summary_table(rows))


def _identical_cell(row: dict) -> str:
    return "(sampled)" if row["identical"] is None else f"{row['identical']}/{row['prompts']}"


def write_outputs(path_prefix: str, config: dict, records: list[dict], rows: list[dict],
                  report: dict | None = None) -> list[str]:
    """Write `<prefix>.json` and, when matplotlib is installed, `<prefix>.png`; return the paths.

    report: the run's report (report.make_report); default: one titled config["title"] holding the
    summary table, with this process's command line."""
    if report is None:
        report = make_report(config.get("title", "draftcore benchmark"), [summary_table(rows)])
    paths = [path_prefix + ".json"]
    with open(paths[0], "w") as f:
        json.dump({"report": report, "config": config, "summary": rows, "records": records}, f, indent=1,
                  default=str)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return paths
    datasets = sorted({r["dataset"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(len(methods), 1)
    for j, method in enumerate(methods):
        for ax, key in zip(axes, ("speedup", "tokens_per_step")):
            values = [next((r[key] for r in rows if r["dataset"] == d and r["method"] == method), 0.0)
                      for d in datasets]
            ax.bar(np.arange(len(datasets)) + j * width, values, width, label=method)
    for ax, title in zip(axes, ("speedup vs plain greedy (median)", "tokens per step")):
        ax.set_xticks(np.arange(len(datasets)) + width * (len(methods) - 1) / 2, datasets)
        ax.set_title(title)
        ax.axhline(1.0, color="grey", lw=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle(config.get("title", "draftcore benchmark"))
    fig.tight_layout()
    paths.append(path_prefix + ".png")
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths
