"""The `draftcore` command line.

    draftcore replay --traces traces.jsonl.gz --eos 2            the library's defaults on recorded outputs, no model
    draftcore bench --backend hf --datasets humaneval,mtbench --n 20  methods side by side on a real model
    draftcore bench --backend hf --model FOLDER --prompts mine.jsonl  the same on your model and prompts
    draftcore bench --backend llamacpp --vocab 262144              SmolLM2 padded to a large vocabulary
    draftcore record --backend hf --dataset humaneval --n 40 --out t.jsonl.gz   plain greedy traces
    draftcore results                        docs/results.md + archive (+ README blocks) from docs/results/*.json

`replay`'s defaults are the library's: with no trie option and no --budget it replays the bare call
`draftcore.speculate(verifier, prompt)` (the verifier's session TrieDrafter and auto budget), so it
measures what users get. Each trie option given is passed to `TrieDrafter` on its own (--no-fill
as its research switch, TrieResearch(fill=False)); one not given keeps TrieDrafter's default.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..drafters import drafter_names
from ..errors import ConfigError, DraftcoreError, InputError
from .cost_model import COST_TABLES
from . import variants  # noqa: F401  (registers the measured variants: --drafter and --methods take them)

DEFAULT_DATASETS = "humaneval,mtbench"   # what `draftcore bench` runs without --datasets or --prompts
DEFAULT_N = 20                           # recorded prompts per dataset without --n

# (flag, TrieDrafter argument or TrieResearch switch, argparse options): only the flags given reach TrieDrafter
_TRIE_OPTIONS = (
    ("--branch-length", "branch_length", dict(type=int, help="tokens per inserted branch")),
    ("--max-match", "max_match", dict(type=int, help="longest context suffix matched")),
    ("--prompt-weight", "prompt_weight", dict(type=float, help="factor on the current prompt's counts")),
    ("--recent-weight", "recent_weight", dict(type=float, help="extra factor on the current output's counts")),
    ("--layout", "layout", dict(choices=["hierarchical", "parallel", "single"])),
    ("--no-fill", "fill", dict(action="store_false", help="paper retrieval: one stage only")),
    ("--capacity", "capacity", dict(type=int, help="nodes in the trie's pool")),
)


def _add_trie_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("trie drafter (each defaults to TrieDrafter's own default)")
    for flag, dest, options in _TRIE_OPTIONS:
        g.add_argument(flag, dest=dest, default=argparse.SUPPRESS, **options)
    g.add_argument("--reset-per-request", action="store_true", help="a fresh trie for every request")


def trie_options(args) -> dict:
    """The TrieDrafter arguments and research switches the user gave (none: TrieDrafter's defaults)."""
    return {dest: getattr(args, dest) for _, dest, _ in _TRIE_OPTIONS if hasattr(args, dest)}


def replay_arguments(args) -> dict:
    """`replay()`'s keyword arguments from the command line; what is not given is the library's."""
    from .variants import research_trie
    given = trie_options(args)
    if given and args.drafter not in (None, "trie"):
        raise ConfigError(f"drafter: trie options ({', '.join(given)}) need --drafter trie, got {args.drafter!r}")
    drafter = (lambda: research_trie(**given)) if given else args.drafter
    return dict(drafter=drafter, budget=args.budget,
                cost=None if args.cost == "none" else args.cost, eos_token_id=args.eos,
                reset_per_request=args.reset_per_request)


def run_replay(args):
    """The replay behind `draftcore replay`: its ReplayReport."""
    from .replay import replay
    return replay(_load_replay_traces(args), **replay_arguments(args))


def _load_replay_traces(args) -> list:
    from .traces import read_traces
    traces = [trace for path in args.traces or [] for trace in read_traces(path)]
    if args.humaneval_canonical:
        from .canonical import humaneval_canonical_traces
        traces += humaneval_canonical_traces(args.humaneval_canonical, tokenizer=args.tokenizer)
    if not traces:
        raise InputError("traces: give --traces PATH and/or --humaneval-canonical N")
    return traces


def _replay_command(args) -> int:
    from .report import make_report, table_text
    report = run_replay(args)
    given = trie_options(args)
    label = (f"TrieDrafter({', '.join(f'{k}={v!r}' for k, v in given.items())})" if given or args.drafter is None
             else repr(report.drafter))
    setup = (f"drafter: {label}{'' if given or args.drafter else ' (library default)'}{', reset per request' if args.reset_per_request else ''}; "
             f"budget: {_budget_label(args.budget)}; "
             f"cost model: {'none (real clock)' if report.cost is None else _cost_label(report.cost)}")
    rows = [_replay_row(name, s) for name, s in report.items()]
    tables = _replay_tables(setup, rows)
    print("\n\n".join(table_text(t) for t in tables))
    if args.json:
        run = make_report(f"Replay of recorded traces ({', '.join(r['dataset'] for r in rows)})", tables,
                          command=getattr(args, "command_line", None))
        with open(args.json, "w") as f:
            json.dump({"report": run, "config": _config(args), "results": rows}, f, indent=1, default=str)
    return 0


def _budget_label(budget) -> str:
    return "auto (library default: CostAwareBudget)" if budget in (None, "auto") else f"fixed {budget}"


def _cost_label(cost) -> str:
    table = " ".join(f"{n}:{ms:g}" for n, ms in cost.ms_by_nodes.items())
    return f"{cost.name} (ms per verify by nodes: {table})"


def _replay_row(name: str, s) -> dict:
    return {"dataset": name, "requests": s.requests, "tokens_per_step": s.tokens_per_step,
            "simulated_speedup": s.speedup, "draft_us_p50": s.draft_us(0.5), "draft_us_p90": s.draft_us(0.9),
            "accepted_hist": s.accepted_hist, "budget_hist": dict(sorted(s.budget_hist.items()))}


def _replay_tables(setup: str, rows: list[dict]) -> list[dict]:
    """The replay's printed tables (report.table): the summary under `setup` (drafter, budget, cost
    model), then the two histograms."""
    from .report import table
    summary = table(setup, ["dataset", "requests", "tokens/step", "sim. speedup", "draft µs p50", "p90"],
                    [[r["dataset"], r["requests"], f"{r['tokens_per_step']:.3f}",
                      "-" if r["simulated_speedup"] is None else f"{r['simulated_speedup']:.2f}x",
                      f"{r['draft_us_p50']:.1f}", f"{r['draft_us_p90']:.1f}"] for r in rows])
    tables = [summary]
    for key, title in (("accepted_hist", "accepted drafted tokens per step: steps"),
                       ("budget_hist", "drafted candidates verified per step: steps")):
        cells = []
        for r in rows:
            hist = r[key] if isinstance(r[key], dict) else dict(enumerate(r[key]))
            cells.append([r["dataset"], " ".join(f"{k}:{c}" for k, c in hist.items() if c)])
        tables.append(table(title, ["dataset", "count:steps"], cells))
    return tables


def _config(args) -> dict:
    """The parsed command line as a JSON's config records it."""
    return {k: v for k, v in vars(args).items() if k not in ("func", "command_line")}


def _bench_command(args) -> int:
    import os

    from .backends import load_backend
    from .bench import kernel_choices, run_benchmark, summarize, summary_table, with_control, write_outputs
    from .report import machine_line, make_report, table_text
    backend = load_backend(args.backend)
    user_prompts = _read_user_prompts(args, backend)   # a bad prompt file fails here, before the model loads
    model, tokenizer = backend.load_model(args.model, **_model_options(args, backend.load_model))
    prompts = (_encode_user_prompts(args, backend, tokenizer, user_prompts) if user_prompts is not None
               else _dataset_prompts(args, backend, tokenizer))
    names = args.methods.split(",") if args.methods else list(getattr(backend, "METHODS", ()))
    methods = backend.make_methods(model, tokenizer, names) if names else backend.make_methods(model, tokenizer)
    if args.control:
        methods = with_control(methods)
    bar = _progress(len(prompts) * args.rounds, "bench")
    records = run_benchmark(methods, prompts, args.max_new_tokens, warmup=args.warmup, rounds=args.rounds,
                            progress=bar)
    bar(None)
    rows = summarize(records, baseline=methods[0].name)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    config = _config(args)
    if user_prompts is not None:
        config.update(_user_prompts_config(user_prompts, args.warmup))
    config["title"] = (f"{args.backend}: {args.model or 'default model'}{_vocab_words(args)}, "
                       f"{args.datasets or os.path.basename(args.prompts)}, {args.max_new_tokens} new tokens")
    settings = {}
    if hasattr(backend, "model_settings"):   # what the backend's defaults resolved to, not only what was asked
        settings = backend.model_settings(model)
        config.update(settings)
    kernels = kernel_choices(methods)   # what each verifier chose on this machine (after the runs)
    if kernels:
        settings["kernels"] = kernels
    summary = summary_table(rows)
    run = make_report(f"draftcore bench, {config['title']}", [summary], command=getattr(args, "command_line", None),
                      settings=settings)
    print(table_text(summary))
    print(f"\nmachine: {machine_line(run['machine'])}")
    for path in write_outputs(args.out, config, records, rows, report=run):
        print("wrote", path)
    return 0


def _vocab_words(args) -> str:
    """The title's words for --vocab: a padded vocabulary is another model's cost, so it is named."""
    return "" if args.vocab is None else f" with its vocabulary padded to {args.vocab} tokens"


def _read_user_prompts(args, backend):
    """The prompts of --prompts FILE the bench runs (prompt_file.py), read and checked; None
    without --prompts. ConfigError for a backend that cannot tokenise them (no encode_request)."""
    if args.prompts is None:
        return None
    if not callable(getattr(backend, "encode_request", None)):
        raise ConfigError(f"prompts: backend {args.backend!r} has no encode_request hook, so it cannot tokenise "
                          f"a user's prompts; expected --datasets, or a backend with that hook")
    from .prompt_file import prompts_to_run, read_prompt_file
    return prompts_to_run(read_prompt_file(args.prompts), args.prompts, args.n, args.warmup)


def _encode_user_prompts(args, backend, tokenizer, user_prompts) -> list:
    """The prompts file's prompts as the loaded model's tokens, under the file's name as their dataset."""
    from .prompt_file import encode_prompts, prompt_file_dataset
    return encode_prompts(user_prompts, prompt_file_dataset(args.prompts),
                          lambda request: backend.encode_request(tokenizer, request), args.prompts)


def _dataset_prompts(args, backend, tokenizer) -> list:
    """The first --warmup + --n prompts of each of --datasets, as the backend tokenises them (their
    defaults written into args, so that the JSON's config records what ran)."""
    args.datasets = args.datasets or DEFAULT_DATASETS
    args.n = DEFAULT_N if args.n is None else args.n
    return [prompt for dataset in args.datasets.split(",")
            for prompt in backend.load_prompts(tokenizer, dataset, args.n + args.warmup)]


def _user_prompts_config(user_prompts, warmup: int) -> dict:
    """What the bench's JSON keeps of a prompt file's run: how many prompts it recorded, and each
    prompt's line and "id" (null where it has none), listed by a record's idx."""
    return {"n": len(user_prompts) - warmup, "prompt_lines": [p.line for p in user_prompts],
            "prompt_ids": [p.id for p in user_prompts]}


def _record_command(args) -> int:
    from .backends import load_backend
    from .traces import Trace, write_traces
    backend = load_backend(args.backend)
    model, tokenizer = backend.load_model(args.model, **_model_options(args, backend.load_model))
    traces = []
    prompts = backend.load_prompts(tokenizer, args.dataset, args.n)
    bar = _progress(len(prompts), "record")
    for prompt in prompts:
        out = backend.plain_greedy(model, tokenizer, prompt.ids, args.max_new_tokens)
        traces.append(Trace(prompt.dataset, prompt.idx, prompt.ids, out))
        bar(prompt)
    bar(None)
    write_traces(args.out, traces)
    print(f"wrote {len(traces)} traces to {args.out}")
    return 0


def _results_command(args) -> int:
    from .results import default_inputs, load_report, result_name, write_results
    if args.name:   # the name each JSON takes in docs/results/, nothing written
        for path in args.inputs or default_inputs():
            print(f"{path}: {result_name(load_report(path))}")
        return 0
    readme = args.readme
    if readme is None and os.path.isfile("README.md"):
        readme = "README.md"
    for path in write_results(args.inputs or default_inputs(), args.out, readme):
        print("wrote", path)
    return 0


def _model_options(args, load_model) -> dict:
    """The model options given on the command line (the backend's load_model has the defaults);
    ConfigError for one this backend's load_model does not take."""
    import inspect

    given = {k: v for k, v in (("dtype", args.dtype), ("device", args.device), ("attn", args.attn),
                               ("vocab", args.vocab)) if v is not None}
    parameters = inspect.signature(load_model).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    unknown = [k for k in given if k not in parameters and not takes_any]
    if unknown:
        raise ConfigError(f"{unknown[0]}: backend {args.backend!r} has no such model option; its load_model "
                          f"takes {[k for k in parameters if k != 'model_path']}")
    return given


def _progress(total: int, label: str):
    """A progress callback: tqdm when installed, else nothing; call with None to close."""
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda item: None
    bar = tqdm(total=total, desc=label, unit="prompt")

    def update(item):
        if item is None:
            bar.close()
        else:
            bar.update(1)
    return update


def _add_model_options(p: argparse.ArgumentParser) -> None:
    from .backends import backend_names
    names = backend_names()
    p.add_argument("--backend", choices=names, default="hf" if "hf" in names else None, required="hf" not in names)
    p.add_argument("--model", help="model path (HF folder or GGUF); default: the backend's default model")
    p.add_argument("--dtype", help="weights' dtype (default: the backend's)")
    p.add_argument("--attn", help="attention implementation, for backends that have a choice "
                                  "(hf: draftcore_sdpa, the default for SmolLM2; sdpa, the default for --model; eager)")
    p.add_argument("--device", help="default: the backend's (cpu)")
    p.add_argument("--vocab", type=_at_least(1), metavar="N",
                   help="llamacpp: the default model (SmolLM2, 49152 tokens) with its vocabulary padded to N "
                        "tokens (e.g. 128256, 262144): the same answers at a large vocabulary's output-head "
                        "cost; built once, cached under ~/.cache/draftcore/padded_vocab")
    p.add_argument("--max-new-tokens", type=_at_least(1), default=128)


def _at_least(minimum: int):
    """An argparse type: an int >= minimum (a negative count would otherwise slice lists from the end)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {text!r}")
        return value
    return parse


def _file_to_write(text: str) -> str:
    """An argparse type: a file path whose folder exists, checked before a long run rather than after it."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text) or not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"expected a file path in an existing folder, got {text!r}")
    return text


def _budget(text: str):
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an int >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an int >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftcore", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("replay", help="replay recorded (prompt, output) traces through the speculate loop, no model")
    p.add_argument("--traces", action="append", help="JSONL trace file, .gz allowed (repeatable)")
    p.add_argument("--humaneval-canonical", type=_at_least(0), default=0, metavar="N",
                   help="also replay the first N HumanEval prompts with their canonical solutions")
    p.add_argument("--tokenizer", choices=["auto", "smollm2", "bytes"], default="auto",
                   help="tokenizer of --humaneval-canonical")
    p.add_argument("--eos", type=int, default=None, help="EOS token id of the traces")
    p.add_argument("--drafter", choices=drafter_names(), default=None,
                   help="a drafter by name (default: the library's, the verifier's session drafter)")
    p.add_argument("--budget", type=_budget, default=None, metavar="N|auto",
                   help="drafted candidates verified per step (default: auto, the library's CostAwareBudget)")
    p.add_argument("--cost", default="hf-cpu", metavar="NAME|TABLE",
                   help=f"simulated verify cost: {', '.join(COST_TABLES)} (hf-cpu by default), a table "
                        "'nodes:ms,nodes:ms,...', or none (real clock, no speedup)")
    p.add_argument("--json", type=_file_to_write, help="write the results here")
    _add_trie_options(p)
    p.set_defaults(func=_replay_command)

    p = sub.add_parser("bench", help="plain vs peers vs draftcore on a real model, side by side")
    _add_model_options(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--datasets", default=None, help=f"the project's datasets, comma-separated "
                                                         f"(default: {DEFAULT_DATASETS})")
    source.add_argument("--prompts", metavar="FILE.jsonl", default=None,
                        help='your own prompts instead, one a line: {"prompt": "text"} (tokenised as it is) or '
                             '{"messages": [{"role": ..., "content": ...}, ...]} (the model\'s chat template), '
                             'each maybe with an "id"; the table names them by the file\'s name')
    p.add_argument("--n", type=_at_least(1), default=None,
                   help=f"recorded prompts per dataset (default: {DEFAULT_N}; with --prompts, every prompt "
                        f"of the file after the warm-up ones)")
    p.add_argument("--warmup", type=_at_least(0), default=1,
                   help="prompts per dataset run first and not recorded (with --prompts: the file's first ones)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the whole prompt list this many times, each afresh; each (method, prompt) "
                        "reports its median-speed round (steadier ratios on a noisy machine)")
    p.add_argument("--methods", default=None,
                   help="comma-separated method names (default: the backend's METHODS; the first is the reference)")
    p.add_argument("--control", action="store_true",
                   help="run the reference method a second time, last on each prompt: its ratios are the "
                        "machine's own noise, the yardstick for the others' lowest ratios")
    p.add_argument("--out", default="bench_out/bench", help="prefix of the .json and .png written")
    p.set_defaults(func=_bench_command)

    p = sub.add_parser("record", help="record plain greedy (prompt, output) traces as JSONL (.gz: compressed)")
    _add_model_options(p)
    p.add_argument("--dataset", default="humaneval")
    p.add_argument("--n", type=_at_least(1), default=40)
    p.add_argument("--out", type=_file_to_write, required=True)
    p.set_defaults(func=_record_command)

    p = sub.add_parser("results", help="write docs/results.md, its archive (and README.md's results blocks) from "
                                        "benchmarks' JSON")
    p.add_argument("inputs", nargs="*", metavar="JSON",
                   help="benchmark JSON files, each with a report (default: docs/results/*.json, sorted by name)")
    p.add_argument("--out", type=_file_to_write, default=os.path.join("docs", "results.md"),
                   help="the page written: the newest run of each measurement (default: docs/results.md); "
                        "every other run goes to the archive beside it (docs/results-archive.md)")
    p.add_argument("--name", action="store_true",
                   help="print the name each JSON takes in docs/results/ (<benchmark>_<backend>_<machine kind>_"
                        "<date>.json) and write nothing")
    p.add_argument("--readme", default=None,
                   help="README whose results block is refreshed (default: README.md, when there is one)")
    p.set_defaults(func=_results_command)
    return parser


def main(argv=None) -> int:
    from .report import command_line
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.command_line = command_line(["draftcore", *argv])   # what a report records as the command run
    try:
        return args.func(args)
    except DraftcoreError as exc:
        print(f"draftcore: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
